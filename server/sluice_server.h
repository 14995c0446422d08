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
#include "codec/frame_format.h"
#include "rpc/tls_options.h"

namespace sluice {

struct ServerOptions {
  std::string listen_address = "127.0.0.1:7070";  ///< host:port; port 0 picks a free one
  std::string data_dir;
  uint64_t memory_budget_bytes = 256ull << 20;
  bool fsync = true;
  FrameLimits limits;  ///< max frame size and records per frame
  int worker_threads = 4;
  size_t merge_fan_in = 4096;  ///< runs merged at once; more go through temporary files first
  /// KEY-ordered fetches merging at once (0 = worker_threads); others wait, holding nothing.
  size_t max_concurrent_merges = 0;
  /// Frames one mapper attempt may push (each costs ~24 bytes of bookkeeping until it ends).
  uint64_t max_frames_per_attempt = uint64_t{1} << 20;
  /// New push streams are refused while the data directory's file system is fuller than this
  /// percentage (0 = never).
  uint32_t disk_high_water_pct = 95;
  /// A shuffle nobody pushed to, fetched from or asked about for this long is deleted (0 =
  /// never). Servers on their own only: in a cluster, engines delete their shuffles.
  std::chrono::seconds shuffle_ttl{0};
  std::chrono::milliseconds shutdown_grace{5000};
  /// How long a drain (SIGTERM, the Drain RPC) lets pushes and fetches in flight run on.
  std::chrono::milliseconds drain_grace{30000};
  /// The Drain RPC from other hosts than the server's own (loopback) too.
  bool allow_remote_admin = false;
  /// host:port of the Prometheus metrics endpoint (HTTP, GET /metrics); empty = none.
  std::string metrics_listen;

  // Security (docs/security.md).
  /// TLS, or mutual TLS with a client CA. Without it the server serves in clear: on loopback
  /// always, on any other address only with `plaintext` (asked for explicitly, and warned of).
  ServerTlsOptions tls;
  bool plaintext = false;
  /// Credentials every call must present (server/auth.h); empty: none asked for. Read again
  /// every `auth_reload_interval` and on ReloadFiles.
  std::string auth_file;
  std::chrono::seconds auth_reload_interval{10};
  /// Each tenant's quotas where its quota line sets none (0 = no limit); with auth_file only.
  uint64_t tenant_max_shuffles = 1000;
  uint64_t tenant_max_stored_bytes = 0;
  uint64_t tenant_max_streams = 0;
  /// Serve gRPC server reflection (grpcurl's `list`, `describe`).
  bool reflection = true;

  // Streams and connections (docs/operations.md, "Limits"): what one client may hold, and for
  // how long without progress.
  size_t max_push_streams = 4096;              ///< open push streams, server-wide
  size_t max_fetch_streams = 1024;             ///< open fetch streams, server-wide
  uint32_t max_streams_per_connection = 1024;  ///< HTTP/2 concurrent streams per connection
  /// HTTP/2 receive window of each stream: what gRPC buffers of a stream the server has not
  /// read yet. 0 = gRPC's bandwidth-probed windows (larger, to many MiB a stream).
  uint64_t stream_window_bytes = uint64_t{4} << 20;
  /// A push stream waiting this long for its next message ends with DEADLINE_EXCEEDED.
  std::chrono::milliseconds push_idle_timeout{std::chrono::seconds(300)};
  /// A fetch whose reader takes no chunk for this long is cancelled.
  std::chrono::milliseconds fetch_stall_timeout{std::chrono::seconds(120)};
  /// A connection with no call for this long is closed (the client reconnects when it needs to).
  std::chrono::milliseconds connection_idle_timeout{std::chrono::seconds(600)};

  // Cluster mode (docs/cluster.md).
  /// This server's id, stable across restarts and address changes (empty = the host name).
  std::string node_id;
  /// etcd's endpoints ("host:port", or several IPv4 ones comma-separated); empty = one server
  /// on its own, registered nowhere.
  std::string etcd_endpoints;
  std::string etcd_prefix = "/sluice/v1/";  ///< the cluster's keys in etcd
  /// Where clients and other servers reach this server (empty = the listen address, with the
  /// host name for a wildcard host and the port actually bound).
  std::string advertise_address;
  std::chrono::seconds node_lease_ttl{10};  ///< a dead server leaves the cluster after this
};

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
  /// Blocks until a drain has been asked for (Drain, the Drain RPC) and has ended.
  void WaitDrained();
  /// Looks at the TLS files and the credentials file again now (SIGHUP) rather than at their
  /// next interval.
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
  const std::string& node_id() const;
  const std::string& address() const;

 private:
  struct Impl;
  explicit SluiceServer(std::unique_ptr<Impl> impl);
  // Names the server and, with --etcd, registers it; on error the server is shut down.
  absl::Status JoinCluster();
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SLUICE_SERVER_H_
