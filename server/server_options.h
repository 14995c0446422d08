// ServerOptions: everything a sluice-server runs on (the daemon's flags, server_main.cc, fill
// them; tests set them directly), and their checks: ValidateOptions names the flag of the first
// option out of range, before anything is opened or bound. The defaults that depend on other
// options or on the machine (0 = "work it out") are worked out in one place, ResolveOptions,
// which the server starts from and logs.
#ifndef SLUICE_SERVER_SERVER_OPTIONS_H_
#define SLUICE_SERVER_SERVER_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
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
  /// The background scrub's rate over committed data, in bytes a second (0 = off).
  uint64_t scrub_bytes_per_s = uint64_t{16} << 20;
  /// The background pre-merge's rate, in bytes a second written (0 = off), and the fewest runs
  /// of a partition it merges (docs/storage.md, "Pre-merged runs").
  uint64_t premerge_bytes_per_s = uint64_t{32} << 20;
  uint32_t premerge_min_runs = 64;
  /// Shuffles open at once (each holds 2 descriptors and its index; 0 = what the open-files
  /// limit leaves beside the connections' share), and memory their indexes may take: past
  /// either, idle shuffles close (and open again from their logs when asked for).
  size_t max_open_shuffles = 0;
  uint64_t index_memory_bytes = uint64_t{1} << 30;
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
  /// Re-replication's own calls to the other servers (docs/cluster.md, "Re-replication"). With
  /// TLS: `peer_tls.ca_file`, the CAs their certificates chain to (needed to repair); its
  /// `server_name`, the name they carry (empty: the host dialled); its `cert_file` and
  /// `key_file`, this server's client certificate for servers that ask for one. With
  /// auth_file: `peer_token_file`, a file holding a token every server's file names as admin
  /// (needed to repair).
  ClientTlsOptions peer_tls;
  std::string peer_token_file;
  /// Serve gRPC server reflection (grpcurl's `list`, `describe`).
  bool reflection = true;

  // Streams and connections (docs/operations.md, "Limits"): what one client may hold, and for
  // how long without progress.
  size_t max_push_streams = 4096;   ///< open push streams, server-wide
  size_t max_fetch_streams = 1024;  ///< open fetch streams, server-wide
  /// Plain Push streams (clients without credit) open at once: each may make gRPC hold its
  /// stream window and a message outside the memory budget. One past them is refused.
  size_t max_plain_push_streams = 16;
  uint32_t max_streams_per_connection = 1024;  ///< HTTP/2 concurrent streams per connection
  /// HTTP/2 receive window of each stream: what gRPC buffers of a stream the server has not
  /// read yet. 0 = gRPC's bandwidth-probed windows (larger, to many MiB a stream).
  uint64_t stream_window_bytes = uint64_t{1} << 20;
  /// A push stream waiting this long for its next message ends with DEADLINE_EXCEEDED.
  std::chrono::milliseconds push_idle_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds push_credit_timeout{std::chrono::seconds(10)};
  /// A fetch whose reader takes no chunk for this long is cancelled.
  std::chrono::milliseconds fetch_stall_timeout{std::chrono::seconds(120)};
  /// A KEY fetch whose reader takes no chunk for this long gives its merge slot and memory to a
  /// fetch that waits for one, and merges again from where it was once its reader reads.
  std::chrono::milliseconds merge_park_after{std::chrono::seconds(2)};
  /// An open fetch checks its caller's credentials again at most this often as its chunks go (a
  /// token taken out of --auth_file ends it). Not a flag; tests set 0 (every chunk).
  std::chrono::milliseconds caller_recheck{std::chrono::seconds(1)};
  /// A connection with no call for this long is closed (the client reconnects when it needs to).
  std::chrono::milliseconds connection_idle_timeout{std::chrono::seconds(600)};
  /// Connections open at once (0 = half the open-files limit), and from one client address (0 =
  /// a quarter of that, at most 256); a connection past either is closed as it is accepted
  /// (server/net/connection_guard.h).
  size_t max_connections = 0;
  size_t max_connections_per_address = 0;
  /// A new connection that has not completed its handshake (TLS, HTTP/2's preface) within this
  /// is closed: one that sends nothing holds nothing for long.
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(10)};
  /// Apply the connection limits and keep accept failures from gRPC's listener (false: count
  /// and watch only, gRPC's own behaviour).
  bool guard_connections = true;
  /// Route the process's accepts through the guard: sluice-server does (its accept4 shim is
  /// linked in); an in-process server in a test has no shim, and the guard then sees nothing.
  bool install_connection_guard = false;
  /// With the guard installed: how often the listener is probed (a connection to itself that
  /// must be accepted within 5 s, or the interval if shorter); 0 = never.
  std::chrono::milliseconds listener_probe_interval{std::chrono::seconds(10)};

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
  /// A server of a shuffle unregistered this long is taken out of the shuffle's placement (a
  /// new epoch); 0 = never by itself (docs/cluster.md, "Placement epochs").
  std::chrono::seconds dead_after{60};
  /// Revives this server decides a second at most (docs/cluster.md, "Revive"); 0 = none.
  uint32_t revives_per_s = 10;
  /// A partition's segment stored past this many bytes on its servers takes further servers
  /// for its new frames (docs/cluster.md, "Huge partitions"); 0 = never.
  uint64_t partition_split_bytes = uint64_t{1024} << 20;
  /// Re-replication's rate: what this server's replicas lack is copied from other replicas at
  /// most this fast (bytes a second); 0 = off.
  uint64_t repair_bytes_per_s = uint64_t{64} << 20;

  // The object tier (docs/object-store.md): sealed partitions uploaded to an S3-compatible
  // store. Credentials come from the AWS environment variables and files, never a flag.
  std::string object_store;     ///< s3://bucket/prefix; empty = off
  std::string object_endpoint;  ///< scheme://host[:port]; empty = AWS_ENDPOINT_URL*, else AWS
  std::string object_region;    ///< empty = AWS_REGION, AWS_DEFAULT_REGION, the profile's
  std::string object_addressing = "auto";  ///< "path", "virtual", or "auto" (path for an endpoint)
  std::string object_ca_file;              ///< the endpoint's CA bundle (empty: the system's)
  uint64_t object_bytes_per_s = uint64_t{64} << 20;  ///< uploads' rate, all of them together
  uint64_t object_part_bytes = uint64_t{8} << 20;    ///< multipart uploads' part size
  int object_parallel_parts = 4;                     ///< parts of one upload in flight
  /// Shuffles all in the store are evicted while their data directory is fuller (percent; 0:
  /// never; below --disk_high_water_pct).
  uint32_t object_evict_pct = 85;
};

/// OK if every option is in range; else INVALID_ARGUMENT naming the flag that sets the first
/// one that is not.
absl::Status ValidateOptions(const ServerOptions& options);

/// What the options come to once the defaults that depend on other options or on the machine
/// are worked out (docs/operations.md says each).
struct ResolvedOptions {
  bool clustered = false;  ///< --etcd given
  /// KEY merges at once (--max_concurrent_merges, else --worker_threads), and the threads that
  /// run them (one a slot, at most 64).
  size_t merges = 1;
  int merge_threads = 1;
  /// What one merge plans its decoded frames within: an equal share of the budget, and how its
  /// error names that limit.
  uint64_t merge_memory_bytes = 1;
  std::string merge_limit_name;
  /// The background pre-merge's: one merge's share, at most a quarter of the budget; and the
  /// disk use it leaves alone above (10 points under --disk_high_water_pct, 90% without one).
  uint64_t premerge_memory_bytes = 1;
  uint32_t premerge_disk_mark_pct = 90;
  /// How long after an etcd outage creates wait for the servers registered before it: two
  /// leases (servers re-register within a third of theirs).
  std::chrono::milliseconds settle{20000};
  /// Connections: the process's descriptors, connections at once (--max_connections, else half
  /// the descriptors, at least 16) and from one address (--max_connections_per_address, else a
  /// quarter of those, 1 to 256).
  int descriptor_limit = 1024;
  size_t max_connections = 16;
  size_t max_connections_per_address = 4;
  /// Shuffles open at once (--max_open_shuffles, else half the descriptors connections and 256
  /// others leave, at least 16: a shuffle holds 2).
  size_t max_open_shuffles = 16;
};

/// ValidateOptions, then the defaults worked out for a process that may open
/// `open_files_limit` descriptors.
absl::StatusOr<ResolvedOptions> ResolveOptions(const ServerOptions& options,
                                               uint64_t open_files_limit);

/// --data_dir's list: one directory per disk, comma-separated (trailing slashes dropped).
std::vector<std::string> SplitDataDirs(const std::string& list);

/// This machine's host name ("localhost" if it has none).
std::string HostName();

/// host:port of `listen` with the port bound; a wildcard host becomes the host name.
std::string AdvertisedAddress(const std::string& listen, int port);

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVER_OPTIONS_H_
