// CheckReplicas: which committed mappers one server's replicas of a shuffle hold (docs/cluster.md,
// "Placement epochs", "Re-replication"), from the cluster's decisions, the partitions this
// server held in each placement epoch and its store. A winner pushed in epoch e has its data
// here for exactly the partitions held in e (or a partition repaired here since). Transport-free
// and without etcd: ClusterNode reads the decisions and the placement, this judges.
#ifndef SLUICE_SERVER_RULES_REPLICA_CHECK_H_
#define SLUICE_SERVER_RULES_REPLICA_CHECK_H_

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "cluster/placement_store.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

struct ReplicaCheck {
  /// Decided mappers not committed here although this server held a partition in their epoch:
  /// what it had prepared is gone (its data directory lost or replaced).
  std::vector<uint32_t> lost;
  /// Per partition held here in some epoch: the (mapper, winning attempt) pairs whose data is
  /// not here (pushed in an epoch that did not place the partition here, not repaired since),
  /// in mapper order.
  std::map<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>> missing;
  /// Of an evicted store (ShuffleStore::evicted(); then `lost` and `missing` stay empty): per
  /// partition held here, the (mapper, winning attempt) pairs whose data is not here: read back
  /// from the partition's object when it is read (none once it was).
  std::map<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>> evicted;
};

/// `held`: per epoch, per partition, whether this server held it (ShufflePlacement::HeldBy);
/// empty for a shuffle without a placement (every partition held, one epoch).
/// Of `lost` (partition -> mappers found lost), those `missing` (a ReplicaCheck's) still lacks.
std::map<uint32_t, std::set<uint32_t>> StillLost(
    const std::map<uint32_t, std::set<uint32_t>>& lost,
    const std::map<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>>& missing);

/// `born`: per stored partition, the epoch it was made in (a huge partition's segment: winners
/// of earlier epochs have nothing in it); empty: all 0.
ReplicaCheck CheckReplicas(const std::vector<std::vector<bool>>& held,
                           const std::map<uint32_t, MapperDecision>& decided,
                           const ShuffleStore& store, const std::vector<uint32_t>& born = {});

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_REPLICA_CHECK_H_
