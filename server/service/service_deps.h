// What the gRPC service's handlers and reactors forward to: the transport-free parts of one
// server, wired by SluiceServer (server/sluice_server.cc). No gRPC here.
#ifndef SLUICE_SERVER_SERVICE_SERVICE_DEPS_H_
#define SLUICE_SERVER_SERVICE_SERVICE_DEPS_H_

#include <chrono>
#include <functional>

#include "server/metrics/server_metrics.h"
#include "server/rules/admission.h"
#include "server/rules/cluster_node.h"
#include "server/rules/fetch_session.h"
#include "server/rules/push_attempt.h"
#include "server/rules/repairer.h"
#include "server/runtime/watchdog.h"
#include "server/runtime/worker_pool.h"
#include "server/security/auth.h"
#include "server/security/tenancy.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

/// How long a stream may wait for progress.
struct StreamTimeouts {
  /// A push stream waiting this long for its next message (or for a large frame's pieces) is
  /// ended with DEADLINE_EXCEEDED and its attempt discarded (--push_idle_timeout_s).
  std::chrono::milliseconds push_idle{std::chrono::seconds(300)};
  /// A fetch whose reader takes no chunk for this long is cancelled, giving back its memory
  /// and merge slot (--fetch_stall_timeout_s).
  std::chrono::milliseconds fetch_stall{std::chrono::seconds(120)};
  /// A KEY fetch whose reader takes no chunk for this long, while another fetch waits for a
  /// merge slot, gives its slot and its merge's memory up; it merges again from where it was
  /// once its reader reads (--merge_park_after_s).
  std::chrono::milliseconds merge_park{std::chrono::seconds(2)};
  /// Credit granted to a PushFlow stream whose message does not come within this long goes
  /// back, the stream ended with DEADLINE_EXCEEDED (--push_credit_timeout_s).
  std::chrono::milliseconds push_credit{std::chrono::seconds(10)};
};

/// The admin calls' part of the server.
struct AdminDeps {
  std::function<void(std::chrono::milliseconds grace)> drain;  ///< SluiceServer::Drain
  /// Starts (or goes on with) the server's decommission and says how far it is.
  std::function<absl::StatusOr<DecommissionState>()> decommission;
  std::chrono::milliseconds drain_grace{30000};  ///< --drain_grace_s
  bool allow_remote = false;                     ///< --allow_remote_admin
};

struct ServiceDeps {
  ShuffleRegistry* registry = nullptr;
  ClusterNode* node = nullptr;
  WorkerPool* pool = nullptr;        ///< push work, fetch setup, UNORDERED fetches
  WorkerPool* meta_pool = nullptr;   ///< the small calls: never behind bulk work
  WorkerPool* merge_pool = nullptr;  ///< KEY fetches' merges, which can run long
  AdmissionDeps admission;
  PushLimits push;
  FetchDeps fetch;
  Watchdog* watchdog = nullptr;
  StreamTimeouts timeouts;
  ServerMetrics* metrics = nullptr;
  const Authenticator* auth = nullptr;  ///< null: no credentials asked for (--auth_file)
  TenantLimits quotas;                  ///< tenants' quotas where their lines set none
  AdminDeps admin;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_SERVICE_DEPS_H_
