// sluice-server: the shuffle service daemon. Flags carry units; see docs/operations.md.
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "codec/frame_format.h"
#include "server/sluice_server.h"
#include "server/storage/file_util.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "address to listen on (host:port; port 0 = any)");
ABSL_FLAG(std::string, data_dir, "", "directory for shuffle data (required)");
ABSL_FLAG(uint64_t, memory_budget_mb, 256, "budget for buffered push data and fetch buffers");
ABSL_FLAG(bool, fsync, true, "sync data and commit log before acknowledging a commit");
ABSL_FLAG(uint32_t, max_frame_mb, 64, "largest frame accepted, uncompressed (1 to 1024)");
ABSL_FLAG(int32_t, worker_threads, 4, "threads for disk, validation and compression work");
ABSL_FLAG(uint32_t, merge_fan_in, 4096, "runs merged at once by a KEY-ordered fetch");
ABSL_FLAG(uint64_t, max_frames_per_attempt, uint64_t{1} << 20,
          "frames one mapper attempt may push (bookkeeping: ~24 bytes each until it ends)");
ABSL_FLAG(uint32_t, max_concurrent_merges, 0,
          "KEY-ordered fetches merging at once (0 = --worker_threads); others wait");
ABSL_FLAG(uint64_t, max_push_streams, 4096, "open push streams, server-wide");
ABSL_FLAG(uint64_t, max_fetch_streams, 1024, "open fetch streams, server-wide");
ABSL_FLAG(uint64_t, max_plain_push_streams, 16,
          "plain Push streams (clients without credit) open at once: each may make the server "
          "hold its stream window and a message outside the memory budget (0: none taken)");
ABSL_FLAG(uint32_t, max_streams_per_connection, 1024, "concurrent streams per connection");
ABSL_FLAG(double, stream_window_mb, 1,
          "HTTP/2 receive window per stream in MiB, 0.0625 to 64 (0 = gRPC's bandwidth-probed "
          "windows)");
ABSL_FLAG(uint32_t, push_idle_timeout_s, 300,
          "a push stream waiting this long for a message ends and its attempt is discarded");
ABSL_FLAG(uint32_t, push_credit_timeout_s, 10,
          "credit granted to a push stream whose message does not come this soon goes back and "
          "its attempt is discarded");
ABSL_FLAG(uint32_t, fetch_stall_timeout_s, 120,
          "a fetch whose reader takes no chunk for this long is cancelled");
ABSL_FLAG(uint32_t, merge_park_after_s, 2,
          "a KEY fetch whose reader takes no chunk for this long gives its merge slot to a fetch "
          "that waits for one (and resumes where it was once its reader reads)");
ABSL_FLAG(uint32_t, connection_idle_timeout_s, 600, "a connection with no call this long closes");
ABSL_FLAG(uint64_t, max_connections, 0,
          "connections open at once; past it a new one is closed (0 = half the open-files limit)");
ABSL_FLAG(uint64_t, max_connections_per_address, 0,
          "connections open at once from one client address; past it a new one is closed (0 = "
          "a quarter of --max_connections, at most 256)");
ABSL_FLAG(uint32_t, listener_probe_s, 10,
          "probe the listener this often; three failed probes drain the server and exit 1 (0 = "
          "never)");
ABSL_FLAG(bool, guard_connections, true,
          "apply the connection limits and keep accept failures from the listener (false: count "
          "only; gRPC's own accept loop, unbounded, which stops for good when out of files)");
ABSL_FLAG(uint32_t, handshake_timeout_s, 10,
          "a new connection that has not completed its TLS and HTTP/2 handshake by then closes");
ABSL_FLAG(std::string, node_id, "",
          "this server's id in its cluster, stable across restarts (default: the host name)");
ABSL_FLAG(std::string, etcd, "",
          "etcd endpoints (host:port, or IPv4 host:port,host:port...): join that cluster");
ABSL_FLAG(std::string, etcd_prefix, "/sluice/v1/", "the cluster's keys in etcd");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port clients and servers reach this one at (default: the listen address)");
ABSL_FLAG(uint32_t, node_lease_s, 10, "a server that stops renewing leaves the cluster after it");
ABSL_FLAG(uint32_t, repair_mb_per_s, 64,
          "copy what this server's replicas lack from other replicas at most this fast (a "
          "partition taken over in a later placement epoch); 0 = off");
ABSL_FLAG(uint32_t, dead_after_s, 60,
          "a server of a shuffle unregistered this long is taken out of its placement (a new "
          "epoch: new attempts go to live servers); 0 = never");
ABSL_FLAG(uint32_t, revives_per_s, 10,
          "in a cluster: revives this server decides a second at most (a writer that cannot "
          "reach a server of its shuffle has it taken out at once: docs/cluster.md, Revive); "
          "0 = none, writers wait for --dead_after_s");
ABSL_FLAG(uint32_t, partition_split_mb, 1024,
          "in a cluster: a partition whose frames stored on a server pass this many MiB takes "
          "further servers for its new frames (recorded in the shuffles this server creates); "
          "0 = never split");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical, off");
ABSL_FLAG(uint32_t, drain_grace_s, 30,
          "on SIGTERM (or the Drain RPC): how long pushes and fetches in flight may run on");
ABSL_FLAG(bool, allow_remote_admin, false, "take the Drain RPC from other hosts than this one");
ABSL_FLAG(uint32_t, shuffle_ttl_s, 0,
          "delete a shuffle nobody used for this long (0 = never; servers on their own only)");
ABSL_FLAG(uint32_t, scrub_mb_per_s, 16,
          "read and check committed data in the background at this rate, MiB/s (0 = off)");
ABSL_FLAG(uint32_t, premerge_mb_per_s, 32,
          "merge partitions' committed runs into longer sorted runs in the background, writing "
          "at most this many MiB/s (0 = off)");
ABSL_FLAG(uint32_t, premerge_min_runs, 64,
          "fewest runs of a partition the background pre-merge merges at once");
ABSL_FLAG(uint64_t, max_open_shuffles, 0,
          "shuffles open at once; idle ones past it close (0 = what the open-files limit leaves "
          "beside the connections)");
ABSL_FLAG(uint64_t, index_memory_mb, 1024,
          "memory the open shuffles' frame indexes may take; idle shuffles past it close");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port for Prometheus metrics over HTTP (GET /metrics); empty = none");
ABSL_FLAG(uint32_t, disk_high_water_pct, 95,
          "refuse new pushes while the data directory's file system is fuller (0 = never)");
ABSL_FLAG(std::string, object_store, "",
          "s3://bucket/prefix: upload sealed partitions to this S3-compatible object store "
          "(credentials from the AWS environment variables and files)");
ABSL_FLAG(std::string, object_endpoint, "",
          "the store's scheme://host[:port] (empty: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else "
          "AWS's regional endpoint)");
ABSL_FLAG(std::string, object_region, "",
          "the store's signing region (empty: AWS_REGION, AWS_DEFAULT_REGION, the profile's, "
          "else us-east-1)");
ABSL_FLAG(std::string, object_addressing, "auto",
          "path (endpoint/bucket/key), virtual (bucket.endpoint/key), or auto (path with an "
          "endpoint)");
ABSL_FLAG(std::string, object_ca_file, "", "PEM CAs of the store's TLS (empty: the system's)");
ABSL_FLAG(uint64_t, object_mb_per_s, 64, "all uploads to the object store together, MiB/s");
ABSL_FLAG(uint64_t, object_part_mb, 8, "multipart uploads' part size, MiB (5 to 5120)");
ABSL_FLAG(int32_t, object_parallel_parts, 4, "parts of one upload in flight (1 to 64)");
ABSL_FLAG(uint32_t, object_evict_pct, 85,
          "with --object_store: shuffles whose every partition is in the store are evicted from "
          "a data directory fuller than this, in percent (0: never; below "
          "--disk_high_water_pct); their partitions are read back from the store when read");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the server: serve TLS (with --tls_key); watched for rotation");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CAs: require client certificates they signed (mutual TLS)");
ABSL_FLAG(uint32_t, tls_reload_s, 10,
          "look at the TLS files again this often: rotated certificates need no restart");
ABSL_FLAG(std::string, auth_file, "",
          "credentials every call must present (token hashes, certificate names -> tenant, "
          "role); watched for changes");
ABSL_FLAG(uint32_t, auth_reload_s, 10, "look at --auth_file again this often");
ABSL_FLAG(std::string, peer_tls_ca, "",
          "with TLS: PEM CAs the other servers' certificates chain to (re-replication dials "
          "them; without it a TLS server does not repair)");
ABSL_FLAG(std::string, peer_tls_server_name, "",
          "the name the other servers' certificates carry (empty: the host dialled)");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "PEM client certificate this server shows servers that ask for one (mutual TLS)");
ABSL_FLAG(std::string, peer_tls_key, "", "PEM private key of --peer_tls_cert");
ABSL_FLAG(std::string, peer_token_file, "",
          "with --auth_file: a file holding a token every server's --auth_file names as admin "
          "(re-replication presents it; without it such a server does not repair)");
ABSL_FLAG(uint64_t, tenant_max_shuffles, 1000,
          "shuffles a tenant may hold on this server, unless its quota line says (0 = no limit)");
ABSL_FLAG(uint64_t, tenant_max_stored_mb, 0,
          "MiB of shuffle data a tenant may hold on this server, unless its quota line says "
          "(0 = no limit)");
ABSL_FLAG(uint64_t, tenant_max_streams, 0,
          "push and fetch streams a tenant may have open at once, unless its quota line says (0 = "
          "no limit)");
ABSL_FLAG(bool, reflection, true, "serve gRPC server reflection (grpcurl list/describe)");
ABSL_FLAG(bool, plaintext, false,
          "serve without TLS on an address other hosts can reach (loopback is always allowed)");

namespace {

// Flags to options, refusing what is out of range: a value that would wrap (--max_frame_mb=4096
// shifted into 32 bits is 0) must not start a server. SluiceServer::Start checks the rest.
absl::StatusOr<sluice::ServerOptions> OptionsFromFlags() {
  sluice::ServerOptions opts;
  opts.listen_address = absl::GetFlag(FLAGS_listen);
  opts.data_dir = absl::GetFlag(FLAGS_data_dir);
  const uint64_t budget_mb = absl::GetFlag(FLAGS_memory_budget_mb);
  if (budget_mb < 1 || budget_mb > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory_budget_mb=", budget_mb, " is out of range [1, 16777216]"));
  }
  opts.memory_budget_bytes = budget_mb << 20;
  opts.fsync = absl::GetFlag(FLAGS_fsync);
  const uint64_t frame_mb = absl::GetFlag(FLAGS_max_frame_mb);
  if (frame_mb < 1 || (frame_mb << 20) > sluice::kMaxFrameCapBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--max_frame_mb=", frame_mb,
                                                   " is out of range [1, ",
                                                   sluice::kMaxFrameCapBytes >> 20, "]"));
  }
  opts.limits.max_uncompressed_bytes = static_cast<uint32_t>(frame_mb << 20);
  opts.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  opts.merge_fan_in = absl::GetFlag(FLAGS_merge_fan_in);
  opts.max_concurrent_merges = absl::GetFlag(FLAGS_max_concurrent_merges);
  opts.max_frames_per_attempt = absl::GetFlag(FLAGS_max_frames_per_attempt);
  opts.max_push_streams = absl::GetFlag(FLAGS_max_push_streams);
  opts.max_fetch_streams = absl::GetFlag(FLAGS_max_fetch_streams);
  opts.max_plain_push_streams = absl::GetFlag(FLAGS_max_plain_push_streams);
  opts.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);
  const double window_mb = absl::GetFlag(FLAGS_stream_window_mb);
  // (Written so that NaN fails too.) SluiceServer::Start checks the bytes' range again.
  if (!(window_mb == 0 || (window_mb >= 1.0 / 16 && window_mb <= 64))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream_window_mb=", window_mb, " is out of range: 0, or 0.0625 (64 KiB) to 64"));
  }
  opts.stream_window_bytes = static_cast<uint64_t>(std::llround(window_mb * (1 << 20)));
  // Seconds to milliseconds cannot overflow from 32 bits; the range is checked at Start.
  auto seconds = [](uint32_t s) { return std::chrono::milliseconds(uint64_t{s} * 1000); };
  opts.push_idle_timeout = seconds(absl::GetFlag(FLAGS_push_idle_timeout_s));
  opts.push_credit_timeout = seconds(absl::GetFlag(FLAGS_push_credit_timeout_s));
  opts.fetch_stall_timeout = seconds(absl::GetFlag(FLAGS_fetch_stall_timeout_s));
  opts.merge_park_after = seconds(absl::GetFlag(FLAGS_merge_park_after_s));
  opts.connection_idle_timeout = seconds(absl::GetFlag(FLAGS_connection_idle_timeout_s));
  opts.max_connections = absl::GetFlag(FLAGS_max_connections);
  opts.max_connections_per_address = absl::GetFlag(FLAGS_max_connections_per_address);
  opts.handshake_timeout = seconds(absl::GetFlag(FLAGS_handshake_timeout_s));
  opts.guard_connections = absl::GetFlag(FLAGS_guard_connections);
  opts.install_connection_guard = true;  // server/net/accept_shim.cc is linked in
  opts.listener_probe_interval = seconds(absl::GetFlag(FLAGS_listener_probe_s));
  opts.node_id = absl::GetFlag(FLAGS_node_id);
  opts.etcd_endpoints = absl::GetFlag(FLAGS_etcd);
  opts.etcd_prefix = absl::GetFlag(FLAGS_etcd_prefix);
  opts.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  opts.node_lease_ttl = std::chrono::seconds(absl::GetFlag(FLAGS_node_lease_s));
  opts.dead_after = std::chrono::seconds(absl::GetFlag(FLAGS_dead_after_s));
  opts.revives_per_s = absl::GetFlag(FLAGS_revives_per_s);
  opts.partition_split_bytes = uint64_t{absl::GetFlag(FLAGS_partition_split_mb)} << 20;
  opts.repair_bytes_per_s = uint64_t{absl::GetFlag(FLAGS_repair_mb_per_s)} << 20;
  opts.drain_grace = seconds(absl::GetFlag(FLAGS_drain_grace_s));
  opts.allow_remote_admin = absl::GetFlag(FLAGS_allow_remote_admin);
  opts.disk_high_water_pct = absl::GetFlag(FLAGS_disk_high_water_pct);
  opts.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  opts.shuffle_ttl = std::chrono::seconds(absl::GetFlag(FLAGS_shuffle_ttl_s));
  opts.scrub_bytes_per_s = uint64_t{absl::GetFlag(FLAGS_scrub_mb_per_s)} << 20;
  opts.premerge_bytes_per_s = uint64_t{absl::GetFlag(FLAGS_premerge_mb_per_s)} << 20;
  opts.premerge_min_runs = absl::GetFlag(FLAGS_premerge_min_runs);
  opts.max_open_shuffles = absl::GetFlag(FLAGS_max_open_shuffles);
  // MiB flags in bytes (past 2^24 MiB: 2^45 bytes, out of every range, named by the check).
  const auto mib = [](uint64_t n) { return n > (uint64_t{1} << 24) ? uint64_t{1} << 45 : n << 20; };
  opts.index_memory_bytes = mib(absl::GetFlag(FLAGS_index_memory_mb));
  opts.object_store = absl::GetFlag(FLAGS_object_store);
  opts.object_endpoint = absl::GetFlag(FLAGS_object_endpoint);
  opts.object_region = absl::GetFlag(FLAGS_object_region);
  opts.object_addressing = absl::GetFlag(FLAGS_object_addressing);
  opts.object_ca_file = absl::GetFlag(FLAGS_object_ca_file);
  opts.object_bytes_per_s = mib(absl::GetFlag(FLAGS_object_mb_per_s));
  opts.object_part_bytes = mib(absl::GetFlag(FLAGS_object_part_mb));
  opts.object_parallel_parts = absl::GetFlag(FLAGS_object_parallel_parts);
  opts.object_evict_pct = absl::GetFlag(FLAGS_object_evict_pct);
  opts.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  opts.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  opts.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  opts.tls.reload_interval = std::chrono::seconds(absl::GetFlag(FLAGS_tls_reload_s));
  opts.plaintext = absl::GetFlag(FLAGS_plaintext);
  opts.auth_file = absl::GetFlag(FLAGS_auth_file);
  opts.auth_reload_interval = std::chrono::seconds(absl::GetFlag(FLAGS_auth_reload_s));
  opts.peer_tls.ca_file = absl::GetFlag(FLAGS_peer_tls_ca);
  opts.peer_tls.server_name = absl::GetFlag(FLAGS_peer_tls_server_name);
  opts.peer_tls.cert_file = absl::GetFlag(FLAGS_peer_tls_cert);
  opts.peer_tls.key_file = absl::GetFlag(FLAGS_peer_tls_key);
  opts.peer_token_file = absl::GetFlag(FLAGS_peer_token_file);
  opts.tenant_max_shuffles = absl::GetFlag(FLAGS_tenant_max_shuffles);
  const uint64_t stored_mb = absl::GetFlag(FLAGS_tenant_max_stored_mb);
  if (stored_mb > (uint64_t{1} << 43)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenant_max_stored_mb=", stored_mb, " is out of range [0, 8796093022208]"));
  }
  opts.tenant_max_stored_bytes = stored_mb << 20;
  opts.tenant_max_streams = absl::GetFlag(FLAGS_tenant_max_streams);
  opts.reflection = absl::GetFlag(FLAGS_reflection);
  return opts;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("sluice-server --data_dir DIR [--listen HOST:PORT] [flags]");
  absl::ParseCommandLine(argc, argv);
  // Logs go to stderr; stdout only carries the "listening on port N" line.
  spdlog::set_default_logger(spdlog::stderr_color_mt("sluice"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  const std::string level = absl::GetFlag(FLAGS_log_level);
  spdlog::set_level(spdlog::level::from_str(level));
  if (level != "off" && spdlog::get_level() == spdlog::level::off) {  // from_str's "unknown"
    spdlog::set_level(spdlog::level::info);
    spdlog::critical(
        "event=start_failed error=\"--log_level={} is not one of trace, debug, info, warn, "
        "error, critical, off\"",
        level);
    return 2;
  }
  // Every shuffle holds descriptors: take all the hard limit allows (docs/operations.md).
  const uint64_t open_files = sluice::file::RaiseOpenFilesLimit();
  spdlog::info("event=open_files_limit limit={}", open_files);
  auto opts = OptionsFromFlags();
  if (!opts.ok()) {
    spdlog::critical("event=start_failed error=\"{}\"", opts.status().ToString());
    return 2;
  }

  // Signals are taken by sigwait below, not by handlers, so shutdown runs on a normal thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);  // look at the TLS files again now
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = sluice::SluiceServer::Start(*opts);
  if (!server.ok()) {
    spdlog::critical("event=start_failed error=\"{}\"", server.status().ToString());
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  // The port on stdout, for scripts and tests that start the server with port 0.
  std::cout << "listening on port " << (*server)->port() << std::endl;
  // A signal drains (a second one ends the grace at once); so does the Drain RPC. Once
  // drained, the server stops and the process exits 0.
  std::thread([&signals, &server, grace = opts->drain_grace] {
    for (int n = 0;; ++n) {
      int sig = 0;
      sigwait(&signals, &sig);
      spdlog::info("event=signal signal={}", sig);
      if (sig == SIGHUP) {
        (*server)->ReloadFiles();
        --n;
        continue;
      }
      (*server)->Drain(n == 0 ? grace : std::chrono::milliseconds(0));
    }
  }).detach();
  (*server)->WaitDrained();
  const bool listener_failed = (*server)->listener_failed();
  (*server)->Shutdown();
  // Out without destructors: the signal thread may still take a late SIGHUP or SIGTERM, and
  // must not find the server destroyed under it.
  spdlog::shutdown();
  std::fflush(nullptr);
  std::_Exit(listener_failed ? 1 : 0);  // (1: restart me, the listener is gone)
}
