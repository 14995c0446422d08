#include "codec/bitpack.h"

#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sluice::bitpack {

#if defined(__x86_64__)

bool HaveSimd() {
  // SLUICE_NO_SIMD=1 forces the scalar loops (the tests run both ways).
  static const bool have = __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("sse4.1") &&
                           std::getenv("SLUICE_NO_SIMD") == nullptr;
  return have;
}

__attribute__((target("ssse3,sse4.1"))) const uint8_t* Unpack6(const uint8_t* src, size_t groups,
                                                               const uint8_t* alphabet,
                                                               uint8_t* out) {
  const __m128i t0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(alphabet));
  const __m128i t1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(alphabet + 16));
  const __m128i t2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(alphabet + 32));
  const __m128i t3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(alphabet + 48));
  // Each 32-bit lane gets one 3-byte triple, i.e. four codes.
  const __m128i spread = _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
  const __m128i m0 = _mm_set1_epi32(0x3f), m1 = _mm_set1_epi32(0x3f00);
  const __m128i m2 = _mm_set1_epi32(0x3f0000), m3 = _mm_set1_epi32(0x3f000000);
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m128i one = _mm_set1_epi8(1), two = _mm_set1_epi8(2), three = _mm_set1_epi8(3);
  for (size_t g = 0; g < groups; ++g) {
    const __m128i in = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i v = _mm_shuffle_epi8(in, spread);
    // Code j of a lane is bits 6j..6j+5 of its 24-bit value: move each to byte j.
    const __m128i codes =
        _mm_or_si128(_mm_or_si128(_mm_and_si128(v, m0), _mm_and_si128(_mm_slli_epi32(v, 2), m1)),
                     _mm_or_si128(_mm_and_si128(_mm_slli_epi32(v, 4), m2),
                                  _mm_and_si128(_mm_slli_epi32(v, 6), m3)));
    // 64-entry lookup: four 16-entry ones, chosen by the code's top two bits.
    const __m128i lo = _mm_and_si128(codes, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(codes, 4), low4);
    __m128i r = _mm_shuffle_epi8(t0, lo);
    r = _mm_blendv_epi8(r, _mm_shuffle_epi8(t1, lo), _mm_cmpeq_epi8(hi, one));
    r = _mm_blendv_epi8(r, _mm_shuffle_epi8(t2, lo), _mm_cmpeq_epi8(hi, two));
    r = _mm_blendv_epi8(r, _mm_shuffle_epi8(t3, lo), _mm_cmpeq_epi8(hi, three));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), r);
    src += 12;
    out += 16;
  }
  return src;
}

namespace {
// Four 6-bit codes per 32-bit lane (one per byte) into 24 bits, 16 codes into 12 bytes.
__attribute__((target("ssse3,sse4.1"))) inline __m128i Squeeze6(__m128i codes) {
  const __m128i b0 = _mm_and_si128(codes, _mm_set1_epi32(0x3f));
  const __m128i b1 = _mm_srli_epi32(_mm_and_si128(codes, _mm_set1_epi32(0x3f00)), 2);
  const __m128i b2 = _mm_srli_epi32(_mm_and_si128(codes, _mm_set1_epi32(0x3f0000)), 4);
  const __m128i b3 = _mm_srli_epi32(_mm_and_si128(codes, _mm_set1_epi32(0x3f000000)), 6);
  const __m128i v = _mm_or_si128(_mm_or_si128(b0, b1), _mm_or_si128(b2, b3));
  const __m128i gather = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  return _mm_shuffle_epi8(v, gather);
}
}  // namespace

__attribute__((target("ssse3,sse4.1"))) bool Pack6(const uint8_t* src, size_t groups,
                                                   const Ranges& ranges, uint8_t* out) {
  __m128i lo[8], hi[8], delta[8];
  for (int r = 0; r < ranges.count; ++r) {
    lo[r] = _mm_set1_epi8(static_cast<char>(ranges.lo[r]));
    hi[r] = _mm_set1_epi8(static_cast<char>(ranges.lo[r] + ranges.span[r] - 1));
    delta[r] = _mm_set1_epi8(static_cast<char>(ranges.base[r] - ranges.lo[r]));
  }
  __m128i missing = _mm_setzero_si128();
  for (size_t g = 0; g < groups; ++g) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    __m128i codes = _mm_setzero_si128();
    __m128i found = _mm_setzero_si128();
    for (int r = 0; r < ranges.count; ++r) {
      // x in [lo, hi] (unsigned): max(x, lo) == x and min(x, hi) == x.
      const __m128i in = _mm_and_si128(_mm_cmpeq_epi8(_mm_max_epu8(x, lo[r]), x),
                                       _mm_cmpeq_epi8(_mm_min_epu8(x, hi[r]), x));
      codes = _mm_or_si128(codes, _mm_and_si128(in, _mm_add_epi8(x, delta[r])));
      found = _mm_or_si128(found, in);
    }
    missing = _mm_or_si128(missing, _mm_cmpeq_epi8(found, _mm_setzero_si128()));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), Squeeze6(codes));
    src += 16;
    out += 12;
  }
  return _mm_movemask_epi8(missing) == 0;
}

__attribute__((target("ssse3,sse4.1"))) bool Pack6(const uint8_t* src, size_t groups,
                                                   const NibbleTables& tables, uint8_t* out) {
  const __m128i min_t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tables.min));
  const __m128i max_t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tables.max));
  const __m128i delta_t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tables.delta));
  const __m128i low4 = _mm_set1_epi8(0x0f);
  __m128i ok = _mm_set1_epi8(-1);
  for (size_t g = 0; g < groups; ++g) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), low4);
    const __m128i lo = _mm_and_si128(x, low4);
    const __m128i mn = _mm_shuffle_epi8(min_t, hi);
    const __m128i mx = _mm_shuffle_epi8(max_t, hi);
    ok = _mm_and_si128(ok, _mm_and_si128(_mm_cmpeq_epi8(_mm_max_epu8(lo, mn), lo),
                                         _mm_cmpeq_epi8(_mm_min_epu8(lo, mx), lo)));
    const __m128i codes = _mm_add_epi8(x, _mm_shuffle_epi8(delta_t, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), Squeeze6(codes));
    src += 16;
    out += 12;
  }
  return _mm_movemask_epi8(ok) == 0xffff;
}

#else

bool HaveSimd() { return false; }
bool Pack6(const uint8_t*, size_t, const NibbleTables&, uint8_t*) { return false; }
const uint8_t* Unpack6(const uint8_t* src, size_t, const uint8_t*, uint8_t*) { return src; }
bool Pack6(const uint8_t*, size_t, const Ranges&, uint8_t*) { return false; }

#endif

}  // namespace sluice::bitpack
