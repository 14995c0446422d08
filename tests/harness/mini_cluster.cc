#include "tests/harness/mini_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "tests/harness/wait.h"

#ifndef SLUICE_SERVER_BIN
#error "SLUICE_SERVER_BIN must name the sluice-server executable"
#endif

namespace sluice::testing {

absl::StatusOr<std::unique_ptr<MiniCluster>> MiniCluster::Start(MiniClusterOptions options) {
  std::unique_ptr<MiniCluster> cluster(new MiniCluster(std::move(options)));
  if (cluster->options_.etcd) {
    SLUICE_ASSIGN_OR_RETURN(cluster->etcd_,
                            EtcdProcess::Start("127.0.0.1", cluster->options_.etcd_also_on));
  }
  for (size_t i = 0; i < cluster->options_.servers; ++i) {
    SLUICE_RETURN_IF_ERROR(cluster->Add().status());
  }
  return cluster;
}

MiniCluster::~MiniCluster() {
  for (Server& s : servers_) s.process.reset();  // SIGKILL
}

std::string MiniCluster::Host(size_t i) const {
  if (i < servers_.size() && !servers_[i].place.host.empty()) return servers_[i].place.host;
  return options_.etcd ? absl::StrCat("127.0.0.", i + 2) : "127.0.0.1";
}

absl::StatusOr<size_t> MiniCluster::AddIn(const ServerPlace& place,
                                          const std::vector<std::string>& extra) {
  if (!options_.etcd) return absl::FailedPreconditionError("a server elsewhere needs etcd");
  const size_t i = servers_.size();
  Server s;
  s.place = place;
  s.port = 20000 + static_cast<int>(::getpid() % 20000);  // (its own namespace: free)
  s.address = absl::StrCat(place.host, ":", s.port);
  s.owned_dir = std::make_unique<TempDir>();
  s.dir = s.owned_dir->path();
  servers_.push_back(std::move(s));
  if (absl::Status st = Restart(i, extra); !st.ok()) {
    servers_.pop_back();
    return st;
  }
  return i;
}

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

absl::StatusOr<size_t> MiniCluster::Add(const std::vector<std::string>& extra,
                                        const std::string& data_dir) {
  const size_t i = servers_.size();
  Server s;
  // A cluster's servers register their address, so it is picked first; a standalone server
  // takes the kernel's pick at its first start and keeps it.
  if (options_.etcd) {
    SLUICE_ASSIGN_OR_RETURN(s.port, FreePort(Host(i)));
  }
  s.address = absl::StrCat(Host(i), ":", s.port);
  if (data_dir.empty()) {
    s.owned_dir = std::make_unique<TempDir>();
    s.dir = s.owned_dir->path();
  } else {
    s.dir = data_dir;
  }
  servers_.push_back(std::move(s));
  if (absl::Status st = Restart(i, extra); !st.ok()) {
    servers_.pop_back();
    return st;
  }
  return i;
}

absl::Status MiniCluster::Restart(size_t i, const std::vector<std::string>& extra) {
  Server& s = servers_[i];
  s.process.reset();
  s.extra = extra;
  std::vector<std::string> args;
  std::string binary = SLUICE_SERVER_BIN;
  if (!options_.nofile.empty()) {
    args = {"--nofile=" + options_.nofile, binary};
    binary = "/usr/bin/prlimit";
  }
  if (!s.place.netns.empty()) {
    args.insert(args.begin(), {"netns", "exec", s.place.netns, binary});
    binary = "/usr/sbin/ip";
  }
  args.push_back("--data_dir=" + s.dir);
  args.push_back("--listen=" + s.address);
  if (options_.etcd) {
    args.push_back("--etcd=" + (s.place.etcd.empty() ? etcd_->endpoint() : s.place.etcd));
    args.push_back("--node_id=" + node_id(i));
    args.push_back(absl::StrCat("--node_lease_s=", options_.lease_s));
  }
  args.insert(args.end(), options_.flags.begin(), options_.flags.end());
  args.insert(args.end(), extra.begin(), extra.end());
  SLUICE_ASSIGN_OR_RETURN(s.process, ServerProcess::Start(binary, args, Host(i)));
  if (s.port == 0) {
    s.port = s.process->port();
    s.address = absl::StrCat(Host(i), ":", s.port);
  }
  return absl::OkStatus();
}

absl::Status MiniCluster::Stop(size_t i) {
  if (servers_[i].process == nullptr) return absl::FailedPreconditionError("not running");
  absl::Status st = servers_[i].process->Stop();
  servers_[i].process.reset();
  return st;
}

int MiniCluster::Kill(size_t i) { return Signal(i, SIGKILL); }

int MiniCluster::Signal(size_t i, int sig) {
  if (servers_[i].process == nullptr) return -1;
  const int status = servers_[i].process->Signal(sig);
  servers_[i].process.reset();
  return status;
}

void MiniCluster::Pause(size_t i) {
  if (servers_[i].process != nullptr) StopProcess(servers_[i].process->pid());
}

void MiniCluster::Resume(size_t i) {
  if (servers_[i].process != nullptr) ::kill(servers_[i].process->pid(), SIGCONT);
}

absl::Status MiniCluster::Wipe(size_t i) {
  if (servers_[i].process != nullptr) {
    return absl::FailedPreconditionError("wipe a server's disk only while it is down");
  }
  servers_[i].owned_dir = std::make_unique<TempDir>();
  servers_[i].dir = servers_[i].owned_dir->path();
  return absl::OkStatus();
}

ClientOptions MiniCluster::ShortDeadlines() {
  ClientOptions options;
  options.call_deadline = std::chrono::seconds(5);
  options.keepalive_time = std::chrono::seconds(1);
  options.keepalive_timeout = std::chrono::seconds(1);
  return options;
}

absl::StatusOr<std::unique_ptr<ShuffleClient>> MiniCluster::Client(ClientOptions options) const {
  options.server = addresses();
  return ShuffleClient::Connect(options);
}

absl::StatusOr<std::unique_ptr<ShuffleClient>> MiniCluster::ClientOf(size_t i,
                                                                     ClientOptions options) const {
  options.server = address(i);
  return ShuffleClient::Connect(options);
}

std::unique_ptr<ServerLink> MiniCluster::Link(size_t i, ClientOptions options) const {
  options.server = address(i);
  return ConnectServer(options);
}

}  // namespace sluice::testing
