// ClusterDecisions: what the cluster decides once in its record (docs/cluster.md), and what this
// server's stores make of it; the part of the ClusterNode (cluster_node.h) that writes the
// record's decisions and applies them here:
//   - a create places the shuffle once in the record and makes its store here if this server
//     keeps any part of it; a delete removes the record first, so that no server makes the
//     store again from it;
//   - a prepared attempt becomes visible once its mapper's winner is decided in the record
//     (DecideMapper); the decisions others made are applied here before the shuffle is served
//     (ResolvePending), and a server that lost what it had prepared (its data directory
//     replaced) refuses to serve it as if whole (DATA_LOSS: read another replica);
//   - revoked decisions (RevokeMappers: a new epoch) are hidden here before anything of the
//     shuffle is served or pushed at that epoch (ApplyRevoked);
//   - the committed mappers a partition this server took over in a later epoch lacks here
//     (missing, for the repairer: RepairBacklog), and those no registered server holds (lost).
// On its own (no cluster) every call acts on this server's registry alone, and the first attempt
// of a mapper resolved here wins.
//
//   ClusterDecisions decisions(&registry, &membership, &cache, {});
//   SLUICE_ASSIGN_OR_RETURN(uint64_t winner, decisions.DecideMapper("job", 3, attempt, epoch));
//
// Thread-safe. Tests drive it with an in-memory record (tests/harness/fake_cluster.h).
#ifndef SLUICE_SERVER_RULES_CLUSTER_DECISIONS_H_
#define SLUICE_SERVER_RULES_CLUSTER_DECISIONS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/placement_store.h"
#include "server/rules/cluster_membership.h"
#include "server/rules/placement_cache.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

class ClusterDecisions {
 public:
  struct Options {
    /// The split size recorded in the shuffles this server creates (--partition_split_mb; 0:
    /// their partitions are never split over further servers).
    uint64_t split_bytes = 0;
  };
  ClusterDecisions(ShuffleRegistry* registry, ClusterMembership* membership, PlacementCache* cache,
                   Options options)
      : registry_(registry), membership_(membership), cache_(cache), options_(options) {}

  /// Creates the shuffle (in a cluster: placed and recorded once, and made here if this server
  /// keeps any of it); false when it existed with the same parameters, ALREADY_EXISTS with
  /// others. `replication` 0: the default for the cluster's size.
  absl::StatusOr<bool> Create(const ShuffleParams& params, uint32_t replication);
  /// Deletes the shuffle: its record first (in a cluster), then its store here. OK when the
  /// record existed and the store was elsewhere.
  absl::Status Delete(const std::string& id);
  /// Shuffles with ids starting `prefix` that creating `id` would add to (a tenant's quota):
  /// 0 when `id` exists already (here or, in a cluster, in the record).
  absl::StatusOr<size_t> CountForCreate(const std::string& prefix, const std::string& id);
  /// CommitMapper: the mapper's winning attempt, decided in the record in a cluster (on its
  /// own, the first attempt resolved here wins), applied to the store here.
  /// FAILED_PRECONDITION when `attempt` is not prepared here.
  /// `epoch`: the placement epoch the attempt was pushed in (an older one than the newest is
  /// UNAVAILABLE, kPlacementChanged, unless the mapper is decided already).
  absl::StatusOr<uint64_t> DecideMapper(const std::string& id, uint32_t mapper, uint64_t attempt,
                                        uint32_t epoch = 0);
  /// Revokes the winning decisions of `mappers` of shuffle `id` (docs/cluster.md, "Revoking
  /// decisions"), as a caller that saw placement epoch `seen` asks: decided once in the record
  /// (a new epoch; see PlacementStore::Revoke), applied here at once and by every other server
  /// before it serves the shuffle at that epoch. The attempts revoked (one per mapper) and the
  /// new epoch. FAILED_PRECONDITION on its own (no decisions to revoke: nothing is lost without
  /// the server itself).
  struct Revoked {
    std::vector<uint64_t> attempts;
    uint32_t epoch = 0;
  };
  absl::StatusOr<Revoked> RevokeMappers(const std::string& id, const std::vector<uint32_t>& mappers,
                                        uint32_t seen);

  /// Applies to the store here the decisions the remembered placement of `id` revoked (once per
  /// epoch read; the store's Revoke is idempotent and durable).
  absl::Status ApplyRevoked(const std::string& id);
  /// Every decision the cluster made applied here (once per shuffle, start and placement
  /// epoch: later decisions all come through prepares here), and what each partition lacks
  /// noted (LackingMappers).
  absl::Status ResolvePending(const std::string& id);

  /// Committed mappers partition `partition` of `id` lacks here, as the last ResolvePending
  /// found (none on its own or before it), in mapper order.
  std::vector<uint32_t> LackingMappers(const std::string& id, uint32_t partition) const;
  uint32_t MissingMappers(const std::string& id, uint32_t partition) const {
    return static_cast<uint32_t>(LackingMappers(id, partition).size());
  }
  /// Of an evicted shuffle here (ShuffleStore::evicted()), the (mapper, winning attempt) pairs
  /// partition `partition` lacks here as the last ResolvePending found: read back from its
  /// object before it is served (none once it was, and for any other shuffle).
  std::vector<std::pair<uint32_t, uint64_t>> EvictedLacking(const std::string& id,
                                                            uint32_t partition) const;
  /// Of those, the ones the repairer found no registered server holding (MarkLost): lost,
  /// until a check at a newer epoch or a repair says otherwise.
  std::vector<uint32_t> LostMappers(const std::string& id, uint32_t partition) const;
  /// Only a mapper the partition still lacks as last checked is marked. Returns whether it was
  /// not marked yet.
  bool MarkLost(const std::string& id, uint32_t partition, uint32_t mapper);
  /// Every shuffle's lost (mapper, partition) pairs, as marked.
  uint64_t LostTotal() const;

  /// Re-replication's work here (docs/cluster.md, "Re-replication"): a partition this server
  /// keeps in its shuffle's newest epoch and lacks committed mappers of, which mappers (with
  /// their winning attempts), and the addresses of its other replicas registered now.
  struct RepairItem {
    std::string id;
    uint32_t partition = 0;
    std::vector<std::pair<uint32_t, uint64_t>> mappers;
    std::vector<std::string> sources;  // addresses of the other holders registered now
    // Other holders neither registered nor taken out by an epoch (restarting, or not dead
    // long enough): while there are any, nothing they may hold counts as lost.
    uint32_t unknown_holders = 0;
  };
  /// What this server's replicas lack, checking first the shuffles whose placement moved
  /// since they were last checked (reads etcd's decisions for those).
  std::vector<RepairItem> RepairBacklog();
  /// Committed (mapper, partition) pairs this server's replicas lack, as last checked.
  uint64_t MissingTotal() const;
  /// Marks what was checked of `id` stale (a repair changed it): the next serve checks again.
  void Recheck(const std::string& id);
  /// The placement cache forgot `id`: so do the revocations applied of it.
  void ForgetRevocations(const std::string& id);

 private:
  ShuffleRegistry* const registry_;
  ClusterMembership* const membership_;
  PlacementCache* const cache_;
  const Options options_;
  mutable std::mutex mu_;
  // Shuffles found holding every mapper the cluster decided (ResolvePending), at which placement
  // epoch, and per partition the committed mappers missing here (a partition taken over in a
  // later epoch, not repaired); guarded by mu_.
  struct Checked {
    uint32_t epoch = 0;
    uint64_t instance = 0;  // the store checked (ShuffleStore::instance(): evicted, reopened)
    // partition -> the (mapper, winning attempt) pairs missing here
    std::map<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>> missing;
    // partition -> of an evicted shuffle, the pairs not here (ReplicaCheck::evicted)
    std::map<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>> evicted;
    // partition -> those of its missing mappers no registered server holds (MarkLost)
    std::map<uint32_t, std::set<uint32_t>> lost;
    bool stale = false;  // a repair changed it since (Recheck): checked again at the next serve
    std::map<uint32_t, MapperDecision> decided;  // the decisions it was checked against
  };
  std::map<std::string, Checked> checked_;
  // Per shuffle, the placement epoch whose revoked decisions were applied to the store here.
  std::map<std::string, uint32_t> revoked_applied_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_CLUSTER_DECISIONS_H_
