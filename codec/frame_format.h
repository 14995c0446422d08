// The Sluice frame: a fixed 32-byte little-endian header followed by a payload.
//
// A frame carries a batch of records (key bytes, value bytes). The header's one-byte format
// tag says how the records are laid out in the payload, so a reader needs no configuration:
// the writer may pick a different layout for every frame. docs/frame-format.md describes
// every byte; this header is the single source of the numbers.
//
//   offset size field
//   0      4    magic "SLCF"
//   4      1    version (1)
//   5      1    format tag (Layout)
//   6      1    compression (Compression)
//   7      1    flags (bit 0: records sorted by key; other bits must be 0)
//   8      4    record count
//   12     4    uncompressed payload size
//   16     4    stored payload size (bytes that follow the header)
//   20     8    XXH3-64 of the stored payload
//   28     4    low 32 bits of XXH3-64 of header bytes [0, 28)
#ifndef SLUICE_CODEC_FRAME_FORMAT_H_
#define SLUICE_CODEC_FRAME_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice {

/// One record: an opaque key and value. Views never own their bytes.
struct Record {
  std::string_view key;
  std::string_view value;
};

/// Keys order by unsigned lexicographic byte comparison; on a common prefix the shorter key
/// comes first. This is the order of a KEY-ordered fetch and of sorted frames.
inline int CompareKeys(std::string_view a, std::string_view b) {
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  const auto* pa = reinterpret_cast<const unsigned char*>(a.data());
  const auto* pb = reinterpret_cast<const unsigned char*>(b.data());
  if (n >= 8) {  // the first 8 bytes as one big-endian word decide most comparisons
    uint64_t x, y;
    std::memcpy(&x, pa, 8);
    std::memcpy(&y, pb, 8);
    if (x != y) return __builtin_bswap64(x) < __builtin_bswap64(y) ? -1 : 1;
    const int c = std::memcmp(pa + 8, pb + 8, n - 8);
    if (c != 0) return c;
  } else {
    for (size_t i = 0; i < n; ++i) {  // short keys: no call
      if (pa[i] != pb[i]) return pa[i] < pb[i] ? -1 : 1;
    }
  }
  return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
}
inline bool KeyLess(std::string_view a, std::string_view b) { return CompareKeys(a, b) < 0; }

/// The first 8 bytes of a key, big-endian, zero-padded: KeyPrefix(a) < KeyPrefix(b) implies
/// a < b, so most comparisons need no memcmp (a merge or sort caches it per record).
inline uint64_t KeyPrefix(std::string_view k) {
  uint8_t b[8] = {};
  if (!k.empty()) std::memcpy(b, k.data(), k.size() < 8 ? k.size() : 8);
  uint64_t v;
  std::memcpy(&v, b, 8);
  return __builtin_bswap64(v);  // little-endian hosts
}
/// CompareKeys given both keys' KeyPrefix.
inline int CompareKeysWithPrefix(std::string_view a, uint64_t pa, std::string_view b, uint64_t pb) {
  if (pa != pb) return pa < pb ? -1 : 1;
  if (a.size() <= 8 && b.size() <= 8) {  // equal up to their lengths: the shorter first
    return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
  }
  return CompareKeys(a, b);
}

/// Sorts records by key, keeping the order of equal keys (like std::stable_sort with KeyLess,
/// faster: it sorts 16-byte entries by cached key prefixes). `scratch` is reused across calls.
void StableSortByKey(absl::Span<Record> records, std::vector<Record>* scratch);

/// How records are laid out in the payload (the format tag).
enum class Layout : uint8_t {
  kOpaque = 0x00,    ///< keys and values are opaque byte strings
  kMsgpack = 0x01,   ///< each value is one msgpack object; rows form a msgpack stream
  kColumnar = 0x02,  ///< values are msgpack maps of one shape, stored column by column
};
/// The encoder may also be asked to choose (never written to a header).
enum class LayoutChoice : uint8_t { kOpaque = 0, kMsgpack = 1, kColumnar = 2, kAuto = 0xff };

/// How a frame's payload is stored. kZstdSections (docs/frame-format.md) is written by the
/// encoder when asked for kZstd and the layout marked byte ranges an entropy coder cannot shrink:
/// those ("plain" sections) are compressed apart, at a zstd level without literal entropy coding.
enum class Compression : uint8_t { kNone = 0, kZstd = 1, kZstdSections = 2 };

const char* LayoutName(Layout layout);
const char* LayoutChoiceName(LayoutChoice choice);
const char* CompressionName(Compression compression);
/// Parses "opaque", "msgpack", "columnar" or "auto" (case-insensitive).
absl::StatusOr<LayoutChoice> ParseLayoutChoice(std::string_view name);

inline constexpr size_t kFrameHeaderSize = 32;
inline constexpr char kFrameMagic[4] = {'S', 'L', 'C', 'F'};
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr uint8_t kFlagSortedByKey = 0x01;
inline constexpr uint8_t kKnownFlags = kFlagSortedByKey;
/// Default cap on any decoded size (payload after decompression, rebuilt records).
inline constexpr uint32_t kDefaultMaxUncompressedBytes = 64u << 20;
/// The largest max_uncompressed_bytes anything may be configured with (a server's
/// --max_frame_mb is at most 1024): a frame stored under any cap is within it.
inline constexpr uint32_t kMaxFrameCapBytes = 1u << 30;
/// Default cap on the record count of one frame.
inline constexpr uint32_t kDefaultMaxRecords = 4u << 20;
// kZstdSections (docs/frame-format.md): the flags byte's bits, the level plain sections are
// compressed at (zstd's fast levels store literals without entropy coding, and still find
// repeats), and how many sections a frame may have.
inline constexpr uint8_t kSectionsEntropyZstd = 0x01;
inline constexpr uint8_t kSectionsPlainZstd = 0x02;
inline constexpr int kPlainSectionLevel = -1;
inline constexpr uint32_t kMaxSections = 1u << 16;

/// The decoded header fields.
struct FrameHeader {
  Layout layout = Layout::kOpaque;
  Compression compression = Compression::kNone;
  uint8_t flags = 0;
  uint32_t record_count = 0;
  uint32_t uncompressed_size = 0;
  uint32_t stored_size = 0;
  uint64_t payload_checksum = 0;

  bool sorted_by_key() const { return (flags & kFlagSortedByKey) != 0; }
  size_t frame_size() const { return kFrameHeaderSize + stored_size; }
};

/// Limits applied to untrusted frames.
struct FrameLimits {
  uint32_t max_uncompressed_bytes = kDefaultMaxUncompressedBytes;
  uint32_t max_records = kDefaultMaxRecords;
};

/// Writes `h` (with its header checksum) to `out[0, kFrameHeaderSize)`.
void WriteFrameHeader(const FrameHeader& h, uint8_t* out);

/// Parses and validates a header from the first kFrameHeaderSize bytes of `bytes`: magic,
/// version, header checksum, known tags and flags, and sizes within `limits`. Does not look at
/// the payload. `bytes` may hold more than one frame; use frame_size() to step.
absl::StatusOr<FrameHeader> ParseFrameHeader(absl::Span<const uint8_t> bytes,
                                             const FrameLimits& limits = {});

/// XXH3-64 of `n` bytes (the payload checksum).
uint64_t PayloadChecksum(const uint8_t* data, size_t n);

/// PayloadChecksum of bytes given piece by piece (a frame read in bounded pieces).
class PayloadHasher {
 public:
  PayloadHasher();
  ~PayloadHasher();
  PayloadHasher(const PayloadHasher&) = delete;
  PayloadHasher& operator=(const PayloadHasher&) = delete;
  void Update(const uint8_t* data, size_t n);
  /// PayloadChecksum of everything given so far.
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t (xxhash.h stays out of this header)
};

}  // namespace sluice

#endif  // SLUICE_CODEC_FRAME_FORMAT_H_
