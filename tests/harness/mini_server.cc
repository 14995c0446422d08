#include "tests/harness/mini_server.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace sluice::testing {
namespace {

// The flags of a child process for `o` (tests always log at warn).
absl::StatusOr<std::vector<std::string>> ChildFlags(const ServerOptions& o) {
  if (o.limits.max_uncompressed_bytes % (1 << 20) != 0) {
    return absl::InvalidArgumentError(
        "a child server's frame cap is whole MiB (--max_frame_mb); run it in process instead");
  }
  for (auto d : {o.push_idle_timeout, o.push_credit_timeout, o.fetch_stall_timeout,
                 o.connection_idle_timeout}) {
    if (d.count() % 1000 != 0) {
      return absl::InvalidArgumentError(
          "a child server's timeouts are whole seconds; run it in process instead");
    }
  }
  return std::vector<std::string>{
      absl::StrCat("--memory_budget_mb=", o.memory_budget_bytes >> 20),
      absl::StrCat("--fsync=", o.fsync ? "true" : "false"),
      absl::StrCat("--max_frame_mb=", o.limits.max_uncompressed_bytes >> 20),
      absl::StrCat("--worker_threads=", o.worker_threads),
      absl::StrCat("--merge_fan_in=", o.merge_fan_in),
      absl::StrCat("--max_concurrent_merges=", o.max_concurrent_merges),
      absl::StrCat("--max_frames_per_attempt=", o.max_frames_per_attempt),
      absl::StrCat("--max_push_streams=", o.max_push_streams),
      absl::StrCat("--max_fetch_streams=", o.max_fetch_streams),
      absl::StrCat("--max_streams_per_connection=", o.max_streams_per_connection),
      absl::StrCat("--stream_window_mb=", static_cast<double>(o.stream_window_bytes) / (1 << 20)),
      absl::StrCat("--push_idle_timeout_s=", o.push_idle_timeout.count() / 1000),
      absl::StrCat("--push_credit_timeout_s=", o.push_credit_timeout.count() / 1000),
      absl::StrCat("--fetch_stall_timeout_s=", o.fetch_stall_timeout.count() / 1000),
      absl::StrCat("--connection_idle_timeout_s=", o.connection_idle_timeout.count() / 1000),
      absl::StrCat("--drain_grace_s=", o.drain_grace.count() / 1000),
      absl::StrCat("--disk_high_water_pct=", o.disk_high_water_pct),
      absl::StrCat("--shuffle_ttl_s=", o.shuffle_ttl.count()),
      absl::StrCat("--scrub_mb_per_s=", o.scrub_bytes_per_s >> 20),
      absl::StrCat("--premerge_mb_per_s=", o.premerge_bytes_per_s >> 20),
      absl::StrCat("--premerge_min_runs=", o.premerge_min_runs),
      absl::StrCat("--metrics_listen=", o.metrics_listen),
      absl::StrCat("--tls_cert=", o.tls.cert_file),
      absl::StrCat("--tls_key=", o.tls.key_file),
      absl::StrCat("--tls_client_ca=", o.tls.client_ca_file),
      absl::StrCat("--tls_reload_s=", o.tls.reload_interval.count()),
      absl::StrCat("--plaintext=", o.plaintext ? "true" : "false"),
      absl::StrCat("--auth_file=", o.auth_file),
      absl::StrCat("--auth_reload_s=", o.auth_reload_interval.count()),
      absl::StrCat("--tenant_max_shuffles=", o.tenant_max_shuffles),
      absl::StrCat("--tenant_max_stored_mb=", o.tenant_max_stored_bytes >> 20),
      absl::StrCat("--tenant_max_streams=", o.tenant_max_streams),
      absl::StrCat("--reflection=", o.reflection ? "true" : "false"),
      "--log_level=warn"};
}

}  // namespace

absl::StatusOr<std::unique_ptr<MiniServer>> MiniServer::Start(MiniServerOptions options) {
  std::unique_ptr<MiniServer> server(new MiniServer(std::move(options)));
  if (server->options_.server.data_dir.empty()) {
    server->owned_dir_.emplace();
    server->options_.server.data_dir = server->owned_dir_->path();
  }
  SLUICE_RETURN_IF_ERROR(server->Launch());
  return server;
}

MiniServer::~MiniServer() { (void)Stop(); }

absl::Status MiniServer::Launch() {
  options_.server.listen_address = "127.0.0.1:0";
  if (options_.child_process) {
    SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> flags, ChildFlags(options_.server));
    if (child_ == nullptr) {
      MiniClusterOptions standalone;
      standalone.servers = 0;
      standalone.etcd = false;
      standalone.flags = {};  // (ChildFlags gives them all)
      SLUICE_ASSIGN_OR_RETURN(child_, MiniCluster::Start(standalone));
      if (absl::Status st = child_->Add(flags, options_.server.data_dir).status(); !st.ok()) {
        child_.reset();
        return st;
      }
    } else {
      SLUICE_RETURN_IF_ERROR(child_->Restart(0, flags));
    }
    port_ = child_->port(0);
    return absl::OkStatus();
  }
  SLUICE_ASSIGN_OR_RETURN(in_process_, SluiceServer::Start(options_.server));
  port_ = in_process_->port();
  return absl::OkStatus();
}

absl::Status MiniServer::Restart() { return Restart(options_); }

absl::Status MiniServer::Restart(MiniServerOptions options) {
  SLUICE_RETURN_IF_ERROR(Stop());
  options.server.data_dir = options_.server.data_dir;
  options_ = std::move(options);
  return Launch();
}

absl::Status MiniServer::Stop() {
  port_ = 0;
  if (in_process_ != nullptr) in_process_.reset();  // Shutdown
  if (child_ == nullptr || !child_->running(0)) return absl::OkStatus();
  return child_->Stop(0);
}

int MiniServer::Kill(int sig) {
  if (child_ == nullptr) return -1;
  port_ = 0;
  return child_->Signal(0, sig);
}

pid_t MiniServer::pid() const { return child_ != nullptr ? child_->pid(0) : 0; }

absl::StatusOr<std::unique_ptr<ShuffleClient>> MiniServer::Client(ClientOptions options) const {
  if (port_ == 0) return absl::FailedPreconditionError("the mini server is not running");
  options.server = address();
  return ShuffleClient::Connect(options);
}

}  // namespace sluice::testing
