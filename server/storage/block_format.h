// The bytes of a shuffle directory's files besides its commit log (docs/storage.md): SHUFFLE,
// the shuffle's parameters, and the block header in front of every frame of the data file.
// Each is written and read here, side by side; commits.log's records are CommitLog's.
//
//   SHUFFLE  "SLSH", u8 layout version (3), u32 partitions, u32 mappers, u32 id length, the id,
//            u64 XXH3 of everything before it
//   EVICTED  "SLEV", u8 version (1), u32 partitions, u32 winners, then each winner's u32 mapper
//            and u64 attempt, then each partition's u64 records, u64 bytes, u32 frames; u64 XXH3
//            of everything before it (an evicted shuffle: ShuffleStore::evicted())
//   block    "SLBK", u8 version (2), u16 partition, a zero byte, u32 mapper, u64 attempt,
//            u32 frame size, u32 records, u32 check of the 28 bytes before it; then the frame
//
// All little-endian. Layouts 1 and 2 (one file per partition) were never released and are not
// read: such a shuffle is reported damaged (DATA_LOSS naming its layout), kept, and deletable.
#ifndef SLUICE_SERVER_STORAGE_BLOCK_FORMAT_H_
#define SLUICE_SERVER_STORAGE_BLOCK_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/storage/commit_log.h"

namespace sluice {

struct ShuffleParams {
  std::string shuffle_id;
  uint32_t num_partitions = 0;
  uint32_t num_mappers = 0;  ///< 0 = not known in advance
};

struct PartitionStats {
  uint64_t records = 0;
  uint64_t bytes = 0;  ///< frame bytes
  uint32_t frames = 0;
};

/// What an evicted shuffle held here when its data was let go (docs/object-store.md, "Disks as
/// a cache"): its partitions are read from their objects again when asked for, and until then
/// its status answers with what it held.
struct EvictedSummary {
  std::map<uint32_t, uint64_t> winners;  ///< mapper -> its committed attempt
  std::vector<PartitionStats> partitions;
};

inline constexpr char kParamsFile[] = "SHUFFLE";
inline constexpr char kEvictedFile[] = "EVICTED";
/// A server without etcd: the shuffle's objects in the object store (its manifest's JSON,
/// objstore/object_record.h), the commit point of its uploads (docs/object-store.md, "A server
/// on its own").
inline constexpr char kObjectsFile[] = "OBJECTS";
/// Largest OBJECTS file read (a record is ~250 bytes; 2^16 partitions and their segments).
inline constexpr size_t kMaxObjectsFile = size_t{64} << 20;
inline constexpr char kDataFile[] = "data";
/// Largest SHUFFLE file read (an id is at most 128 bytes).
inline constexpr size_t kMaxParamsFile = 1 << 16;
inline constexpr size_t kBlockHeaderSize = 32;
/// Most partitions a shuffle may have (a block header names its partition in 16 bits).
inline constexpr uint32_t kMaxPartitions = 1u << 16;

std::string EncodeParams(const ShuffleParams& params);
/// The parameters in a SHUFFLE file's bytes. DATA_LOSS naming `path` (as messages show it) for
/// bytes that are not a valid file, or a file of an earlier layout.
absl::StatusOr<ShuffleParams> DecodeParams(const std::string& bytes, const std::string& path);

std::string EncodeEvicted(const EvictedSummary& e);
/// DATA_LOSS naming `path` for bytes that are not a valid EVICTED file of `partitions`
/// partitions.
absl::StatusOr<EvictedSummary> DecodeEvicted(const std::string& bytes, uint32_t partitions,
                                             const std::string& path);
/// Largest EVICTED file read: a winner for each of 2^24 mappers and every partition.
inline constexpr size_t kMaxEvictedFile = (size_t{12} << 24) + 20 * size_t{kMaxPartitions} + 64;

/// Writes the header of a block of `partition` into h[0, kBlockHeaderSize).
void WriteBlockHeader(uint32_t partition, uint32_t mapper, uint64_t attempt, uint32_t frame_size,
                      uint32_t records, uint8_t* h);
/// Whether the block header at `h` is the one of `block` of that attempt (every field and the
/// check).
bool BlockHeaderMatches(const uint8_t* h, uint32_t mapper, uint64_t attempt, const BlockRef& block);

inline absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

}  // namespace sluice

#endif  // SLUICE_SERVER_STORAGE_BLOCK_FORMAT_H_
