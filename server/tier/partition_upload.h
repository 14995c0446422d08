// The object tier's upload of one stored partition (docs/object-store.md, "Uploading a
// partition"): its winners' committed frames, read from the shuffle's store in mapper order and
// sent as stored (no decoding, no re-encoding: each frame keeps its own checksums), then the
// footer that indexes them (objstore/partition_object.h), as one object of the store.
//
// The caller decides which partitions to upload, and when: every mapper decided, this replica
// whole for the partition (a mapper with no frames here must have none for it anywhere), this
// server the one that uploads it. UploadPartition only checks that each winner is the attempt
// committed here.
#ifndef SLUICE_SERVER_TIER_PARTITION_UPLOAD_H_
#define SLUICE_SERVER_TIER_PARTITION_UPLOAD_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "objstore/object_upload.h"
#include "objstore/s3_store.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

struct UploadedPartition {
  objstore::ObjectInfo object;  ///< key, size, ETag
  uint32_t frames = 0;
  uint64_t frame_bytes = 0;  ///< the frames' bytes (the object less its footer and trailer)
  std::vector<std::pair<uint32_t, uint64_t>> winners;
};

/// Uploads partition `partition` of `store` (shuffle `shuffle_id`) as object `key` of `s3`:
/// the frames of each (mapper, attempt) of `winners` (mappers ascending), then the footer.
/// FAILED_PRECONDITION when a winner is not the attempt committed here (nothing is left in the
/// store: the upload is aborted); the store's and the frames' errors as they are (a frame found
/// damaged is DATA_LOSS and marks its partition, as any read does).
absl::StatusOr<UploadedPartition> UploadPartition(
    const ShuffleStore& store, const std::string& shuffle_id, uint32_t partition,
    const std::vector<std::pair<uint32_t, uint64_t>>& winners, objstore::S3Store* s3,
    const std::string& key, const objstore::UploadOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVER_TIER_PARTITION_UPLOAD_H_
