#include "server/tier/partition_upload.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "objstore/partition_object.h"
#include "server/storage/shuffle_id.h"

namespace sluice {

absl::StatusOr<UploadedPartition> UploadPartition(
    const ShuffleStore& store, const std::string& shuffle_id, uint32_t partition,
    const std::vector<std::pair<uint32_t, uint64_t>>& winners, objstore::S3Store* s3,
    const std::string& key, const objstore::UploadOptions& options) {
  if (partition >= store.params().num_partitions) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", partition, " of shuffle '",
                                                   ShuffleName(shuffle_id), "' is out of range"));
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<objstore::ObjectUpload> up,
                          objstore::ObjectUpload::Start(s3, key, options));
  objstore::PartitionObjectFooter footer;
  footer.shuffle_id = shuffle_id;
  footer.partition = partition;
  footer.winners = winners;
  std::string frame;
  std::vector<uint32_t> mappers;
  std::vector<uint64_t> attempts;
  uint64_t at = 0;
  for (const auto& [mapper, attempt] : winners) {
    // (One look at the index: the mapper's blocks and the attempt committed here, together.)
    absl::StatusOr<std::vector<BlockRef>> blocks =
        store.CommittedBlocksOf(partition, {mapper}, &mappers, &attempts, /*with_bounds=*/true);
    if ((!blocks.ok() && absl::IsAborted(blocks.status())) ||
        (blocks.ok() && (attempts.size() != 1 || attempts[0] != attempt))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mapper ", mapper, " attempt ", attempt, " of shuffle '", ShuffleName(shuffle_id),
          "' is not the attempt committed on this server: partition ", partition,
          " is not uploaded from here"));
    }
    if (!blocks.ok()) return blocks.status();
    for (const BlockRef& b : *blocks) {
      SLUICE_RETURN_IF_ERROR(store.ReadFrame(b, &frame));
      SLUICE_RETURN_IF_ERROR(up->Append(frame));
      // (Bounds past what a footer takes, never made by a server, are left out: any key.)
      footer.frames.push_back(objstore::ObjectFrame{
          mapper, attempt, at, b.frame_size, b.records, b.uncompressed,
          b.bounds.size() <= objstore::kMaxFrameBoundsBytes ? b.bounds : std::string()});
      at += b.frame_size;
    }
  }
  SLUICE_RETURN_IF_ERROR(up->Append(objstore::EncodeFooter(footer)));
  UploadedPartition out;
  SLUICE_ASSIGN_OR_RETURN(out.object, up->Finish());
  out.frames = static_cast<uint32_t>(footer.frames.size());
  out.frame_bytes = at;
  out.winners = winners;
  return out;
}

}  // namespace sluice
