// The gRPC edge of every call, in one place: who the caller is (its credentials and peer,
// resolved once into a CallContext for the transport-free rules) and what it is told of an
// error (an absl::Status below the edge, a grpc::Status here, the code kept). Included by the
// service's .cc files only.
#ifndef SLUICE_SERVER_SERVICE_CALL_EDGE_H_
#define SLUICE_SERVER_SERVICE_CALL_EDGE_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/security/call_context.h"
#include "server/service/service_deps.h"

namespace sluice {

/// The caller of `ctx`: UNAUTHENTICATED without credentials the server knows (--auth_file);
/// everyone, as an admin, without --auth_file.
absl::StatusOr<CallContext> ResolveCaller(const ServiceDeps& deps,
                                          const grpc::CallbackServerContext* ctx);

/// The caller of `ctx` again, for a stream that outlives a reload of --auth_file: OK while its
/// credentials still resolve to `opened`'s tenant and role (always, without --auth_file); else
/// the refusal (UNAUTHENTICATED, or PERMISSION_DENIED for a changed tenant or role), its
/// message ending with `then` ("checked again at the commit; the attempt was discarded").
absl::Status CheckCallerAgain(const ServiceDeps& deps, const grpc::CallbackServerContext* ctx,
                              const CallContext& opened, absl::string_view then);

/// What the caller is told of `st`. Messages below the edge are made for callers (they name
/// shuffles as their tenants know them and never a server path), so the code and the message
/// go out as they are.
grpc::Status ToCaller(const absl::Status& st);

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_CALL_EDGE_H_
