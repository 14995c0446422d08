// LEB128 varints and zigzag, as used inside OPAQUE and COLUMNAR payloads.
//
// Decoding is strict: at most 10 bytes, no over-long encodings (a final 0x00 byte after a
// continuation), and the 10th byte may only carry the top bit of a 64-bit value.
#ifndef SLUICE_CODEC_VARINT_H_
#define SLUICE_CODEC_VARINT_H_

#include <cstddef>
#include <cstdint>

namespace sluice {

inline constexpr size_t kMaxVarintBytes = 10;

inline size_t VarintLength(uint64_t v) {
  const int bits = 64 - __builtin_clzll(v | 1);
  return static_cast<size_t>((bits + 6) / 7);
}

inline uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

/// Reads one varint from [*p, end). On success advances *p and returns true.
inline bool GetVarint(const uint8_t** p, const uint8_t* end, uint64_t* out) {
  const uint8_t* q = *p;
  if (q < end && *q < 0x80) {  // one-byte fast path
    *out = *q;
    *p = q + 1;
    return true;
  }
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (q >= end) return false;
    const uint8_t b = *q++;
    if (shift == 63 && b > 1) return false;  // would overflow 64 bits
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (b < 0x80) {
      if (b == 0 && shift != 0) return false;  // over-long encoding
      *out = v;
      *p = q;
      return true;
    }
  }
  return false;
}

/// Reads one varint at *p and advances *p past it, checking nothing: only for bytes that
/// GetVarint has already accepted (a decoder's second pass over a validated stream).
inline uint64_t GetValidatedVarint(const uint8_t** p) {
  const uint8_t* q = *p;
  uint64_t b = *q++;
  if (b < 0x80) {
    *p = q;
    return b;
  }
  uint64_t v = b & 0x7f;
  for (int shift = 7;; shift += 7) {
    b = *q++;
    v |= (b & 0x7f) << shift;
    if (b < 0x80) break;
  }
  *p = q;
  return v;
}

inline uint64_t ZigZag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t UnZigZag(uint64_t v) { return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1)); }

}  // namespace sluice

#endif  // SLUICE_CODEC_VARINT_H_
