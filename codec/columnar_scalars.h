// Internal to codec/: the COLUMNAR layout's small scalar columns, writer and reader side by
// side: floats (raw, as msgpack holds them, or float64 as decimal mantissas: value = m / 10^e,
// bit-exact) and bools (a byte a value, or a bit a value). Nil columns hold nothing.
// docs/frame-format.md describes the bytes. What runs per value is inline here.
#ifndef SLUICE_CODEC_COLUMNAR_SCALARS_H_
#define SLUICE_CODEC_COLUMNAR_SCALARS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "codec/buffer.h"
#include "codec/columnar.h"
#include "codec/columnar_internal.h"
#include "codec/columnar_ints.h"
#include "codec/endian.h"

namespace sluice::columnar_internal {

// --- Writer (a column at a time). Each writes the column after its type byte at w, returns the
// end, and sets *bulk to where its values start (for the plain-range check).

// The most the writers below write for n values: floats of `width` bytes (the float encoding
// and exponent bytes, the integer encoding and bits bytes, two varints of header, then raw
// values or a varint a mantissa), bools (the encoding byte and a byte a value).
constexpr size_t MaxFloatsSize(size_t n, size_t width) {
  return 4 + 2 * kMaxVarintBytes +
         (n * width > n * kMaxVarintBytes ? n * width : n * kMaxVarintBytes);
}
constexpr size_t MaxBoolsSize(size_t n) { return 1 + n; }

// n float64 values (msgpack's big-endian bytes at `fixed`): as decimal mantissas when every
// value is m / 10^e for one e (`mantissas` is n values of scratch), else raw.
uint8_t* SerializeFloat64s(const uint8_t* fixed, size_t n, PodBuffer<int64_t>* mantissas,
                           uint8_t* w, uint8_t** bulk);
// n float32 values, raw.
uint8_t* SerializeFloat32s(const uint8_t* fixed, size_t n, uint8_t* w, uint8_t** bulk);
// n bools (bytes of 0 or 1): a bit each, or a byte each when that is as small (1 or 2 values).
uint8_t* SerializeBools(const uint8_t* values, size_t n, uint8_t* w, uint8_t** bulk);

// --- Reader. Each validates a column of n values at *pp (`name` for messages), moves *pp past
// it, says how it is stored, and sets *rebuilt to the bytes its values rebuild to.

// A bool column: *values are n bytes (kBool) or n bits (kBoolBits).
absl::Status ReadBools(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                       Storage* storage, const uint8_t** values, uint64_t* rebuilt);
// A float32 or float64 column: *fixed are the raw values (kFloat32, kFloat64), or the mantissas
// are in *mantissas and value i is mantissas->Value(i) / *pow10 (kFloat64Decimal).
absl::Status ReadFloats(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                        ColumnType type, Storage* storage, const uint8_t** fixed, double* pow10,
                        IntReader* mantissas, uint64_t* rebuilt);

// --- Per value: record i's msgpack encoding at w (which has kSlack spare bytes); each returns
// the end.

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteBoolByte(const uint8_t* values, size_t i,
                                                           uint8_t* w) {
  *w = static_cast<uint8_t>(0xc2 | values[i]);
  return w + 1;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteBoolBit(const uint8_t* bits, size_t i,
                                                          uint8_t* w) {
  *w = static_cast<uint8_t>(0xc2 | ((bits[i >> 3] >> (i & 7)) & 1));
  return w + 1;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteFloat32(const uint8_t* fixed, size_t i,
                                                          uint8_t* w) {
  *w = 0xca;
  std::memcpy(w + 1, fixed + i * 4, 4);
  return w + 5;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteFloat64(const uint8_t* fixed, size_t i,
                                                          uint8_t* w) {
  *w = 0xcb;
  std::memcpy(w + 1, fixed + i * 8, 8);
  return w + 9;
}
// The division the writer checked each value against (DecimalOf).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteDecimal(int64_t mantissa, double pow10,
                                                          uint8_t* w) {
  *w = 0xcb;
  StoreBE64(w + 1, DoubleBits(static_cast<double>(mantissa) / pow10));
  return w + 9;
}

}  // namespace sluice::columnar_internal

#endif  // SLUICE_CODEC_COLUMNAR_SCALARS_H_
