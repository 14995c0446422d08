// The COLUMNAR payload (format tag 0x02): a batch of records whose values are msgpack maps of
// one shape (same field names in the same order, one scalar type per field) stored column by
// column. Keys form a column too, or refer to the field they copy. Each column gets the
// encoding that suits it: integers as plain or delta varints, a step sequence, or bit-packed
// values or steps; float64s as decimal mantissas when that is exact; bools as bits; strings and
// bins as lengths plus contents, hex bytes, codes of a small alphabet, or a dictionary.
// columnar_{ints,scalars,bytes,dict}.h hold each encoding's writer and reader.
//
// Only canonical msgpack encodings are accepted, and decoding rebuilds exactly those bytes, so
// a round trip is byte-identical. Anything the layout cannot hold exactly (nested values,
// heterogeneous maps, a type change within a column, non-canonical encodings, ext types) makes
// the batch ineligible: the encoder reports why and the caller falls back to MSGPACK.
// docs/frame-format.md describes the bytes.
#ifndef SLUICE_CODEC_COLUMNAR_H_
#define SLUICE_CODEC_COLUMNAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/buffer.h"
#include "codec/frame_format.h"

namespace sluice {

/// Where one record lives in a decoded buffer.
struct RecordRef {
  uint32_t key_off;
  uint32_t key_len;
  uint32_t value_off;
  uint32_t value_len;
};

/// Column value types (one byte in the payload).
enum class ColumnType : uint8_t {
  kNil = 0,
  kBool = 1,
  kInt = 2,
  kFloat32 = 3,
  kFloat64 = 4,
  kStr = 5,
  kBin = 6,
  kRawBytes = 7,  ///< key column only: keys that are not one msgpack scalar
  kKeyRef = 8,    ///< key column only: each key equals the encoded value of one field
};

/// Encodes record batches as COLUMNAR payloads. Keeps its scratch buffers across calls.
class ColumnarEncoder {
 public:
  ColumnarEncoder();
  ~ColumnarEncoder();
  ColumnarEncoder(const ColumnarEncoder&) = delete;
  ColumnarEncoder& operator=(const ColumnarEncoder&) = delete;

  /// Appends the COLUMNAR payload for `records` to `payload` and returns true, or returns
  /// false (payload unchanged in size) and sets `*why_not` when the batch is not eligible.
  bool Encode(absl::Span<const Record> records, ByteBuffer* payload, std::string* why_not);

  /// A byte range of the last payload (offsets from its start) whose bytes look too close to
  /// random for an entropy coder to shrink by much: random ids, float mantissas, dense codes.
  struct Span {
    uint32_t offset;
    uint32_t length;
  };
  /// The last Encode's plain ranges, in order and disjoint (adjacent ones merged).
  absl::Span<const Span> plain_spans() const;

 private:
  bool EncodeImpl(absl::Span<const Record> records, ByteBuffer* payload, std::string* why_not);
  struct State;
  std::unique_ptr<State> state_;
};

/// Decodes COLUMNAR payloads. Keeps its scratch buffers across calls.
class ColumnarDecoder {
 public:
  ColumnarDecoder();
  ~ColumnarDecoder();
  ColumnarDecoder(const ColumnarDecoder&) = delete;
  ColumnarDecoder& operator=(const ColumnarDecoder&) = delete;

  /// Validates `payload` as `record_count` records and rebuilds them into `rows` (keys and
  /// canonical msgpack values, back to back) with one RecordRef per record in `index`. The
  /// rebuilt size may not exceed `max_rows_bytes`. `rows` gets kSlack spare bytes of capacity.
  /// With `keys_only`, the payload is validated exactly as fully, but only the keys are
  /// rebuilt: every value comes back empty.
  absl::Status Decode(const uint8_t* payload, size_t size, uint32_t record_count,
                      uint32_t max_rows_bytes, ByteBuffer* rows, PodBuffer<RecordRef>* index,
                      bool keys_only = false);
  /// Scratch memory kept for the next call.
  size_t retained_bytes() const;

 private:
  absl::Status DecodeImpl(const uint8_t* payload, size_t size, uint32_t record_count,
                          uint32_t max_rows_bytes, ByteBuffer* rows, PodBuffer<RecordRef>* index,
                          bool keys_only);
  absl::Status RebuildKeys(size_t n, uint64_t num_fields, ByteBuffer* rows,
                           PodBuffer<RecordRef>* index);
  struct State;
  std::unique_ptr<State> state_;
};

/// Spare bytes past the end kept in decode buffers so small copies can run as fixed-size
/// loads and stores.
inline constexpr size_t kSlack = 32;

}  // namespace sluice

#endif  // SLUICE_CODEC_COLUMNAR_H_
