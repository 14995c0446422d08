// COLUMNAR decoder: validates a payload and rebuilds its records as canonical msgpack.
#include <algorithm>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/strings/escaping.h"
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

// A column as read: its type, how it is stored (the tag WriteValue switches on) and the reader
// of that storage.
struct ReadColumn {
  ColumnType type = ColumnType::kNil;
  Storage storage = Storage::kNil;
  IntReader ints;                  // kInt, kIntStep, kIntPacked, kFloat64Decimal
  const uint8_t* fixed = nullptr;  // floats (big-endian, as in msgpack), bools
  double pow10 = 1;                // kFloat64Decimal: value i is ints.Value(i) / pow10
  BytesReader bytes;               // kBytesPlain, kBytesHex, kBytesPacked
  DictReader dict;                 // kBytesDict
  uint32_t key_ref_field = 0;      // kKeyRef
  uint64_t rebuilt_bytes = 0;      // bytes this column contributes to the rebuilt rows

  bool IsBytes() const {
    return storage == Storage::kBytesPlain || storage == Storage::kBytesHex ||
           storage == Storage::kBytesPacked;
  }
  // Whether the column is decoded again a chunk at a time while rebuilding.
  bool Streamed() const {
    if (storage == Storage::kInt) return true;
    if (storage == Storage::kFloat64Decimal) return ints.Streamed();
    return IsBytes();
  }
  // Starts the second pass over the column's varints.
  void StartStream() {
    if (IsBytes()) {
      bytes.StartStream();
    } else {
      ints.StartStream();
    }
  }
  // Decodes the next m (<= kChunk) values' varints.
  ABSL_ATTRIBUTE_NOINLINE void FillChunk(size_t m) {
    if (IsBytes()) {
      bytes.FillChunk(m);
    } else {
      ints.FillChunk(m);
    }
  }

  size_t RetainedBytes() const {
    return ints.chunk.capacity() * 8 + bytes.lens.capacity() * 4 + dict.RetainedBytes();
  }
};

// A str, bin or raw bytes column: the encoding byte, then the values or a dictionary.
absl::Status ReadBytesColumn(const uint8_t** pp, const uint8_t* end, size_t n,
                             absl::string_view name, ReadColumn* c, uint64_t* dict_budget) {
  const uint8_t* p = *pp;
  if (p >= end || *p > kBytesPacked || (*p == kBytesHex && c->type != ColumnType::kStr)) {
    return Corrupt(absl::StrCat("column '", name, "' has ",
                                p >= end ? "no encoding byte" : "an unknown encoding"));
  }
  const uint8_t encoding = *p++;
  absl::Status st;
  if (encoding == kBytesDict) {
    st = ReadDict(&p, end, n, name, c->type, &c->dict, dict_budget, &c->rebuilt_bytes);
    if (st.ok()) c->storage = Storage::kBytesDict;
  } else {
    st = ReadBytes(&p, end, n, name, c->type, encoding, &c->storage, &c->bytes, &c->rebuilt_bytes);
  }
  if (st.ok()) *pp = p;
  return st;
}

// Reads and validates one column; `dict_budget` is what dictionaries may still take to hold.
absl::Status ReadColumnData(const uint8_t** pp, const uint8_t* end, size_t n, bool is_key,
                            uint64_t num_fields, absl::string_view name, ReadColumn* c,
                            uint64_t* dict_budget) {
  const uint8_t* p = *pp;
  if (p >= end) return Corrupt(absl::StrCat("column '", name, "' is missing"));
  const uint8_t t = *p++;
  const bool key_only = t == static_cast<uint8_t>(ColumnType::kRawBytes) ||
                        t == static_cast<uint8_t>(ColumnType::kKeyRef);
  if (t > static_cast<uint8_t>(ColumnType::kKeyRef) || (!is_key && key_only)) {
    return Corrupt(absl::StrCat("column '", name, "' has unknown type ", t));
  }
  c->type = static_cast<ColumnType>(t);
  switch (c->type) {
    case ColumnType::kKeyRef: {
      uint64_t field;
      if (!GetVarint(&p, end, &field)) return Corrupt("key reference is truncated");
      if (field >= num_fields) {
        return Corrupt(absl::StrCat("key column refers to field ", field, " of ", num_fields));
      }
      c->key_ref_field = static_cast<uint32_t>(field);
      c->rebuilt_bytes = 0;  // keys are views into the values
      c->storage = Storage::kKeyRef;
      break;
    }
    case ColumnType::kNil:
      c->rebuilt_bytes = n;
      c->storage = Storage::kNil;
      break;
    case ColumnType::kBool:
      if (auto st = ReadBools(&p, end, n, name, &c->storage, &c->fixed, &c->rebuilt_bytes);
          !st.ok()) {
        return st;
      }
      break;
    case ColumnType::kFloat32:
    case ColumnType::kFloat64:
      if (auto st = ReadFloats(&p, end, n, name, c->type, &c->storage, &c->fixed, &c->pow10,
                               &c->ints, &c->rebuilt_bytes);
          !st.ok()) {
        return st;
      }
      break;
    case ColumnType::kInt: {
      uint64_t rebuilt = 0;
      if (auto st = ReadInts(&p, end, n, name, /*allow_step=*/true, &c->ints, &rebuilt); !st.ok()) {
        return st;
      }
      c->rebuilt_bytes = rebuilt;
      c->storage = c->ints.encoding == IntReader::Encoding::kStep     ? Storage::kIntStep
                   : c->ints.encoding == IntReader::Encoding::kPacked ? Storage::kIntPacked
                                                                      : Storage::kInt;
      break;
    }
    case ColumnType::kStr:
    case ColumnType::kBin:
    case ColumnType::kRawBytes:
      if (auto st = ReadBytesColumn(&p, end, n, name, c, dict_budget); !st.ok()) return st;
      break;
  }
  *pp = p;
  return absl::OkStatus();
}

// Writes record i of column c at w; returns the pointer past it. `w` has kSlack spare bytes.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteValue(const ReadColumn& c, size_t i,
                                                        const uint8_t** blob_cursor, uint8_t* w,
                                                        uint32_t* bad) {
  switch (c.storage) {
    case Storage::kNil:
      *w = 0xc0;
      return w + 1;
    case Storage::kBool:
      return WriteBoolByte(c.fixed, i, w);
    case Storage::kBoolBits:
      return WriteBoolBit(c.fixed, i, w);
    case Storage::kInt:
      return mp::WriteInt(w, c.ints.chunk[i & kChunkMask]);
    case Storage::kIntStep:
      return mp::WriteInt(w, c.ints.Step(i));
    case Storage::kIntPacked:
      return mp::WriteInt(w, c.ints.Packed(i));
    case Storage::kFloat32:
      return WriteFloat32(c.fixed, i, w);
    case Storage::kFloat64:
      return WriteFloat64(c.fixed, i, w);
    case Storage::kFloat64Decimal:
      return WriteDecimal(c.ints.Value(i), c.pow10, w);
    case Storage::kKeyRef:
      return w;
    default:
      // The bytes storages, last in Storage, share this case, told apart by comparisons that
      // go the same way for every value of a column: the switch then reaches them with one
      // range check, where a jump table entry each cost an indirect jump per value (str3's
      // rebuild: 3% more instructions).
      if (c.storage == Storage::kBytesDict) return WriteEntry(c.dict, i, w);
      if (c.storage == Storage::kBytesPacked) {
        return WritePacked(c.bytes, c.type, i, blob_cursor, w, bad);
      }
      if (c.storage == Storage::kBytesHex) return WriteHex(c.bytes, c.type, i, blob_cursor, w);
      return WritePlain(c.bytes, c.type, i, blob_cursor, w);
  }
}

// Writes record i's key from column c (the key column, or the field a key reference names):
// raw keys are copied as they are, anything else is written as its msgpack encoding.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteKey(const ReadColumn& c, size_t i,
                                                      const uint8_t** cursor, uint8_t* w,
                                                      uint32_t* bad) {
  if (c.storage == Storage::kBytesPlain && c.type == ColumnType::kRawBytes) {
    return WriteRaw(c.bytes, i, cursor, w);
  }
  return WriteValue(c, i, cursor, w, bad);
}

}  // namespace

struct ColumnarDecoder::State {
  ReadColumn key;
  std::vector<ReadColumn> fields;
  std::vector<Prefix> prefixes;
  std::vector<const uint8_t*> cursors;
  std::vector<std::string> names;     // escaped, for messages
  std::vector<ReadColumn*> streamed;  // the columns decoded again a chunk at a time
  ByteBuffer scratch;

  absl::Status ReadFieldNames(const uint8_t** pp, const uint8_t* end, uint64_t num_fields,
                              uint64_t* prefix_total);
};

ColumnarDecoder::ColumnarDecoder() : state_(std::make_unique<State>()) {}
ColumnarDecoder::~ColumnarDecoder() = default;

absl::Status ColumnarDecoder::Decode(const uint8_t* payload, size_t size, uint32_t record_count,
                                     uint32_t max_rows_bytes, ByteBuffer* rows,
                                     PodBuffer<RecordRef>* index, bool keys_only) {
  absl::Status st = DecodeImpl(payload, size, record_count, max_rows_bytes, rows, index, keys_only);
  // Scratch is reused across frames, but frames with many fields must not ratchet it up:
  // beyond one cap's worth, let it all go.
  if (retained_bytes() > max_rows_bytes) state_ = std::make_unique<State>();
  return st;
}

size_t ColumnarDecoder::retained_bytes() const {
  size_t retained = state_->key.RetainedBytes() + state_->scratch.capacity();
  for (const ReadColumn& c : state_->fields) retained += c.RetainedBytes();
  for (const Prefix& p : state_->prefixes) retained += p.long_bytes.capacity();
  return retained;
}

// The field names: each field's name (escaped, for messages) and prefix (the map header for
// field 0, the name's str header, the name), and the bytes the prefixes of a record take.
absl::Status ColumnarDecoder::State::ReadFieldNames(const uint8_t** pp, const uint8_t* end,
                                                    uint64_t num_fields, uint64_t* prefix_total) {
  const uint8_t* p = *pp;
  names.resize(num_fields);
  uint64_t total = num_fields == 0 ? 1 : 0;  // the empty map is one byte
  for (uint64_t j = 0; j < num_fields; ++j) {
    uint64_t len;
    if (!GetVarint(&p, end, &len) || len > static_cast<size_t>(end - p)) {
      return Corrupt(absl::StrCat("field ", j, " name is truncated"));
    }
    // For messages only: untrusted bytes, escaped and cut short.
    names[j] = absl::CHexEscape(
        absl::string_view(reinterpret_cast<const char*>(p), std::min<uint64_t>(len, 64)));
    // prefix = [map header for field 0] + str header + name
    scratch.Clear();
    uint8_t* w = scratch.Extend(10 + len);
    uint8_t* const start = w;
    if (j == 0) w = mp::WriteMapHeader(w, static_cast<uint32_t>(num_fields));
    w = mp::WriteStrHeader(w, static_cast<uint32_t>(len));
    std::memcpy(w, p, len);
    w += len;
    prefixes[j].Set(start, static_cast<size_t>(w - start));
    total += prefixes[j].len;
    p += len;
  }
  *prefix_total = total;
  *pp = p;
  return absl::OkStatus();
}

absl::Status ColumnarDecoder::DecodeImpl(const uint8_t* payload, size_t size, uint32_t record_count,
                                         uint32_t max_rows_bytes, ByteBuffer* rows,
                                         PodBuffer<RecordRef>* index, bool keys_only) {
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
  uint64_t prefix_total;
  if (auto st = s.ReadFieldNames(&p, end, num_fields, &prefix_total); !st.ok()) return st;
  // Every record rebuilds to at least its field prefixes (map header and names) plus a byte a
  // value: refuse early what cannot fit the cap, so columns that store nothing per value (nil,
  // integer sequences) cannot make a few bytes cost work for records no frame could hold.
  const uint64_t min_record = std::max<uint64_t>(1, prefix_total + num_fields);
  if (n != 0 && min_record > max_rows_bytes / n) {
    return Corrupt(absl::StrCat(n, " records of at least ", min_record,
                                " bytes each cannot fit the rows cap of ", max_rows_bytes,
                                " bytes"));
  }
  // Dictionary entries are the one per-frame scratch that grows with the payload's bytes:
  // together they may take at most the rows cap to hold.
  uint64_t dict_budget = max_rows_bytes;
  if (auto st =
          ReadColumnData(&p, end, n, /*is_key=*/true, num_fields, "<key>", &s.key, &dict_budget);
      !st.ok()) {
    return st;
  }
  for (uint64_t j = 0; j < num_fields; ++j) {
    if (auto st = ReadColumnData(&p, end, n, /*is_key=*/false, num_fields, s.names[j], &s.fields[j],
                                 &dict_budget);
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

  if (keys_only) return RebuildKeys(n, num_fields, rows, index);

  rows->Reserve(total + kSlack);
  rows->Resize(total);
  index->Resize(n);
  uint8_t* const base = rows->data();
  uint8_t* w = base;
  RecordRef* refs = index->data();
  const uint8_t* key_blob = s.key.bytes.blob;
  s.cursors.resize(num_fields);
  for (uint64_t j = 0; j < num_fields; ++j) s.cursors[j] = s.fields[j].bytes.blob;
  const ReadColumn* const cols = s.fields.data();
  const Prefix* const prefixes = s.prefixes.data();
  const uint8_t** cursors = s.cursors.data();
  const bool key_ref = s.key.type == ColumnType::kKeyRef;
  const uint64_t key_field = s.key.key_ref_field;
  s.streamed.clear();
  if (s.key.Streamed()) s.streamed.push_back(&s.key);
  for (uint64_t j = 0; j < num_fields; ++j) {
    if (s.fields[j].Streamed()) s.streamed.push_back(&s.fields[j]);
  }
  for (ReadColumn* c : s.streamed) c->StartStream();
  uint32_t bad = 0;  // a packed value had non-zero padding bits
  for (size_t i0 = 0; i0 < n; i0 += kChunk) {
    const size_t m = std::min(kChunk, n - i0);
    for (ReadColumn* c : s.streamed) c->FillChunk(m);
    for (size_t i = i0; i < i0 + m; ++i) {
      RecordRef& r = refs[i];
      if (!key_ref) {
        r.key_off = static_cast<uint32_t>(w - base);
        w = WriteKey(s.key, i, &key_blob, w, &bad);
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
          w = WriteValue(cols[j], i, &cursors[j], w, &bad);
          if (key_ref && j == key_field) {
            r.key_off = static_cast<uint32_t>(value_start - base);
            r.key_len = static_cast<uint32_t>(w - value_start);
          }
        }
      }
      r.value_len = static_cast<uint32_t>(w - base) - r.value_off;
    }
  }
  if (bad != 0) {
    return Corrupt("a packed column has non-zero padding bits");
  }
  if (static_cast<uint64_t>(w - base) != total) {
    return absl::InternalError("COLUMNAR rebuild size mismatch");  // cannot happen
  }
  return absl::OkStatus();
}

// The keys-only rebuild (the columns have been read and validated, the total size checked):
// the keys, or for a key reference the referenced field's encoded values, and the one check
// the value loop would make, packed columns' padding bits.
absl::Status ColumnarDecoder::RebuildKeys(size_t n, uint64_t num_fields, ByteBuffer* rows,
                                          PodBuffer<RecordRef>* index) {
  State& s = *state_;
  const bool key_ref = s.key.type == ColumnType::kKeyRef;
  ReadColumn& kc = key_ref ? s.fields[s.key.key_ref_field] : s.key;
  const uint64_t key_bytes = kc.rebuilt_bytes;  // within the checked total
  rows->Reserve(key_bytes + kSlack);
  rows->Resize(key_bytes);
  index->Resize(n);
  uint8_t* const base = rows->data();
  uint8_t* w = base;
  RecordRef* refs = index->data();
  const uint8_t* cursor = kc.bytes.blob;
  uint32_t bad = 0;
  if (kc.Streamed()) kc.StartStream();
  for (size_t i0 = 0; i0 < n; i0 += kChunk) {
    const size_t m = std::min(kChunk, n - i0);
    if (kc.Streamed()) kc.FillChunk(m);
    for (size_t i = i0; i < i0 + m; ++i) {
      RecordRef& r = refs[i];
      r.key_off = static_cast<uint32_t>(w - base);
      w = WriteKey(kc, i, &cursor, w, &bad);
      r.key_len = static_cast<uint32_t>(w - base) - r.key_off;
      r.value_off = static_cast<uint32_t>(w - base);
      r.value_len = 0;
    }
  }
  if (static_cast<uint64_t>(w - base) != key_bytes) {
    return absl::InternalError("COLUMNAR key rebuild size mismatch");  // cannot happen
  }
  for (uint64_t j = 0; j < num_fields; ++j) {
    const ReadColumn& c = s.fields[j];
    if (c.storage != Storage::kBytesPacked || &c == &kc) continue;
    if (!PackedPaddingIsZero(c.bytes, n)) bad = 1;
  }
  if (bad != 0) return Corrupt("a packed column has non-zero padding bits");
  return absl::OkStatus();
}

}  // namespace sluice
