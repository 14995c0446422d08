// What the gRPC service's handlers and reactors forward to: the transport-free parts of one
// server, wired by SluiceServer (server/sluice_server.cc). No gRPC here.
#ifndef SLUICE_SERVER_SERVICE_SERVICE_DEPS_H_
#define SLUICE_SERVER_SERVICE_SERVICE_DEPS_H_

#include <chrono>
#include <functional>

#include "server/rules/repairer.h"
#include "server/rules/stream_deps.h"
#include "server/runtime/watchdog.h"
#include "server/runtime/worker_pool.h"
#include "server/security/auth.h"
#include "server/security/tenancy.h"

namespace sluice {

/// The admin calls' part of the server.
struct AdminDeps {
  std::function<void(std::chrono::milliseconds grace)> drain;  ///< SluiceServer::Drain
  /// Starts (or goes on with) the server's decommission and says how far it is.
  std::function<absl::StatusOr<DecommissionState>()> decommission;
  std::chrono::milliseconds drain_grace{30000};  ///< --drain_grace_s
  bool allow_remote = false;                     ///< --allow_remote_admin
};

/// The stream sessions' part (StreamDeps: registry, node, admission, limits, timeouts, counters,
/// clock), and what the transport alone uses.
struct ServiceDeps : StreamDeps {
  WorkerPool* pool = nullptr;        ///< push work, fetch setup, UNORDERED fetches
  WorkerPool* meta_pool = nullptr;   ///< the small calls: never behind bulk work
  WorkerPool* merge_pool = nullptr;  ///< KEY fetches' merges, which can run long
  Watchdog* watchdog = nullptr;
  const Authenticator* auth = nullptr;  ///< null: no credentials asked for (--auth_file)
  TenantLimits quotas;                  ///< tenants' quotas where their lines set none
  AdminDeps admin;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_SERVICE_DEPS_H_
