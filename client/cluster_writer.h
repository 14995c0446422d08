// The cluster client's writer (docs/cluster.md, "The client", "Revive"): a PartitionedWriter
// over one push stream per server of the attempt, each stream watched for breaking without an
// answer from its server, and the failures that say what the engine should do next:
//   - a server that did not answer (refused, reset, past the keepalive): it is revived (taken
//     out of the shuffle with a new placement epoch at once), and the attempt fails UNAVAILABLE
//     with reason PLACEMENT_CHANGED: the engine's retry is routed by the new epoch;
//   - a server that keeps no part of the shuffle (a node renamed at its address) or a newer
//     epoch: the placement is forgotten, the retry routed afresh.
// Transport-free, over PushStreams.
#ifndef SLUICE_CLIENT_CLUSTER_WRITER_H_
#define SLUICE_CLIENT_CLUSTER_WRITER_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/shuffle_client.h"
#include "client/transport.h"

namespace sluice::client_internal {

// A failure that says the server could not be reached or did not answer in time (not an
// answer it gave).
bool Unanswered(const absl::Status& st);

// What an attempt whose writer, routed by `epoch`, could not reach server `node_id` (`cause`;
// `address` empty: not registered) fails with once the server was asked to revive it (`revive`,
// docs/cluster.md, "Revive"): UNAVAILABLE with reason PLACEMENT_CHANGED when the shuffle moved
// on without it (the engine's retry is routed by the new epoch); `cause` when nothing moved;
// UNAVAILABLE naming both, with the revive's reason and retry time, when it could not be now
// (retry: a drained server is back, or the grace takes it out).
absl::Status AfterRevive(const std::string& id, uint32_t epoch, const std::string& node_id,
                         const std::string& address, absl::Status cause,
                         const absl::StatusOr<ShuffleClient::Revive>& revive);

// A push stream that notes whether it broke without an answer from its server.
class WatchedStream final : public PushStream {
 public:
  explicit WatchedStream(std::unique_ptr<PushStream> stream) : stream_(std::move(stream)) {}
  std::string* NewFrame(uint32_t partition) override { return stream_->NewFrame(partition); }
  absl::Status SendFrame() override { return Note(stream_->SendFrame()); }
  absl::Status SendCommit(uint64_t frames, uint64_t records) override {
    return Note(stream_->SendCommit(frames, records));
  }
  absl::StatusOr<WriteResult> FinishCommit() override;
  void Cancel() override;
  std::vector<SegmentNotice> TakeSegments() override { return stream_->TakeSegments(); }
  // Why it broke unanswered (OK: it did not, or it was cancelled first).
  absl::Status unanswered() const;

 private:
  absl::Status Note(absl::Status st);
  std::unique_ptr<PushStream> stream_;
  mutable std::mutex mu_;
  bool cancelled_ = false;
  absl::Status unanswered_;
};

// A cluster attempt's writer: `writer` (over the attempt's streams) with what its failures
// call for.
class ClusterWriter final : public ShuffleWriter {
 public:
  struct Watched {
    std::string node_id;
    std::string address;
    const WatchedStream* stream = nullptr;  // owned by the writer
  };
  struct Hooks {
    // Forgets the shuffle's placement (the next attempt reads it afresh).
    std::function<void()> forget;
    // Revives a server that did not answer (`cause`): the attempt's failure to return.
    std::function<absl::Status(const std::string& node_id, const std::string& address,
                               absl::Status cause)>
        revive;
  };
  ClusterWriter(std::unique_ptr<ShuffleWriter> writer, std::vector<Watched> watched, Hooks hooks)
      : writer_(std::move(writer)), watched_(std::move(watched)), hooks_(std::move(hooks)) {}
  absl::Status Add(std::string_view key, std::string_view value) override;
  absl::StatusOr<WriteResult> Close() override;
  void Abort() override { writer_->Abort(); }

 private:
  absl::Status Failed(absl::Status st);
  std::unique_ptr<ShuffleWriter> writer_;
  std::vector<Watched> watched_;
  Hooks hooks_;
  bool revived_ = false;  // (once per attempt)
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CLUSTER_WRITER_H_
