#include "codec/columnar.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "codec/endian.h"
#include "codec/msgpack_scan.h"
#include "codec/varint.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace sluice {
namespace {

// More fields than this and a batch is not worth a columnar layout (and a decoder would be
// asked to track an unbounded number of columns).
constexpr uint64_t kMaxFields = 4096;

// Column encodings (the byte after the type byte, for the types that have one).
constexpr uint8_t kIntPlain = 0;
constexpr uint8_t kIntDelta = 1;
constexpr uint8_t kBytesPlain = 0;
constexpr uint8_t kBytesDict = 1;
constexpr uint8_t kBytesHex = 2;
// Dictionary code layouts (the code width byte).
constexpr uint8_t kCodeBytes = 1;   // one byte a code
constexpr uint8_t kCode16 = 2;      // two bytes a code, little-endian
constexpr uint8_t kCodePlanes = 3;  // two bytes a code: n low bytes, then n high bytes  // str
                                    // only: lowercase hex of even length, stored as bytes

// Nibble of a lowercase hex digit, 0xff for anything else.
struct HexTables {
  uint8_t nibble[256];
  char digits[256][2];
  constexpr HexTables() : nibble(), digits() {
    for (int c = 0; c < 256; ++c) nibble[c] = 0xff;
    for (int c = '0'; c <= '9'; ++c) nibble[c] = static_cast<uint8_t>(c - '0');
    for (int c = 'a'; c <= 'f'; ++c) nibble[c] = static_cast<uint8_t>(c - 'a' + 10);
    for (int b = 0; b < 256; ++b) {
      digits[b][0] = "0123456789abcdef"[b >> 4];
      digits[b][1] = "0123456789abcdef"[b & 15];
    }
  }
};
constexpr HexTables kHex;
constexpr uint8_t kFloatRaw = 0;
constexpr uint8_t kFloatDecimal = 1;  // float64 only: value = int / 10^e, bit-exact

constexpr double kPow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9};
constexpr int kMaxDecimalExponent = 9;

inline uint64_t DoubleBits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}
inline double BitsDouble(uint64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}

// If v == m / 10^e exactly (bit for bit, as the decoder will compute it), sets *m.
inline bool DecimalOf(double v, int e, int64_t* m) {
  const double p = kPow10[e];
  if (!(std::fabs(v) < 4503599627370496.0 / p)) return false;  // also rejects NaN and inf
  const double scaled = v * p;
  // Round to nearest with the 2^52 + 2^51 trick (|scaled| < 2^52 here).
  const double r = (scaled + 6755399441055744.0) - 6755399441055744.0;
  const auto mm = static_cast<int64_t>(r);
  if (DoubleBits(static_cast<double>(mm) / p) != DoubleBits(v)) return false;
  *m = mm;
  return true;
}

// Dictionary limits: past kDictProbe values a column whose values are more than half distinct
// stops building its dictionary; no dictionary grows past kMaxDict entries.
constexpr size_t kDictProbe = 1024;
// The encoder drops its scratch buffers after a batch that left more than this behind.
constexpr size_t kMaxRetainedScratch = 256u << 20;
constexpr uint32_t kMaxDict = 1u << 16;

const char* ColumnTypeName(ColumnType t) {
  switch (t) {
    case ColumnType::kNil:
      return "nil";
    case ColumnType::kBool:
      return "bool";
    case ColumnType::kInt:
      return "int";
    case ColumnType::kFloat32:
      return "float32";
    case ColumnType::kFloat64:
      return "float64";
    case ColumnType::kStr:
      return "str";
    case ColumnType::kBin:
      return "bin";
    case ColumnType::kRawBytes:
      return "raw bytes";
    case ColumnType::kKeyRef:
      return "key reference";
  }
  return "unknown";
}

bool IsBytesType(ColumnType t) {
  return t == ColumnType::kStr || t == ColumnType::kBin || t == ColumnType::kRawBytes;
}

// The column type a msgpack header byte belongs to, or false for maps, arrays, ext and 0xc1.
bool ClassifyScalar(uint8_t b, ColumnType* t) {
  if (b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3)) {
    *t = ColumnType::kInt;
  } else if ((b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb)) {
    *t = ColumnType::kStr;
  } else if (b >= 0xc4 && b <= 0xc6) {
    *t = ColumnType::kBin;
  } else if (b == 0xc0) {
    *t = ColumnType::kNil;
  } else if (b == 0xc2 || b == 0xc3) {
    *t = ColumnType::kBool;
  } else if (b == 0xca) {
    *t = ColumnType::kFloat32;
  } else if (b == 0xcb) {
    *t = ColumnType::kFloat64;
  } else {
    return false;
  }
  return true;
}

const char* DescribeByte(uint8_t b) {
  if ((b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf)) return "a nested map or array";
  if ((b >= 0xc7 && b <= 0xc9) || (b >= 0xd4 && b <= 0xd8)) return "an ext value";
  if (b == 0xc1) return "the reserved byte 0xc1";
  return "an unsupported value";
}

struct ShortKey {
  uint64_t a, b;
};

// Two words that, with the length, identify a span of up to 16 bytes exactly. For 4 to 16
// bytes they are four 4-byte windows at 0, min(4, len-4), min(8, len-4) and len-4: together
// they cover every byte, they never leave [p, p + len), and nothing branches on the exact
// length (a branch there mispredicts on real data, where lengths vary record to record).
inline ShortKey KeyShort(const uint8_t* p, uint32_t len) {
  if (ABSL_PREDICT_TRUE(len >= 4)) {
    const uint32_t last = len - 4;
    const uint32_t o1 = last < 4 ? last : 4;
    const uint32_t o2 = last < 8 ? last : 8;
    return {LoadLE32(p) | (uint64_t{LoadLE32(p + o1)} << 32),
            LoadLE32(p + o2) | (uint64_t{LoadLE32(p + last)} << 32)};
  }
  if (len > 0) return {p[0] | (uint64_t{p[len / 2]} << 8) | (uint64_t{p[len - 1]} << 16), 0};
  return {0, 0};
}

// True when [p, p+len) equals [q, q+len).
inline bool SameBytes(const uint8_t* p, const uint8_t* q, size_t len) {
  if (ABSL_PREDICT_TRUE(len >= 4 && len <= 16)) {  // the four windows of KeyShort
    const size_t last = len - 4;
    const size_t o1 = last < 4 ? last : 4;
    const size_t o2 = last < 8 ? last : 8;
    return ((LoadLE32(p) ^ LoadLE32(q)) | (LoadLE32(p + o1) ^ LoadLE32(q + o1)) |
            (LoadLE32(p + o2) ^ LoadLE32(q + o2)) | (LoadLE32(p + last) ^ LoadLE32(q + last))) == 0;
  }
  if (len < 4) {
    const ShortKey x = KeyShort(p, static_cast<uint32_t>(len));
    const ShortKey y = KeyShort(q, static_cast<uint32_t>(len));
    return x.a == y.a && x.b == y.b;
  }
  return std::memcmp(p, q, len) == 0;
}

// A column being built from one batch. Strings are not copied while parsing: the column keeps
// pointers into the records and, while values repeat, a dictionary.
struct BuildColumn {
  ColumnType type = ColumnType::kNil;
  size_t n = 0;
  PodBuffer<int64_t> ints;         // kInt; kFloat64 as decimals (see Serialize)
  ByteBuffer fixed;                // kFloat32, kFloat64, kBool: n * width bytes (as in msgpack)
  PodBuffer<const uint8_t*> ptrs;  // bytes types: where each value's content starts
  PodBuffer<uint32_t> lens;        // bytes types: content lengths
  uint64_t total_len = 0;          // sum of lens

  // Dictionary (bytes types). The hash table holds 4-byte slots, (epoch << 16) | code, so it
  // stays small; each entry's identifying words live in `entry_keys`, indexed by code. A slot
  // whose epoch is not the current one is empty: a new batch starts by bumping the epoch.
  struct EntryKey {
    uint64_t a, b;
    uint32_t len, unused;
  };
  bool dict_active = false;
  PodBuffer<uint32_t> codes;       // per value
  PodBuffer<uint32_t> firsts;      // per dictionary entry: index of its first value
  PodBuffer<EntryKey> entry_keys;  // per dictionary entry
  uint64_t dict_len = 0;           // sum of the entries' lengths
  PodBuffer<uint32_t> slots;
  uint32_t slot_shift = 0;  // 64 - log2(slots)
  uint32_t epoch = 0;       // 1..65535

  void Start(ColumnType t, size_t count) {
    type = t;
    n = count;
    total_len = 0;
    switch (t) {
      case ColumnType::kInt:
        ints.Resize(n);
        break;
      case ColumnType::kFloat32:
        fixed.Resize(n * 4);
        break;
      case ColumnType::kFloat64:
        fixed.Resize(n * 8);
        break;
      case ColumnType::kBool:
        fixed.Resize(n);
        break;
      case ColumnType::kStr:
      case ColumnType::kBin:
      case ColumnType::kRawBytes:
        ptrs.Resize(n);
        lens.Resize(n);
        codes.Resize(n);
        firsts.Clear();
        entry_keys.Clear();
        dict_len = 0;
        dict_active = n > 1;
        if (slots.empty()) ResizeSlots(1024);
        if (++epoch > 0xffff) {  // wrapped: forget every slot the slow way
          std::memset(slots.data(), 0, slots.size() * sizeof(uint32_t));
          epoch = 1;
        }
        break;
      default:
        break;
    }
  }

  size_t RetainedBytes() const {
    return ints.capacity() * 8 + fixed.capacity() + ptrs.capacity() * 8 + lens.capacity() * 4 +
           codes.capacity() * 4 + firsts.capacity() * 4 + entry_keys.capacity() * sizeof(EntryKey) +
           slots.capacity() * 4;
  }

  // A new, empty table (epoch 0 is never current).
  void ResizeSlots(size_t cap) {
    slots.Resize(cap);
    std::memset(slots.data(), 0, cap * sizeof(uint32_t));
    slot_shift = static_cast<uint32_t>(64 - __builtin_ctzll(cap));
    if (epoch == 0) epoch = 1;
  }

  static inline uint64_t Hash(uint64_t a, uint64_t b, uint32_t len) {
    return (a * 0x9e3779b97f4a7c15ULL) ^ (b * 0xc2b2ae3d27d4eb4fULL) ^
           (uint64_t{len} * 0x165667b19e3779f9ULL);
  }

  inline void KeyOf(const uint8_t* p, uint32_t len, uint64_t* a, uint64_t* b) const {
    if (len <= 16) {
      const ShortKey k = KeyShort(p, len);
      *a = k.a;
      *b = k.b;
    } else {
      *a = XXH3_64bits(p, len);
      *b = LoadLE64(p);
    }
  }

  // Finds or adds the value at index i in the dictionary.
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline void AddToDict(size_t i, const uint8_t* p, uint32_t len) {
    uint64_t a, b;
    KeyOf(p, len, &a, &b);
    const size_t mask = slots.size() - 1;
    size_t idx = Hash(a, b, len) >> slot_shift;
    for (;;) {
      const uint32_t slot = slots[idx];
      if (ABSL_PREDICT_FALSE((slot >> 16) != epoch)) {
        Insert(idx, i, a, b, len);
        return;
      }
      const uint32_t code = slot & 0xffff;
      const EntryKey& e = entry_keys[code];
      if (e.a == a && e.b == b && e.len == len &&
          (len <= 16 || std::memcmp(p, ptrs[firsts[code]], len) == 0)) {
        codes[i] = code;
        return;
      }
      idx = (idx + 1) & mask;
    }
  }

  ABSL_ATTRIBUTE_NOINLINE void Insert(size_t idx, size_t i, uint64_t a, uint64_t b, uint32_t len) {
    const auto code = static_cast<uint32_t>(firsts.size());
    slots[idx] = (epoch << 16) | code;
    firsts.PushBack(static_cast<uint32_t>(i));
    entry_keys.PushBack(EntryKey{a, b, len, 0});
    dict_len += len;
    codes[i] = code;
    if (code + 1 >= kMaxDict || (i >= kDictProbe && !DictPays(i + 1))) {
      dict_active = false;  // too many distinct values: a dictionary would not pay
    } else if (4 * size_t{code + 1} > slots.size()) {  // keep the load under 1/4: few probes
      Grow();
    }
  }

  // Whether, on the first `seen` values, dictionary + codes beat lengths + contents by 10%.
  bool DictPays(size_t seen) const {
    const uint64_t entries = firsts.size();
    const uint64_t dict_cost = dict_len + entries + seen * CodeWidth(entries);
    const uint64_t plain_cost = total_len + seen;
    return dict_cost * 10 < plain_cost * 9;
  }

  void Grow() {
    ResizeSlots(slots.size() * 2);
    const size_t mask = slots.size() - 1;
    for (uint32_t code = 0; code < entry_keys.size(); ++code) {
      const EntryKey& e = entry_keys[code];
      size_t idx = Hash(e.a, e.b, e.len) >> slot_shift;
      while ((slots[idx] >> 16) == epoch) idx = (idx + 1) & mask;
      slots[idx] = (epoch << 16) | code;
    }
  }

  // Parses the value at p as record i of a column of type T; returns the pointer past it or
  // nullptr.
  template <ColumnType T>
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline const uint8_t* ParseAs(size_t i, const uint8_t* p,
                                                             const uint8_t* end) {
    if constexpr (T == ColumnType::kInt) {
      int64_t v;
      p = mp::ReadCanonicalInt(p, end, &v);
      if (p != nullptr) ints[i] = v;
      return p;
    } else if constexpr (T == ColumnType::kFloat64) {
      if (end - p < 9 || *p != 0xcb) return nullptr;
      std::memcpy(fixed.data() + i * 8, p + 1, 8);
      return p + 9;
    } else if constexpr (T == ColumnType::kFloat32) {
      if (end - p < 5 || *p != 0xca) return nullptr;
      std::memcpy(fixed.data() + i * 4, p + 1, 4);
      return p + 5;
    } else if constexpr (T == ColumnType::kBool) {
      if (p >= end || (*p & 0xfe) != 0xc2) return nullptr;
      fixed[i] = *p & 1;
      return p + 1;
    } else if constexpr (T == ColumnType::kNil) {
      if (p >= end || *p != 0xc0) return nullptr;
      return p + 1;
    } else if constexpr (T == ColumnType::kStr || T == ColumnType::kBin) {
      uint32_t len;
      const uint8_t* q = T == ColumnType::kStr ? mp::ReadCanonicalStr(p, end, &len)
                                               : mp::ReadCanonicalBin(p, end, &len);
      if (q == nullptr) return nullptr;
      AddBytes(i, q, len);
      return q + len;
    } else if constexpr (T == ColumnType::kRawBytes) {
      AddBytes(i, p, static_cast<uint32_t>(end - p));
      return end;
    } else {
      return nullptr;
    }
  }

  const uint8_t* Parse(size_t i, const uint8_t* p, const uint8_t* end) {
    switch (type) {
      case ColumnType::kInt:
        return ParseAs<ColumnType::kInt>(i, p, end);
      case ColumnType::kFloat64:
        return ParseAs<ColumnType::kFloat64>(i, p, end);
      case ColumnType::kFloat32:
        return ParseAs<ColumnType::kFloat32>(i, p, end);
      case ColumnType::kBool:
        return ParseAs<ColumnType::kBool>(i, p, end);
      case ColumnType::kNil:
        return ParseAs<ColumnType::kNil>(i, p, end);
      case ColumnType::kStr:
        return ParseAs<ColumnType::kStr>(i, p, end);
      case ColumnType::kBin:
        return ParseAs<ColumnType::kBin>(i, p, end);
      case ColumnType::kRawBytes:
        return ParseAs<ColumnType::kRawBytes>(i, p, end);
      case ColumnType::kKeyRef:
        return nullptr;
    }
    return nullptr;
  }

  ABSL_ATTRIBUTE_ALWAYS_INLINE inline void AddBytes(size_t i, const uint8_t* p, uint32_t len) {
    ptrs[i] = p;
    lens[i] = len;
    total_len += len;
    if (dict_active) AddToDict(i, p, len);
  }

  bool UseDict() const { return IsBytesType(type) && dict_active && firsts.size() < n; }

  static uint8_t CodeWidth(size_t dict_size) { return dict_size <= 256 ? 1 : 2; }

  // Upper bound of the serialized size (type byte and headers included).
  size_t MaxSerializedSize() const {
    switch (type) {
      case ColumnType::kInt:
        return 2 + n * kMaxVarintBytes;
      case ColumnType::kFloat32:
      case ColumnType::kFloat64:
        return 4 + std::max(fixed.size(), n * kMaxVarintBytes);
      case ColumnType::kBool:
        return 1 + fixed.size();
      case ColumnType::kNil:
        return 1;
      default:
        if (UseDict()) {
          return 3 + 2 * kMaxVarintBytes + firsts.size() * 5 + dict_len + n * 2;
        }
        return 2 + kMaxVarintBytes + n * 5 + total_len;
    }
  }

  uint8_t* Serialize(uint8_t* w) {
    *w++ = static_cast<uint8_t>(type);
    switch (type) {
      case ColumnType::kInt:
        return SerializeInts(ints.data(), n, w);
      case ColumnType::kFloat64: {
        int e;
        if (ToDecimals(&e)) {
          *w++ = kFloatDecimal;
          *w++ = static_cast<uint8_t>(e);
          return SerializeInts(ints.data(), n, w);
        }
        *w++ = kFloatRaw;
        std::memcpy(w, fixed.data(), fixed.size());
        return w + fixed.size();
      }
      case ColumnType::kFloat32:
        *w++ = kFloatRaw;
        std::memcpy(w, fixed.data(), fixed.size());
        return w + fixed.size();
      case ColumnType::kBool:
        std::memcpy(w, fixed.data(), fixed.size());
        return w + fixed.size();
      case ColumnType::kNil:
        return w;
      default:
        return UseDict() ? SerializeDict(w) : SerializePlainBytes(w);
    }
  }

  // Decimal floats (prices, rounded measurements): when every value is m / 10^e exactly for
  // one e, the column is stored as the integers m, which compress far better than raw bits.
  // The exponent comes from the first values; one miss anywhere keeps the column raw.
  bool ToDecimals(int* exponent) {
    if (n == 0) return false;
    const uint8_t* f = fixed.data();
    auto value = [f](size_t i) { return BitsDouble(LoadBE64(f + 8 * i)); };
    int e = 0;
    int64_t m;
    for (size_t i = 0; i < n && i < 16; ++i) {
      while (e <= kMaxDecimalExponent && !DecimalOf(value(i), e, &m)) ++e;
      if (e > kMaxDecimalExponent) return false;
    }
    ints.Resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (!DecimalOf(value(i), e, &ints[i])) return false;
    }
    *exponent = e;
    return true;
  }

  static uint8_t* SerializeInts(const int64_t* v, size_t n, uint8_t* w) {
    // Plain or delta zigzag varints: estimated on an even sample of at most 512 values, so
    // the column is only walked once more, to write it.
    const size_t step = n > 512 ? n / 512 : 1;
    size_t plain = 0, delta = 0;
    for (size_t i = 0; i < n; i += step) {
      plain += VarintLength(ZigZag(v[i]));
      const uint64_t prev = i == 0 ? 0 : static_cast<uint64_t>(v[i - 1]);
      delta += VarintLength(ZigZag(static_cast<int64_t>(static_cast<uint64_t>(v[i]) - prev)));
    }
    if (delta < plain) {
      *w++ = kIntDelta;
      uint64_t prev = 0;
      for (size_t i = 0; i < n; ++i) {
        const auto x = static_cast<uint64_t>(v[i]);
        w = PutVarint(w, ZigZag(static_cast<int64_t>(x - prev)));
        prev = x;
      }
    } else {
      *w++ = kIntPlain;
      for (size_t i = 0; i < n; ++i) w = PutVarint(w, ZigZag(v[i]));
    }
    return w;
  }

  // Hex strings (trace ids, hashes, session ids) are stored as the bytes they spell: half the
  // size, and no low-entropy text for zstd to wade through. Returns nullptr if any value is not
  // lowercase hex of even length.
  uint8_t* SerializeHex(uint8_t* w) const {
    if (type != ColumnType::kStr || total_len == 0) return nullptr;
    *w++ = kBytesHex;
    for (size_t i = 0; i < n; ++i) {
      if (lens[i] & 1) return nullptr;
      w = PutVarint(w, lens[i] / 2);
    }
    w = PutVarint(w, total_len / 2);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* src = ptrs[i];
      uint8_t bad = 0;
      for (uint32_t k = 0; k < lens[i]; k += 2) {
        const uint8_t hi = kHex.nibble[src[k]], lo = kHex.nibble[src[k + 1]];
        bad |= hi | lo;
        *w++ = static_cast<uint8_t>((hi << 4) | (lo & 0x0f));
      }
      if (bad & 0xf0) return nullptr;
    }
    return w;
  }

  uint8_t* SerializePlainBytes(uint8_t* w) const {
    if (uint8_t* end = SerializeHex(w); end != nullptr) return end;
    *w++ = kBytesPlain;
    for (size_t i = 0; i < n; ++i) w = PutVarint(w, lens[i]);
    w = PutVarint(w, total_len);
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(w, ptrs[i], lens[i]);
      w += lens[i];
    }
    return w;
  }

  uint8_t* SerializeDict(uint8_t* w) const {
    *w++ = kBytesDict;
    const size_t d = firsts.size();
    w = PutVarint(w, d);
    for (size_t c = 0; c < d; ++c) w = PutVarint(w, lens[firsts[c]]);
    w = PutVarint(w, dict_len);
    for (size_t c = 0; c < d; ++c) {
      const uint32_t i = firsts[c];
      std::memcpy(w, ptrs[i], lens[i]);
      w += lens[i];
    }
    const uint8_t width = CodeWidth(d);
    *w++ = width == 1 ? kCodeBytes : kCode16;
    if (width == 1) {
      for (size_t i = 0; i < n; ++i) w[i] = static_cast<uint8_t>(codes[i]);
      return w + n;
    }
    // Two bytes a code. When at least two thirds of the codes are below 256 (frequent values come
    // first and get small codes) the codes go as two planes, every low byte then every high byte:
    // the high plane is then almost all zeros, which zstd crosses quickly. Otherwise the codes stay
    // interleaved little-endian, which zstd handles faster for flatter distributions.
    size_t high = 0;
    for (size_t i = 0; i < n; ++i) high += codes[i] >> 8 != 0;
    if (high * 3 <= n) {
      w[-1] = kCodePlanes;
      for (size_t i = 0; i < n; ++i) {
        w[i] = static_cast<uint8_t>(codes[i]);
        w[n + i] = static_cast<uint8_t>(codes[i] >> 8);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        const auto c = static_cast<uint16_t>(codes[i]);  // little-endian host
        std::memcpy(w + 2 * i, &c, 2);
      }
    }
    return w + 2 * n;
  }
};

// The bytes every value starts a field with: the encoded field name (and, for field 0, the
// map header).
struct Prefix {
  uint8_t bytes[32] = {};
  ByteBuffer long_bytes;  // when len > 16
  size_t len = 0;
  ShortKey key{0, 0};
  // Two overlapping loads from either end compare any prefix of 4..16 bytes.
  uint64_t head64 = 0, tail64 = 0;
  uint32_t head32 = 0, tail32 = 0;

  void Set(const uint8_t* p, size_t n) {
    len = n;
    long_bytes.Clear();
    std::memset(bytes, 0, sizeof(bytes));
    if (n > 16) {
      long_bytes.Append(p, n);
    } else {
      std::memcpy(bytes, p, n);
      key = KeyShort(bytes, static_cast<uint32_t>(n));
      if (n >= 8) {
        head64 = LoadLE64(bytes);
        tail64 = LoadLE64(bytes + n - 8);
      }
      if (n >= 4) {
        head32 = LoadLE32(bytes);
        tail32 = LoadLE32(bytes + n - 4);
      }
    }
  }
  const uint8_t* data() const { return len > 16 ? long_bytes.data() : bytes; }
};

// How a record failed to fit a column.
enum class ParseFailure { kNone, kPrefix, kValue, kTrailing };

// What a column's loop checks besides its own field.
struct ColumnChecks {
  bool last_field = false;              // the value must end right after this field
  const Record* key_records = nullptr;  // if set: does each key equal this field's encoding?
  bool key_ref_holds = false;           // in: whether to check; out: the answer
};

// Parses one field (prefix `pr`, then a value of type T) for every record, advancing each
// record's cursor. Returns n, or the index of the first record that does not fit (*failure
// says how).
template <ColumnType T>
size_t ParseColumn(BuildColumn& col, const Prefix& pr, const uint8_t** __restrict cur,
                   const uint8_t* const* __restrict ends, size_t n, ColumnChecks* checks,
                   ParseFailure* failure) {
  // Everything the loop touches lives in locals, so stores through the output arrays do not
  // force the compiler to reload the column's members on every record.
  int64_t* __restrict ints = col.ints.data();
  uint8_t* __restrict fixed = col.fixed.data();
  // (No __restrict on these two: the dictionary reads them back through `col`.)
  const uint8_t** ptrs = col.ptrs.data();
  uint32_t* lens = col.lens.data();
  const size_t plen = pr.len;
  const ShortKey pkey = pr.key;
  // The same for every record, so these branches predict perfectly.
  const bool prefix8to16 = plen >= 8 && plen <= 16;
  const bool prefix4to7 = plen >= 4 && plen < 8;
  const uint64_t head64 = pr.head64, tail64 = pr.tail64;
  const uint32_t head32 = pr.head32, tail32 = pr.tail32;
  const bool last_field = checks->last_field;
  const Record* const key_records = checks->key_records;
  bool key_ref_holds = checks->key_ref_holds && key_records != nullptr;
  size_t i = 0;
  for (; i < n; ++i) {
    const uint8_t* q = cur[i];
    const uint8_t* const end = ends[i];
    const auto avail = static_cast<size_t>(end - q);
    if (ABSL_PREDICT_FALSE(avail < plen)) break;
    if (prefix8to16) {
      if (ABSL_PREDICT_FALSE(LoadLE64(q) != head64 || LoadLE64(q + plen - 8) != tail64)) break;
    } else if (prefix4to7) {
      if (ABSL_PREDICT_FALSE(LoadLE32(q) != head32 || LoadLE32(q + plen - 4) != tail32)) break;
    } else if (plen < 4) {
      const ShortKey k = KeyShort(q, static_cast<uint32_t>(plen));
      if (ABSL_PREDICT_FALSE(k.a != pkey.a || k.b != pkey.b)) break;
    } else if (std::memcmp(q, pr.data(), plen) != 0) {
      break;
    }
    const uint8_t* p = q + plen;
    if constexpr (T == ColumnType::kInt) {
      int64_t v;
      p = mp::ReadCanonicalInt(p, end, &v);
      if (ABSL_PREDICT_FALSE(p == nullptr)) goto value_failed;
      ints[i] = v;
    } else if constexpr (T == ColumnType::kFloat64) {
      if (ABSL_PREDICT_FALSE(end - p < 9 || *p != 0xcb)) goto value_failed;
      std::memcpy(fixed + i * 8, p + 1, 8);
      p += 9;
    } else if constexpr (T == ColumnType::kFloat32) {
      if (ABSL_PREDICT_FALSE(end - p < 5 || *p != 0xca)) goto value_failed;
      std::memcpy(fixed + i * 4, p + 1, 4);
      p += 5;
    } else if constexpr (T == ColumnType::kBool) {
      if (ABSL_PREDICT_FALSE(p >= end || (*p & 0xfe) != 0xc2)) goto value_failed;
      fixed[i] = *p & 1;
      p += 1;
    } else if constexpr (T == ColumnType::kNil) {
      if (ABSL_PREDICT_FALSE(p >= end || *p != 0xc0)) goto value_failed;
      p += 1;
    } else {
      static_assert(T == ColumnType::kStr || T == ColumnType::kBin);
      uint32_t len;
      const uint8_t* s = T == ColumnType::kStr ? mp::ReadCanonicalStr(p, end, &len)
                                               : mp::ReadCanonicalBin(p, end, &len);
      if (ABSL_PREDICT_FALSE(s == nullptr)) goto value_failed;
      ptrs[i] = s;
      lens[i] = len;
      col.total_len += len;  // (read by the dictionary's cost check)
      if (col.dict_active) col.AddToDict(i, s, len);
      p = s + len;
    }
    if (last_field && ABSL_PREDICT_FALSE(p != end)) {
      checks->key_ref_holds = key_ref_holds;
      *failure = ParseFailure::kTrailing;
      return i;
    }
    if (key_ref_holds) {
      const std::string_view key = key_records[i].key;
      const uint8_t* value = q + plen;
      key_ref_holds = static_cast<size_t>(p - value) == key.size() &&
                      SameBytes(value, reinterpret_cast<const uint8_t*>(key.data()), key.size());
    }
    cur[i] = p;
  }
  checks->key_ref_holds = key_ref_holds;
  *failure = i == n ? ParseFailure::kNone : ParseFailure::kPrefix;
  return i;
value_failed:
  checks->key_ref_holds = key_ref_holds;
  *failure = ParseFailure::kValue;
  return i;
}

size_t ParseColumnOfType(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                         const uint8_t* const* ends, size_t n, ColumnChecks* checks,
                         ParseFailure* failure) {
  switch (col.type) {
    case ColumnType::kInt:
      return ParseColumn<ColumnType::kInt>(col, pr, cur, ends, n, checks, failure);
    case ColumnType::kFloat64:
      return ParseColumn<ColumnType::kFloat64>(col, pr, cur, ends, n, checks, failure);
    case ColumnType::kFloat32:
      return ParseColumn<ColumnType::kFloat32>(col, pr, cur, ends, n, checks, failure);
    case ColumnType::kBool:
      return ParseColumn<ColumnType::kBool>(col, pr, cur, ends, n, checks, failure);
    case ColumnType::kNil:
      return ParseColumn<ColumnType::kNil>(col, pr, cur, ends, n, checks, failure);
    case ColumnType::kStr:
      return ParseColumn<ColumnType::kStr>(col, pr, cur, ends, n, checks, failure);
    case ColumnType::kBin:
      return ParseColumn<ColumnType::kBin>(col, pr, cur, ends, n, checks, failure);
    default:
      *failure = ParseFailure::kValue;
      return 0;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Encoder

struct ColumnarEncoder::State {
  BuildColumn key;
  std::vector<BuildColumn> fields;
  std::vector<Prefix> prefixes;
  std::vector<absl::string_view> names;  // views into records[0].value
  PodBuffer<const uint8_t*> cursors;     // per record: where parsing continues
  PodBuffer<const uint8_t*> ends;        // per record: end of its value
};

ColumnarEncoder::ColumnarEncoder() : state_(std::make_unique<State>()) {}
ColumnarEncoder::~ColumnarEncoder() = default;

bool ColumnarEncoder::Encode(absl::Span<const Record> records, ByteBuffer* payload,
                             std::string* why_not) {
  const bool ok = EncodeImpl(records, payload, why_not);
  // As in the decoder: reuse scratch, but do not let wide batches ratchet it up for good.
  size_t retained = state_->key.RetainedBytes();
  for (const BuildColumn& c : state_->fields) retained += c.RetainedBytes();
  if (retained > kMaxRetainedScratch) state_ = std::make_unique<State>();
  return ok;
}

bool ColumnarEncoder::EncodeImpl(absl::Span<const Record> records, ByteBuffer* payload,
                                 std::string* why_not) {
  State& s = *state_;
  const size_t n = records.size();
  if (n == 0) {
    *why_not = "empty batch";
    return false;
  }
  auto bytes_of = [](std::string_view v) { return reinterpret_cast<const uint8_t*>(v.data()); };

  // --- Shape, from record 0's value: a map of str field names to scalars.
  const uint8_t* v0 = bytes_of(records[0].value);
  const uint8_t* v0_end = v0 + records[0].value.size();
  uint32_t num_fields;
  const uint8_t* p = mp::ReadCanonicalMapHeader(v0, v0_end, &num_fields);
  if (p == nullptr) {
    *why_not = "record 0: value is not a canonically encoded msgpack map";
    return false;
  }
  if (num_fields > kMaxFields) {
    *why_not = absl::StrCat("record 0: ", num_fields, " fields, more than ", kMaxFields);
    return false;
  }
  if (s.fields.size() < num_fields) {
    s.fields.resize(num_fields);
    s.prefixes.resize(num_fields);
  }
  s.names.clear();
  // The key may be a copy of one field's encoded value (zephyr derives keys that way): then
  // the key column is just a reference to that field.
  const uint8_t* k0 = bytes_of(records[0].key);
  int key_ref = -1;
  for (uint32_t j = 0; j < num_fields; ++j) {
    const uint8_t* name_start = p;
    uint32_t name_len;
    const uint8_t* name = mp::ReadCanonicalStr(p, v0_end, &name_len);
    if (name == nullptr) {
      *why_not = absl::StrCat("record 0: field ", j, " name is not a canonical msgpack str");
      return false;
    }
    s.names.emplace_back(reinterpret_cast<const char*>(name), name_len);
    p = name + name_len;
    const uint8_t* prefix_start = j == 0 ? v0 : name_start;  // field 0 includes the map header
    s.prefixes[j].Set(prefix_start, static_cast<size_t>(p - prefix_start));
    ColumnType t;
    if (p >= v0_end || !ClassifyScalar(*p, &t)) {
      *why_not = absl::StrCat("record 0: field '", s.names.back(), "' holds ",
                              p >= v0_end ? "nothing (truncated)" : DescribeByte(*p));
      return false;
    }
    s.fields[j].Start(t, n);
    mp::ScanError err;
    const uint8_t* value_start = p;
    p = mp::SkipObject(p, v0_end, &err);
    if (p == nullptr) {
      *why_not = absl::StrCat("record 0: field '", s.names.back(), "': ", mp::ScanErrorName(err));
      return false;
    }
    if (key_ref < 0 && static_cast<size_t>(p - value_start) == records[0].key.size() &&
        std::memcmp(value_start, k0, records[0].key.size()) == 0) {
      key_ref = static_cast<int>(j);
    }
  }

  // --- Values, column by column: one tight loop per field, specialised for its type.
  BuildColumn* const cols = s.fields.data();
  const Prefix* const prefixes = s.prefixes.data();
  s.cursors.Resize(n);
  s.ends.Resize(n);
  const uint8_t** cur = s.cursors.data();
  const uint8_t** ends = s.ends.data();
  for (size_t i = 0; i < n; ++i) {
    cur[i] = bytes_of(records[i].value);
    ends[i] = cur[i] + records[i].value.size();
  }
  if (num_fields == 0) {
    for (size_t i = 0; i < n; ++i) {
      if (records[i].value.size() != 1 || *cur[i] != 0x80) {
        *why_not = absl::StrCat("record ", i, ": value is not the empty map like record 0");
        return false;
      }
    }
  }
  bool key_ref_holds = key_ref >= 0;
  for (uint32_t j = 0; j < num_fields; ++j) {
    ColumnChecks checks;
    checks.last_field = j + 1 == num_fields;
    if (static_cast<int>(j) == key_ref) {
      checks.key_records = records.data();
      checks.key_ref_holds = true;
    }
    ParseFailure failure = ParseFailure::kNone;
    const size_t i = ParseColumnOfType(cols[j], prefixes[j], cur, ends, n, &checks, &failure);
    if (static_cast<int>(j) == key_ref) key_ref_holds = checks.key_ref_holds;
    if (failure == ParseFailure::kNone) continue;
    if (failure == ParseFailure::kPrefix) {
      *why_not = absl::StrCat("record ", i, ": map shape differs from record 0 at field ", j, " ('",
                              s.names[j], "')");
      return false;
    }
    if (failure == ParseFailure::kTrailing) {
      *why_not = absl::StrCat("record ", i, ": value has bytes after the map like record 0's");
      return false;
    }
    const uint8_t* start = cur[i] + prefixes[j].len;
    ColumnType got;
    if (start < ends[i] && ClassifyScalar(*start, &got) && got != cols[j].type) {
      *why_not = absl::StrCat("record ", i, ": field '", s.names[j], "' changes type from ",
                              ColumnTypeName(cols[j].type), " to ", ColumnTypeName(got));
    } else if (start < ends[i] && !ClassifyScalar(*start, &got)) {
      *why_not =
          absl::StrCat("record ", i, ": field '", s.names[j], "' holds ", DescribeByte(*start));
    } else {
      *why_not = absl::StrCat("record ", i, ": field '", s.names[j],
                              "' is truncated, out of int64 range or not canonically encoded");
    }
    return false;
  }

  // --- Keys: a field reference, one canonical msgpack scalar each of one type, or raw bytes.
  if (!key_ref_holds) {
    key_ref = -1;
    ColumnType kt = ColumnType::kRawBytes;
    if (!records[0].key.empty() && ClassifyScalar(k0[0], &kt)) {
      s.key.Start(kt, n);
      for (size_t i = 0; i < n; ++i) {
        const uint8_t* k = bytes_of(records[i].key);
        const uint8_t* k_end = k + records[i].key.size();
        if (s.key.Parse(i, k, k_end) != k_end) {
          kt = ColumnType::kRawBytes;
          break;
        }
      }
    }
    if (kt == ColumnType::kRawBytes) {
      s.key.Start(kt, n);
      for (size_t i = 0; i < n; ++i) {
        const uint8_t* k = bytes_of(records[i].key);
        s.key.Parse(i, k, k + records[i].key.size());
      }
    }
  }

  // --- Serialize.
  size_t bound = kMaxVarintBytes + (key_ref >= 0 ? 1 + kMaxVarintBytes : s.key.MaxSerializedSize());
  for (uint32_t j = 0; j < num_fields; ++j) {
    bound += kMaxVarintBytes + s.names[j].size() + cols[j].MaxSerializedSize();
  }
  const size_t start_size = payload->size();
  uint8_t* const start = payload->Extend(bound);
  uint8_t* w = start;
  w = PutVarint(w, num_fields);
  for (uint32_t j = 0; j < num_fields; ++j) {
    w = PutVarint(w, s.names[j].size());
    std::memcpy(w, s.names[j].data(), s.names[j].size());
    w += s.names[j].size();
  }
  if (key_ref >= 0) {
    *w++ = static_cast<uint8_t>(ColumnType::kKeyRef);
    w = PutVarint(w, static_cast<uint64_t>(key_ref));
  } else {
    w = s.key.Serialize(w);
  }
  for (uint32_t j = 0; j < num_fields; ++j) w = cols[j].Serialize(w);
  payload->Resize(start_size + static_cast<size_t>(w - start));
  return true;
}

// ---------------------------------------------------------------------------------------------
// Decoder

namespace {

struct ReadColumn {
  ColumnType type = ColumnType::kNil;
  PodBuffer<int64_t> ints;
  PodBuffer<uint32_t> lens;        // plain bytes: per value
  const uint8_t* fixed = nullptr;  // floats (big-endian, as in msgpack), bools
  ByteBuffer decimal_floats;       // float64 decimals, turned back into raw bits
  const uint8_t* blob = nullptr;   // plain bytes: contents back to back
  const uint8_t* blob_end = nullptr;
  bool hex = false;  // plain bytes stored as the bytes their hex digits spell
  // Dictionary bytes: every entry pre-encoded (msgpack header + content) in `entries`.
  bool dict = false;
  ByteBuffer entries;
  PodBuffer<uint32_t> entry_off;  // d + 1 offsets into entries
  const uint8_t* codes = nullptr;
  uint8_t code_width = 1;
  uint32_t key_ref_field = 0;  // kKeyRef
  uint64_t rebuilt_bytes = 0;  // bytes this column contributes to the rebuilt rows

  size_t RetainedBytes() const {
    return ints.capacity() * 8 + lens.capacity() * 4 + decimal_floats.capacity() +
           entries.capacity() + entry_off.capacity() * 4;
  }

  size_t n = 0;
  uint32_t Code(size_t i) const {
    if (code_width == kCodeBytes) return codes[i];
    if (code_width == kCode16) return codes[2 * i] | (uint32_t{codes[2 * i + 1]} << 8);
    return codes[i] | (uint32_t{codes[n + i]} << 8);  // low plane, then high plane
  }
};

absl::Status Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("corrupt COLUMNAR payload: ", what));
}

size_t BytesHeaderSize(ColumnType t, uint64_t len) {
  return t == ColumnType::kStr ? mp::StrHeaderSize(len)
                               : (t == ColumnType::kBin ? mp::BinHeaderSize(len) : 0);
}
uint8_t* WriteBytesHeader(ColumnType t, uint8_t* w, uint32_t len) {
  if (t == ColumnType::kStr) return mp::WriteStrHeader(w, len);
  if (t == ColumnType::kBin) return mp::WriteBinHeader(w, len);
  return w;
}

// An int stream: encoding byte (plain or delta) and n zigzag varints.
absl::Status ReadInts(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                      PodBuffer<int64_t>* ints) {
  const uint8_t* p = *pp;
  if (p >= end || *p > kIntDelta) {
    return Corrupt(
        absl::StrCat("column '", name, "' has ",
                     p >= end ? "no integer encoding byte" : "an unknown integer encoding"));
  }
  const bool delta = *p++ == kIntDelta;
  if (static_cast<size_t>(end - p) < n) {  // at least one byte per value
    return Corrupt(absl::StrCat("column '", name, "' integers are truncated"));
  }
  ints->Resize(n);
  int64_t* out = ints->data();
  uint64_t prev = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t z;
    if (!GetVarint(&p, end, &z)) {
      return Corrupt(absl::StrCat("column '", name, "' has a truncated or over-long varint"));
    }
    int64_t v = UnZigZag(z);
    if (delta) {
      prev += static_cast<uint64_t>(v);
      v = static_cast<int64_t>(prev);
    }
    out[i] = v;
  }
  *pp = p;
  return absl::OkStatus();
}

absl::Status ReadBytesColumn(const uint8_t** pp, const uint8_t* end, size_t n,
                             absl::string_view name, ReadColumn* c) {
  const uint8_t* p = *pp;
  const auto avail = [&]() { return static_cast<size_t>(end - p); };
  if (avail() < 1 || *p > kBytesHex || (*p == kBytesHex && c->type != ColumnType::kStr)) {
    return Corrupt(absl::StrCat("column '", name, "' has ",
                                avail() < 1 ? "no encoding byte" : "an unknown encoding"));
  }
  c->hex = *p == kBytesHex;
  c->dict = *p++ == kBytesDict;
  // Lengths: n of them (plain) or d (dictionary), then the blob they measure.
  uint64_t count = n;
  if (c->dict) {
    if (!GetVarint(&p, end, &count) || count > n || (n > 0 && count == 0)) {
      return Corrupt(absl::StrCat("column '", name, "' has a bad dictionary size"));
    }
  }
  if (count > avail()) return Corrupt(absl::StrCat("column '", name, "' is truncated"));
  c->lens.Resize(count);
  uint32_t* lens = c->lens.data();
  uint64_t sum = 0;
  for (size_t i = 0; i < count; ++i) {
    uint64_t len;
    if (!GetVarint(&p, end, &len) || len > 0xffffffffu) {
      return Corrupt(absl::StrCat("column '", name, "' has a bad length"));
    }
    lens[i] = static_cast<uint32_t>(len);
    sum += len;
  }
  uint64_t blob_len;
  if (!GetVarint(&p, end, &blob_len) || blob_len != sum) {
    return Corrupt(absl::StrCat("column '", name, "' blob size does not match its lengths"));
  }
  if (blob_len > avail()) return Corrupt(absl::StrCat("column '", name, "' blob is truncated"));
  c->blob = p;
  c->blob_end = p + blob_len;
  p += blob_len;
  if (c->hex) {
    uint64_t headers = 0;
    for (size_t i = 0; i < n; ++i) headers += BytesHeaderSize(c->type, 2ull * lens[i]);
    c->rebuilt_bytes = 2 * sum + headers;
    *pp = p;
    return absl::OkStatus();
  }
  if (!c->dict) {
    uint64_t headers = 0;
    for (size_t i = 0; i < n; ++i) headers += BytesHeaderSize(c->type, lens[i]);
    c->rebuilt_bytes = sum + headers;
    *pp = p;
    return absl::OkStatus();
  }
  // Codes.
  if (avail() < 1 || *p < kCodeBytes || *p > kCodePlanes) {
    return Corrupt(absl::StrCat("column '", name, "' has an unknown code layout"));
  }
  c->code_width = *p++;
  const size_t code_bytes = c->code_width == kCodeBytes ? 1 : 2;
  if (avail() / code_bytes < n) {
    return Corrupt(absl::StrCat("column '", name, "' codes are truncated"));
  }
  c->codes = p;
  c->n = n;
  p += n * code_bytes;
  // Pre-encode the entries (bounded by the blob plus 5 header bytes each, both within the
  // payload), then size the rebuilt column from the codes.
  if (blob_len + 5 * count > 0xffffffffu - kSlack) {
    return Corrupt(absl::StrCat("column '", name, "' dictionary is too large"));
  }
  c->entry_off.Resize(count + 1);
  c->entries.Reserve(blob_len + 5 * count + kSlack);
  c->entries.Resize(blob_len + 5 * count);
  uint8_t* w = c->entries.data();
  const uint8_t* src = c->blob;
  for (size_t d = 0; d < count; ++d) {
    c->entry_off[d] = static_cast<uint32_t>(w - c->entries.data());
    w = WriteBytesHeader(c->type, w, lens[d]);
    std::memcpy(w, src, lens[d]);
    w += lens[d];
    src += lens[d];
  }
  c->entry_off[count] = static_cast<uint32_t>(w - c->entries.data());
  c->entries.Resize(static_cast<size_t>(w - c->entries.data()));
  uint64_t rebuilt = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t code = c->Code(i);
    if (code >= count) {
      return Corrupt(absl::StrCat("column '", name, "' has code ", code, " beyond its ", count,
                                  "-entry dictionary"));
    }
    rebuilt += c->entry_off[code + 1] - c->entry_off[code];
  }
  c->rebuilt_bytes = rebuilt;
  *pp = p;
  return absl::OkStatus();
}

absl::Status ReadColumnData(const uint8_t** pp, const uint8_t* end, size_t n, bool is_key,
                            uint64_t num_fields, absl::string_view name, ReadColumn* c) {
  const uint8_t* p = *pp;
  if (p >= end) return Corrupt(absl::StrCat("column '", name, "' is missing"));
  const uint8_t t = *p++;
  const bool key_only = t == static_cast<uint8_t>(ColumnType::kRawBytes) ||
                        t == static_cast<uint8_t>(ColumnType::kKeyRef);
  if (t > static_cast<uint8_t>(ColumnType::kKeyRef) || (!is_key && key_only)) {
    return Corrupt(absl::StrCat("column '", name, "' has unknown type ", t));
  }
  c->type = static_cast<ColumnType>(t);
  c->dict = false;
  c->hex = false;
  const auto avail = [&]() { return static_cast<size_t>(end - p); };
  switch (c->type) {
    case ColumnType::kKeyRef: {
      uint64_t field;
      if (!GetVarint(&p, end, &field)) return Corrupt("key reference is truncated");
      if (field >= num_fields) {
        return Corrupt(absl::StrCat("key column refers to field ", field, " of ", num_fields));
      }
      c->key_ref_field = static_cast<uint32_t>(field);
      c->rebuilt_bytes = 0;  // keys are views into the values
      break;
    }
    case ColumnType::kNil:
      c->rebuilt_bytes = n;
      break;
    case ColumnType::kBool:
      if (avail() < n) return Corrupt(absl::StrCat("bool column '", name, "' is truncated"));
      for (size_t i = 0; i < n; ++i) {
        if (p[i] > 1) return Corrupt(absl::StrCat("bool column '", name, "' holds ", p[i]));
      }
      c->fixed = p;
      p += n;
      c->rebuilt_bytes = n;
      break;
    case ColumnType::kFloat32:
    case ColumnType::kFloat64: {
      const size_t width = c->type == ColumnType::kFloat32 ? 4 : 8;
      c->rebuilt_bytes = n * (width + 1);
      if (avail() < 1) {
        return Corrupt(absl::StrCat("float column '", name, "' has no encoding byte"));
      }
      if (*p > kFloatDecimal || (*p == kFloatDecimal && c->type != ColumnType::kFloat64)) {
        return Corrupt(absl::StrCat("float column '", name, "' has an unknown encoding"));
      }
      if (*p++ == kFloatDecimal) {
        if (avail() < 1 || *p > kMaxDecimalExponent) {
          return Corrupt(absl::StrCat("float column '", name, "' has a bad decimal exponent"));
        }
        const double pow10 = kPow10[*p++];
        if (auto st = ReadInts(&p, end, n, name, &c->ints); !st.ok()) return st;
        c->decimal_floats.Resize(n * 8);
        uint8_t* out = c->decimal_floats.data();
        for (size_t i = 0; i < n; ++i) {
          StoreBE64(out + 8 * i, DoubleBits(static_cast<double>(c->ints[i]) / pow10));
        }
        c->fixed = out;
        break;
      }
      if (avail() / width < n) {
        return Corrupt(absl::StrCat("float column '", name, "' is truncated"));
      }
      c->fixed = p;
      p += n * width;
      break;
    }
    case ColumnType::kInt: {
      uint64_t rebuilt = 0;
      if (auto st = ReadInts(&p, end, n, name, &c->ints); !st.ok()) return st;
      for (size_t i = 0; i < n; ++i) rebuilt += mp::IntSize(c->ints[i]);
      c->rebuilt_bytes = rebuilt;
      break;
    }
    case ColumnType::kStr:
    case ColumnType::kBin:
    case ColumnType::kRawBytes:
      if (auto st = ReadBytesColumn(&p, end, n, name, c); !st.ok()) return st;
      break;
  }
  *pp = p;
  return absl::OkStatus();
}

// Copies len bytes; short copies run as one fixed 16-byte move when both sides allow it.
inline uint8_t* CopySmall(uint8_t* w, const uint8_t* src, const uint8_t* src_end, size_t len) {
  if (len <= 16 && src_end - src >= 16) {
    std::memcpy(w, src, 16);  // w always has kSlack spare bytes
  } else if (len != 0) {
    std::memcpy(w, src, len);
  }
  return w + len;
}

// Writes record i of column c at w; returns the pointer past it. `w` has kSlack spare bytes.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteValue(const ReadColumn& c, size_t i,
                                                        const uint8_t** blob_cursor, uint8_t* w) {
  switch (c.type) {
    case ColumnType::kNil:
      *w = 0xc0;
      return w + 1;
    case ColumnType::kBool:
      *w = static_cast<uint8_t>(0xc2 | c.fixed[i]);
      return w + 1;
    case ColumnType::kInt:
      return mp::WriteInt(w, c.ints[i]);
    case ColumnType::kFloat32:
      *w = 0xca;
      std::memcpy(w + 1, c.fixed + i * 4, 4);
      return w + 5;
    case ColumnType::kFloat64:
      *w = 0xcb;
      std::memcpy(w + 1, c.fixed + i * 8, 8);
      return w + 9;
    case ColumnType::kKeyRef:
      return w;
    default: {
      if (c.dict) {
        const uint32_t code = c.Code(i);
        const uint32_t off = c.entry_off[code];
        const uint8_t* e = c.entries.data();
        return CopySmall(w, e + off, e + c.entries.capacity(), c.entry_off[code + 1] - off);
      }
      const uint32_t len = c.lens[i];
      const uint8_t* src = *blob_cursor;
      *blob_cursor = src + len;
      if (c.hex) {
        w = WriteBytesHeader(c.type, w, 2 * len);
        for (uint32_t k = 0; k < len; ++k) {
          std::memcpy(w, kHex.digits[src[k]], 2);
          w += 2;
        }
        return w;
      }
      w = WriteBytesHeader(c.type, w, len);
      return CopySmall(w, src, c.blob_end, len);
    }
  }
}

}  // namespace

struct ColumnarDecoder::State {
  ReadColumn key;
  std::vector<ReadColumn> fields;
  std::vector<Prefix> prefixes;
  std::vector<const uint8_t*> cursors;
  std::vector<std::string> names;  // escaped, for messages
  ByteBuffer scratch;
};

ColumnarDecoder::ColumnarDecoder() : state_(std::make_unique<State>()) {}
ColumnarDecoder::~ColumnarDecoder() = default;

absl::Status ColumnarDecoder::Decode(const uint8_t* payload, size_t size, uint32_t record_count,
                                     uint32_t max_rows_bytes, ByteBuffer* rows,
                                     PodBuffer<RecordRef>* index) {
  absl::Status st = DecodeImpl(payload, size, record_count, max_rows_bytes, rows, index);
  // Scratch is reused across frames, but frames with many fields must not ratchet it up:
  // beyond one cap's worth, let it all go.
  size_t retained = state_->key.RetainedBytes() + state_->scratch.capacity();
  for (const ReadColumn& c : state_->fields) retained += c.RetainedBytes();
  for (const Prefix& p : state_->prefixes) retained += p.long_bytes.capacity();
  if (retained > max_rows_bytes) state_ = std::make_unique<State>();
  return st;
}

absl::Status ColumnarDecoder::DecodeImpl(const uint8_t* payload, size_t size, uint32_t record_count,
                                         uint32_t max_rows_bytes, ByteBuffer* rows,
                                         PodBuffer<RecordRef>* index) {
  State& s = *state_;
  const size_t n = record_count;
  const uint8_t* p = payload;
  const uint8_t* end = payload + size;

  uint64_t num_fields;
  if (!GetVarint(&p, end, &num_fields) || num_fields > kMaxFields) {
    return Corrupt("bad field count");
  }
  if (s.fields.size() < num_fields) {
    s.fields.resize(num_fields);
    s.prefixes.resize(num_fields);
  }
  s.names.resize(num_fields);
  uint64_t prefix_total = num_fields == 0 ? 1 : 0;  // the empty map is one byte
  for (uint64_t j = 0; j < num_fields; ++j) {
    uint64_t len;
    if (!GetVarint(&p, end, &len) || len > static_cast<size_t>(end - p)) {
      return Corrupt(absl::StrCat("field ", j, " name is truncated"));
    }
    // For messages only: untrusted bytes, escaped and cut short.
    s.names[j] = absl::CHexEscape(
        absl::string_view(reinterpret_cast<const char*>(p), std::min<uint64_t>(len, 64)));
    // prefix = [map header for field 0] + str header + name
    s.scratch.Clear();
    uint8_t* w = s.scratch.Extend(10 + len);
    uint8_t* const start = w;
    if (j == 0) w = mp::WriteMapHeader(w, static_cast<uint32_t>(num_fields));
    w = mp::WriteStrHeader(w, static_cast<uint32_t>(len));
    std::memcpy(w, p, len);
    w += len;
    s.prefixes[j].Set(start, static_cast<size_t>(w - start));
    prefix_total += s.prefixes[j].len;
    p += len;
  }
  if (auto st = ReadColumnData(&p, end, n, /*is_key=*/true, num_fields, "<key>", &s.key);
      !st.ok()) {
    return st;
  }
  for (uint64_t j = 0; j < num_fields; ++j) {
    if (auto st =
            ReadColumnData(&p, end, n, /*is_key=*/false, num_fields, s.names[j], &s.fields[j]);
        !st.ok()) {
      return st;
    }
  }
  if (p != end) {
    return Corrupt(absl::StrCat(end - p, " unexpected bytes after the last column"));
  }

  // Exact rebuilt size, checked against the cap before anything is allocated for it.
  uint64_t total;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n), prefix_total, &total) ||
      __builtin_add_overflow(total, s.key.rebuilt_bytes, &total)) {
    total = UINT64_MAX;
  }
  for (uint64_t j = 0; j < num_fields && total != UINT64_MAX; ++j) {
    if (__builtin_add_overflow(total, s.fields[j].rebuilt_bytes, &total)) total = UINT64_MAX;
  }
  if (total > max_rows_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("COLUMNAR frame rebuilds to ", total,
                                                   " bytes, over the cap of ", max_rows_bytes));
  }

  rows->Reserve(total + kSlack);
  rows->Resize(total);
  index->Resize(n);
  uint8_t* const base = rows->data();
  uint8_t* w = base;
  RecordRef* refs = index->data();
  const uint8_t* key_blob = s.key.blob;
  s.cursors.resize(num_fields);
  for (uint64_t j = 0; j < num_fields; ++j) s.cursors[j] = s.fields[j].blob;
  const ReadColumn* const cols = s.fields.data();
  const Prefix* const prefixes = s.prefixes.data();
  const uint8_t** cursors = s.cursors.data();
  const bool key_ref = s.key.type == ColumnType::kKeyRef;
  const uint64_t key_field = s.key.key_ref_field;
  for (size_t i = 0; i < n; ++i) {
    RecordRef& r = refs[i];
    if (!key_ref) {
      r.key_off = static_cast<uint32_t>(w - base);
      if (s.key.type == ColumnType::kRawBytes && !s.key.dict) {
        const uint32_t len = s.key.lens[i];
        w = CopySmall(w, key_blob, s.key.blob_end, len);
        key_blob += len;
      } else {
        w = WriteValue(s.key, i, &key_blob, w);
      }
      r.key_len = static_cast<uint32_t>(w - base) - r.key_off;
    }
    r.value_off = static_cast<uint32_t>(w - base);
    if (num_fields == 0) {
      *w++ = 0x80;
    } else {
      for (uint64_t j = 0; j < num_fields; ++j) {
        const Prefix& pr = prefixes[j];
        if (pr.len <= 16) {
          std::memcpy(w, pr.bytes, 16);
        } else {
          std::memcpy(w, pr.data(), pr.len);
        }
        w += pr.len;
        uint8_t* const value_start = w;
        w = WriteValue(cols[j], i, &cursors[j], w);
        if (key_ref && j == key_field) {
          r.key_off = static_cast<uint32_t>(value_start - base);
          r.key_len = static_cast<uint32_t>(w - value_start);
        }
      }
    }
    r.value_len = static_cast<uint32_t>(w - base) - r.value_off;
  }
  if (static_cast<uint64_t>(w - base) != total) {
    return absl::InternalError("COLUMNAR rebuild size mismatch");  // cannot happen
  }
  return absl::OkStatus();
}

}  // namespace sluice
