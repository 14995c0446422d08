// Internal to codec/: the COLUMNAR payload's constants and the helpers its encoder and
// decoder share (docs/frame-format.md describes the bytes). Not part of the public API.
#ifndef SLUICE_CODEC_COLUMNAR_INTERNAL_H_
#define SLUICE_CODEC_COLUMNAR_INTERNAL_H_

#include <cstdint>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "codec/buffer.h"
#include "codec/columnar.h"
#include "codec/dict_hash_table.h"
#include "codec/endian.h"

namespace sluice::columnar_internal {

// More fields than this and a batch is not worth a columnar layout (and a decoder would be
// asked to track an unbounded number of columns).
constexpr uint64_t kMaxFields = 4096;

// Column encodings (the byte after the type byte, for the types that have one).
constexpr uint8_t kIntPlain = 0;
constexpr uint8_t kIntDelta = 1;
constexpr uint8_t kIntStep = 2;  // value i = first + i * step (mod 2^64): two varints in all
// value i = base + a b-bit number (b in 1..kMaxIntPackedBits; mod 2^64): a zigzag varint
// base, a bits byte, then n*b bits, least significant first.
constexpr uint8_t kIntPacked = 3;
constexpr uint8_t kMaxIntPackedBits = 56;
// value 0 = first; value i = value i-1 + step_base + a b-bit number (b in 1..kMaxIntPackedBits;
// mod 2^64): zigzag varints first and step_base, a bits byte, then (n-1)*b bits, least
// significant first. Timestamps and other columns that rise by steps in a narrow range.
constexpr uint8_t kIntDeltaPacked = 4;
// Bool columns: n bytes of 0 or 1 (the only form before bit packing; a first byte of 0 or 1
// says so), or this byte and then n bits.
constexpr uint8_t kBoolPacked = 2;
// The encoder bit-packs small-range ints, dictionary codes and bools when they take at most this
// many bits (32 values): a byte each would waste 3 bits a value or more, which zstd's entropy
// coder, one table for a whole block of mixed columns, wins back only in part and slowly
// (wide10: 1% smaller and 20% faster to write with them packed).
constexpr uint8_t kMaxSmallPackedBits = 5;
constexpr uint8_t kBytesPlain = 0;
constexpr uint8_t kBytesDict = 1;
constexpr uint8_t kBytesHex = 2;     // str only: lowercase hex of even length, stored as bytes
constexpr uint8_t kBytesPacked = 3;  // every byte from an alphabet of <= 64: b-bit codes
constexpr uint8_t kMaxPackedBits = 6;
// A dictionary has at most this many entries (codes are at most 16 bits).
constexpr uint32_t kMaxDict = 1u << 16;
// Dictionary code layouts (the code width byte).
constexpr uint8_t kCodeBytes = 1;   // one byte a code
constexpr uint8_t kCode16 = 2;      // two bytes a code, little-endian
constexpr uint8_t kCodePlanes = 3;  // two bytes a code: n low bytes, then n high bytes
constexpr uint8_t kCodePacked = 4;  // a bits byte (1..16), then n codes of that many bits

// How the decoder holds a column, as read: what its WriteValue switches on, so that no value
// pays a second branch for it.
enum class Storage : uint8_t {
  kNil,
  kBool,            // a byte a value, 0 or 1
  kBoolBits,        // a bit a value
  kInt,             // plain, delta or delta-packed ints: rebuilt a chunk at a time (IntReader)
  kIntStep,         // first + i * step
  kIntPacked,       // base + b bits
  kFloat32,         // raw, big-endian as in msgpack
  kFloat64,         // raw, big-endian as in msgpack
  kFloat64Decimal,  // mantissa / 10^e; the mantissas in an IntReader
  kKeyRef,          // key column only: each key is the encoded value of one field
  // The bytes storages come last: WriteValue takes them as one case (see there).
  kBytesDict,    // codes into pre-encoded dictionary entries
  kBytesPacked,  // lengths (a chunk at a time) and a blob of b-bit codes of a small alphabet
  kBytesHex,     // lengths and a blob of the bytes the hex digits spell
  kBytesPlain,   // lengths and a blob of contents
};

// Nibble of a lowercase hex digit, 0xff for anything else.
struct HexTables {
  uint8_t nibble[256];
  char digits[256][2];
  constexpr HexTables() : nibble(), digits() {
    for (int c = 0; c < 256; ++c) nibble[c] = 0xff;
    for (int c = '0'; c <= '9'; ++c) nibble[c] = static_cast<uint8_t>(c - '0');
    for (int c = 'a'; c <= 'f'; ++c) nibble[c] = static_cast<uint8_t>(c - 'a' + 10);
    for (int b = 0; b < 256; ++b) {
      digits[b][0] = "0123456789abcdef"[b >> 4];
      digits[b][1] = "0123456789abcdef"[b & 15];
    }
  }
};
constexpr HexTables kHex;
constexpr uint8_t kFloatRaw = 0;
constexpr uint8_t kFloatDecimal = 1;  // float64 only: value = int / 10^e, bit-exact

constexpr double kPow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9};
constexpr int kMaxDecimalExponent = 9;

inline uint64_t DoubleBits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}
inline double BitsDouble(uint64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}

inline const char* ColumnTypeName(ColumnType t) {
  switch (t) {
    case ColumnType::kNil:
      return "nil";
    case ColumnType::kBool:
      return "bool";
    case ColumnType::kInt:
      return "int";
    case ColumnType::kFloat32:
      return "float32";
    case ColumnType::kFloat64:
      return "float64";
    case ColumnType::kStr:
      return "str";
    case ColumnType::kBin:
      return "bin";
    case ColumnType::kRawBytes:
      return "raw bytes";
    case ColumnType::kKeyRef:
      return "key reference";
  }
  return "unknown";
}

inline bool IsBytesType(ColumnType t) {
  return t == ColumnType::kStr || t == ColumnType::kBin || t == ColumnType::kRawBytes;
}

// The bytes every value starts a field with: the encoded field name (and, for field 0, the
// map header).
struct Prefix {
  uint8_t bytes[32] = {};
  ByteBuffer long_bytes;  // when len > 16
  size_t len = 0;
  ShortKey key{0, 0};
  // Two overlapping loads from either end compare any prefix of 4..16 bytes.
  uint64_t head64 = 0, tail64 = 0;
  uint32_t head32 = 0, tail32 = 0;

  void Set(const uint8_t* p, size_t n) {
    len = n;
    long_bytes.Clear();
    std::memset(bytes, 0, sizeof(bytes));
    if (n > 16) {
      long_bytes.Append(p, n);
    } else {
      std::memcpy(bytes, p, n);
      key = KeyShort(bytes, static_cast<uint32_t>(n));
      if (n >= 8) {
        head64 = LoadLE64(bytes);
        tail64 = LoadLE64(bytes + n - 8);
      }
      if (n >= 4) {
        head32 = LoadLE32(bytes);
        tail32 = LoadLE32(bytes + n - 4);
      }
    }
  }
  const uint8_t* data() const { return len > 16 ? long_bytes.data() : bytes; }
};

// Bits needed for codes 0..d-1 (at least 1).
inline uint8_t BitsFor(size_t d) {
  return d <= 2 ? 1 : static_cast<uint8_t>(64 - __builtin_clzll(static_cast<uint64_t>(d - 1)));
}

// Writes value(0..n-1), each `bits` (1..32) wide, least significant bits first, in
// ceil(n * bits / 8) bytes; returns the end.
template <typename Value>
inline uint8_t* PackFixedWidth(size_t n, uint32_t bits, uint8_t* w, Value value) {
  uint64_t acc = 0;
  uint32_t have = 0;
  for (size_t i = 0; i < n; ++i) {
    acc |= uint64_t{value(i)} << have;
    have += bits;
    if (have >= 32) {
      StoreLE32(w, static_cast<uint32_t>(acc));
      w += 4;
      acc >>= 32;
      have -= 32;
    }
  }
  for (; have > 0; have = have > 8 ? have - 8 : 0) {
    *w++ = static_cast<uint8_t>(acc);
    acc >>= 8;
  }
  return w;
}

// The `bits` (1..56) bits at bit offset `bit` of [base, end), least significant first, read
// without touching a byte outside [base, end).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint64_t BitsAt(const uint8_t* base, const uint8_t* end,
                                                    uint64_t bit, uint32_t bits) {
  const uint8_t* q = base + (bit >> 3);
  uint64_t v = 0;
  if (end - q >= 8) {
    v = LoadLE64(q);
  } else {
    for (int k = 0; q + k < end; ++k) v |= uint64_t{q[k]} << (8 * k);
  }
  return (v >> (bit & 7)) & ((uint64_t{1} << bits) - 1);  // bit & 7 + bits <= 63
}

// Whether the padding after the first `bits` bits of the ceil(bits / 8) bytes at p is zero.
inline bool PaddingIsZero(const uint8_t* p, uint64_t bits) {
  return bits % 8 == 0 || (p[bits / 8] >> (bits % 8)) == 0;
}

// Records are rebuilt this many at a time: columns stored as varints (plain and delta ints,
// decimal mantissas, byte lengths) are validated and sized in one pass when read, and decoded
// again a chunk at a time while rebuilding, so that what the decoder holds per value is bounded
// by the chunk, not by the payload (a varint byte would otherwise hold 8 bytes of scratch).
// Chunks start at multiples of kChunk, so record i's value sits at i % kChunk of its chunk.
constexpr size_t kChunk = 256;
constexpr size_t kChunkMask = kChunk - 1;
static_assert((kChunk & kChunkMask) == 0, "a power of two");

// A decoder error for a payload that breaks the format. (Out of line: error paths only.)
ABSL_ATTRIBUTE_NOINLINE inline absl::Status Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("corrupt COLUMNAR payload: ", what));
}

}  // namespace sluice::columnar_internal

#endif  // SLUICE_CODEC_COLUMNAR_INTERNAL_H_
