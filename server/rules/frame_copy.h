// FrameCopy: one (mapper, partition) copy into a store from elsewhere (a peer's replica, the
// object store): its frames checked end to end as they come, given key bounds like pushed
// frames (a range read and the split plan go by them; each frame is decoded for them, up to
// kMaxBoundsDecodeBytes uncompressed), appended; then made visible with one REPAIR record
// (ShuffleStore::Repair), or given back.
//
//   FrameCopy copy(&store, partition, mapper, attempt);
//   for (frame : frames) RETURN_IF_ERROR(copy.Add(frame, "server b"));
//   absl::Status st = copy.Commit();   // or copy.Discard()
//
// Not thread-safe.
#ifndef SLUICE_SERVER_RULES_FRAME_COPY_H_
#define SLUICE_SERVER_RULES_FRAME_COPY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/frame_decoder.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

class FrameCopy {
 public:
  /// Frames copied are decoded for their key bounds up to this size (uncompressed).
  static constexpr uint32_t kMaxBoundsDecodeBytes = 16u << 20;

  FrameCopy(ShuffleStore* store, uint32_t partition, uint32_t mapper, uint64_t attempt)
      : store_(store), partition_(partition), mapper_(mapper), attempt_(attempt) {
    // Any frame a server stored is within the largest cap (the cap may have been lowered
    // since).
    limits_.max_uncompressed_bytes = kMaxFrameCapBytes;
    limits_.max_records = UINT32_MAX;
    DecodeOptions o;
    o.limits = limits_;
    o.keys_only = true;  // (as a push validates: the bounds need the keys)
    decoder_ = std::make_unique<FrameDecoder>(o);
  }
  uint32_t mapper() const { return mapper_; }
  uint64_t bytes() const { return bytes_; }

  /// Checks one frame (from `source`, as messages name it) and appends it: DATA_LOSS when it
  /// fails its checks.
  /// `bounds`: its key bounds as its source gives them (a partition object's footer), kept
  /// when they are a valid encoding instead of decoding the frame for them.
  absl::Status Add(absl::Span<const uint8_t> frame, const std::string& source,
                   std::string_view bounds = {});
  absl::Status Commit() { return store_->Repair(mapper_, attempt_, partition_, blocks_); }
  void Discard() {
    store_->Discard(blocks_);
    blocks_.clear();
  }

 private:
  ShuffleStore* const store_;
  const uint32_t partition_, mapper_;
  const uint64_t attempt_;
  FrameLimits limits_;
  std::unique_ptr<FrameDecoder> decoder_;
  DecodedFrame decoded_;
  std::string bounds_;
  std::vector<std::string_view> bound_keys_;
  std::vector<BlockRef> blocks_;
  uint64_t bytes_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_FRAME_COPY_H_
