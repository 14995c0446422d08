// PushReactor: one mapper attempt's push stream (open, frames..., commit), as a gRPC
// ServerReadReactor (Push) or ServerBidiReactor (PushFlow). It converts each message and
// forwards it to the attempt's rules (PushAttempt), what the stream takes of the server to its
// StreamAdmission, and the cluster's part to the ClusterNode; it never blocks a gRPC thread:
// each message is handled on the worker pool, and the next read starts only once that is done
// and (Push) the memory budget has room (back-pressure is not reading). A frame larger than a
// message is announced with its size, which is reserved before its first piece is read. PushFlow
// grants credit before its client sends: a frames message's size (asked for, reserved in the
// budget), a large frame's size once it is promised (docs/api.md).
#ifndef SLUICE_SERVER_SERVICE_PUSH_REACTOR_H_
#define SLUICE_SERVER_SERVICE_PUSH_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include "server/service/service_deps.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {

/// A new push stream's reactor (it deletes itself when done).
grpc::ServerReadReactor<v1::PushRequest>* StartPush(const ServiceDeps& deps,
                                                    grpc::CallbackServerContext* ctx,
                                                    v1::PushResponse* response);

/// A new PushFlow stream's reactor: the same attempt, its frames and pieces sent within credit
/// granted from the memory budget (it deletes itself when done).
grpc::ServerBidiReactor<v1::PushRequest, v1::PushReply>* StartPushFlow(
    const ServiceDeps& deps, grpc::CallbackServerContext* ctx);

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_PUSH_REACTOR_H_
