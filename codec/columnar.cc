#include "codec/columnar.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/msgpack_scan.h"
#include "codec/varint.h"

namespace sluice {
namespace {

// More fields than this and a batch is not worth a columnar layout (and a decoder would be
// asked to track an unbounded number of columns).
constexpr uint64_t kMaxFields = 4096;

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
  }
  return "unknown";
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

// A column being built from one batch.
struct BuildColumn {
  ColumnType type = ColumnType::kNil;
  PodBuffer<int64_t> ints;   // kInt
  ByteBuffer fixed;          // kFloat32, kFloat64, kBool: n * width bytes
  PodBuffer<uint32_t> lens;  // kStr, kBin, kRawBytes
  ByteBuffer blob;

  void Start(ColumnType t, size_t n) {
    type = t;
    blob.Clear();
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
        lens.Resize(n);
        break;
      case ColumnType::kNil:
        break;
    }
  }

  // Parses the value at p as record i of this column; returns the pointer past it or nullptr.
  inline const uint8_t* Parse(size_t i, const uint8_t* p, const uint8_t* end) {
    switch (type) {
      case ColumnType::kInt: {
        int64_t v;
        p = mp::ReadCanonicalInt(p, end, &v);
        if (p != nullptr) ints[i] = v;
        return p;
      }
      case ColumnType::kFloat64:
        if (end - p < 9 || *p != 0xcb) return nullptr;
        std::memcpy(fixed.data() + i * 8, p + 1, 8);
        return p + 9;
      case ColumnType::kFloat32:
        if (end - p < 5 || *p != 0xca) return nullptr;
        std::memcpy(fixed.data() + i * 4, p + 1, 4);
        return p + 5;
      case ColumnType::kBool:
        if (p >= end || (*p & 0xfe) != 0xc2) return nullptr;
        fixed[i] = *p & 1;
        return p + 1;
      case ColumnType::kNil:
        if (p >= end || *p != 0xc0) return nullptr;
        return p + 1;
      case ColumnType::kStr: {
        uint32_t n;
        const uint8_t* q = mp::ReadCanonicalStr(p, end, &n);
        if (q == nullptr) return nullptr;
        lens[i] = n;
        blob.Append(q, n);
        return q + n;
      }
      case ColumnType::kBin: {
        uint32_t n;
        const uint8_t* q = mp::ReadCanonicalBin(p, end, &n);
        if (q == nullptr) return nullptr;
        lens[i] = n;
        blob.Append(q, n);
        return q + n;
      }
      case ColumnType::kRawBytes: {
        const auto n = static_cast<uint32_t>(end - p);
        lens[i] = n;
        blob.Append(p, n);
        return end;
      }
    }
    return nullptr;
  }

  // Upper bound of the serialized size (type byte and headers included).
  size_t MaxSerializedSize(size_t n) const {
    switch (type) {
      case ColumnType::kInt:
        return 2 + kMaxVarintBytes + n * kMaxVarintBytes;
      case ColumnType::kFloat32:
      case ColumnType::kFloat64:
      case ColumnType::kBool:
        return 1 + fixed.size();
      case ColumnType::kNil:
        return 1;
      default:
        return 1 + 2 * kMaxVarintBytes + n * 5 + blob.size();
    }
  }

  uint8_t* Serialize(size_t n, uint8_t* w) const {
    *w++ = static_cast<uint8_t>(type);
    switch (type) {
      case ColumnType::kInt: {
        // Plain or delta: whichever zigzag varint stream is shorter.
        size_t plain = 0, delta = 0;
        uint64_t prev = 0;
        for (size_t i = 0; i < n; ++i) {
          const auto v = static_cast<uint64_t>(ints[i]);
          plain += VarintLength(ZigZag(ints[i]));
          delta += VarintLength(ZigZag(static_cast<int64_t>(v - prev)));
          prev = v;
        }
        const bool use_delta = delta < plain;
        *w++ = use_delta ? 1 : 0;
        w = PutVarint(w, use_delta ? delta : plain);
        if (use_delta) {
          prev = 0;
          for (size_t i = 0; i < n; ++i) {
            const auto v = static_cast<uint64_t>(ints[i]);
            w = PutVarint(w, ZigZag(static_cast<int64_t>(v - prev)));
            prev = v;
          }
        } else {
          for (size_t i = 0; i < n; ++i) w = PutVarint(w, ZigZag(ints[i]));
        }
        return w;
      }
      case ColumnType::kFloat32:
      case ColumnType::kFloat64:
      case ColumnType::kBool:
        std::memcpy(w, fixed.data(), fixed.size());
        return w + fixed.size();
      case ColumnType::kNil:
        return w;
      default: {
        size_t len_bytes = 0;
        for (size_t i = 0; i < n; ++i) len_bytes += VarintLength(lens[i]);
        w = PutVarint(w, len_bytes);
        for (size_t i = 0; i < n; ++i) w = PutVarint(w, lens[i]);
        w = PutVarint(w, blob.size());
        if (!blob.empty()) std::memcpy(w, blob.data(), blob.size());
        return w + blob.size();
      }
    }
  }
};

// The bytes every value starts a field with: the encoded field name (and, for field 0, the
// map header). Compared with one or two masked 8-byte loads when short.
struct Prefix {
  uint8_t bytes[24] = {};
  ByteBuffer long_bytes;  // when len > sizeof(bytes)
  size_t len = 0;
  uint64_t w0 = 0, w1 = 0, m0 = 0, m1 = 0;

  void Set(const uint8_t* p, size_t n) {
    len = n;
    long_bytes.Clear();
    if (n > sizeof(bytes)) {
      long_bytes.Append(p, n);
    } else {
      std::memset(bytes, 0, sizeof(bytes));
      std::memcpy(bytes, p, n);
    }
    uint8_t mask[16] = {};
    for (size_t i = 0; i < n && i < 16; ++i) mask[i] = 0xff;
    std::memcpy(&w0, bytes, 8);
    std::memcpy(&w1, bytes + 8, 8);
    std::memcpy(&m0, mask, 8);
    std::memcpy(&m1, mask + 8, 8);
  }
  const uint8_t* data() const { return len > sizeof(bytes) ? long_bytes.data() : bytes; }

  inline bool Matches(const uint8_t* p, const uint8_t* end) const {
    const auto avail = static_cast<size_t>(end - p);
    if (avail < len) return false;
    if (len <= 8 && avail >= 8) {
      uint64_t a;
      std::memcpy(&a, p, 8);
      return ((a ^ w0) & m0) == 0;
    }
    if (len <= 16 && avail >= 16) {
      uint64_t a, b;
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + 8, 8);
      return (((a ^ w0) & m0) | ((b ^ w1) & m1)) == 0;
    }
    return std::memcmp(p, data(), len) == 0;
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Encoder

struct ColumnarEncoder::State {
  BuildColumn key;
  std::vector<BuildColumn> fields;
  std::vector<Prefix> prefixes;
  std::vector<absl::string_view> names;  // views into records[0].value
};

ColumnarEncoder::ColumnarEncoder() : state_(std::make_unique<State>()) {}
ColumnarEncoder::~ColumnarEncoder() = default;

bool ColumnarEncoder::Encode(absl::Span<const Record> records, ByteBuffer* payload,
                             std::string* why_not) {
  State& s = *state_;
  const size_t n = records.size();
  if (n == 0) {
    *why_not = "empty batch";
    return false;
  }

  // --- Shape, from record 0's value: a map of str field names to scalars.
  const auto* v0 = reinterpret_cast<const uint8_t*>(records[0].value.data());
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
    // Field 0's prefix includes the map header.
    const uint8_t* prefix_start = j == 0 ? v0 : name_start;
    s.prefixes[j].Set(prefix_start, static_cast<size_t>(p - prefix_start));
    ColumnType t;
    if (p >= v0_end || !ClassifyScalar(*p, &t)) {
      *why_not = absl::StrCat("record 0: field '", s.names.back(), "' holds ",
                              p >= v0_end ? "nothing (truncated)" : DescribeByte(*p));
      return false;
    }
    s.fields[j].Start(t, n);
    mp::ScanError err;
    p = mp::SkipObject(p, v0_end, &err);
    if (p == nullptr) {
      *why_not = absl::StrCat("record 0: field '", s.names.back(), "': ", mp::ScanErrorName(err));
      return false;
    }
  }

  // --- Keys: one canonical msgpack scalar each, of one type, or else raw bytes.
  {
    const auto* k0 = reinterpret_cast<const uint8_t*>(records[0].key.data());
    ColumnType kt = ColumnType::kRawBytes;
    if (!records[0].key.empty() && ClassifyScalar(k0[0], &kt)) {
      s.key.Start(kt, n);
      for (size_t i = 0; i < n; ++i) {
        const auto* k = reinterpret_cast<const uint8_t*>(records[i].key.data());
        const uint8_t* k_end = k + records[i].key.size();
        if (s.key.Parse(i, k, k_end) != k_end) {
          kt = ColumnType::kRawBytes;
          break;
        }
      }
    } else {
      kt = ColumnType::kRawBytes;
    }
    if (kt == ColumnType::kRawBytes) {
      s.key.Start(kt, n);
      for (size_t i = 0; i < n; ++i) {
        const auto* k = reinterpret_cast<const uint8_t*>(records[i].key.data());
        s.key.Parse(i, k, k + records[i].key.size());
      }
    }
  }

  // --- Values, row by row.
  BuildColumn* const cols = s.fields.data();
  const Prefix* const prefixes = s.prefixes.data();
  for (size_t i = 0; i < n; ++i) {
    const auto* v = reinterpret_cast<const uint8_t*>(records[i].value.data());
    const uint8_t* end = v + records[i].value.size();
    const uint8_t* q = v;
    if (num_fields == 0) {
      if (records[i].value.size() != 1 || *v != 0x80) {
        *why_not = absl::StrCat("record ", i, ": value is not the empty map like record 0");
        return false;
      }
      continue;
    }
    for (uint32_t j = 0; j < num_fields; ++j) {
      if (!prefixes[j].Matches(q, end)) {
        *why_not = absl::StrCat("record ", i, ": map shape differs from record 0 at field ", j,
                                " ('", s.names[j], "')");
        return false;
      }
      const uint8_t* start = q + prefixes[j].len;
      q = cols[j].Parse(i, start, end);
      if (q == nullptr) {
        ColumnType got;
        if (start < end && ClassifyScalar(*start, &got) && got != cols[j].type) {
          *why_not = absl::StrCat("record ", i, ": field '", s.names[j], "' changes type from ",
                                  ColumnTypeName(cols[j].type), " to ", ColumnTypeName(got));
        } else if (start < end && !ClassifyScalar(*start, &got)) {
          *why_not =
              absl::StrCat("record ", i, ": field '", s.names[j], "' holds ", DescribeByte(*start));
        } else {
          *why_not = absl::StrCat("record ", i, ": field '", s.names[j],
                                  "' is truncated, out of int64 range or not canonically encoded");
        }
        return false;
      }
    }
    if (q != end) {
      *why_not = absl::StrCat("record ", i, ": value has bytes after the map like record 0's");
      return false;
    }
  }

  // --- Serialize.
  size_t bound = kMaxVarintBytes + s.key.MaxSerializedSize(n);
  for (uint32_t j = 0; j < num_fields; ++j) {
    bound += kMaxVarintBytes + s.names[j].size() + cols[j].MaxSerializedSize(n);
  }
  uint8_t* w = payload->Extend(bound);
  w = PutVarint(w, num_fields);
  for (uint32_t j = 0; j < num_fields; ++j) {
    w = PutVarint(w, s.names[j].size());
    std::memcpy(w, s.names[j].data(), s.names[j].size());
    w += s.names[j].size();
  }
  w = s.key.Serialize(n, w);
  for (uint32_t j = 0; j < num_fields; ++j) w = cols[j].Serialize(n, w);
  payload->Resize(static_cast<size_t>(w - payload->data()));
  return true;
}

// ---------------------------------------------------------------------------------------------
// Decoder

namespace {

struct ReadColumn {
  ColumnType type = ColumnType::kNil;
  PodBuffer<int64_t> ints;
  PodBuffer<uint32_t> lens;
  const uint8_t* fixed = nullptr;  // floats, bools
  const uint8_t* blob = nullptr;
  const uint8_t* blob_end = nullptr;
  uint64_t rebuilt_bytes = 0;  // bytes this column contributes to the rebuilt rows
};

absl::Status Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("corrupt COLUMNAR payload: ", what));
}

absl::Status ReadColumnData(const uint8_t** pp, const uint8_t* end, size_t n, bool is_key,
                            absl::string_view name, ReadColumn* c) {
  const uint8_t* p = *pp;
  if (p >= end) return Corrupt(absl::StrCat("column '", name, "' is missing"));
  const uint8_t t = *p++;
  if (t > static_cast<uint8_t>(ColumnType::kRawBytes) ||
      (!is_key && t == static_cast<uint8_t>(ColumnType::kRawBytes))) {
    return Corrupt(absl::StrCat("column '", name, "' has unknown type ", t));
  }
  c->type = static_cast<ColumnType>(t);
  const auto avail = [&]() { return static_cast<size_t>(end - p); };
  switch (c->type) {
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
      if (avail() / width < n) {
        return Corrupt(absl::StrCat("float column '", name, "' is truncated"));
      }
      c->fixed = p;
      p += n * width;
      c->rebuilt_bytes = n * (width + 1);
      break;
    }
    case ColumnType::kInt: {
      if (avail() < 1 || *p > 1) {
        return Corrupt(absl::StrCat("int column '", name, "' has a bad mode"));
      }
      const bool delta = *p++ == 1;
      uint64_t nbytes;
      if (!GetVarint(&p, end, &nbytes) || nbytes > avail() || nbytes < n) {
        return Corrupt(absl::StrCat("int column '", name, "' has a bad size"));
      }
      const uint8_t* q = p;
      const uint8_t* q_end = p + nbytes;
      c->ints.Resize(n);
      int64_t* out = c->ints.data();
      uint64_t prev = 0, rebuilt = 0;
      for (size_t i = 0; i < n; ++i) {
        uint64_t z;
        if (!GetVarint(&q, q_end, &z)) {
          return Corrupt(absl::StrCat("int column '", name, "' has a bad varint"));
        }
        int64_t v = UnZigZag(z);
        if (delta) {
          prev += static_cast<uint64_t>(v);
          v = static_cast<int64_t>(prev);
        }
        out[i] = v;
        rebuilt += mp::IntSize(v);
      }
      if (q != q_end) {
        return Corrupt(absl::StrCat("int column '", name, "' has bytes after its values"));
      }
      p = q_end;
      c->rebuilt_bytes = rebuilt;
      break;
    }
    case ColumnType::kStr:
    case ColumnType::kBin:
    case ColumnType::kRawBytes: {
      uint64_t nbytes;
      if (!GetVarint(&p, end, &nbytes) || nbytes > avail() || nbytes < n) {
        return Corrupt(absl::StrCat("column '", name, "' has a bad lengths size"));
      }
      const uint8_t* q = p;
      const uint8_t* q_end = p + nbytes;
      c->lens.Resize(n);
      uint32_t* lens = c->lens.data();
      uint64_t sum = 0, headers = 0;
      for (size_t i = 0; i < n; ++i) {
        uint64_t len;
        if (!GetVarint(&q, q_end, &len) || len > 0xffffffffu) {
          return Corrupt(absl::StrCat("column '", name, "' has a bad length"));
        }
        lens[i] = static_cast<uint32_t>(len);
        sum += len;
        headers += c->type == ColumnType::kStr   ? mp::StrHeaderSize(len)
                   : c->type == ColumnType::kBin ? mp::BinHeaderSize(len)
                                                 : 0;
      }
      if (q != q_end) {
        return Corrupt(absl::StrCat("column '", name, "' has bytes after its lengths"));
      }
      p = q_end;
      uint64_t blob_len;
      if (!GetVarint(&p, end, &blob_len) || blob_len != sum || blob_len > avail()) {
        return Corrupt(absl::StrCat("column '", name, "' blob size does not match its lengths"));
      }
      c->blob = p;
      c->blob_end = p + blob_len;
      p += blob_len;
      c->rebuilt_bytes = sum + headers;
      break;
    }
  }
  *pp = p;
  return absl::OkStatus();
}

// Writes record i of column c at w; returns the pointer past it. `w` has kSlack spare bytes.
inline uint8_t* WriteValue(ReadColumn& c, size_t i, const uint8_t** blob_cursor, uint8_t* w) {
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
    default: {
      const uint32_t len = c.lens[i];
      if (c.type == ColumnType::kStr) {
        w = mp::WriteStrHeader(w, len);
      } else if (c.type == ColumnType::kBin) {
        w = mp::WriteBinHeader(w, len);
      }
      const uint8_t* src = *blob_cursor;
      if (len <= 16 && c.blob_end - src >= 16) {
        std::memcpy(w, src, 16);
      } else {
        std::memcpy(w, src, len);
      }
      *blob_cursor = src + len;
      return w + len;
    }
  }
}

}  // namespace

struct ColumnarDecoder::State {
  ReadColumn key;
  std::vector<ReadColumn> fields;
  std::vector<Prefix> prefixes;
  std::vector<const uint8_t*> cursors;
  ByteBuffer scratch;
};

ColumnarDecoder::ColumnarDecoder() : state_(std::make_unique<State>()) {}
ColumnarDecoder::~ColumnarDecoder() = default;

absl::Status ColumnarDecoder::Decode(const uint8_t* payload, size_t size, uint32_t record_count,
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
  std::vector<absl::string_view> names(num_fields);
  uint64_t prefix_total = num_fields == 0 ? 1 : 0;  // the empty map is one byte
  for (uint64_t j = 0; j < num_fields; ++j) {
    uint64_t len;
    if (!GetVarint(&p, end, &len) || len > static_cast<size_t>(end - p)) {
      return Corrupt(absl::StrCat("field ", j, " name is truncated"));
    }
    names[j] = absl::string_view(reinterpret_cast<const char*>(p), len);
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
  if (auto st = ReadColumnData(&p, end, n, /*is_key=*/true, "<key>", &s.key); !st.ok()) return st;
  for (uint64_t j = 0; j < num_fields; ++j) {
    if (auto st = ReadColumnData(&p, end, n, /*is_key=*/false, names[j], &s.fields[j]); !st.ok()) {
      return st;
    }
  }
  if (p != end) {
    return Corrupt(absl::StrCat(end - p, " unexpected bytes after the last column"));
  }

  // Exact rebuilt size, checked against the cap before anything is allocated for it.
  uint64_t total = s.key.rebuilt_bytes + static_cast<uint64_t>(n) * prefix_total;
  for (uint64_t j = 0; j < num_fields; ++j) total += s.fields[j].rebuilt_bytes;
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
  ReadColumn* const cols = s.fields.data();
  const Prefix* const prefixes = s.prefixes.data();
  const uint8_t** cursors = s.cursors.data();
  for (size_t i = 0; i < n; ++i) {
    RecordRef& r = refs[i];
    r.key_off = static_cast<uint32_t>(w - base);
    if (s.key.type == ColumnType::kRawBytes) {
      const uint32_t len = s.key.lens[i];
      if (len <= 16 && s.key.blob_end - key_blob >= 16) {
        std::memcpy(w, key_blob, 16);
      } else if (len != 0) {
        std::memcpy(w, key_blob, len);
      }
      key_blob += len;
      w += len;
    } else {
      w = WriteValue(s.key, i, &key_blob, w);
    }
    r.key_len = static_cast<uint32_t>(w - base) - r.key_off;
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
        w = WriteValue(cols[j], i, &cursors[j], w);
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
