// PartitionedWriter: the mapper side of the client, apart from the transport. Add() routes each
// record to its partition's buffer (WriterOptions::partitioner); when all buffers together pass
// the budget the largest is flushed (or, when even the largest holds under 1/16 of the budget,
// as in a writer of thousands of partitions, the largest ones together, in one hand-over,
// until half the budget is free): a
// sender thread sorts each (for KEY-ordered shuffles), encodes it into frames of at most
// frame_bytes and sends them on the partition's PushStream, which packs small frames into
// shared messages, while Add() goes on (at most two flushes in flight, then Add() waits).
// Close() flushes the rest and commits every stream.
//
// One writer may feed several streams (a cluster client sends each partition to every server
// that holds a replica of it): `routes[p]` names partition p's streams; each of its frames is
// encoded once and sent on all of them. Close() sends every stream its commit, then waits for
// every answer; the first failure cancels the rest (a stream committed before it stays
// committed). With a `decide` step (cluster mode: the streams only prepared), Close() then
// calls it, and its answer says whether the attempt won.
//
// Memory: buffers grow in fixed-size chunks from a pool the partitions share and give them back
// once sent, so what a writer holds follows the budget, not every partition's largest size so
// far, and is reused rather than fetched fresh. Not thread-safe (one mapper).
#ifndef SLUICE_CLIENT_PARTITIONED_WRITER_H_
#define SLUICE_CLIENT_PARTITIONED_WRITER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "codec/frame_encoder.h"
#include "codec/frame_format.h"

namespace sluice {
namespace client_internal {
struct PartitionBuffer;
}  // namespace client_internal

class PartitionedWriter final : public ShuffleWriter {
 public:
  /// Decides the attempt once every stream prepared: the mapper's winning attempt.
  using Decider = std::function<absl::StatusOr<uint64_t>()>;
  /// `routes` empty: every partition goes to streams[0]. INVALID_ARGUMENT for no streams, a
  /// partition without a route, a route to a stream that does not exist, or zero partitions.
  static absl::StatusOr<std::unique_ptr<PartitionedWriter>> Make(
      uint32_t num_partitions, std::vector<std::unique_ptr<PushStream>> streams,
      std::vector<std::vector<uint32_t>> routes, WriterOptions options, FrameLimits limits,
      Decider decide = nullptr, uint64_t attempt = 0);
  ~PartitionedWriter() override;  // without Close(): the attempt is discarded

  absl::Status Add(std::string_view key, std::string_view value) override;
  absl::StatusOr<WriteResult> Close() override;
  void Abort() override;

  /// Bytes the partition buffers hold now (what the budget counts).
  size_t buffered_bytes() const { return buffered_; }

 private:
  struct Buffers;  // the chunk pool and the partitions' buffers
  struct Job;      // flushed partitions, on their way to the sender
  PartitionedWriter(uint32_t num_partitions, std::vector<std::unique_ptr<PushStream>> streams,
                    std::vector<std::vector<uint32_t>> routes, WriterOptions options,
                    FrameLimits limits, Decider decide, uint64_t attempt);
  absl::Status Flush(uint32_t partition);
  absl::Status FlushLargest(size_t bytes);
  // A job to fill (a spare one when there is), once fewer than two are in flight.
  absl::StatusOr<std::unique_ptr<Job>> NextJob();
  absl::Status Submit(std::unique_ptr<Job> job);
  void SendLoop();
  absl::Status Send(uint32_t partition, client_internal::PartitionBuffer& buffer,
                    FrameEncoder& encoder);
  void StopSender();
  void CancelStreams();

  const FrameLimits limits_;
  WriterOptions options_;
  const uint32_t num_partitions_;
  std::vector<std::unique_ptr<PushStream>> streams_;
  const std::vector<std::vector<uint32_t>> routes_;  // per partition
  const Decider decide_;
  const uint64_t attempt_;  // (with decide_: what the decision is compared with)
  std::unique_ptr<Buffers> buffers_;
  size_t buffered_ = 0;
  bool finished_ = false;
  // Per stream: written by the sender, read after it stopped.
  std::vector<uint64_t> frames_, records_;
  WriteResult sent_;  // the attempt's frames, records and frame bytes (each replica's copy once)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> jobs_;
  std::vector<std::unique_ptr<Job>> spare_;  // sent jobs, their arrays kept for reuse
  bool stopping_ = false;
  absl::Status send_error_;
  std::vector<Record> sort_scratch_;   // the sender's
  std::vector<uint32_t> flush_order_;  // FlushLargest's
  std::thread sender_;
};

}  // namespace sluice

#endif  // SLUICE_CLIENT_PARTITIONED_WRITER_H_
