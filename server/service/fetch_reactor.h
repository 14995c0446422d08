// FetchReactor: one partition's fetch as a gRPC ServerWriteReactor. It converts the request and
// does what the fetch's session says (FetchStream, server/rules/fetch_stream.h: admission,
// setup, memory, the stall and park deadlines, the credentials again): work on a pool, write a
// chunk, finish, or cancel. Each chunk is prepared on a pool while the previous one is on the
// wire (KEY merges on the merge pool, behind the merge gate).
#ifndef SLUICE_SERVER_SERVICE_FETCH_REACTOR_H_
#define SLUICE_SERVER_SERVICE_FETCH_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include "server/service/service_deps.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {

/// A new fetch stream's reactor (it deletes itself when done).
grpc::ServerWriteReactor<v1::FetchResponse>* StartFetch(const ServiceDeps& deps,
                                                        grpc::CallbackServerContext* ctx,
                                                        const v1::FetchRequest* request);

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_FETCH_REACTOR_H_
