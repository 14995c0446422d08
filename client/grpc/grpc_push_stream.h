// A push stream over gRPC (Push, or PushFlow: each frames message within credit the server
// granted), as the transport-free writer sees it (client/transport.h's PushStream).
#ifndef SLUICE_CLIENT_GRPC_GRPC_PUSH_STREAM_H_
#define SLUICE_CLIENT_GRPC_GRPC_PUSH_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/grpc/grpc_calls.h"
#include "client/transport.h"

namespace sluice::grpc_client {

/// Opens a push stream of attempt `attempt` of mapper `mapper` of shuffle `id` (routed by
/// placement epoch `epoch`) over `stub`: PushFlow when `flow`; its attempt prepared rather than
/// committed when `prepare`; with `await_headers`, once the server has taken the stream (a
/// refusal or a dead connection known before anything is sent).
absl::StatusOr<std::unique_ptr<PushStream>> OpenPushStream(
    pb::ShuffleService::Stub* stub, const ClientOptions& options, bool prepare, bool flow,
    const std::string& id, uint32_t mapper, uint64_t attempt, uint32_t epoch, bool await_headers);

}  // namespace sluice::grpc_client

#endif  // SLUICE_CLIENT_GRPC_GRPC_PUSH_STREAM_H_
