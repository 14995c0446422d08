// COLUMNAR encoder: detects a batch's shape (msgpack maps of one set of fields), drives the
// per-field parse loops (columnar_parse.cc) over blocks of records into columns
// (columnar_column.h), and serializes the columns.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "codec/columnar.h"
#include "codec/columnar_bytes.h"
#include "codec/columnar_column.h"
#include "codec/columnar_dict.h"
#include "codec/columnar_internal.h"
#include "codec/columnar_ints.h"
#include "codec/columnar_scalars.h"
#include "codec/msgpack_scan.h"
#include "codec/varint.h"

namespace sluice {
using namespace columnar_internal;  // NOLINT(google-build-using-namespace): the codec's own helpers
namespace {
// Records are parsed in blocks of this many, field by field within a block: long enough loops
// for the lookups of many records to overlap, short enough that a block's records stay in
// cache from one field to the next (one block of the whole batch: ints3 1.7x slower). 256
// measured 2-4% faster than 64 on every benchmark dataset, and equal to 512 and 1,024.
constexpr size_t kParseBlock = 256;
// The encoder drops its scratch buffers after a batch that left more than this behind.
constexpr size_t kMaxRetainedScratch = 256u << 20;
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
