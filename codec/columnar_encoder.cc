// COLUMNAR encoder: parses msgpack maps column by column and serializes the columns.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "codec/columnar.h"
#include "codec/columnar_bytes.h"
#include "codec/columnar_dict.h"
#include "codec/columnar_internal.h"
#include "codec/columnar_ints.h"
#include "codec/columnar_scalars.h"
#include "codec/msgpack_scan.h"
#include "codec/varint.h"

namespace sluice {
using namespace columnar_internal;  // NOLINT(google-build-using-namespace): this file's own helpers
namespace {
// Records are parsed in blocks of this many, field by field within a block: long enough loops
// for the lookups of many records to overlap, short enough that a block's records stay in
// cache from one field to the next (one block of the whole batch: ints3 1.7x slower). 256
// measured 2-4% faster than 64 on every benchmark dataset, and equal to 512 and 1,024.
constexpr size_t kParseBlock = 256;
// The encoder drops its scratch buffers after a batch that left more than this behind.
constexpr size_t kMaxRetainedScratch = 256u << 20;
// Plain-range detection: a column part of at least kMinPlainSpan bytes whose order-0 entropy,
// estimated on at most kPlainSample of its bytes (see LooksPlain), is kPlainBits bits a byte or
// more is "plain": Huffman coding could save at most an eighth of it, at several ns a byte.
constexpr size_t kMinPlainSpan = 256;
constexpr size_t kPlainSample = 512;
constexpr size_t kPlainBlocks = 8;
constexpr double kPlainBits = 7.0;

// n * log2(n) for n in [0, kPlainSample].
struct NLog2NTable {
  float v[kPlainSample + 1];
  NLog2NTable() {
    v[0] = 0;
    for (size_t i = 1; i <= kPlainSample; ++i) {
      v[i] = static_cast<float>(static_cast<double>(i) * std::log2(static_cast<double>(i)));
    }
  }
};

bool LooksPlain(const uint8_t* p, size_t n) {
  if (n < kMinPlainSpan) return false;
  static const NLog2NTable kTable;
  uint16_t hist[256] = {};
  // Up to kPlainSample bytes: all of a short range, else kPlainBlocks runs of contiguous bytes
  // spread over it. Contiguous runs see every byte position of short values (a fixed stride
  // would see one position of values whose size it divides), and spreading them sees the
  // range's start, middle and end.
  size_t m = 0;
  if (n <= kPlainSample) {
    for (size_t i = 0; i < n; ++i) ++hist[p[i]];
    m = n;
  } else {
    constexpr size_t kRun = kPlainSample / kPlainBlocks;
    for (size_t k = 0; k < kPlainBlocks; ++k) {
      const uint8_t* q = p + (n - kRun) * k / (kPlainBlocks - 1);
      for (size_t i = 0; i < kRun; ++i) ++hist[q[i]];
    }
    m = kPlainSample;
  }
  // Plug-in entropy with the Miller-Madow correction for the small sample:
  // H = log2(m) - sum(c log2 c) / m + (K - 1) / (2 m ln 2).
  float sum = 0;
  int used = 0;
  for (int c = 0; c < 256; ++c) {
    sum += kTable.v[hist[c]];
    used += hist[c] != 0;
  }
  const double md = static_cast<double>(m);
  const double h = std::log2(md) - sum / md + (used - 1) / (2 * md * 0.6931471805599453);
  return h >= kPlainBits;
}

// Collects plain ranges while a payload is serialized.
struct PlainSpans {
  const uint8_t* base = nullptr;
  std::vector<ColumnarEncoder::Span> spans;
  void Consider(const uint8_t* begin, const uint8_t* end) {
    const auto n = static_cast<size_t>(end - begin);
    if (!LooksPlain(begin, n)) return;
    const auto off = static_cast<uint32_t>(begin - base);
    if (!spans.empty() && spans.back().offset + spans.back().length == off) {
      spans.back().length += static_cast<uint32_t>(n);
    } else {
      spans.push_back({off, static_cast<uint32_t>(n)});
    }
  }
};

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

// A field prefix's words, copied into a parse loop's locals (the prefix's members would be
// reloaded after every store the loop makes), and the comparisons the loops make with them:
// 8 to 16 bytes as two overlapping 64-bit loads from either end, 4 to 7 as two 32-bit loads,
// fewer through KeyShort, more with memcmp.
struct PrefixCheck {
  explicit PrefixCheck(const Prefix& pr)
      : len(pr.len),
        data(pr.data()),
        key(pr.key),
        head64(pr.head64),
        tail64(pr.tail64),
        head32(pr.head32),
        tail32(pr.tail32),
        is8to16(len >= 8 && len <= 16),
        is4to7(len >= 4 && len < 8) {}

  // Whether q does not start with the prefix, known to be 8 to 16 bytes long (kLong) or 4 to 7:
  // no branch on the length. The hints are on each comparison, where the loops had them: on
  // the result of an inlined call they lead the compiler to lay the loops out differently.
  template <bool kLong>
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool DiffersAt(const uint8_t* q) const {
    if constexpr (kLong) {
      return ABSL_PREDICT_FALSE(LoadLE64(q) != head64) ||
             ABSL_PREDICT_FALSE(LoadLE64(q + len - 8) != tail64);
    } else {
      return ABSL_PREDICT_FALSE(LoadLE32(q) != head32) ||
             ABSL_PREDICT_FALSE(LoadLE32(q + len - 4) != tail32);
    }
  }

  // The same for a prefix of under 4 or over 16 bytes.
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool DiffersAtOther(const uint8_t* q) const {
    if (len < 4) {
      const ShortKey k = KeyShort(q, static_cast<uint32_t>(len));
      return ABSL_PREDICT_FALSE(k.a != key.a) || ABSL_PREDICT_FALSE(k.b != key.b);
    }
    return std::memcmp(q, data, len) != 0;
  }

  size_t len;
  const uint8_t* data;
  ShortKey key;
  uint64_t head64, tail64;
  uint32_t head32, tail32;
  bool is8to16, is4to7;
};

// Whether `key` is exactly the `size` bytes at `value` (a field's encoded value): the check a
// key reference makes for each record.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool KeyIs(std::string_view key, const uint8_t* value,
                                               size_t size) {
  return size == key.size() &&
         SameBytes(value, reinterpret_cast<const uint8_t*>(key.data()), key.size());
}

// The same for a fixstr value with header byte h and len (<= 16) bytes whose KeyShort words are
// k: the key must be the header, then the same bytes. (One result set in one branch: written
// with an early return, it made GCC spill the str loop's cursor array instead.)
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool KeyIsShortStr(std::string_view key, uint8_t h,
                                                       const ShortKey& k, uint32_t len) {
  bool same = false;
  if (key.size() == len + 1 && static_cast<uint8_t>(key[0]) == h) {
    const ShortKey kk = KeyShort(reinterpret_cast<const uint8_t*>(key.data()) + 1, len);
    same = kk.a == k.a && kk.b == k.b;
  }
  return same;
}

// A column being built from one batch. Strings are not copied while parsing: the column keeps
// pointers into the records and, while values repeat, a dictionary.
struct BuildColumn {
  // Bytes types. First, so that its address is the column's: the str loops' calls into it on
  // their slow path then cost no address computation, and no spill of it, on every value.
  DictBuilder dict;
  ColumnType type = ColumnType::kNil;
  size_t n = 0;
  PodBuffer<int64_t> ints;         // kInt; kFloat64 as decimal mantissas (SerializeFloat64s)
  ByteBuffer fixed;                // kFloat32, kFloat64, kBool: n * width bytes (as in msgpack)
  PodBuffer<const uint8_t*> ptrs;  // bytes types: where each value's content starts
  PodBuffer<uint32_t> lens;        // bytes types: content lengths
  uint64_t total_len = 0;          // sum of lens
  // Set while serializing: where the bulk of the column starts.
  uint8_t* bulk_begin = nullptr;

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
        dict.Start(n);
        break;
      default:
        break;
    }
  }

  size_t RetainedBytes() const {
    return ints.capacity() * 8 + fixed.capacity() + ptrs.capacity() * 8 + lens.capacity() * 4 +
           dict.RetainedBytes();
  }

  // Parses the value at p as record i of a column of type T; returns the pointer past it or
  // nullptr.
  template <ColumnType T>
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline const uint8_t* ParseAs(size_t i, const uint8_t* p,
                                                             const uint8_t* end) {
    if constexpr (T == ColumnType::kInt) {
      int64_t v;
      p = mp::ReadCanonicalIntFast(p, end, &v);
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
    if (dict.active) dict.Add(i, p, len, ptrs.data(), total_len);
  }

  // The column's arrays, running length and dictionary, copied into a column loop's locals.
  // The members would be reloaded after every store through ptrs, lens or codes (such a store
  // may alias them, as far as the compiler knows); locals stay in registers.
  struct Hot {
    const uint8_t** ptrs;
    uint32_t* lens;
    uint64_t total_len;
    DictBuilder::Hot dict;
  };
  Hot LoadHot() { return Hot{ptrs.data(), lens.data(), total_len, dict.LoadHot()}; }

  BytesValues bytes() const { return BytesValues{type, n, ptrs.data(), lens.data(), total_len}; }
  bool UseDict() const { return IsBytesType(type) && dict.Use(n, total_len); }

  // Upper bound of the serialized size (type byte and headers included).
  size_t MaxSerializedSize() const {
    switch (type) {
      case ColumnType::kInt:
        return 1 + MaxIntsSize(n);
      case ColumnType::kFloat32:
        return 1 + MaxFloatsSize(n, 4);
      case ColumnType::kFloat64:
        return 1 + MaxFloatsSize(n, 8);
      case ColumnType::kBool:
        return 1 + MaxBoolsSize(n);
      case ColumnType::kNil:
        return 1;
      default:
        return 1 + (UseDict() ? MaxDictSize(n, dict) : MaxBytesSize(n, total_len));
    }
  }

  // Serializes the column and offers its bulk (the values' bytes, past the headers) to `plain`.
  uint8_t* Serialize(uint8_t* w, PlainSpans* plain) {
    bulk_begin = nullptr;
    uint8_t* const end = SerializeBody(w);
    if (bulk_begin != nullptr) plain->Consider(bulk_begin, end);
    return end;
  }

  uint8_t* SerializeBody(uint8_t* w) {
    *w++ = static_cast<uint8_t>(type);
    switch (type) {
      case ColumnType::kInt:
        bulk_begin = w + 1;
        return SerializeInts(ints.data(), n, w, /*allow_step=*/true);
      case ColumnType::kFloat64:
        return SerializeFloat64s(fixed.data(), n, &ints, w, &bulk_begin);
      case ColumnType::kFloat32:
        return SerializeFloat32s(fixed.data(), n, w, &bulk_begin);
      case ColumnType::kBool:
        return SerializeBools(fixed.data(), n, w, &bulk_begin);
      case ColumnType::kNil:
        return w;
      default:
        return UseDict() ? SerializeDict(bytes(), dict, w, &bulk_begin)
                         : SerializeBytes(bytes(), w, &bulk_begin);
    }
  }
};

// How a record failed to fit a column.
enum class ParseFailure { kNone, kPrefix, kValue, kTrailing };

// What a column's loop checks besides its own field.
struct ColumnChecks {
  bool last_field = false;              // the value must end right after this field
  const Record* key_records = nullptr;  // if set: does each key equal this field's encoding?
  bool key_ref_holds = false;           // in: whether to check; out: the answer
};

// Parses one field (prefix `pr`, then a value of type T) for records [begin, n), advancing
// each record's cursor. Returns n, or the index of the first record that does not fit
// (*failure says how). One function per type, not inlined into the dispatch: each loop keeps
// its own registers and alignment, so changing one type's loop does not move another's.
template <ColumnType T>
ABSL_ATTRIBUTE_NOINLINE size_t ParseColumn(BuildColumn& col, const Prefix& pr,
                                           const uint8_t** __restrict cur,
                                           const uint8_t* const* __restrict ends, size_t begin,
                                           size_t n, ColumnChecks* checks, ParseFailure* failure) {
  const PrefixCheck prefix(pr);
  const size_t plen = prefix.len;
  const bool last_field = checks->last_field;
  const Record* const key_records = checks->key_records;
  bool key_ref_holds = checks->key_ref_holds && key_records != nullptr;
  size_t i = begin;
  for (; i < n; ++i) {
    const uint8_t* q = cur[i];
    const uint8_t* const end = ends[i];
    const auto avail = static_cast<size_t>(end - q);
    if (ABSL_PREDICT_FALSE(avail < plen)) break;
    // The same branch for every record, so these predict perfectly.
    if (prefix.is8to16) {
      if (prefix.DiffersAt<true>(q)) break;
    } else if (prefix.is4to7) {
      if (prefix.DiffersAt<false>(q)) break;
    } else if (prefix.DiffersAtOther(q)) {
      break;
    }
    const uint8_t* p = col.ParseAs<T>(i, q + plen, end);
    if (ABSL_PREDICT_FALSE(p == nullptr)) goto value_failed;
    if (last_field && ABSL_PREDICT_FALSE(p != end)) {
      checks->key_ref_holds = key_ref_holds;
      *failure = ParseFailure::kTrailing;
      return i;
    }
    if (key_ref_holds) {
      const uint8_t* value = q + plen;
      key_ref_holds = KeyIs(key_records[i].key, value, static_cast<size_t>(p - value));
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

// The common case of a str column in a loop of its own: a field prefix of 4 to 16 bytes
// (kLongPrefix: 8 to 16) and a value of up to 255 bytes (fixstr or str8). Runs from record i while
// records take that path, and returns the first that does not, untouched, for ParseColumn to take;
// or returns after the record whose value turned the dictionary off (kDict), so the caller goes on
// without it. Which checks apply is fixed per instantiation, so the loop tests no flags.
template <bool kLongPrefix, bool kDict>
struct StrLoop {
  template <bool kKeyRef, bool kLastField>
  ABSL_ATTRIBUTE_NOINLINE static size_t Run(BuildColumn& col, const Prefix& pr,
                                            const uint8_t** __restrict cur,
                                            const uint8_t* const* __restrict ends, size_t i,
                                            size_t n, const Record* key_records,
                                            bool* key_ref_holds) {
    const PrefixCheck prefix(pr);
    const size_t plen = prefix.len;
    bool holds = *key_ref_holds;
    BuildColumn::Hot hot = col.LoadHot();
    while (i < n) {
      const uint8_t* q = cur[i];
      const auto avail = static_cast<size_t>(ends[i] - q);
      if (ABSL_PREDICT_FALSE(avail <= plen)) break;
      if (prefix.DiffersAt<kLongPrefix>(q)) break;
      // A fixstr, or a str8 (32 to 255 bytes).
      const uint8_t h = q[plen];
      uint32_t len;
      size_t header;
      if (ABSL_PREDICT_TRUE((h & 0xe0) == 0xa0)) {
        len = h & 0x1f;
        header = 1;
      } else if (h == 0xd9 && avail > plen + 1 && q[plen + 1] >= 32) {
        len = q[plen + 1];
        header = 2;
      } else {
        break;
      }
      const size_t used = plen + header + len;
      if (ABSL_PREDICT_FALSE(used > avail)) break;
      if (kLastField && ABSL_PREDICT_FALSE(used != avail)) break;
      const uint8_t* v = q + plen + header;
      hot.ptrs[i] = v;
      hot.lens[i] = len;
      hot.total_len += len;
      cur[i] = v + len;
      if (kDict && ABSL_PREDICT_TRUE(len <= 16)) {
        const ShortKey k = KeyShort(v, len);
        if (kKeyRef && holds) holds = KeyIsShortStr(key_records[i].key, h, k, len);
        if (ABSL_PREDICT_FALSE(
                !col.dict.LookupHot(hot.dict, i++, k, len, hot.ptrs, hot.total_len))) {
          break;
        }
        continue;
      }
      if (kKeyRef && holds) holds = KeyIs(key_records[i].key, v - header, header + len);
      if constexpr (kDict) {
        if (!col.dict.LookupLongHot(hot.dict, i++, v, len, hot.ptrs, hot.total_len)) break;
      } else {
        ++i;
      }
    }
    col.total_len = hot.total_len;
    *key_ref_holds = holds;
    return i;
  }
};

// Runs Loop::Run<kKeyRef, kLastField> (StrLoop or ScalarLoop) with the checks that
// apply to this field fixed at compile time.
template <typename Loop>
size_t RunFastLoop(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                   const uint8_t* const* ends, size_t i, size_t n, ColumnChecks* checks) {
  if (checks->key_records != nullptr) {
    return checks->last_field
               ? Loop::template Run<true, true>(col, pr, cur, ends, i, n, checks->key_records,
                                                &checks->key_ref_holds)
               : Loop::template Run<true, false>(col, pr, cur, ends, i, n, checks->key_records,
                                                 &checks->key_ref_holds);
  }
  bool unused = false;
  return checks->last_field
             ? Loop::template Run<false, true>(col, pr, cur, ends, i, n, nullptr, &unused)
             : Loop::template Run<false, false>(col, pr, cur, ends, i, n, nullptr, &unused);
}

// A str column: the fast loop while records take its path, ParseColumn for each one that does
// not (a value over 255 bytes, a prefix outside 4..16 bytes, or a record that does not fit).
size_t ParseStrColumn(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                      const uint8_t* const* ends, size_t begin, size_t n, ColumnChecks* checks,
                      ParseFailure* failure) {
  if (pr.len < 4 || pr.len > 16) {
    return ParseColumn<ColumnType::kStr>(col, pr, cur, ends, begin, n, checks, failure);
  }
  // A key reference that no longer holds needs no more checking.
  if (!checks->key_ref_holds) checks->key_records = nullptr;
  size_t i = begin;
  const bool long_prefix = pr.len >= 8;
  for (;;) {
    const bool dict = col.dict.active;
    const size_t from = i;
    if (dict) {
      i = long_prefix ? RunFastLoop<StrLoop<true, true>>(col, pr, cur, ends, i, n, checks)
                      : RunFastLoop<StrLoop<false, true>>(col, pr, cur, ends, i, n, checks);
    } else {
      i = long_prefix ? RunFastLoop<StrLoop<true, false>>(col, pr, cur, ends, i, n, checks)
                      : RunFastLoop<StrLoop<false, false>>(col, pr, cur, ends, i, n, checks);
    }
    if (i == n) {
      *failure = ParseFailure::kNone;
      return n;
    }
    if (!checks->key_ref_holds) checks->key_records = nullptr;
    if (dict && !col.dict.active) continue;  // record i-1 turned the dictionary off: go on
    // Record i does not take the fast path: the general loop takes it, or says why it fails.
    // When the fast loop took nothing, the general loop takes the rest of the block: a column
    // of values over 255 bytes would otherwise switch loops at every record.
    const size_t until = i == from ? n : i + 1;
    const size_t r = ParseColumn<ColumnType::kStr>(col, pr, cur, ends, i, until, checks, failure);
    if (*failure != ParseFailure::kNone) return r;
    if (until == n || ++i == n) return n;
  }
}

// The common case of an int, float64 or bool column in a loop of its own, as StrLoop: a
// field prefix of 4 to 16 bytes, the checks that apply fixed per instantiation, and the column's
// arrays in locals (a float's bytes are copied with memcpy, which may alias anything). Returns
// the first record that does not take the path, untouched.
template <ColumnType T, bool kLongPrefix>
struct ScalarLoop {
  template <bool kKeyRef, bool kLastField>
  ABSL_ATTRIBUTE_NOINLINE static size_t Run(BuildColumn& col, const Prefix& pr,
                                            const uint8_t** __restrict cur,
                                            const uint8_t* const* __restrict ends, size_t i,
                                            size_t n, const Record* key_records,
                                            bool* key_ref_holds) {
    const PrefixCheck prefix(pr);
    const size_t plen = prefix.len;
    bool holds = *key_ref_holds;
    int64_t* const ints = col.ints.data();
    uint8_t* const fixed = col.fixed.data();
    for (; i < n; ++i) {
      const uint8_t* q = cur[i];
      const uint8_t* const end = ends[i];
      const auto avail = static_cast<size_t>(end - q);
      if (ABSL_PREDICT_FALSE(avail <= plen)) break;
      if (prefix.DiffersAt<kLongPrefix>(q)) break;
      const uint8_t* const v = q + plen;
      const uint8_t* p;
      if constexpr (T == ColumnType::kInt) {
        int64_t x;
        p = mp::ReadCanonicalIntFast(v, end, &x);
        if (ABSL_PREDICT_FALSE(p == nullptr)) break;
        if (kLastField && ABSL_PREDICT_FALSE(p != end)) break;
        ints[i] = x;
      } else if constexpr (T == ColumnType::kFloat64) {
        if (ABSL_PREDICT_FALSE(avail - plen < 9 || *v != 0xcb)) break;
        p = v + 9;
        if (kLastField && ABSL_PREDICT_FALSE(p != end)) break;
        std::memcpy(fixed + i * 8, v + 1, 8);
      } else {
        static_assert(T == ColumnType::kBool);
        if (ABSL_PREDICT_FALSE((*v & 0xfe) != 0xc2)) break;
        p = v + 1;
        if (kLastField && ABSL_PREDICT_FALSE(p != end)) break;
        fixed[i] = *v & 1;
      }
      if (kKeyRef && holds) holds = KeyIs(key_records[i].key, v, static_cast<size_t>(p - v));
      cur[i] = p;
    }
    *key_ref_holds = holds;
    return i;
  }
};

// An int, float64 or bool column: the fast loop while records take its path, ParseColumn for
// each one that does not (and to say why it does not fit).
template <ColumnType T>
size_t ParseScalarColumn(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                         const uint8_t* const* ends, size_t begin, size_t n, ColumnChecks* checks,
                         ParseFailure* failure) {
  if (pr.len < 4 || pr.len > 16) {
    return ParseColumn<T>(col, pr, cur, ends, begin, n, checks, failure);
  }
  if (!checks->key_ref_holds) checks->key_records = nullptr;
  size_t i = begin;
  for (;;) {
    const size_t from = i;
    i = pr.len >= 8 ? RunFastLoop<ScalarLoop<T, true>>(col, pr, cur, ends, i, n, checks)
                    : RunFastLoop<ScalarLoop<T, false>>(col, pr, cur, ends, i, n, checks);
    if (i == n) {
      *failure = ParseFailure::kNone;
      return n;
    }
    if (!checks->key_ref_holds) checks->key_records = nullptr;
    // As for str columns: the general loop takes the rest when the fast one took nothing.
    const size_t until = i == from ? n : i + 1;
    const size_t r = ParseColumn<T>(col, pr, cur, ends, i, until, checks, failure);
    if (*failure != ParseFailure::kNone) return r;
    if (until == n || ++i == n) return n;
  }
}

size_t ParseColumnOfType(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                         const uint8_t* const* ends, size_t begin, size_t n, ColumnChecks* checks,
                         ParseFailure* failure) {
  switch (col.type) {
    case ColumnType::kInt:
      return ParseScalarColumn<ColumnType::kInt>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kFloat64:
      return ParseScalarColumn<ColumnType::kFloat64>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kFloat32:
      return ParseColumn<ColumnType::kFloat32>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kBool:
      return ParseScalarColumn<ColumnType::kBool>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kNil:
      return ParseColumn<ColumnType::kNil>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kStr:
      return ParseStrColumn(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kBin:
      return ParseColumn<ColumnType::kBin>(col, pr, cur, ends, begin, n, checks, failure);
    default:
      *failure = ParseFailure::kValue;
      return begin;
  }
}

}  // namespace

struct ColumnarEncoder::State {
  BuildColumn key;
  std::vector<BuildColumn> fields;
  std::vector<Prefix> prefixes;
  std::vector<absl::string_view> names;  // views into records[0].value
  PodBuffer<const uint8_t*> cursors;     // per record: where parsing continues
  PodBuffer<const uint8_t*> ends;        // per record: end of its value
  PlainSpans plain;
  uint32_t num_fields = 0;
  int key_ref = -1;  // the field whose encoded value every key is, or -1

  bool ReadShape(absl::Span<const Record> records, std::string* why_not);
  bool ParseValues(absl::Span<const Record> records, std::string* why_not);
  std::string Explain(ParseFailure failure, size_t i, uint32_t j) const;
  void ParseKeys(absl::Span<const Record> records);
  void Serialize(ByteBuffer* payload);
};

namespace {
const uint8_t* BytesOf(std::string_view v) { return reinterpret_cast<const uint8_t*>(v.data()); }
}  // namespace

ColumnarEncoder::ColumnarEncoder() : state_(std::make_unique<State>()) {}
ColumnarEncoder::~ColumnarEncoder() = default;

absl::Span<const ColumnarEncoder::Span> ColumnarEncoder::plain_spans() const {
  return state_->plain.spans;
}

bool ColumnarEncoder::Encode(absl::Span<const Record> records, ByteBuffer* payload,
                             std::string* why_not) {
  state_->plain.spans.clear();
  const bool ok = EncodeImpl(records, payload, why_not);
  if (!ok) state_->plain.spans.clear();
  // As in the decoder: reuse scratch, but do not let wide batches ratchet it up for good.
  size_t retained = state_->key.RetainedBytes();
  for (const BuildColumn& c : state_->fields) retained += c.RetainedBytes();
  if (retained > kMaxRetainedScratch) state_ = std::make_unique<State>();
  return ok;
}

bool ColumnarEncoder::EncodeImpl(absl::Span<const Record> records, ByteBuffer* payload,
                                 std::string* why_not) {
  State& s = *state_;
  if (records.empty()) {
    *why_not = "empty batch";
    return false;
  }
  if (!s.ReadShape(records, why_not) || !s.ParseValues(records, why_not)) return false;
  if (s.key_ref < 0) s.ParseKeys(records);
  s.Serialize(payload);
  return true;
}

// Shape, from record 0's value: a map of str field names to scalars. Sets each field's name,
// prefix and column type, and key_ref to the first field whose encoded value record 0's key is.
bool ColumnarEncoder::State::ReadShape(absl::Span<const Record> records, std::string* why_not) {
  const size_t n = records.size();
  const uint8_t* v0 = BytesOf(records[0].value);
  const uint8_t* v0_end = v0 + records[0].value.size();
  const uint8_t* p = mp::ReadCanonicalMapHeader(v0, v0_end, &num_fields);
  if (p == nullptr) {
    *why_not = "record 0: value is not a canonically encoded msgpack map";
    return false;
  }
  if (num_fields > kMaxFields) {
    *why_not = absl::StrCat("record 0: ", num_fields, " fields, more than ", kMaxFields);
    return false;
  }
  if (fields.size() < num_fields) {
    fields.resize(num_fields);
    prefixes.resize(num_fields);
  }
  names.clear();
  // The key may be a copy of one field's encoded value (zephyr derives keys that way): then
  // the key column is just a reference to that field.
  const uint8_t* k0 = BytesOf(records[0].key);
  key_ref = -1;
  for (uint32_t j = 0; j < num_fields; ++j) {
    const uint8_t* name_start = p;
    uint32_t name_len;
    const uint8_t* name = mp::ReadCanonicalStr(p, v0_end, &name_len);
    if (name == nullptr) {
      *why_not = absl::StrCat("record 0: field ", j, " name is not a canonical msgpack str");
      return false;
    }
    names.emplace_back(reinterpret_cast<const char*>(name), name_len);
    p = name + name_len;
    const uint8_t* prefix_start = j == 0 ? v0 : name_start;  // field 0 includes the map header
    prefixes[j].Set(prefix_start, static_cast<size_t>(p - prefix_start));
    ColumnType t;
    if (p >= v0_end || !ClassifyScalar(*p, &t)) {
      *why_not = absl::StrCat("record 0: field '", names.back(), "' holds ",
                              p >= v0_end ? "nothing (truncated)" : DescribeByte(*p));
      return false;
    }
    fields[j].Start(t, n);
    mp::ScanError err;
    const uint8_t* value_start = p;
    p = mp::SkipObject(p, v0_end, &err);
    if (p == nullptr) {
      *why_not = absl::StrCat("record 0: field '", names.back(), "': ", mp::ScanErrorName(err));
      return false;
    }
    if (key_ref < 0 && static_cast<size_t>(p - value_start) == records[0].key.size() &&
        std::memcmp(value_start, k0, records[0].key.size()) == 0) {
      key_ref = static_cast<int>(j);
    }
  }
  return true;
}

// Values, column by column: one tight loop per field, specialised for its type. Leaves key_ref
// at -1 unless every key is that field's encoded value.
bool ColumnarEncoder::State::ParseValues(absl::Span<const Record> records, std::string* why_not) {
  const size_t n = records.size();
  BuildColumn* const cols = fields.data();
  cursors.Resize(n);
  ends.Resize(n);
  const uint8_t** cur = cursors.data();
  const uint8_t** end = ends.data();
  for (size_t i = 0; i < n; ++i) {
    cur[i] = BytesOf(records[i].value);
    end[i] = cur[i] + records[i].value.size();
  }
  if (num_fields == 0) {
    for (size_t i = 0; i < n; ++i) {
      if (records[i].value.size() != 1 || *cur[i] != 0x80) {
        *why_not = absl::StrCat("record ", i, ": value is not the empty map like record 0");
        return false;
      }
    }
  }
  // Field by field within blocks of records: each field's loop is specialised for its type,
  // and a block's records stay in cache while their fields are parsed one after another (a
  // pass over the whole batch per field would fetch wide records from memory once per field).
  bool key_ref_holds = key_ref >= 0;
  for (size_t b0 = 0; b0 < n; b0 += kParseBlock) {
    const size_t b1 = std::min(n, b0 + kParseBlock);
    for (uint32_t j = 0; j < num_fields; ++j) {
      ColumnChecks checks;
      checks.last_field = j + 1 == num_fields;
      if (static_cast<int>(j) == key_ref) {
        checks.key_records = records.data();
        checks.key_ref_holds = key_ref_holds;
      }
      ParseFailure failure = ParseFailure::kNone;
      const size_t i = ParseColumnOfType(cols[j], prefixes[j], cur, end, b0, b1, &checks, &failure);
      if (static_cast<int>(j) == key_ref) key_ref_holds = checks.key_ref_holds;
      if (failure == ParseFailure::kNone) continue;
      *why_not = Explain(failure, i, j);
      return false;
    }
  }
  if (!key_ref_holds) key_ref = -1;
  return true;
}

// Why record i does not fit field j, which its parse loop stopped at.
std::string ColumnarEncoder::State::Explain(ParseFailure failure, size_t i, uint32_t j) const {
  if (failure == ParseFailure::kPrefix) {
    return absl::StrCat("record ", i, ": map shape differs from record 0 at field ", j, " ('",
                        names[j], "')");
  }
  if (failure == ParseFailure::kTrailing) {
    return absl::StrCat("record ", i, ": value has bytes after the map like record 0's");
  }
  const uint8_t* start = cursors[i] + prefixes[j].len;
  const ColumnType type = fields[j].type;
  ColumnType got;
  if (start < ends[i] && ClassifyScalar(*start, &got) && got != type) {
    return absl::StrCat("record ", i, ": field '", names[j], "' changes type from ",
                        ColumnTypeName(type), " to ", ColumnTypeName(got));
  }
  if (start < ends[i] && !ClassifyScalar(*start, &got)) {
    return absl::StrCat("record ", i, ": field '", names[j], "' holds ", DescribeByte(*start));
  }
  return absl::StrCat("record ", i, ": field '", names[j],
                      "' is truncated, out of int64 range or not canonically encoded");
}

// Keys that are not a field reference: one canonical msgpack scalar each of one type, or raw
// bytes.
void ColumnarEncoder::State::ParseKeys(absl::Span<const Record> records) {
  const size_t n = records.size();
  ColumnType kt = ColumnType::kRawBytes;
  if (!records[0].key.empty() && ClassifyScalar(BytesOf(records[0].key)[0], &kt)) {
    key.Start(kt, n);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* k = BytesOf(records[i].key);
      const uint8_t* k_end = k + records[i].key.size();
      if (key.Parse(i, k, k_end) != k_end) {
        kt = ColumnType::kRawBytes;
        break;
      }
    }
  }
  if (kt == ColumnType::kRawBytes) {
    key.Start(kt, n);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* k = BytesOf(records[i].key);
      key.Parse(i, k, k + records[i].key.size());
    }
  }
}

// Appends the payload: the field names, the key column (or reference), then the field columns.
void ColumnarEncoder::State::Serialize(ByteBuffer* payload) {
  size_t bound = kMaxVarintBytes + (key_ref >= 0 ? 1 + kMaxVarintBytes : key.MaxSerializedSize());
  for (uint32_t j = 0; j < num_fields; ++j) {
    bound += kMaxVarintBytes + names[j].size() + fields[j].MaxSerializedSize();
  }
  const size_t start_size = payload->size();
  uint8_t* const start = payload->Extend(bound);
  uint8_t* w = start;
  plain.base = start;  // span offsets count from the start of this payload
  w = PutVarint(w, num_fields);
  for (uint32_t j = 0; j < num_fields; ++j) {
    w = PutVarint(w, names[j].size());
    std::memcpy(w, names[j].data(), names[j].size());
    w += names[j].size();
  }
  if (key_ref >= 0) {
    *w++ = static_cast<uint8_t>(ColumnType::kKeyRef);
    w = PutVarint(w, static_cast<uint64_t>(key_ref));
  } else {
    w = key.Serialize(w, &plain);
  }
  for (uint32_t j = 0; j < num_fields; ++j) w = fields[j].Serialize(w, &plain);
  payload->Resize(start_size + static_cast<size_t>(w - start));
}

}  // namespace sluice
