// One COLUMNAR column as the encoder builds it from a batch of msgpack maps (columnar_encoder.cc
// detects the shape and drives the loops): BuildColumn holds a field's values as parsed and
// serializes them; the parse loops (columnar_parse.cc) fill it, one tight loop per field and
// type; PlainSpans notes the serialized ranges zstd cannot shrink (sections, docs/frame-format.md).
// Internal to the codec.
#ifndef SLUICE_CODEC_COLUMNAR_COLUMN_H_
#define SLUICE_CODEC_COLUMNAR_COLUMN_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "codec/buffer.h"
#include "codec/columnar.h"
#include "codec/columnar_bytes.h"
#include "codec/columnar_dict.h"
#include "codec/columnar_internal.h"
#include "codec/columnar_ints.h"
#include "codec/columnar_scalars.h"
#include "codec/msgpack_scan.h"

namespace sluice::columnar_internal {

// Plain-range detection: a column part of at least kMinPlainSpan bytes whose order-0 entropy,
// estimated on at most kPlainSample of its bytes (see LooksPlain), is kPlainBits bits a byte or
// more is "plain": Huffman coding could save at most an eighth of it, at several ns a byte.
constexpr size_t kMinPlainSpan = 256;
constexpr size_t kPlainSample = 512;
constexpr size_t kPlainBlocks = 8;
constexpr double kPlainBits = 7.0;

/// Whether `n` bytes at `p` look plain (order-0 entropy of a sample at least kPlainBits a byte).
bool LooksPlain(const uint8_t* p, size_t n);

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

/// The column type a msgpack header byte belongs to, or false for maps, arrays, ext and 0xc1.
bool ClassifyScalar(uint8_t b, ColumnType* t);
/// What an unsupported header byte is, for errors.
const char* DescribeByte(uint8_t b);

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

/// Parses field `col` (prefix `pr`, then a value of its type) for records [begin, n), advancing
/// each record's cursor. Returns n, or the index of the first record that does not fit
/// (*failure says how). Each type has its own loop (columnar_parse.cc).
size_t ParseColumnOfType(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                         const uint8_t* const* ends, size_t begin, size_t n, ColumnChecks* checks,
                         ParseFailure* failure);

}  // namespace sluice::columnar_internal

#endif  // SLUICE_CODEC_COLUMNAR_COLUMN_H_
