// PushAttempt: the rules of one mapper attempt's push, apart from any transport. The gRPC push
// reactor (server/service/push_reactor.cc) converts each stream message and forwards it here;
// tests drive the same rules without a stream.
//
//   PushAttempt attempt(&registry, limits);
//   SLUICE_RETURN_IF_ERROR(attempt.Open("job", /*mapper=*/3, /*attempt=*/1));
//   SLUICE_RETURN_IF_ERROR(attempt.AddFrame(/*partition=*/0, frame_bytes));
//   SLUICE_ASSIGN_OR_RETURN(PushSummary summary, attempt.Commit(/*frames=*/1, /*records=*/n));
//
// The rules: Open comes first and once; every frame is validated as a full decode would (keys
// rebuilt, values only checked) and appended to its partition before the next; Commit must
// name exactly the frames and records received, and makes the attempt durable and visible, or
// reports it a duplicate (another attempt of the mapper committed first) and discards its
// blocks. Any error ends the attempt: the caller calls Abort with it, which discards what was
// appended (unless a commit was tried: its record may be on disk, and recovery judges). An
// attempt destroyed before Commit or Abort is aborted.
//
// Not thread-safe: one caller at a time (a push stream handles one message at a time).
#ifndef SLUICE_SERVER_RULES_PUSH_ATTEMPT_H_
#define SLUICE_SERVER_RULES_PUSH_ATTEMPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/frame_decoder.h"
#include "codec/frame_format.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

struct PushLimits {
  FrameLimits frame;  ///< every pushed frame must decode within these
  /// Frames one attempt may push (each costs ~64 bytes and its key bounds of bookkeeping until it
  /// ends).
  uint64_t max_frames_per_attempt = uint64_t{1} << 20;
  /// New attempts are refused while the shuffle's data directory is fuller than this, in
  /// percent (--disk_high_water_pct; 0 = never): committed data and the pushes already running
  /// keep the room left.
  uint32_t disk_high_water_pct = 0;
  /// Attempts must be prepared, then decided (a server of a cluster: every replica must reflect
  /// the same winner); a plain commit is FAILED_PRECONDITION.
  bool require_prepare = false;
  /// The largest push message the transport reads (a PushFlow ask's limit): the wiring sets the
  /// transport's.
  uint64_t max_message_bytes = (uint64_t{1} << 20) + (64 << 10);
};

/// What a committed attempt amounted to.
struct PushSummary {
  bool duplicate = false;  ///< another attempt of the mapper had committed; this one discarded
  bool prepared = false;   ///< prepared (Commit with `prepare`): durable, for Resolve to decide
  uint64_t frames = 0, records = 0, bytes = 0;
};

class PushAttempt {
 public:
  PushAttempt(ShuffleRegistry* registry, PushLimits limits)
      : registry_(registry), limits_(limits) {}
  ~PushAttempt();
  PushAttempt(const PushAttempt&) = delete;
  PushAttempt& operator=(const PushAttempt&) = delete;

  /// NOT_FOUND for an unknown shuffle, INVALID_ARGUMENT for a mapper out of range or a second
  /// open, RESOURCE_EXHAUSTED past the disk high-water mark. `kept` (in a cluster): the partitions
  /// this server keeps; a frame for another one is refused with FAILED_PRECONDITION.
  absl::Status Open(std::string_view shuffle_id, uint32_t mapper, uint64_t attempt,
                    std::shared_ptr<const std::vector<bool>> kept = nullptr);
  /// Validates and appends one frame. INVALID_ARGUMENT names the frame, its partition and what
  /// is wrong; RESOURCE_EXHAUSTED past the frame limit or when the disk is full.
  absl::Status AddFrame(uint32_t partition, absl::Span<const uint8_t> frame);
  /// One frame of a push message.
  struct Frame {
    uint32_t partition = 0;
    absl::Span<const uint8_t> bytes;
  };
  /// Validates every frame of a message, then appends them all with one write; the first
  /// invalid frame fails the call (as AddFrame would) before anything is written.
  absl::Status AddFrames(absl::Span<const Frame> frames);
  /// Starts a frame that arrives in pieces (a frame larger than a push message): checks the
  /// partition and that `size` is within the frame cap before any piece is taken, so that a
  /// caller may reserve `size` bytes of memory first. Nothing but its pieces may follow until
  /// the frame is complete.
  absl::Status BeginLargeFrame(uint32_t partition, uint64_t size);
  /// Takes the next piece of the frame begun; the last one (the announced size reached) has the
  /// frame validated and appended as AddFrame would. INVALID_ARGUMENT for a piece with no frame
  /// begun, an empty piece, or pieces past the announced size.
  absl::Status AddPiece(absl::Span<const uint8_t> piece);
  /// The announced size of the frame being assembled from pieces; 0 when none is.
  uint64_t large_frame_size() const { return large_size_; }

  /// Commits the attempt; `frame_count` and `record_count` are what the pusher says it sent.
  /// With `prepare` (cluster mode), prepares it instead (ShuffleStore::Prepare): durable, not
  /// visible until the mapper's winner is resolved.
  absl::StatusOr<PushSummary> Commit(uint64_t frame_count, uint64_t record_count,
                                     bool prepare = false);
  /// Ends the attempt after an error (`why`, for the log): its blocks are discarded.
  void Abort(const absl::Status& why);

  bool opened() const { return store_ != nullptr; }
  /// Whether a frame for `partition` would pass the kept check now (true on its own).
  bool Keeps(uint32_t partition) const { return Kept(partition).ok(); }
  /// The partitions kept, read again (a huge partition's segment made since the open).
  void Rekeep(std::shared_ptr<const std::vector<bool>> kept) {
    if (kept != nullptr) kept_ = std::move(kept);
  }
  /// Frames, records and frame bytes taken so far (validated and appended).
  uint64_t frames() const { return frames_; }
  uint64_t records() const { return records_; }
  uint64_t bytes() const { return bytes_; }

 private:
  ShuffleRegistry* const registry_;
  // INVALID_ARGUMENT naming `what` while a large frame still awaits pieces.
  absl::Status NoLargeFramePending(const char* what) const;
  // FAILED_PRECONDITION for a partition kept on other servers of the cluster.
  absl::Status Kept(uint32_t partition) const;

  const PushLimits limits_;
  std::shared_ptr<ShuffleStore> store_;
  std::shared_ptr<const std::vector<bool>> kept_;
  uint32_t mapper_ = 0;
  uint64_t attempt_ = 0;
  std::vector<BlockRef> blocks_;
  std::vector<ShuffleStore::FrameToAppend> validated_;  // AddFrames' scratch
  std::string bounds_;                                  // their key bounds, back to back
  std::vector<size_t> bounds_at_;                       // where each frame's start in bounds_
  std::vector<std::string_view> bound_keys_;            // AppendFrameBounds' scratch
  uint64_t frames_ = 0, records_ = 0, bytes_ = 0;
  bool commit_tried_ = false;
  bool ended_ = false;  // committed or aborted
  // A frame arriving in pieces: its partition, announced size and the bytes so far.
  uint32_t large_partition_ = 0;
  uint64_t large_size_ = 0;
  std::string large_bytes_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_PUSH_ATTEMPT_H_
