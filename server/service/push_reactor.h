// PushReactor: one mapper attempt's push stream (open, frames..., commit), as a gRPC
// ServerReadReactor (Push) or ServerBidiReactor (PushFlow). It converts each message and does
// what the stream's session says (PushStream, server/rules/push_stream.h: admission, memory and
// credit, deadlines, the attempt): read the next message by a deadline (sending PushFlow's
// credit first), hand the message to the worker pool, or finish. It never blocks a gRPC thread,
// and it does not read while the session waits (back-pressure is not reading).
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
