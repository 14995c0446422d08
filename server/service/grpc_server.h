// GrpcServer: the gRPC side of one sluice-server, with no gRPC type in this header: the shuffle
// service (service/shuffle_service.h), the health service (liveness "", readiness
// "sluice.v1.ShuffleService"), reflection unless turned off, the interceptor that counts every
// call by method and code, and the transport's limits from the options (message sizes,
// keepalive, idle connections, stream windows, streams per connection).
//
//   SLUICE_ASSIGN_OR_RETURN(auto grpc, GrpcServer::Start(options, deps, tls, &metrics.calls));
//   ... grpc->port() ...
//   grpc->SetReady(false);   // draining
//   grpc->Shutdown(deadline);
#ifndef SLUICE_SERVER_SERVICE_GRPC_SERVER_H_
#define SLUICE_SERVER_SERVICE_GRPC_SERVER_H_

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "server/metrics/server_metrics.h"
#include "server/security/tls_reloader.h"
#include "server/server_options.h"
#include "server/service/service_deps.h"

namespace sluice {

/// The health service's name for readiness: NOT_SERVING while draining ("" stays SERVING while
/// the process lives: liveness). deploy/ probes it by this name.
inline constexpr char kReadinessService[] = "sluice.v1.ShuffleService";

class GrpcServer {
 public:
  /// Listens on options.listen_address, with TLS from `tls` (null: plaintext), and serves.
  /// UNAVAILABLE when it cannot listen.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const ServerOptions& options,
                                                           ServiceDeps deps, TlsReloader* tls,
                                                           CallCounts* calls);
  ~GrpcServer();  // Shutdown() now
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  int port() const;
  /// Readiness: SERVING or NOT_SERVING.
  void SetReady(bool ready);
  /// Stops taking calls; calls in flight run until `deadline`, then are cancelled. Idempotent.
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  struct Impl;
  explicit GrpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_GRPC_SERVER_H_
