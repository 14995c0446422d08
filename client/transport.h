// The client's transport seam (Arrow Flight's transport.h is the model): the writer's and the
// reader's logic — partitioning, buffering, flushing, encoding, decoding — sits on these two
// small stream interfaces, and the gRPC client implements them (grpc_client.cc). A cluster
// client routes partitions to several servers' PushStreams behind one PartitionedWriter; tests
// drive the logic over in-memory streams. No gRPC types here.
#ifndef SLUICE_CLIENT_TRANSPORT_H_
#define SLUICE_CLIENT_TRANSPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/shuffle_client.h"

namespace sluice {

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
  /// Commits: says how many frames and records were sent, waits for the server's answer.
  virtual absl::StatusOr<WriteResult> Commit(uint64_t frames, uint64_t records) = 0;
  /// Ends the stream without a commit: nothing it sent becomes visible. Idempotent.
  virtual void Cancel() = 0;
};

/// One partition's fetch from one server: the frames it answers with, in order.
class FetchStream {
 public:
  virtual ~FetchStream() = default;
  /// Sets *frame to the next frame's bytes (valid until the next call); false at the end.
  virtual absl::StatusOr<bool> Next(const std::string** frame) = 0;
  /// Stops the fetch early. Idempotent.
  virtual void Cancel() = 0;
};

}  // namespace sluice

#endif  // SLUICE_CLIENT_TRANSPORT_H_
