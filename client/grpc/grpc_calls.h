// What the gRPC client's parts share (client/grpc/: the client's calls, its push and fetch
// streams): the server's status as the caller is told it, when a call failed on a dead
// connection and may be sent again, the credentials and deadline of a stream, and the status
// protos as the client's types. The gRPC transport lives in this folder alone; the client's
// public headers see no gRPC (client/transport.h, client/shuffle_client.h).
#ifndef SLUICE_CLIENT_GRPC_GRPC_CALLS_H_
#define SLUICE_CLIENT_GRPC_GRPC_CALLS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "client/shuffle_client.h"
#include "rpc/grpc_glue.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice::grpc_client {

namespace pb = sluice::v1;

// What a push message holds before it is sent: small frames share one; a frame larger than
// this goes alone, in pieces (a server reads no larger message).
constexpr size_t kPushMessageBytes = rpc::kPushPayloadBytes;
// A frame's own bytes in a message, past its payload (field tags and lengths).
constexpr size_t kFrameOverhead = 16;

/// The server's status as it sent it; a failure of the transport (no server answered it)
/// saying which server could not be reached.
absl::Status FromGrpc(const grpc::Status& st, const std::string& server);
/// Whether the transport failed a call the server never answered.
bool TransportFailed(const absl::Status& st);
/// Whether a call that failed with `st` (sent at `sent`) failed on a dead connection, so that
/// it may be sent again once: see grpc_calls.cc.
bool DeadConnection(const absl::Status& st, std::chrono::steady_clock::time_point sent,
                    const ClientOptions& options, grpc::Channel* channel,
                    std::chrono::system_clock::time_point deadline);
std::chrono::system_clock::time_point Never();
/// Whether the token goes with calls: only where it cannot be read on the way (over TLS, or to
/// this machine).
bool SendsToken(const ClientOptions& options);
/// A stream's credentials and deadline.
void SetStreamDeadline(const ClientOptions& options, grpc::ClientContext* ctx);
PartitionStatsInfo FromProto(const pb::PartitionInfo& p);
ShuffleStatus FromProto(const pb::ShuffleInfo& info);

}  // namespace sluice::grpc_client

#endif  // SLUICE_CLIENT_GRPC_GRPC_CALLS_H_
