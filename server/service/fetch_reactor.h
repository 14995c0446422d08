// FetchReactor: one partition's fetch as a gRPC ServerWriteReactor. It converts the request
// and forwards it to the fetch's rules (FetchSession), after the ClusterNode's part (the store
// here, the partition kept here, the cluster's decisions applied); what the stream takes of the
// server is its StreamAdmission's. Each chunk is prepared on a pool while the previous one is
// on the wire (KEY merges on the merge pool, behind the merge gate); a reader that takes no
// chunk within --fetch_stall_timeout_s is cancelled.
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
