// A partition's object in the object store (docs/object-store.md, "Partition objects"): the
// winning frames of one stored partition (or segment) of a shuffle, back to back exactly as
// they were pushed (each a codec frame carrying its own checksums), then a footer indexing them,
// then a 16-byte trailer that says how long the footer is. A reader needs the object's size (the
// commit record in etcd holds it): it reads the trailer, then the footer, then any frame by a
// byte range, with no server that wrote it.
//
//   object:  frame 0 | frame 1 | ... | footer | trailer
//   trailer: u64 footer size | "SLPE" | u32 low bits of XXH3-64 of the 12 bytes before
//   footer:  "SLPO" | u8 version 2 | 3 zero bytes | u32 partition | u32 id length | shuffle id |
//            u32 winners | (u32 mapper, u64 attempt) each, mappers ascending |
//            u32 frames | (u32 mapper, u64 attempt, u64 offset, u32 size, u32 records,
//            u32 uncompressed size, u16 bounds size, the frame's key bounds) each, in object
//            order | u64 XXH3-64 of the footer before it
//   (version 2; version 1, read too, has no bounds: its frames may hold any key)
//
// All little-endian. The winners are every mapper the object stands for, those without a frame
// in this partition too, so that a reader knows a mapper with nothing here from one missing.
// Every byte is checked on the way in: the object store is not trusted.
#ifndef SLUICE_OBJSTORE_PARTITION_OBJECT_H_
#define SLUICE_OBJSTORE_PARTITION_OBJECT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::objstore {

struct ObjectFrame {
  uint32_t mapper = 0;
  uint64_t attempt = 0;
  uint64_t offset = 0;  ///< from the object's first byte
  uint32_t size = 0;    ///< the frame's bytes
  uint32_t records = 0;
  uint32_t uncompressed = 0;  ///< its payload's uncompressed size
  /// Its key bounds as the server stored them (codec/key_bounds.h's encoding, opaque here; at
  /// most kMaxFrameBoundsBytes; empty: not known, any key): a reader of a key range skips the
  /// frames whose bounds do not meet it.
  std::string bounds;
  bool operator==(const ObjectFrame& o) const {
    return mapper == o.mapper && attempt == o.attempt && offset == o.offset && size == o.size &&
           records == o.records && uncompressed == o.uncompressed && bounds == o.bounds;
  }
};

struct PartitionObjectFooter {
  /// The footer's layout: 2 (frames with key bounds), or 1 as an older object was written
  /// (EncodeFooter writes what it is given, so that a footer read re-encodes to its bytes).
  uint8_t version = 2;
  std::string shuffle_id;
  uint32_t partition = 0;
  /// (mapper, attempt) of every winner the object stands for, mappers ascending.
  std::vector<std::pair<uint32_t, uint64_t>> winners;
  /// Back to back from offset 0, in object order.
  std::vector<ObjectFrame> frames;

  /// The frames' bytes: where the footer starts.
  uint64_t frames_bytes() const {
    return frames.empty() ? 0 : frames.back().offset + frames.back().size;
  }
};

inline constexpr size_t kTrailerBytes = 16;
/// The most key bounds a frame's entry may carry (codec/key_bounds.h's take at most ~1.2 KiB).
inline constexpr size_t kMaxFrameBoundsBytes = 4096;
/// The most a footer may take (a partition of 2 million frames); larger is refused as damage.
inline constexpr uint64_t kMaxFooterBytes = 64u << 20;

/// The footer and the trailer, to follow the frames. The footer's frames must be back to back
/// from 0 and name winners (the encoder does not check; DecodeFooter does). Version 1 carries
/// no key bounds (the frames' are left out).
std::string EncodeFooter(const PartitionObjectFooter& footer);

/// The footer's size from an object's last kTrailerBytes; DATA_LOSS naming the damage when the
/// trailer is not one or does not fit `object_size`.
absl::StatusOr<uint64_t> FooterSize(absl::string_view trailer, uint64_t object_size);

/// The footer from its bytes (FooterSize of them, before the trailer), checked: its checksum,
/// the shuffle and partition the caller expects, winners ascending and once each, frames back
/// to back from 0 up to the footer (`object_size` - footer - trailer), each of a winner.
absl::StatusOr<PartitionObjectFooter> DecodeFooter(absl::string_view bytes, uint64_t object_size,
                                                   absl::string_view shuffle_id,
                                                   uint32_t partition);

}  // namespace sluice::objstore

#endif  // SLUICE_OBJSTORE_PARTITION_OBJECT_H_
