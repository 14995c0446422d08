// Membership: a server's registration in its cluster. A server started with --etcd puts
// <prefix>nodes/<node_id> = {address, started} in etcd, attached to a lease it renews every
// third of the lease's TTL; the key goes when the server leaves (the lease revoked) or dies
// (the lease expires). Anyone can list the registered servers (docs/cluster.md).
//
//   SLUICE_ASSIGN_OR_RETURN(auto member, Membership::Join(etcd, {.node_id = "sluice-0", ...}));
//   SLUICE_ASSIGN_OR_RETURN(std::vector<NodeEntry> nodes, member->Nodes());
//
// A node id belongs to one live server. A server that restarts at the address it had takes its
// registration over at once; one at another address (rescheduled elsewhere) waits up to a lease
// TTL for the old registration to expire, and if it does not (another live server renews it),
// it is refused, naming the other's address. A lost lease (etcd unreachable past the TTL) is
// re-registered once etcd answers again.
#ifndef SLUICE_CLUSTER_MEMBERSHIP_H_
#define SLUICE_CLUSTER_MEMBERSHIP_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/etcd_client.h"

namespace sluice {

struct MembershipOptions {
  std::string prefix = "/sluice/v1/";  ///< every key of this cluster starts with it
  std::string node_id;
  std::string address;  ///< host:port where clients and other servers reach this server
  std::chrono::seconds lease_ttl{10};
  uint64_t started_unix_ms = 0;  ///< when the server started, as registered
  /// How long a drained server is said to be restarting (writers do not revive it meanwhile).
  std::chrono::seconds restart_grace{30};
};

/// A registered server.
struct NodeEntry {
  std::string node_id;
  std::string address;
  uint64_t started_unix_ms = 0;
};

/// INVALID_ARGUMENT unless `id` is 1 to 128 of [A-Za-z0-9._-] (it is part of etcd keys and of
/// placement's hashes, and shows in logs).
absl::Status ValidateNodeId(const std::string& id);

/// The cluster's registered servers, as a server's rules ask for them (Membership in etcd;
/// tests use a list of their own).
class NodeDirectory {
 public:
  virtual ~NodeDirectory() = default;
  /// Every registered server, in node id order. A `deadline` (> 0) other than etcd's: a caller
  /// with an answer of its own to fall back on asks briefly.
  virtual absl::StatusOr<std::vector<NodeEntry>> Nodes(
      std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) const = 0;
  /// Whether this server's own registration is live.
  virtual bool registered() const = 0;
  /// Whether server `node_id` drained to restart and is not back yet (for at most its restart
  /// grace): a writer that finds it down waits for it rather than revive it.
  virtual absl::StatusOr<bool> Restarting(const std::string& node_id) const {
    (void)node_id;
    return false;
  }
};

class Membership final : public NodeDirectory {
 public:
  /// Registers this server; see above for an id that is already registered.
  static absl::StatusOr<std::unique_ptr<Membership>> Join(std::shared_ptr<EtcdClient> etcd,
                                                          MembershipOptions options);
  ~Membership();  // Leave()
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  absl::StatusOr<std::vector<NodeEntry>> Nodes(
      std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) const override;
  /// Whether the registration is live (false after its lease was lost, until re-registered).
  bool registered() const override { return registered_.load(); }
  absl::StatusOr<bool> Restarting(const std::string& node_id) const override;
  /// Stops renewing and revokes the lease: the server is no longer listed. `restarting` (a
  /// drain): it is said to be restarting for the restart grace first. Idempotent.
  void Leave(bool restarting = false);

 private:
  Membership(std::shared_ptr<EtcdClient> etcd, MembershipOptions options);
  absl::Status Register(std::chrono::steady_clock::time_point give_up);
  void RenewLoop();
  std::string Key() const { return options_.prefix + "nodes/" + options_.node_id; }
  std::string RestartingKey(const std::string& node_id) const {
    return options_.prefix + "restarting/" + node_id;
  }

  const std::shared_ptr<EtcdClient> etcd_;
  const MembershipOptions options_;
  std::atomic<bool> registered_{false};
  int64_t lease_ = 0;  // the renewal thread's, after Join
  std::mutex mu_;
  std::condition_variable cv_;
  bool leaving_ = false;
  std::thread renewer_;
};

}  // namespace sluice

#endif  // SLUICE_CLUSTER_MEMBERSHIP_H_
