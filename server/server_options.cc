#include "server/server_options.h"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cluster/membership.h"
#include "objstore/object_upload.h"
#include "objstore/s3_options.h"

namespace sluice {
namespace {

// A duration option in whole seconds within [1 s, 1 day], named by its flag.
absl::Status CheckSeconds(std::chrono::milliseconds d, const char* flag) {
  if (d < std::chrono::seconds(1) || d > std::chrono::hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", d.count() / 1000.0, " is out of range [1, 86400] seconds"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// host:port of the listen address with the port bound; a wildcard host becomes the host name.
std::string AdvertisedAddress(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") host = HostName();
  return absl::StrCat(host, ":", port);
}

// --data_dir's list: one directory per disk, comma-separated.
std::vector<std::string> SplitDataDirs(const std::string& list) {
  std::vector<std::string> out;
  for (absl::string_view d : absl::StrSplit(list, ',')) {
    std::string dir(d);
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    out.push_back(std::move(dir));
  }
  return out;
}

namespace {

// The object tier's flags (docs/object-store.md, "Configuration").
absl::Status ValidateObjectOptions(const ServerOptions& o) {
  if (o.object_store.empty()) {
    if (!o.object_endpoint.empty() || !o.object_region.empty() || !o.object_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--object_endpoint, --object_region and --object_ca_file are for --object_store");
    }
    return absl::OkStatus();
  }
  if (auto url = objstore::S3OptionsFromUrl(o.object_store); !url.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--object_store: ", url.status().message()));
  }
  if (o.object_addressing != "auto" && o.object_addressing != "path" &&
      o.object_addressing != "virtual") {
    return absl::InvalidArgumentError(absl::StrCat("--object_addressing='", o.object_addressing,
                                                   "' is not one of auto, path, virtual"));
  }
  if (o.object_bytes_per_s < (uint64_t{1} << 20) ||
      o.object_bytes_per_s > (uint64_t{100000} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--object_mb_per_s=", o.object_bytes_per_s >> 20,
                                                   " is out of range [1, 100000]"));
  }
  if (o.object_part_bytes < objstore::kMinPartBytes || o.object_part_bytes > (uint64_t{5} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--object_part_mb=", o.object_part_bytes >> 20,
        " is out of range [5, 5120] (S3 wants every part but the last at least 5 MiB)"));
  }
  if (o.object_parallel_parts < 1 || o.object_parallel_parts > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--object_parallel_parts=", o.object_parallel_parts, " is out of range [1, 64]"));
  }
  if (o.object_evict_pct > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--object_evict_pct=", o.object_evict_pct, " is out of range [0, 100]"));
  }
  if (o.object_evict_pct != 0 && o.disk_high_water_pct != 0 && o.disk_high_water_pct < 100 &&
      o.object_evict_pct >= o.disk_high_water_pct) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--object_evict_pct=", o.object_evict_pct, " must be below --disk_high_water_pct=",
        o.disk_high_water_pct, ": eviction makes room before pushes are refused"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateOptions(const ServerOptions& o) {
  if (o.data_dir.empty())
    return absl::InvalidArgumentError("a data directory is required (--data_dir)");
  std::set<std::string> seen;
  for (const std::string& dir : SplitDataDirs(o.data_dir)) {
    if (dir.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data_dir=", o.data_dir, " has an empty directory in its list"));
    }
    if (!seen.insert(dir).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data_dir=", o.data_dir, " names ", dir, " twice"));
    }
  }
  if (o.limits.max_uncompressed_bytes == 0 || o.limits.max_uncompressed_bytes > kMaxFrameCapBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the frame cap (--max_frame_mb) is ",
                                                   o.limits.max_uncompressed_bytes,
                                                   " bytes; it must be 1 byte to 1 GiB"));
  }
  if (o.limits.max_records == 0)
    return absl::InvalidArgumentError("the record cap must be at least 1");
  if (o.memory_budget_bytes == 0) {
    return absl::InvalidArgumentError("the memory budget (--memory_budget_mb) must not be 0");
  }
  if (o.worker_threads < 1 || o.worker_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_threads=", o.worker_threads, " is out of range [1, 1024]"));
  }
  if (o.merge_fan_in < 2 || o.merge_fan_in > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("--merge_fan_in=", o.merge_fan_in, " is out of range [2, 65536]"));
  }
  if (o.max_frames_per_attempt == 0) {
    return absl::InvalidArgumentError("--max_frames_per_attempt must be at least 1");
  }
  for (const auto& [n, flag] :
       {std::pair<size_t, const char*>{o.max_push_streams, "--max_push_streams"},
        {o.max_fetch_streams, "--max_fetch_streams"},
        {o.max_streams_per_connection, "--max_streams_per_connection"}}) {
    if (n < 1 || n > 1000000) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "=", n, " is out of range [1, 1000000]"));
    }
  }
  if (o.max_plain_push_streams > 100000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_plain_push_streams=", o.max_plain_push_streams, " is out of range [0, 100000]"));
  }
  if (o.stream_window_bytes != 0 && (o.stream_window_bytes < (uint64_t{64} << 10) ||
                                     o.stream_window_bytes > (uint64_t{64} << 20))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stream_window_mb=", static_cast<double>(o.stream_window_bytes) / (1 << 20),
                     " is out of range: 0, or 0.0625 (64 KiB) to 64"));
  }
  if (auto st = CheckSeconds(o.push_idle_timeout, "--push_idle_timeout_s"); !st.ok()) return st;
  if (auto st = CheckSeconds(o.push_credit_timeout, "--push_credit_timeout_s"); !st.ok()) {
    return st;
  }
  if (auto st = CheckSeconds(o.fetch_stall_timeout, "--fetch_stall_timeout_s"); !st.ok()) {
    return st;
  }
  if (auto st = CheckSeconds(o.merge_park_after, "--merge_park_after_s"); !st.ok()) return st;
  if (auto st = CheckSeconds(o.connection_idle_timeout, "--connection_idle_timeout_s"); !st.ok()) {
    return st;
  }
  if (o.max_connections > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_connections=", o.max_connections, " is out of range [0, 1000000]"));
  }
  if (o.max_connections_per_address > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_connections_per_address=", o.max_connections_per_address,
                     " is out of range [0, 1000000]"));
  }
  if (o.listener_probe_interval > std::chrono::hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listener_probe_s=", o.listener_probe_interval.count() / 1000,
                     " is out of range [0, 3600]"));
  }
  if (o.handshake_timeout < std::chrono::seconds(1) ||
      o.handshake_timeout > std::chrono::seconds(300)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--handshake_timeout_s=", o.handshake_timeout.count() / 1000, " is out of range [1, 300]"));
  }
  if (absl::Status st = ValidateObjectOptions(o); !st.ok()) return st;
  if (o.disk_high_water_pct > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--disk_high_water_pct=", o.disk_high_water_pct, " is out of range [0, 100]"));
  }
  if (o.shuffle_ttl > std::chrono::hours(24 * 365)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shuffle_ttl_s=", o.shuffle_ttl.count(), " is out of range [0, 31536000]"));
  }
  if (o.max_open_shuffles > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_open_shuffles=", o.max_open_shuffles, " is out of range [0, 1000000]"));
  }
  if (o.index_memory_bytes < (uint64_t{1} << 20) || o.index_memory_bytes > (uint64_t{1} << 44)) {
    return absl::InvalidArgumentError(absl::StrCat("--index_memory_mb=", o.index_memory_bytes >> 20,
                                                   " is out of range [1, 16777216]"));
  }
  if (o.scrub_bytes_per_s > (uint64_t{10000} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--scrub_mb_per_s=", o.scrub_bytes_per_s >> 20,
                                                   " is out of range [0, 10000]"));
  }
  if (o.premerge_bytes_per_s > (uint64_t{10000} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--premerge_mb_per_s=", o.premerge_bytes_per_s >> 20, " is out of range [0, 10000]"));
  }
  if (o.premerge_min_runs < 2 || o.premerge_min_runs > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--premerge_min_runs=", o.premerge_min_runs,
                     " is out of range [2, 4096] (a merge of one run would copy it)"));
  }
  if (o.shuffle_ttl.count() > 0 && !o.etcd_endpoints.empty()) {
    return absl::InvalidArgumentError(
        "--shuffle_ttl_s is for a server on its own: in a cluster, a shuffle idle on one server "
        "may be in use on another; engines delete their shuffles (DeleteShuffle)");
  }
  if (o.drain_grace > std::chrono::hours(24)) {
    return absl::InvalidArgumentError(absl::StrCat("--drain_grace_s=", o.drain_grace.count() / 1000,
                                                   " is out of range [0, 86400]"));
  }
  if (!o.node_id.empty()) {
    if (auto st = ValidateNodeId(o.node_id); !st.ok()) return st;
  }
  if (o.node_lease_ttl < std::chrono::seconds(1) || o.node_lease_ttl > std::chrono::hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_lease_s=", o.node_lease_ttl.count(), " is out of range [1, 3600]"));
  }
  if (o.repair_bytes_per_s > (uint64_t{10000} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--repair_mb_per_s=", o.repair_bytes_per_s >> 20,
                                                   " is out of range [0, 10000]"));
  }
  if (o.partition_split_bytes > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--partition_split_mb=", o.partition_split_bytes >> 20, " is out of range [0, 1048576]"));
  }
  if (o.revives_per_s > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--revives_per_s=", o.revives_per_s, " is out of range [0, 10000]"));
  }
  if (o.dead_after > std::chrono::hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dead_after_s=", o.dead_after.count(), " is out of range [0, 86400]"));
  }
  if (!o.etcd_endpoints.empty() &&
      (o.etcd_prefix.empty() || o.etcd_prefix.front() != '/' || o.etcd_prefix.back() != '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_prefix='", o.etcd_prefix, "' must start and end with '/'"));
  }
  if (!o.auth_file.empty() && (o.auth_reload_interval < std::chrono::seconds(1) ||
                               o.auth_reload_interval > std::chrono::hours(24))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_reload_s=", o.auth_reload_interval.count(), " is out of range [1, 86400]"));
  }
  if (o.peer_tls.cert_file.empty() != o.peer_tls.key_file.empty()) {
    return absl::InvalidArgumentError("--peer_tls_cert and --peer_tls_key go together");
  }
  if (!o.tls.enabled() && o.peer_tls.On()) {
    return absl::InvalidArgumentError(
        "--peer_tls_* are for a server with TLS (--tls_cert, --tls_key): its peers serve TLS");
  }
  if (!o.peer_token_file.empty() && o.auth_file.empty()) {
    return absl::InvalidArgumentError(
        "--peer_token_file is for a server with --auth_file: its peers ask for credentials");
  }
  // The listening port: TLS, or plaintext, which leaves this machine only when asked for
  // explicitly.
  if (o.tls.enabled()) {
    if (o.plaintext) {
      return absl::InvalidArgumentError("--plaintext and --tls_cert exclude each other");
    }
    if (o.tls.reload_interval < std::chrono::seconds(1) ||
        o.tls.reload_interval > std::chrono::hours(24)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_reload_s=", o.tls.reload_interval.count(), " is out of range [1, 86400]"));
    }
    return absl::OkStatus();
  }
  if (!o.tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
  }
  if (!rpc::IsLoopbackAddress(o.listen_address) && !o.plaintext) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", o.listen_address,
        " is reachable from other hosts: give --tls_cert and --tls_key (docs/security.md), or "
        "--plaintext to serve in clear anyway"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ResolvedOptions> ResolveOptions(const ServerOptions& o, uint64_t open_files_limit) {
  if (absl::Status st = ValidateOptions(o); !st.ok()) return st;
  ResolvedOptions r;
  r.clustered = !o.etcd_endpoints.empty();
  r.merges = o.max_concurrent_merges != 0 ? o.max_concurrent_merges
                                          : static_cast<size_t>(o.worker_threads);
  r.merge_threads = static_cast<int>(std::min<size_t>(r.merges, 64));
  r.merge_memory_bytes = std::max<uint64_t>(o.memory_budget_bytes / r.merges, 1);
  r.merge_limit_name = absl::StrCat("--memory_budget_mb=", o.memory_budget_bytes >> 20,
                                    " shared by --max_concurrent_merges=", r.merges,
                                    "; raise the budget or allow fewer merges");
  r.premerge_memory_bytes =
      std::min(r.merge_memory_bytes, std::max<uint64_t>(o.memory_budget_bytes / 4, 1));
  r.premerge_disk_mark_pct = o.disk_high_water_pct == 0   ? 90
                             : o.disk_high_water_pct > 20 ? o.disk_high_water_pct - 10
                                                          : o.disk_high_water_pct;
  // With the object tier, the pre-merge's copies never take a disk past where eviction begins.
  if (!o.object_store.empty() && o.object_evict_pct != 0) {
    r.premerge_disk_mark_pct = std::min(r.premerge_disk_mark_pct, o.object_evict_pct);
  }
  r.settle = 2 * std::chrono::duration_cast<std::chrono::milliseconds>(o.node_lease_ttl);
  r.descriptor_limit = static_cast<int>(std::min<uint64_t>(open_files_limit, 1 << 22));
  r.max_connections = o.max_connections != 0
                          ? o.max_connections
                          : std::max<size_t>(static_cast<size_t>(r.descriptor_limit) / 2, 16);
  r.max_connections_per_address = o.max_connections_per_address != 0
                                      ? o.max_connections_per_address
                                      : std::clamp<size_t>(r.max_connections / 4, 1, 256);
  const size_t descriptors = static_cast<size_t>(r.descriptor_limit);
  r.max_open_shuffles =
      o.max_open_shuffles != 0
          ? o.max_open_shuffles
          : std::max<size_t>(
                16, (descriptors - std::min<size_t>(descriptors, r.max_connections + 256)) / 2);
  return r;
}

}  // namespace sluice
