// A fetch stream over gRPC, as the transport-free reader sees it (client/transport.h's
// FetchStream): sent again once if a dead connection failed it before anything was received.
#ifndef SLUICE_CLIENT_GRPC_GRPC_FETCH_STREAM_H_
#define SLUICE_CLIENT_GRPC_GRPC_FETCH_STREAM_H_

#include <memory>

#include "client/grpc/grpc_calls.h"
#include "client/transport.h"

namespace sluice::grpc_client {

/// Starts fetching `request` over `stub` (`channel`: its connection, to tell a dead one).
std::unique_ptr<FetchStream> StartFetchStream(pb::ShuffleService::Stub* stub,
                                              grpc::Channel* channel, const ClientOptions& options,
                                              pb::FetchRequest request);

}  // namespace sluice::grpc_client

#endif  // SLUICE_CLIENT_GRPC_GRPC_FETCH_STREAM_H_
