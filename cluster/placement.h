// Placement: which servers hold each partition of a shuffle. Decided once, when the shuffle is
// created, from the servers live then, and recorded with the shuffle (docs/cluster.md), so
// that servers joining or leaving later do not move committed data.
//
// Rendezvous (highest-random-weight) hashing: every (shuffle, partition, node) gets a score,
// xxh3 of the three, and a partition's replicas are its highest-scoring nodes, best first
// (the first is its primary). Plain rendezvous hashing leaves some nodes with more partitions
// than others at small partition counts (8 partitions on 3 nodes can split 5/2/1); so, going
// through the partitions in order, a node takes at most ceil(partitions x replicas / nodes)
// replicas (and, as the partitions run out, one still below the fair share is taken first),
// and a partition whose best nodes are full goes to its next best. Of a partition's
// replicas, the one that is primary of the fewest partitions so far leads (reads go to the
// primary). The result depends only on the arguments: anyone who computes it gets the same.
#ifndef SLUICE_CLUSTER_PLACEMENT_H_
#define SLUICE_CLUSTER_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice {

/// For each partition, the indexes into `nodes` of its `replicas` nodes, best first.
/// INVALID_ARGUMENT for no nodes, duplicate node ids, or replicas outside [1, nodes].
absl::StatusOr<std::vector<std::vector<uint32_t>>> PlaceReplicas(
    std::string_view shuffle_id, uint32_t partitions, absl::Span<const std::string> nodes,
    uint32_t replicas);

/// A new placement epoch's replicas (docs/cluster.md, "Placement epochs"): every partition keeps
/// its replicas in `current` (node ids, primary first) that are not in `removed`, in their order,
/// and is filled back to `replication` from `live` nodes not removed and not holding it already:
/// the one holding the fewest replicas so far, then the best rendezvous score. A partition keeps
/// fewer when `live` cannot give enough (none when no live node is left). Depends only on the
/// arguments.
std::vector<std::vector<std::string>> ReplaceReplicas(
    std::string_view shuffle_id, const std::vector<std::vector<std::string>>& current,
    const std::vector<std::string>& removed, const std::vector<std::string>& live,
    uint32_t replication);

/// The rendezvous score of `node` for one partition of a shuffle.
uint64_t RendezvousScore(std::string_view shuffle_id, uint32_t partition, std::string_view node);

}  // namespace sluice

#endif  // SLUICE_CLUSTER_PLACEMENT_H_
