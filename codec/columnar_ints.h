// Internal to codec/: the COLUMNAR layout's integer streams (int columns, and float64 columns'
// decimal mantissas), writer and reader side by side. docs/frame-format.md describes the bytes:
// an encoding byte, then zigzag varints (plain or delta), a first value and step (a sequence),
// a base and b-bit offsets (packed), or a first value, a smallest step and b-bit step offsets
// (delta-packed).
//
// The writer picks the smallest from a sample and writes the column in one pass; the reader
// validates a stream once when the column is read, then computes step and packed values from
// their index and decodes varints and delta-packed steps again a chunk (kChunk values) at a
// time while the records are rebuilt. What runs per value is inline here.
#ifndef SLUICE_CODEC_COLUMNAR_INTS_H_
#define SLUICE_CODEC_COLUMNAR_INTS_H_

#include <cstddef>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "codec/buffer.h"
#include "codec/columnar_internal.h"
#include "codec/varint.h"

namespace sluice::columnar_internal {

// The most SerializeInts writes for n values: the encoding and bits bytes, two varints of
// header, and a varint a value.
constexpr size_t MaxIntsSize(size_t n) { return 2 + 2 * kMaxVarintBytes + n * kMaxVarintBytes; }

// Writes the n values at v as an integer stream (encoding byte first) at w; returns the end.
// `allow_step`: whether the step encoding may be used (int columns; decimal mantissas may not).
uint8_t* SerializeInts(const int64_t* v, size_t n, uint8_t* w, bool allow_step);

// An integer stream (an int column, or a float64 column's decimal mantissas) as read.
struct IntReader {
  // How the stream is stored (the encoding byte).
  enum class Encoding : uint8_t { kVarints, kDeltaVarints, kStep, kPacked, kDeltaPacked };
  Encoding encoding = Encoding::kVarints;
  // kStep: value i = first + by * i. kPacked: value i = first + bits. kDeltaPacked: value 0 =
  // first, value i = value i-1 + by + bits. (All mod 2^64.) Step and packed values are computed
  // when written, never stored (a few bytes may stand for n values).
  uint64_t first = 0, by = 0;
  // kVarints, kDeltaVarints: the (validated) varints. kPacked, kDeltaPacked: the bits.
  const uint8_t* data = nullptr;
  const uint8_t* data_end = nullptr;
  uint32_t bits = 0;  // 1..56
  // Varints and delta-packed steps are decoded again a chunk at a time while rebuilding: a
  // cursor into the varints, the running value (delta), the index of the next value, and the
  // current chunk's values.
  const uint8_t* cursor = nullptr;
  uint64_t prev = 0;
  size_t next = 0;
  PodBuffer<int64_t> chunk;  // kChunk values

  // Whether the values are decoded a chunk at a time (else computed from i).
  bool Streamed() const {
    return encoding == Encoding::kVarints || encoding == Encoding::kDeltaVarints ||
           encoding == Encoding::kDeltaPacked;
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE int64_t Step(size_t i) const {
    return static_cast<int64_t>(first + by * i);
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE int64_t Packed(size_t i) const {
    return static_cast<int64_t>(first + BitsAt(data, data_end, uint64_t{i} * bits, bits));
  }
  // Value i, of the current chunk when streamed.
  int64_t Value(size_t i) const {
    if (encoding == Encoding::kStep) return Step(i);
    if (encoding == Encoding::kPacked) return Packed(i);
    return chunk[i & kChunkMask];
  }
  // The value after `prev`, the (i+1)th of a kDeltaPacked stream (i counts from 0).
  ABSL_ATTRIBUTE_ALWAYS_INLINE uint64_t NextDeltaPacked(uint64_t prev_value, size_t i) const {
    return prev_value + by + BitsAt(data, data_end, uint64_t{i} * bits, bits);
  }
  // Starts the second pass over a streamed column.
  void StartStream() {
    cursor = data;
    prev = 0;
    next = 0;
    chunk.Resize(kChunk);
  }
  // Decodes the next m (<= kChunk) values into the chunk.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void FillChunk(size_t m) {
    if (encoding == Encoding::kDeltaPacked) {
      FillDeltaPackedChunk(m);
      return;
    }
    const uint8_t* p = cursor;
    int64_t* out = chunk.data();
    if (encoding == Encoding::kDeltaVarints) {
      uint64_t running = prev;
      for (size_t k = 0; k < m; ++k) {
        running += static_cast<uint64_t>(UnZigZag(GetValidatedVarint(&p)));
        out[k] = static_cast<int64_t>(running);
      }
      prev = running;
    } else {
      for (size_t k = 0; k < m; ++k) out[k] = UnZigZag(GetValidatedVarint(&p));
    }
    cursor = p;
  }
  // FillChunk for kDeltaPacked: the next m values from the running one.
  ABSL_ATTRIBUTE_NOINLINE void FillDeltaPackedChunk(size_t m) {
    int64_t* out = chunk.data();
    size_t k = 0;
    uint64_t running = prev;
    if (next == 0 && m > 0) {
      running = first;
      out[k++] = static_cast<int64_t>(running);
    }
    for (; k < m; ++k) {
      running = NextDeltaPacked(running, next + k - 1);
      out[k] = static_cast<int64_t>(running);
    }
    prev = running;
    next += m;
  }
};

// Reads and validates an integer stream of n values at *pp (column `name`, for messages) into
// *r and moves *pp past it. `sizes` (when not null) receives the values' msgpack size.
absl::Status ReadInts(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                      bool allow_step, IntReader* r, uint64_t* sizes);

}  // namespace sluice::columnar_internal

#endif  // SLUICE_CODEC_COLUMNAR_INTS_H_
