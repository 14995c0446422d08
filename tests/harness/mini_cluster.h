// MiniCluster: the one launcher of sluice-server processes in the tests (Kudu's external
// mini-cluster). In cluster mode, a real etcd and N servers, server i on its own loopback
// address (127.0.0.<i+2>), registered as node n<i>; standalone (etcd = false), servers on
// 127.0.0.1 registered nowhere: one daemon's tests (signals, descriptor limits) and
// MiniServer's child process. Each server keeps its address and its data directory across
// restarts; tests stop, kill, signal, pause, wipe and restart servers by index, and get their
// clients here.
//
//   ASSERT_OK_AND_ASSIGN(auto cluster, MiniCluster::Start({.servers = 3}));
//   ASSERT_OK_AND_ASSIGN(auto client, cluster->Client());  // every server, short deadlines
//   cluster->Kill(1);                 // kill -9
//   ASSERT_OK(cluster->Wipe(1));      // a new, empty disk
//   ASSERT_OK(cluster->Restart(1));   // same node id, same address
#ifndef SLUICE_TESTS_HARNESS_MINI_CLUSTER_H_
#define SLUICE_TESTS_HARNESS_MINI_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/server_process.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "tests/harness/etcd_process.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {

struct MiniClusterOptions {
  size_t servers = 3;
  /// Cluster mode: etcd first, and each server registered in it. false: standalone servers on
  /// 127.0.0.1, no etcd.
  bool etcd = true;
  /// --node_lease_s: a dead server leaves the list this long after it stopped renewing.
  int lease_s = 2;
  /// "soft:hard": the servers run under `prlimit --nofile=soft:hard` (empty: this process's
  /// limits).
  std::string nofile;
  /// Flags every server gets besides the harness's own (data directory, listen address, and
  /// in cluster mode etcd, node id and lease).
  std::vector<std::string> flags = {"--worker_threads=2", "--memory_budget_mb=64",
                                    "--log_level=warn"};
  /// Another address etcd answers on (at its port), for servers in a network namespace.
  std::string etcd_also_on;
};

/// Where a server runs other than on the host's loopback (MiniCluster::AddIn): in network
/// namespace `netns` (`ip netns exec`), listening on `host`, reaching etcd at `etcd`.
struct ServerPlace {
  std::string netns;
  std::string host;
  std::string etcd;
};

class MiniCluster {
 public:
  /// etcd (cluster mode), then the servers, each serving (and registered) when this returns.
  static absl::StatusOr<std::unique_ptr<MiniCluster>> Start(MiniClusterOptions options = {});
  ~MiniCluster();  // every server and etcd killed; the directories it made removed

  size_t size() const { return servers_.size(); }
  /// Cluster mode only.
  EtcdProcess& etcd() { return *etcd_; }
  const std::string& etcd_endpoint() const { return etcd_->endpoint(); }

  /// Server i's node id ("n<i>"), address (host:port, kept across restarts), port, data
  /// directory.
  std::string node_id(size_t i) const;
  /// The index of the server registered as `node_id` (size() if none is).
  size_t index_of(const std::string& node_id) const;
  const std::string& address(size_t i) const { return servers_[i].address; }
  int port(size_t i) const { return servers_[i].port; }
  const std::string& data_dir(size_t i) const { return servers_[i].dir; }
  /// Every server's address, comma-separated: a client's server list.
  std::string addresses() const;
  /// Whether server i runs (started and not stopped or killed); its process id then.
  bool running(size_t i) const { return servers_[i].process != nullptr; }
  pid_t pid(size_t i) const;
  /// Server i's process while it runs (its memory, its CPU time), else null.
  ServerProcess* process(size_t i) const { return servers_[i].process.get(); }

  /// Starts server i again on its directory and address, with `extra` flags this time.
  absl::Status Restart(size_t i, const std::vector<std::string>& extra = {});
  /// SIGTERM: it drains and exits; OK if it exited 0.
  absl::Status Stop(size_t i);
  /// kill -9; returns the wait status.
  int Kill(size_t i);
  /// Sends `sig` (0: none, for a server that exits by itself) and waits for it to exit; returns
  /// the wait status (-1 if it was not running).
  int Signal(size_t i, int sig);
  /// SIGSTOP and SIGCONT: a hung server, and one that comes back.
  void Pause(size_t i);
  void Resume(size_t i);
  /// Server i's data directory replaced by an empty one (a lost disk); it must not run.
  absl::Status Wipe(size_t i);
  /// A server more (index size() before the call) joins from `place` (see ServerPlace).
  absl::StatusOr<size_t> AddIn(const ServerPlace& place,
                               const std::vector<std::string>& extra = {});
  /// A server more (index size() before the call) joins, with `extra` flags, on `data_dir`
  /// (the caller's, left in place; empty: a new one the cluster removes).
  absl::StatusOr<size_t> Add(const std::vector<std::string>& extra = {},
                             const std::string& data_dir = {});

  /// Clients, with `options` but the servers (by default ShortDeadlines()).
  ///
  /// A client of every server (what a job's client is given).
  absl::StatusOr<std::unique_ptr<ShuffleClient>> Client(
      ClientOptions options = ShortDeadlines()) const;
  /// A client given server i's address alone (in a cluster, it learns the others from it).
  absl::StatusOr<std::unique_ptr<ShuffleClient>> ClientOf(
      size_t i, ClientOptions options = ShortDeadlines()) const;
  /// Server i alone, never routed elsewhere: its own answers (status, placement, shuffles).
  std::unique_ptr<ServerLink> Link(size_t i, ClientOptions options = ShortDeadlines()) const;
  /// The tests' client options: unary calls of 5 s, and a hung server found within about 2 s
  /// (keepalive_time and keepalive_timeout 1 s). Start from these to add a token, TLS...
  static ClientOptions ShortDeadlines();

 private:
  struct Server {
    std::string address;
    int port = 0;
    std::string dir;
    std::unique_ptr<TempDir> owned_dir;  // when the cluster made `dir`
    std::vector<std::string> extra;      // the flags of its last start
    std::unique_ptr<ServerProcess> process;
    ServerPlace place;  // (empty: the host's loopback)
  };
  explicit MiniCluster(MiniClusterOptions options) : options_(std::move(options)) {}
  std::string Host(size_t i) const;

  const MiniClusterOptions options_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<Server> servers_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_MINI_CLUSTER_H_
