// The client's transport seam (Arrow Flight's transport.h is the model): the writer's and the
// reader's logic — partitioning, buffering, flushing, encoding, decoding — sits on these two
// small stream interfaces, and the gRPC client implements them (grpc_client.cc). A cluster
// client routes partitions to several servers' PushStreams behind one PartitionedWriter; tests
// drive the logic over in-memory streams. No gRPC types here.
//
// ServerLink is one server as the cluster client (cluster_client.h) uses it: the plain
// ShuffleClient calls, and the streams and the decision of one attempt.
#ifndef SLUICE_CLIENT_TRANSPORT_H_
#define SLUICE_CLIENT_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/shuffle_client.h"

namespace sluice {

/// A huge partition's segment a server told a writer of (docs/cluster.md, "Huge partitions"):
/// stored partition `partition_id`, a segment of `parent`, on `nodes` (indexes into the
/// placement's nodes, primary first).
struct SegmentNotice {
  uint32_t partition_id = 0, parent = 0;
  std::vector<uint32_t> nodes;
};

/// One mapper attempt's push stream to one server, opened (its open message sent) by whoever
/// made it. Calls come from one thread at a time, except Cancel, which may come from any.
class PushStream {
 public:
  virtual ~PushStream() = default;
  /// The buffer to encode the next frame for `partition` into; valid until SendFrame.
  virtual std::string* NewFrame(uint32_t partition) = 0;
  /// Sends the frame NewFrame handed out. An error is the stream's end: the server's reason
  /// when it gave one (a rejected frame, say), else why the stream broke.
  virtual absl::Status SendFrame() = 0;
  /// Sends the commit (for an attempt of a cluster shuffle, the prepare: docs/cluster.md),
  /// saying how many frames and records were sent, without waiting for the server's answer;
  /// FinishCommit waits for it. A writer of several streams sends every commit before it waits
  /// for any, so that the servers sync at the same time.
  virtual absl::Status SendCommit(uint64_t frames, uint64_t records) = 0;
  virtual absl::StatusOr<WriteResult> FinishCommit() = 0;
  /// Ends the stream without a commit: nothing it sent becomes visible. Idempotent.
  virtual void Cancel() = 0;
  /// The segments the server told of since the last call (with its credit; none from a stream
  /// without credit).
  virtual std::vector<SegmentNotice> TakeSegments() { return {}; }
};

/// One partition's fetch from one server: the frames it answers with, in order.
class FetchStream {
 public:
  virtual ~FetchStream() = default;
  /// Sets *frame to the next frame's bytes (valid until the next call); false at the end.
  virtual absl::StatusOr<bool> Next(const std::string** frame) = 0;
  /// Stops the fetch early. Idempotent.
  virtual void Cancel() = 0;
  /// The committed mappers the server serves, when the fetch asked it to say (report_mappers),
  /// once the first frame came; empty before or otherwise.
  virtual const std::vector<uint32_t>& mappers() const = 0;
  /// Their committed attempts, one per mapper (as mappers()).
  virtual const std::vector<uint64_t>& attempts() const = 0;
};

/// One server of a cluster, for the cluster client. Thread-safe.
class ServerLink {
 public:
  virtual ~ServerLink() = default;
  /// The server's own calls (create, status, placement...).
  virtual ShuffleClient& client() = 0;
  /// Opens a push stream of the attempt; `prepare`: its commit prepares (cluster mode), routed
  /// by placement epoch `epoch`.
  virtual absl::StatusOr<std::unique_ptr<PushStream>> OpenPush(const std::string& id,
                                                               uint32_t mapper, uint64_t attempt,
                                                               bool prepare, uint32_t epoch) = 0;
  /// Decides the prepared attempt (CommitMapper), pushed in placement epoch `epoch`: the
  /// mapper's winning attempt.
  virtual absl::StatusOr<uint64_t> CommitMapper(const std::string& id, uint32_t mapper,
                                                uint64_t attempt, uint32_t epoch) = 0;
  /// Opens a fetch of one partition (the reader's options, skip_records included); with
  /// `report_mappers`, the stream's mappers() says which mappers the server serves.
  virtual std::unique_ptr<FetchStream> OpenFetch(const std::string& id, uint32_t partition,
                                                 const ReaderOptions& options,
                                                 bool report_mappers) = 0;
  virtual const std::string& address() const = 0;
  /// Has the server read shuffle `id`'s placement at `epoch` or newer (a GetShuffle routed by
  /// it: the server reads the record first when it knows an older one); the epoch it knows.
  virtual absl::StatusOr<uint32_t> CatchUp(const std::string& id, uint32_t epoch) = 0;
};

/// A gRPC link to the one server `options.server` (grpc_client.cc).
std::unique_ptr<ServerLink> ConnectServer(const ClientOptions& options);

}  // namespace sluice

#endif  // SLUICE_CLIENT_TRANSPORT_H_
