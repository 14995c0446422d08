// ClusterNode: this server as a node of its cluster (docs/cluster.md), apart from any transport,
// in three parts along the lines its rules fall into, and the rules that need all three:
//   - membership() (cluster_membership.h): who this server is, who is registered, etcd's
//     health, the settle time after an outage, draining and decommission;
//   - placements() (placement_cache.h): what this server holds of each shuffle, read from the
//     placement record and remembered until a newer epoch or segment shows; the stores it makes
//     from the record; where partitions are (GetPlacement); huge partitions' segments;
//   - decisions() (cluster_decisions.h): creates and deletes, mappers' winners decided once in
//     the record, revocations, and the mappers this server's replicas lack (missing, lost).
// Here: what a push or a read needs before it starts (PrepareToPush, PrepareToServe: the
// partition kept here, at the caller's epoch, every decision applied), and the watch that takes
// dead or leaving servers out of the shuffles' placements (WatchMembers: a new epoch, decided
// once in the record).
//
// On its own (no cluster) every call acts on this server's registry alone, and the first
// attempt of a mapper resolved here wins. A clustered server serves before it has joined (the
// port comes first): until Joined, cluster calls answer UNAVAILABLE, "still joining".
//
// etcd down (docs/cluster.md, "Failures"): a placement changes only through etcd, so what the
// node has read it keeps, and it serves the shuffles it has applied and checked without etcd;
// what needs etcd (a create, a decision, a first read of a placement) is UNAVAILABLE naming etcd
// (ErrorReason::kEtcdUnavailable), at once while etcd is known down.
//
//   ClusterNode node(&registry, /*clustered=*/true);
//   node.membership().SetSelf({"n0", "10.0.0.5:7070", now_ms});
//   node.membership().Joined(&directory, &record);
//   SLUICE_RETURN_IF_ERROR(node.PrepareToServe("job", /*partition=*/3));
//
// Thread-safe. Tests drive it with an in-memory record (tests/harness/fake_cluster.h).
#ifndef SLUICE_SERVER_RULES_CLUSTER_NODE_H_
#define SLUICE_SERVER_RULES_CLUSTER_NODE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/rules/cluster_decisions.h"
#include "server/rules/cluster_membership.h"
#include "server/rules/placement_cache.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

class ClusterNode {
 public:
  struct Options {
    /// Runs with --etcd (known before the server serves; Joined comes later).
    bool clustered = false;
    /// How long after an etcd outage a server registered before it, and not again yet, holds
    /// creates back (servers re-register within a third of their lease): two leases.
    std::chrono::milliseconds settle{20000};
    /// How long a read with an answer of its own to fall back on (a remembered placement, the
    /// last list of servers) waits for etcd.
    std::chrono::milliseconds quick_read{1000};
    /// How long a server of a shuffle may be unregistered before it is taken out of the
    /// shuffle's placement with a new epoch (--dead_after_s); 0: never by itself.
    std::chrono::milliseconds dead_after{60000};
    /// Revive decisions this server makes a second, whatever the shuffles (--revives_per_s;
    /// as many again at once). 0: none (writers wait for dead_after).
    double revives_per_s = 10;
    /// The split size recorded in the shuffles this server creates (--partition_split_mb; 0:
    /// their partitions are never split over further servers).
    uint64_t split_bytes = 0;
    /// What the node times by (tests move a fake one).
    const Clock* clock = Clock::Steady();
  };
  /// A server of this server's shuffles that is not registered now (ListNodes).
  struct Absent {
    std::string node_id;
    std::chrono::milliseconds absent{0};  ///< not registered for this long, as seen here
    bool dead = false;                    ///< past Options::dead_after
  };

  ClusterNode(ShuffleRegistry* registry, Options options);
  ClusterNode(ShuffleRegistry* registry, bool clustered)
      : ClusterNode(registry, Options{clustered}) {}
  ClusterNode(const ClusterNode&) = delete;
  ClusterNode& operator=(const ClusterNode&) = delete;

  ClusterMembership& membership() { return membership_; }
  const ClusterMembership& membership() const { return membership_; }
  PlacementCache& placements() { return placements_; }
  const PlacementCache& placements() const { return placements_; }
  ClusterDecisions& decisions() { return decisions_; }
  const ClusterDecisions& decisions() const { return decisions_; }

  bool clustered() const { return membership_.clustered(); }
  /// Whether an attempt must be prepared and then decided (DecideMapper) rather than committed
  /// by its push: in a cluster, every replica must reflect the same winner.
  bool requires_prepare() const { return clustered(); }

  /// Before a push of shuffle `id` opens, routed by placement epoch `epoch`: its store here
  /// (made from the record if needed), its revoked decisions applied. The partitions kept here
  /// (null: every one), for the push to refuse the others' frames. UNAVAILABLE
  /// (kPlacementChanged) when the shuffle has a newer epoch than `epoch`; a newer `epoch` than
  /// the one remembered is read from the record.
  absl::StatusOr<std::shared_ptr<const std::vector<bool>>> PrepareToPush(const std::string& id,
                                                                         uint32_t epoch = 0);
  /// Before shuffle `id` is read (`partition`) or its status given (nullopt): its store here
  /// (made from the record if needed), the partition kept here, and every decision the cluster
  /// made applied (ClusterDecisions::ResolvePending). A partition this server took over in a
  /// later epoch and lacks committed mappers of is UNAVAILABLE (kIncomplete): another replica
  /// has them. `epoch`: the placement epoch the caller routes by; a newer one than the one
  /// remembered is read from the record first (and the decisions it revoked applied here).
  absl::Status PrepareToServe(const std::string& id, std::optional<uint32_t> partition,
                              uint32_t epoch = 0);
  /// With --object_store: how PrepareToServe reads an evicted shuffle's partition back from its
  /// object (ClusterDecisions::EvictedLacking names the pairs) before serving it. Without one an
  /// evicted partition is UNAVAILABLE (kIncomplete). Set before the server serves.
  using EvictedRestore =
      std::function<absl::Status(const std::string& id, uint32_t partition,
                                 const std::vector<std::pair<uint32_t, uint64_t>>& lacking)>;
  void set_evicted_restore(EvictedRestore restore) { evicted_restore_ = std::move(restore); }

  /// A writer routed by placement epoch `seen` could not reach server `node` of shuffle `id`
  /// (docs/cluster.md, "Revive"): takes it out with a new epoch, decided once in the record,
  /// unless `seen` is no longer the newest or the newest holds nothing on `node`. The newest
  /// epoch, and whether this call made it. FAILED_PRECONDITION on its own or for this server
  /// itself; UNAVAILABLE past --revives_per_s (with a retry time), past the shuffle's kMaxRevives,
  /// with no live server to move to, or naming etcd.
  struct Revived {
    uint32_t epoch = 0;
    bool revived = false;
  };
  absl::StatusOr<Revived> Revive(const std::string& id, uint32_t seen, const std::string& node);

  /// Reads the list of servers (briefly) and notes who is registered and whether etcd answers:
  /// run every second or so (the wiring's Periodic), so that an etcd outage is known before a
  /// reader waits on it and a shrunk list after a stall is told from the cluster's size.
  /// Then, for the shuffles this server knows, takes servers unregistered past
  /// Options::dead_after, or being decommissioned, out of their placements (a new epoch,
  /// decided once in the record).
  void WatchMembers();
  /// The servers of this server's shuffles not registered now, and for how long.
  std::vector<Absent> AbsentNodes() const;

 private:
  EvictedRestore evicted_restore_;
  void RemoveDead(const ClusterMembership::Members& members);

  // One revive decision's token, if the bucket holds one (refilled at revives_per_s); else
  // how long until it will.
  std::optional<std::chrono::milliseconds> TakeReviveToken();

  const std::chrono::milliseconds dead_after_;
  const double revives_per_s_;
  std::mutex revive_mu_;
  double revive_tokens_;
  Clock::time_point revive_refilled_{};
  ClusterMembership membership_;
  PlacementCache placements_;
  ClusterDecisions decisions_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_CLUSTER_NODE_H_
