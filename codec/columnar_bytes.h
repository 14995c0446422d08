// Internal to codec/: the COLUMNAR layout's bytes columns (str, bin, raw keys) stored value by
// value, writer and reader side by side: plain (lengths, then the contents back to back), hex
// (lowercase hex strings as the bytes they spell) and packed (bytes of a small alphabet as b-bit
// codes, 16 at a time with bitpack.h's kernels where the CPU has them). Dictionaries are in
// columnar_dict.h. docs/frame-format.md describes the bytes.
//
// The reader validates a column's lengths once when it is read and decodes them again a chunk
// (kChunk values) at a time while the records are rebuilt. What runs per value is inline here.
#ifndef SLUICE_CODEC_COLUMNAR_BYTES_H_
#define SLUICE_CODEC_COLUMNAR_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "codec/bitpack.h"
#include "codec/buffer.h"
#include "codec/columnar.h"
#include "codec/columnar_internal.h"
#include "codec/endian.h"
#include "codec/msgpack_scan.h"
#include "codec/varint.h"

namespace sluice::columnar_internal {

// --- Writer

// A bytes column's values as the encoder holds them: pointers into the records, not copies.
struct BytesValues {
  ColumnType type;  // kStr, kBin or kRawBytes
  size_t n;
  const uint8_t* const* ptrs;  // where each value's content starts
  const uint32_t* lens;        // content lengths
  uint64_t total_len;          // sum of lens
};

// The most SerializeBytes writes for n values of total_len bytes: the encoding byte, the
// lengths, the contents, and for packed columns the bits byte, the alphabet and 8 bytes of store
// slack.
inline size_t MaxBytesSize(size_t n, uint64_t total_len) {
  return 1 + kMaxVarintBytes + n * 5 + total_len + 3 + 64 + 8;
}

// Writes the column (after its type byte) at w as hex, packed or plain bytes, the first that
// applies; returns the end and sets *bulk to where the contents start.
uint8_t* SerializeBytes(const BytesValues& values, uint8_t* w, uint8_t** bulk);

// --- Reader

// The msgpack header of a rebuilt value of type t (str, bin, or raw bytes: none).
inline size_t BytesHeaderSize(ColumnType t, uint64_t len) {
  return t == ColumnType::kStr ? mp::StrHeaderSize(len)
                               : (t == ColumnType::kBin ? mp::BinHeaderSize(len) : 0);
}
inline uint8_t* WriteBytesHeader(ColumnType t, uint8_t* w, uint32_t len) {
  if (t == ColumnType::kStr) return mp::WriteStrHeader(w, len);
  if (t == ColumnType::kBin) return mp::WriteBinHeader(w, len);
  return w;
}

// A plain, hex or packed bytes column as read.
struct BytesReader {
  // The length varints (validated), a cursor into them while rebuilding, and the current
  // chunk's lengths.
  const uint8_t* lens_src = nullptr;
  const uint8_t* lens_cursor = nullptr;
  PodBuffer<uint32_t> lens;       // kChunk lengths
  const uint8_t* blob = nullptr;  // contents (or the bytes hex digits spell, or codes)
  const uint8_t* blob_end = nullptr;
  // Packed: `bits`-bit codes; symbols[code] is the byte.
  uint8_t bits = 0;
  uint8_t symbols[1 << kMaxPackedBits] = {};

  // Starts the second pass over the lengths.
  void StartStream() {
    lens_cursor = lens_src;
    lens.Resize(kChunk);
  }
  // Decodes the next m (<= kChunk) lengths.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void FillChunk(size_t m) {
    const uint8_t* p = lens_cursor;
    uint32_t* out = lens.data();
    for (size_t k = 0; k < m; ++k) out[k] = static_cast<uint32_t>(GetValidatedVarint(&p));
    lens_cursor = p;
  }
};

// What ReadLengths found: `count` lengths (varints) from `lens`, summing to `sum` content bytes
// whose msgpack headers take `headers` bytes, then the blob [blob, blob_end).
struct BytesLengths {
  const uint8_t* lens;
  uint64_t sum;
  uint64_t headers;
  const uint8_t* blob;
  const uint8_t* blob_end;
};
// Reads and validates `count` lengths and the blob they measure at *pp (a column's values, or a
// dictionary's entries); moves *pp past them. Values of type `type` rebuild to hex_factor times
// their stored length; with packed_bits (1..kMaxPackedBits, else 0) each is stored as that many
// bits a byte.
absl::Status ReadLengths(const uint8_t** pp, const uint8_t* end, uint64_t count,
                         absl::string_view name, ColumnType type, uint32_t hex_factor,
                         uint8_t packed_bits, BytesLengths* out);

// Reads and validates a column of n values stored with `encoding` (kBytesPlain, kBytesHex or
// kBytesPacked; *pp is past the encoding byte) into *r; moves *pp past it, says how it is
// stored and sets *rebuilt to the bytes its values rebuild to.
absl::Status ReadBytes(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                       ColumnType type, uint8_t encoding, Storage* storage, BytesReader* r,
                       uint64_t* rebuilt);

// Whether the padding bits after each of the n values of a packed column are zero (the check
// rebuilding a value makes, for columns the keys-only rebuild skips).
bool PackedPaddingIsZero(const BytesReader& r, size_t n);

// --- Per value: record i's msgpack encoding at w (which has kSlack spare bytes); each takes its
// length from the current chunk, its bytes from *blob_cursor (moved past them), and returns the
// end.

// Copies len bytes; short copies run as one fixed 16-byte move when both sides allow it.
inline uint8_t* CopySmall(uint8_t* w, const uint8_t* src, const uint8_t* src_end, size_t len) {
  if (len <= 16 && src_end - src >= 16) {
    std::memcpy(w, src, 16);  // w always has kSlack spare bytes
  } else if (len != 0) {
    std::memcpy(w, src, len);
  }
  return w + len;
}

// Unpacks len bytes of a packed column with B-bit codes from src to w; returns the source
// past them. Non-zero padding bits set *bad.
template <uint32_t B>
inline const uint8_t* UnpackBits(const uint8_t* sym, const uint8_t* src, const uint8_t* src_end,
                                 uint32_t len, uint8_t* w, uint32_t* bad) {
  constexpr uint64_t kMask = (uint64_t{1} << B) - 1;
  uint32_t k = 0;
  if constexpr (B == 6) {  // 16 codes at a time where the CPU can
    if (len >= 16 && bitpack::HaveSimd()) {
      const uint32_t groups = len / 16;
      if (static_cast<size_t>(src_end - src) >= size_t{groups} * 12 + 4) {
        src = bitpack::Unpack6(src, groups, sym, w);
        k = groups * 16;
      }
    }
  }
  for (; k + 8 <= len; k += 8) {  // 8 codes in exactly B bytes
    uint64_t v;
    if (ABSL_PREDICT_TRUE(src_end - src >= 8)) {
      v = LoadLE64(src);
    } else {
      v = 0;
      std::memcpy(&v, src, B);
    }
    src += B;
    for (uint32_t j = 0; j < 8; ++j) w[k + j] = sym[(v >> (B * j)) & kMask];
  }
  if (k < len) {
    const uint32_t rest = len - k;
    const uint32_t nbytes = (rest * B + 7) / 8;
    uint64_t v = 0;
    std::memcpy(&v, src, nbytes);
    src += nbytes;
    for (uint32_t j = 0; j < rest; ++j) w[k + j] = sym[(v >> (B * j)) & kMask];
    if ((v >> (rest * B)) != 0) *bad = 1;  // padding bits must be zero
  }
  return src;
}

// Unpacks len bytes of a packed column from src to w, and moves *blob_cursor past them.
inline uint8_t* Unpack(const BytesReader& c, const uint8_t* src, uint32_t len,
                       const uint8_t** blob_cursor, uint8_t* w, uint32_t* bad) {
  const uint8_t* sym = c.symbols;
  switch (c.bits) {  // the same for every value of the column: predicted
    case 6:
      *blob_cursor = UnpackBits<6>(sym, src, c.blob_end, len, w, bad);
      break;
    case 5:
      *blob_cursor = UnpackBits<5>(sym, src, c.blob_end, len, w, bad);
      break;
    case 4:
      *blob_cursor = UnpackBits<4>(sym, src, c.blob_end, len, w, bad);
      break;
    case 3:
      *blob_cursor = UnpackBits<3>(sym, src, c.blob_end, len, w, bad);
      break;
    case 2:
      *blob_cursor = UnpackBits<2>(sym, src, c.blob_end, len, w, bad);
      break;
    default:
      *blob_cursor = UnpackBits<1>(sym, src, c.blob_end, len, w, bad);
      break;
  }
  return w + len;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WritePlain(const BytesReader& c, ColumnType type,
                                                        size_t i, const uint8_t** blob_cursor,
                                                        uint8_t* w) {
  const uint32_t len = c.lens[i & kChunkMask];
  const uint8_t* src = *blob_cursor;
  *blob_cursor = src + len;
  w = WriteBytesHeader(type, w, len);
  return CopySmall(w, src, c.blob_end, len);
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteHex(const BytesReader& c, ColumnType type,
                                                      size_t i, const uint8_t** blob_cursor,
                                                      uint8_t* w) {
  const uint32_t len = c.lens[i & kChunkMask];
  const uint8_t* src = *blob_cursor;
  *blob_cursor = src + len;
  w = WriteBytesHeader(type, w, 2 * len);
  for (uint32_t k = 0; k < len; ++k) {
    std::memcpy(w, kHex.digits[src[k]], 2);
    w += 2;
  }
  return w;
}
// Non-zero padding bits set *bad.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WritePacked(const BytesReader& c, ColumnType type,
                                                         size_t i, const uint8_t** blob_cursor,
                                                         uint8_t* w, uint32_t* bad) {
  const uint32_t len = c.lens[i & kChunkMask];
  const uint8_t* src = *blob_cursor;
  *blob_cursor = src + len;
  w = WriteBytesHeader(type, w, len);
  return Unpack(c, src, len, blob_cursor, w, bad);
}
// A raw key: its bytes as they are.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteRaw(const BytesReader& c, size_t i,
                                                      const uint8_t** blob_cursor, uint8_t* w) {
  const uint32_t len = c.lens[i & kChunkMask];
  w = CopySmall(w, *blob_cursor, c.blob_end, len);
  *blob_cursor += len;
  return w;
}

}  // namespace sluice::columnar_internal

#endif  // SLUICE_CODEC_COLUMNAR_BYTES_H_
