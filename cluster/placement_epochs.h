// How a shuffle's placement record changes (docs/cluster.md, "Placement epochs", "Revoking
// decisions", "Huge partitions"), as pure functions of the record: the placement a new shuffle
// gets, a new epoch that takes servers out, a revocation, a further segment of a huge partition.
// Every PlacementStore records what these say, so that any store (etcd's, the tests' in-memory
// one) decides alike.
#ifndef SLUICE_CLUSTER_PLACEMENT_EPOCHS_H_
#define SLUICE_CLUSTER_PLACEMENT_EPOCHS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/shuffle_placement.h"

namespace sluice {

/// The placement a new shuffle gets on `nodes` (what every PlacementStore records), split at
/// `split_bytes` (0: never). INVALID_ARGUMENT for a replication the nodes cannot give.
absl::StatusOr<ShufflePlacement> NewPlacement(const std::string& shuffle_id,
                                              uint32_t num_partitions, uint32_t num_mappers,
                                              uint32_t replication,
                                              const std::vector<std::string>& nodes,
                                              uint64_t split_bytes = 0);

/// The placement with a further segment after `full`, the last segment of its partition's chain
/// (docs/cluster.md, "Huge partitions"); unchanged when `full` is no longer the last (decided
/// already). The segment's replicas are servers of `live` that hold a partition's replica in the
/// newest epoch (every attempt of that epoch prepares on them), those holding fewer of the chain's
/// segments first, then fewer replicas of the shuffle, then by rendezvous score.
/// RESOURCE_EXHAUSTED: every segment slot is taken, or the record would pass kMaxRecordBytes;
/// FAILED_PRECONDITION: the shuffle does not split; UNAVAILABLE: no live server to take it.
absl::StatusOr<ShufflePlacement> NextSegment(const ShufflePlacement& p, uint32_t full,
                                             const std::vector<std::string>& live);

/// The placement with a new epoch that takes `removed` out (see AddEpoch); unchanged (same
/// epoch) when its newest epoch holds none of them. UNAVAILABLE as AddEpoch, and when the
/// record would pass kMaxRecordBytes.
absl::StatusOr<ShufflePlacement> NextEpoch(const ShufflePlacement& p,
                                           const std::vector<std::string>& removed,
                                           const std::vector<std::string>& live);

/// A writer's revive of `node` (docs/cluster.md, "Revive"), routed by epoch `seen`: the record
/// with a new epoch that takes `node` out (NextEpoch over `live`, which must not name it, marked
/// revived), or nullopt when there is nothing to do: `seen` is no longer the newest epoch, or the
/// newest holds no replica on `node` (the writer retries routed by the newest). UNAVAILABLE: the
/// shuffle has had kMaxRevives revives, the record would pass kReviveRecordBytes, or as
/// NextEpoch; INVALID_ARGUMENT: `seen` is past the newest epoch.
absl::StatusOr<std::optional<ShufflePlacement>> PlanRevive(const ShufflePlacement& now,
                                                           uint32_t seen, const std::string& node,
                                                           const std::vector<std::string>& live);

/// What revoking decisions comes to (PlanRevocation): the attempts revoked, one per mapper
/// asked, and the record with the epoch that revokes them (nullopt: an epoch after the one the
/// caller saw revoked them all already, and nothing is to be written).
struct Revocation {
  std::vector<uint64_t> attempts;
  std::optional<ShufflePlacement> next;
};

/// Revoking the decisions of `mappers` of the shuffle whose record is `now` and whose decided
/// mappers are `decided`, as a caller that saw epoch `seen` asks (docs/cluster.md, "Revoking
/// decisions"). INVALID_ARGUMENT: no mapper, a repeat, or one beyond the shuffle's;
/// FAILED_PRECONDITION: a mapper not decided, the record at kMaxPlacementEpochs, or one that
/// would pass kMaxRecordBytes with these revocations; ABORTED
/// (ErrorReason::kPlacementChanged): the record moved past `seen` otherwise than by revoking
/// them (the caller reads the status again).
absl::StatusOr<Revocation> PlanRevocation(const ShufflePlacement& now,
                                          const std::map<uint32_t, MapperDecision>& decided,
                                          const std::vector<uint32_t>& mappers, uint32_t seen);

}  // namespace sluice

#endif  // SLUICE_CLUSTER_PLACEMENT_EPOCHS_H_
