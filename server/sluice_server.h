// SluiceServer: the daemon's core (Kudu's Init/Start/Shutdown split), usable in-process by
// the tests (tests/harness/mini_server.h). No gRPC types in this header.
//
//   sluice::ServerOptions opts;
//   opts.listen_address = "127.0.0.1:0";
//   opts.data_dir = "/var/lib/sluice";
//   SLUICE_ASSIGN_OR_RETURN(auto server, sluice::SluiceServer::Start(opts));
//   ... server->port() ...
//   server->Shutdown();
#ifndef SLUICE_SERVER_SLUICE_SERVER_H_
#define SLUICE_SERVER_SLUICE_SERVER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/server_options.h"

namespace sluice {

class MemoryBudget;

class SluiceServer {
 public:
  /// Recovers the data directory and starts serving.
  static absl::StatusOr<std::unique_ptr<SluiceServer>> Start(const ServerOptions& options);
  ~SluiceServer();  // Shutdown()

  int port() const;
  /// Stops accepting calls, lets in-flight ones finish until the grace period, then cancels them.
  void Shutdown();
  /// Starts a drain (docs/operations.md): readiness (the health service's
  /// "sluice.v1.ShuffleService") goes NOT_SERVING, the server leaves its cluster's list, new
  /// push streams are refused with UNAVAILABLE; pushes in flight finish, their commits
  /// included, and fetches (new ones too) are served until no stream has been open for a second
  /// or `grace` has passed. Returns
  /// at once; a later call may shorten the grace.
  void Drain(std::chrono::milliseconds grace);
  /// The listener stopped accepting connections (the probe found it three times in a row): the
  /// server drained itself, and the process should exit 1 for a restart.
  bool listener_failed() const;
  /// Blocks until a drain has been asked for (Drain, the Drain RPC) and has ended.
  void WaitDrained();
  /// Looks at the TLS files and the credentials file again now (SIGHUP) rather than at their
  /// next interval, and returns once it has.
  void ReloadFiles();
  uint64_t memory_parked_total() const;
  /// The server-wide memory budget, to count memory the server does not see (tests hold it
  /// full to show that pushes wait for it).
  MemoryBudget& memory_budget();
  /// Open push and fetch streams (for tests and status).
  size_t open_push_streams() const;
  size_t open_fetch_streams() const;
  /// The metrics endpoint's port (0 without --metrics_listen), and what it would answer now.
  int metrics_port() const;
  std::string RenderMetrics() const;
  /// Its node id and the address it registered (or would register).
  std::string node_id() const;
  std::string address() const;

 private:
  struct Impl;
  explicit SluiceServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SLUICE_SERVER_H_
