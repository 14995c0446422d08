// PartitionedWriter: the mapper side of the client, apart from the transport. Add() routes each
// record to its partition (WriterOptions::partitioner) and appends it to the writer's one fill:
// every partition's records back to back in pooled chunks, with a 24-byte entry each. When the
// fill passes the budget, the partitions holding the larger half of its bytes (chosen largest
// first),
// and every partition of 64 KiB or more, go to a sender thread; the others' records are copied
// into the next fill, so a small partition is sent when it is among the largest (frames ~1.5x
// the budget's even share of a partition in a wide writer, and a skewed writer's small
// partitions are not sent a few records at a time). The sender groups
// the fill by partition (a stable counting sort), sorts each partition's records by key (for
// KEY-ordered shuffles), encodes them into frames of at most frame_bytes and sends them on the
// partition's PushStream, which packs small frames into shared messages, while Add() fills the
// next (one fill in flight; Add() waits for it before handing over another). Close() sends
// everything left and commits every stream.
//
// One writer may feed several streams (a cluster client sends each partition to every server
// that holds a replica of it): `routes[p]` names partition p's streams; each of its frames is
// encoded once and sent on all of them. Close() sends every stream its commit, then waits for
// every answer; the first failure cancels the rest (a stream committed before it stays
// committed). With a `decide` step (cluster mode: the streams only prepared), Close() then
// calls it, and its answer says whether the attempt won.
//
// Memory follows the records, not the partition count (a writer of thousands of partitions
// with a few records in each holds no chunk per partition): at most two fills (the one
// being filled and the one being sent), each up to the budget (its chunks, and 56 bytes a
// record: its entry and the sender's view of it), in chunks reused from fill to fill; besides,
// the sender's sort scratch (32 bytes a record of the largest partition of a fill) and, per
// partition, up to 20 bytes of counters (and, with routes, its route). A flush sends at most
// one frame per partition it sends (more only past frame_bytes), and copies at most as many
// budget bytes as it sends (a record counts its key, value and 56 bytes). Not thread-safe (one
// mapper).
#ifndef SLUICE_CLIENT_PARTITIONED_WRITER_H_
#define SLUICE_CLIENT_PARTITIONED_WRITER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "codec/frame_encoder.h"
#include "codec/frame_format.h"

namespace sluice {
namespace client_internal {
class ChunkPool;
struct Fill;
}  // namespace client_internal

class PartitionedWriter final : public ShuffleWriter {
 public:
  /// Decides the attempt once every stream prepared: the mapper's winning attempt.
  using Decider = std::function<absl::StatusOr<uint64_t>()>;
  /// Huge partitions in a cluster (docs/cluster.md, "Huge partitions"): each placement node's
  /// stream (-1: none), and the segments known as the writer opens. A partition's frames go to
  /// its newest segment whose servers all have a stream here; segments the streams tell of
  /// later are taken as they come.
  struct SegmentRouting {
    std::vector<int> stream_of_node;
    std::vector<SegmentNotice> segments;
  };
  /// `routes` empty: every partition goes to streams[0]. INVALID_ARGUMENT for no streams, a
  /// partition without a route, a route to a stream that does not exist, or zero partitions.
  static absl::StatusOr<std::unique_ptr<PartitionedWriter>> Make(
      uint32_t num_partitions, std::vector<std::unique_ptr<PushStream>> streams,
      std::vector<std::vector<uint32_t>> routes, WriterOptions options, FrameLimits limits,
      Decider decide = nullptr, uint64_t attempt = 0,
      std::optional<SegmentRouting> segments = std::nullopt);
  /// Frames sent to huge partitions' segments (not to the partitions themselves).
  uint64_t segment_frames() const { return segment_frames_; }
  ~PartitionedWriter() override;  // without Close(): the attempt is discarded

  absl::Status Add(std::string_view key, std::string_view value) override;
  absl::StatusOr<WriteResult> Close() override;
  void Abort() override;

  /// A flush carries a partition's records into the next fill only while it holds less.
  static constexpr uint64_t kCarryBelow = 64u << 10;
  /// Largest WriterOptions::buffer_bytes (a fill's records are counted in 32 bits).
  static constexpr size_t kMaxBufferBytes = size_t{64} << 30;
  /// Bytes the fill holds now (what the budget counts).
  size_t buffered_bytes() const { return buffered_; }

 private:
  struct Job;  // a fill, on its way to the sender
  PartitionedWriter(uint32_t num_partitions, std::vector<std::unique_ptr<PushStream>> streams,
                    const std::vector<std::vector<uint32_t>>& routes, WriterOptions options,
                    FrameLimits limits, Decider decide, uint64_t attempt,
                    std::optional<SegmentRouting> segments);
  // Stored partition q's streams (a partition's, or a segment's).
  absl::Span<const uint32_t> Route(uint32_t q) const;
  // Takes a segment a server told of: routed if each of its servers has a stream here.
  void Learn(const SegmentNotice& s);
  // The segments the streams of `route` told of since (all streams: empty route).
  void TakeSegments(absl::Span<const uint32_t> route);
  // Counts a record's bytes for its partition in the fill being filled.
  void Count(uint32_t partition, uint64_t bytes);
  // Hands the fill to the sender (waiting while one is in flight) and starts the next; unless
  // `all`, the partitions holding the smaller half of its bytes stay for the next (CarryOver).
  absl::Status Flush(bool all);
  void CarryOver(client_internal::Fill& next);
  void SendLoop();
  absl::Status SendFill(const client_internal::Fill& fill, FrameEncoder& encoder);
  absl::Status Send(uint32_t partition, absl::Span<Record> records, FrameEncoder& encoder);
  void StopSender();
  void CancelStreams();

  const FrameLimits limits_;
  WriterOptions options_;
  const uint32_t num_partitions_;
  std::vector<std::unique_ptr<PushStream>> streams_;
  std::vector<uint32_t> route_begin_;    // per partition, and one past (empty: all to stream 0)
  std::vector<uint32_t> route_streams_;  // the routes, back to back
  // Huge partitions (the sender's): per partition, the stored partition its frames go to
  // (empty: no segments); each routed segment's streams; each placement node's stream.
  std::vector<uint32_t> target_;
  std::map<uint32_t, std::vector<uint32_t>> segment_routes_;
  std::vector<int> stream_of_node_;
  uint64_t segment_frames_ = 0;
  const Decider decide_;
  const uint64_t attempt_;  // (with decide_: what the decision is compared with)
  std::unique_ptr<client_internal::ChunkPool> pool_;
  std::unique_ptr<Job> fill_;  // being filled by Add()
  size_t buffered_ = 0;
  // The fill's bytes per partition as the budget counts them (key, value and kPerRecord a
  // record; made at the first Add), the partitions it holds records of, and their sum.
  std::vector<uint64_t> part_bytes_;
  std::vector<uint32_t> touched_;
  uint64_t fill_data_ = 0;
  bool finished_ = false;
  // Per stream: written by the sender, read after it stopped.
  std::vector<uint64_t> frames_, records_;
  WriteResult sent_;  // the attempt's frames, records and frame bytes (each replica's copy once)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> jobs_;  // at most one: the fill being sent
  std::unique_ptr<Job> spare_;             // the last one sent, its arrays kept for reuse
  bool stopping_ = false;
  absl::Status send_error_;
  // The sender's: grouping counters (per partition), the grouped records, the sort's scratch.
  std::vector<uint32_t> group_start_, group_at_;
  std::vector<Record> grouped_;
  std::vector<Record> sort_scratch_;
  std::thread sender_;
};

}  // namespace sluice

#endif  // SLUICE_CLIENT_PARTITIONED_WRITER_H_
