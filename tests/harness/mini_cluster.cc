#include "tests/harness/mini_cluster.h"

#include <signal.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codec/status_macros.h"

#ifndef SLUICE_SERVER_BIN
#error "SLUICE_SERVER_BIN must name the sluice-server executable"
#endif

namespace sluice::testing {

absl::StatusOr<std::unique_ptr<MiniCluster>> MiniCluster::Start(MiniClusterOptions options) {
  std::unique_ptr<MiniCluster> cluster(new MiniCluster(std::move(options)));
  SLUICE_ASSIGN_OR_RETURN(cluster->etcd_, EtcdProcess::Start());
  for (size_t i = 0; i < cluster->options_.servers; ++i) {
    SLUICE_RETURN_IF_ERROR(cluster->Add().status());
  }
  return cluster;
}

MiniCluster::~MiniCluster() {
  for (Server& s : servers_) s.process.reset();  // SIGKILL
}

std::string MiniCluster::Host(size_t i) { return absl::StrCat("127.0.0.", i + 2); }

std::string MiniCluster::node_id(size_t i) const { return absl::StrCat("n", i); }

size_t MiniCluster::index_of(const std::string& node_id) const {
  for (size_t i = 0; i < servers_.size(); ++i) {
    if (this->node_id(i) == node_id) return i;
  }
  return servers_.size();
}

std::string MiniCluster::addresses() const {
  std::vector<std::string> all;
  for (const Server& s : servers_) all.push_back(s.address);
  return absl::StrJoin(all, ",");
}

pid_t MiniCluster::pid(size_t i) const {
  return servers_[i].process != nullptr ? servers_[i].process->pid() : 0;
}

absl::StatusOr<size_t> MiniCluster::Add(const std::vector<std::string>& extra) {
  const size_t i = servers_.size();
  SLUICE_ASSIGN_OR_RETURN(const int port, FreePort(Host(i)));
  servers_.push_back(
      Server{absl::StrCat(Host(i), ":", port), std::make_unique<TempDir>(), {}, nullptr});
  SLUICE_RETURN_IF_ERROR(Restart(i, extra));
  return i;
}

absl::Status MiniCluster::Restart(size_t i, const std::vector<std::string>& extra) {
  Server& s = servers_[i];
  s.process.reset();
  s.extra = extra;
  std::vector<std::string> flags = {"--data_dir=" + s.dir->path(), "--etcd=" + etcd_->endpoint(),
                                    "--node_id=" + node_id(i), "--listen=" + s.address,
                                    absl::StrCat("--node_lease_s=", options_.lease_s)};
  flags.insert(flags.end(), options_.flags.begin(), options_.flags.end());
  flags.insert(flags.end(), extra.begin(), extra.end());
  SLUICE_ASSIGN_OR_RETURN(s.process, ServerProcess::Start(SLUICE_SERVER_BIN, flags, Host(i)));
  return absl::OkStatus();
}

absl::Status MiniCluster::Stop(size_t i) {
  if (servers_[i].process == nullptr) return absl::FailedPreconditionError("not running");
  absl::Status st = servers_[i].process->Stop();
  servers_[i].process.reset();
  return st;
}

int MiniCluster::Kill(size_t i) {
  if (servers_[i].process == nullptr) return -1;
  const int status = servers_[i].process->Signal(SIGKILL);
  servers_[i].process.reset();
  return status;
}

void MiniCluster::Pause(size_t i) {
  if (servers_[i].process != nullptr) ::kill(servers_[i].process->pid(), SIGSTOP);
}

void MiniCluster::Resume(size_t i) {
  if (servers_[i].process != nullptr) ::kill(servers_[i].process->pid(), SIGCONT);
}

absl::Status MiniCluster::Wipe(size_t i) {
  if (servers_[i].process != nullptr) {
    return absl::FailedPreconditionError("wipe a server's disk only while it is down");
  }
  servers_[i].dir = std::make_unique<TempDir>();
  return absl::OkStatus();
}

ClientOptions MiniCluster::ShortDeadlines(const std::string& servers, ClientOptions extra) {
  const ClientOptions defaults;
  extra.server = servers;
  if (extra.call_deadline == defaults.call_deadline) extra.call_deadline = std::chrono::seconds(5);
  if (extra.keepalive_time == defaults.keepalive_time) {
    extra.keepalive_time = std::chrono::seconds(1);
  }
  if (extra.keepalive_timeout == defaults.keepalive_timeout) {
    extra.keepalive_timeout = std::chrono::seconds(1);
  }
  return extra;
}

absl::StatusOr<std::unique_ptr<ShuffleClient>> MiniCluster::Client(ClientOptions extra) const {
  return ShuffleClient::Connect(ShortDeadlines(addresses(), std::move(extra)));
}

absl::StatusOr<std::unique_ptr<ShuffleClient>> MiniCluster::ClientOf(size_t i,
                                                                     ClientOptions extra) const {
  return ShuffleClient::Connect(ShortDeadlines(address(i), std::move(extra)));
}

std::unique_ptr<ServerLink> MiniCluster::Link(size_t i, ClientOptions extra) const {
  return ConnectServer(ShortDeadlines(address(i), std::move(extra)));
}

}  // namespace sluice::testing
