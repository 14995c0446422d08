// Internal to codec/: vectorised kernels for the packed string encoding (6-bit codes, the
// width of base64/base62-like alphabets). Callers fall back to scalar loops when
// HaveSimd() is false or for the last few codes of a value.
#ifndef SLUICE_CODEC_BITPACK_H_
#define SLUICE_CODEC_BITPACK_H_

#include <cstddef>
#include <cstdint>

namespace sluice::bitpack {

/// Whether this CPU runs the kernels below (SSSE3 and SSE4.1) and SLUICE_NO_SIMD is unset;
/// checked once.
bool HaveSimd();

/// Turns `groups` x 16 6-bit codes (12 bytes each, least significant bits first) into bytes
/// through the 64-byte `alphabet`. Reads 16 bytes at the start of each group (4 past its
/// end). Returns src + 12 * groups.
const uint8_t* Unpack6(const uint8_t* src, size_t groups, const uint8_t* alphabet, uint8_t* out);

/// The reverse for bytes whose code is found by ranges: byte x in [lo[r], lo[r] + span[r])
/// has code x - lo[r] + base[r]. Packs `groups` x 16 bytes into 12 bytes each (writes 16 at
/// each group: 4 bytes of slack). Returns false, leaving garbage in out, if a byte is in no
/// range. At most 8 ranges.
struct Ranges {
  int count = 0;
  uint8_t lo[8], span[8], base[8];
};
bool Pack6(const uint8_t* src, size_t groups, const Ranges& ranges, uint8_t* out);

/// The same when, within each block of 16 byte values (same high nibble), the alphabet's
/// bytes are one run [min[h], max[h]] of low nibbles (min > max for none), whose codes are
/// x + delta[h]: three table lookups a byte instead of one test per range.
struct NibbleTables {
  uint8_t min[16], max[16], delta[16];
};
bool Pack6(const uint8_t* src, size_t groups, const NibbleTables& tables, uint8_t* out);

}  // namespace sluice::bitpack

#endif  // SLUICE_CODEC_BITPACK_H_
