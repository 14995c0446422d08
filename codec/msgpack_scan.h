// A small, allocation-free msgpack scanner: validates and skips objects, reads and writes the
// canonical (smallest) encodings of scalars. The codec's hot paths use it instead of building
// msgpack-cxx object trees; msgpack-cxx is the reference it is tested against.
//
// "Canonical" is what msgpack-cxx, msgpack-python and msgspec emit: the smallest header for a
// length, non-negative integers as positive fixint/uint*, negative ones as negative fixint/int*.
// The COLUMNAR layout stores values, not bytes, so it only accepts canonical encodings (and
// rebuilds exactly those); anything else falls back to a byte-preserving layout.
#ifndef SLUICE_CODEC_MSGPACK_SCAN_H_
#define SLUICE_CODEC_MSGPACK_SCAN_H_

#include <cstddef>
#include <cstdint>

#include "codec/endian.h"

namespace sluice::mp {

enum class ScanError : uint8_t { kOk = 0, kTruncated, kReservedByte };
const char* ScanErrorName(ScanError e);

/// Skips one complete msgpack object at p (nested arrays/maps included, iteratively: no
/// recursion, so deep nesting cannot overflow the stack). Returns the pointer past it, or
/// nullptr with *err set when the bytes are truncated or use the reserved byte 0xc1.
const uint8_t* SkipObject(const uint8_t* p, const uint8_t* end, ScanError* err);

/// Canonical size of an int64 encoded as msgpack.
inline size_t IntSize(int64_t v) {
  if (v >= 0) {
    if (v < 128) return 1;
    if (v < 256) return 2;
    if (v < 65536) return 3;
    if (v <= 0xffffffffLL) return 5;
    return 9;
  }
  if (v >= -32) return 1;
  if (v >= -128) return 2;
  if (v >= -32768) return 3;
  if (v >= -2147483648LL) return 5;
  return 9;
}

inline uint8_t* WriteInt(uint8_t* p, int64_t v) {
  if (v >= 0) {
    if (v < 128) {
      *p = static_cast<uint8_t>(v);
      return p + 1;
    }
    if (v < 256) {
      p[0] = 0xcc;
      p[1] = static_cast<uint8_t>(v);
      return p + 2;
    }
    if (v < 65536) {
      p[0] = 0xcd;
      StoreBE16(p + 1, static_cast<uint16_t>(v));
      return p + 3;
    }
    if (v <= 0xffffffffLL) {
      p[0] = 0xce;
      StoreBE32(p + 1, static_cast<uint32_t>(v));
      return p + 5;
    }
    p[0] = 0xcf;
    StoreBE64(p + 1, static_cast<uint64_t>(v));
    return p + 9;
  }
  if (v >= -32) {
    *p = static_cast<uint8_t>(v);
    return p + 1;
  }
  if (v >= -128) {
    p[0] = 0xd0;
    p[1] = static_cast<uint8_t>(v);
    return p + 2;
  }
  if (v >= -32768) {
    p[0] = 0xd1;
    StoreBE16(p + 1, static_cast<uint16_t>(v));
    return p + 3;
  }
  if (v >= -2147483648LL) {
    p[0] = 0xd2;
    StoreBE32(p + 1, static_cast<uint32_t>(v));
    return p + 5;
  }
  p[0] = 0xd3;
  StoreBE64(p + 1, static_cast<uint64_t>(v));
  return p + 9;
}

/// Reads a canonically encoded integer that fits int64. Returns the pointer past it, or
/// nullptr when the bytes are not such an integer (other type, non-canonical width,
/// uint64 above INT64_MAX, truncated).
inline const uint8_t* ReadCanonicalInt(const uint8_t* p, const uint8_t* end, int64_t* v) {
  if (p >= end) return nullptr;
  const uint8_t b = *p;
  if (b < 0x80) {
    *v = b;
    return p + 1;
  }
  if (b >= 0xe0) {
    *v = static_cast<int8_t>(b);  // NOLINT(bugprone-signed-char-misuse): negative fixint
    return p + 1;
  }
  const size_t avail = static_cast<size_t>(end - p);
  switch (b) {
    case 0xcc:
      if (avail < 2 || p[1] < 128) return nullptr;
      *v = p[1];
      return p + 2;
    case 0xcd: {
      if (avail < 3) return nullptr;
      const uint16_t x = LoadBE16(p + 1);
      if (x < 256) return nullptr;
      *v = x;
      return p + 3;
    }
    case 0xce: {
      if (avail < 5) return nullptr;
      const uint32_t x = LoadBE32(p + 1);
      if (x < 65536) return nullptr;
      *v = x;
      return p + 5;
    }
    case 0xcf: {
      if (avail < 9) return nullptr;
      const uint64_t x = LoadBE64(p + 1);
      if (x <= 0xffffffffULL || x > 0x7fffffffffffffffULL) return nullptr;
      *v = static_cast<int64_t>(x);
      return p + 9;
    }
    case 0xd0: {
      if (avail < 2) return nullptr;
      const int8_t x = static_cast<int8_t>(p[1]);
      if (x >= -32) return nullptr;
      *v = x;  // NOLINT(bugprone-signed-char-misuse): int8 is signed
      return p + 2;
    }
    case 0xd1: {
      if (avail < 3) return nullptr;
      const auto x = static_cast<int16_t>(LoadBE16(p + 1));
      if (x >= -128) return nullptr;
      *v = x;
      return p + 3;
    }
    case 0xd2: {
      if (avail < 5) return nullptr;
      const auto x = static_cast<int32_t>(LoadBE32(p + 1));
      if (x >= -32768) return nullptr;
      *v = x;
      return p + 5;
    }
    case 0xd3: {
      if (avail < 9) return nullptr;
      const auto x = static_cast<int64_t>(LoadBE64(p + 1));
      if (x >= -2147483648LL) return nullptr;
      *v = x;
      return p + 9;
    }
    default:
      return nullptr;
  }
}

/// ReadCanonicalInt without its jump table: with 9 bytes available, an 0xcc..0xd3 integer's
/// width, signedness and smallest canonical value come from the tag's low bits, and one 8-byte
/// load reads any width. A column whose integers switch widths record to record (ids around
/// 2^16, 2^32) then costs no mispredicted indirect jump. Same results as ReadCanonicalInt.
inline const uint8_t* ReadCanonicalIntFast(const uint8_t* p, const uint8_t* end, int64_t* v) {
  if (__builtin_expect(end - p < 9, 0)) return ReadCanonicalInt(p, end, v);
  const uint8_t b = *p;
  if (b < 0x80) {
    *v = b;
    return p + 1;
  }
  if (b >= 0xe0) {
    *v = static_cast<int8_t>(b);  // NOLINT(bugprone-signed-char-misuse): negative fixint
    return p + 1;
  }
  const unsigned k = static_cast<unsigned>(b) - 0xcc;  // uint8..uint64, then int8..int64
  if (k > 7) return nullptr;
  const unsigned lg = k & 3;
  const unsigned drop = 64 - (8u << lg);  // the bytes past the value in the 8-byte load
  const uint64_t word = LoadBE64(p + 1);
  if (k < 4) {
    static constexpr uint64_t kMinUnsigned[4] = {128, 256, 65536, 0x100000000ULL};
    const uint64_t x = word >> drop;
    if (x < kMinUnsigned[lg] || x > 0x7fffffffffffffffULL) return nullptr;
    *v = static_cast<int64_t>(x);
  } else {
    static constexpr int64_t kMaxSigned[4] = {-32, -128, -32768, -2147483648LL};
    const int64_t x = static_cast<int64_t>(word) >> drop;  // arithmetic shift: sign-extends
    if (x >= kMaxSigned[lg]) return nullptr;
    *v = x;
  }
  return p + 1 + (size_t{1} << lg);
}

/// Canonical str header size / writer for a byte length.
inline size_t StrHeaderSize(uint64_t n) { return n < 32 ? 1 : (n < 256 ? 2 : (n < 65536 ? 3 : 5)); }
inline uint8_t* WriteStrHeader(uint8_t* p, uint32_t n) {
  if (n < 32) {
    *p = static_cast<uint8_t>(0xa0 | n);
    return p + 1;
  }
  if (n < 256) {
    p[0] = 0xd9;
    p[1] = static_cast<uint8_t>(n);
    return p + 2;
  }
  if (n < 65536) {
    p[0] = 0xda;
    StoreBE16(p + 1, static_cast<uint16_t>(n));
    return p + 3;
  }
  p[0] = 0xdb;
  StoreBE32(p + 1, n);
  return p + 5;
}

/// Canonical bin header size / writer.
inline size_t BinHeaderSize(uint64_t n) { return n < 256 ? 2 : (n < 65536 ? 3 : 5); }
inline uint8_t* WriteBinHeader(uint8_t* p, uint32_t n) {
  if (n < 256) {
    p[0] = 0xc4;
    p[1] = static_cast<uint8_t>(n);
    return p + 2;
  }
  if (n < 65536) {
    p[0] = 0xc5;
    StoreBE16(p + 1, static_cast<uint16_t>(n));
    return p + 3;
  }
  p[0] = 0xc6;
  StoreBE32(p + 1, n);
  return p + 5;
}

/// Canonical map header writer.
inline uint8_t* WriteMapHeader(uint8_t* p, uint32_t n) {
  if (n < 16) {
    *p = static_cast<uint8_t>(0x80 | n);
    return p + 1;
  }
  if (n < 65536) {
    p[0] = 0xde;
    StoreBE16(p + 1, static_cast<uint16_t>(n));
    return p + 3;
  }
  p[0] = 0xdf;
  StoreBE32(p + 1, n);
  return p + 5;
}

/// Reads a canonically encoded str (want_str) or bin header; returns the pointer to the
/// content and sets *len, or nullptr when not such a header or the content is truncated.
inline const uint8_t* ReadCanonicalStr(const uint8_t* p, const uint8_t* end, uint32_t* len) {
  if (p >= end) return nullptr;
  const uint8_t b = *p;
  const size_t avail = static_cast<size_t>(end - p);
  uint32_t n;
  size_t h;
  if ((b & 0xe0) == 0xa0) {
    n = b & 0x1f;
    h = 1;
  } else if (b == 0xd9) {
    if (avail < 2 || p[1] < 32) return nullptr;
    n = p[1];
    h = 2;
  } else if (b == 0xda) {
    if (avail < 3) return nullptr;
    n = LoadBE16(p + 1);
    if (n < 256) return nullptr;
    h = 3;
  } else if (b == 0xdb) {
    if (avail < 5) return nullptr;
    n = LoadBE32(p + 1);
    if (n < 65536) return nullptr;
    h = 5;
  } else {
    return nullptr;
  }
  if (avail - h < n) return nullptr;
  *len = n;
  return p + h;
}

inline const uint8_t* ReadCanonicalBin(const uint8_t* p, const uint8_t* end, uint32_t* len) {
  if (p >= end) return nullptr;
  const uint8_t b = *p;
  const size_t avail = static_cast<size_t>(end - p);
  uint32_t n;
  size_t h;
  if (b == 0xc4) {
    if (avail < 2) return nullptr;
    n = p[1];
    h = 2;
  } else if (b == 0xc5) {
    if (avail < 3) return nullptr;
    n = LoadBE16(p + 1);
    if (n < 256) return nullptr;
    h = 3;
  } else if (b == 0xc6) {
    if (avail < 5) return nullptr;
    n = LoadBE32(p + 1);
    if (n < 65536) return nullptr;
    h = 5;
  } else {
    return nullptr;
  }
  if (avail - h < n) return nullptr;
  *len = n;
  return p + h;
}

/// Reads a canonical map header; returns pointer past it, or nullptr.
inline const uint8_t* ReadCanonicalMapHeader(const uint8_t* p, const uint8_t* end, uint32_t* n) {
  if (p >= end) return nullptr;
  const uint8_t b = *p;
  if ((b & 0xf0) == 0x80) {
    *n = b & 0x0f;
    return p + 1;
  }
  const size_t avail = static_cast<size_t>(end - p);
  if (b == 0xde) {
    if (avail < 3) return nullptr;
    *n = LoadBE16(p + 1);
    return *n < 16 ? nullptr : p + 3;
  }
  if (b == 0xdf) {
    if (avail < 5) return nullptr;
    *n = LoadBE32(p + 1);
    return *n < 65536 ? nullptr : p + 5;
  }
  return nullptr;
}

}  // namespace sluice::mp

#endif  // SLUICE_CODEC_MSGPACK_SCAN_H_
