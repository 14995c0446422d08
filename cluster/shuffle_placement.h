// ShufflePlacement: a shuffle's record in its cluster (docs/cluster.md) as a value: its
// parameters, where its partitions live in each placement epoch, its huge partitions' segments,
// and the decisions its epochs revoked; and a mapper's decision (MapperDecision). How a record
// changes is placement_epochs.h; how it is written in etcd, placement_codec.h; the store that
// decides it once for everyone, placement_store.h.
#ifndef SLUICE_CLUSTER_SHUFFLE_PLACEMENT_H_
#define SLUICE_CLUSTER_SHUFFLE_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sluice {

/// A placement epoch after the first (docs/cluster.md, "Placement epochs"): the servers it took
/// out of the placement and the partitions whose replicas it changed.
struct PlacementEpoch {
  std::vector<std::string> removed;  ///< node ids (gone for good, or decommissioned)
  /// Partition -> its replicas from this epoch on (indexes into ShufflePlacement::nodes).
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> changed;
  /// (mapper, attempt): winning decisions this epoch revoked (docs/cluster.md, "Revoking
  /// decisions"); an epoch that revokes changes no replica.
  std::vector<std::pair<uint32_t, uint64_t>> revoked;
  /// Made by a writer's revive (docs/cluster.md, "Revive"), not by the grace.
  bool revived = false;
};

/// The most epochs a shuffle's record takes (each a server lost while it lives).
inline constexpr uint32_t kMaxPlacementEpochs = 64;
/// The most of them revives may make (the rest stay for the grace, decommissions and
/// revocations).
inline constexpr uint32_t kMaxRevives = 16;
/// The most bytes a record takes in etcd (whose requests are at most 1.5 MiB by default): an
/// epoch that would make it larger is not made (placement_codec.h writes large epochs
/// compactly; docs/cluster.md, "Bounded cost").
inline constexpr size_t kMaxRecordBytes = 1300000;
/// Revives stop at this size, leaving the rest for the grace's epochs.
inline constexpr size_t kReviveRecordBytes = 1000000;

/// A further segment of a huge partition (docs/cluster.md, "Huge partitions"): made when the
/// partition's last segment grew past the shuffle's split size, on other servers, for the
/// partition's new frames. Segment k of a shuffle is stored and read as partition
/// `num_partitions + k`, with its own replicas, epochs and repairs like any partition.
struct PartitionSegment {
  uint32_t parent = 0;  ///< the partition it is a segment of
  uint32_t born = 0;    ///< the placement epoch it was made in (no winner before has data in it)
};

/// Most segments a shuffle's record takes, unless its partitions leave fewer ids free (a stored
/// block names its partition in 16 bits): SegmentSlots.
inline constexpr uint32_t kMaxSegments = 4096;
/// The segment slots a shuffle of `num_partitions` gets when it may split (split_bytes > 0).
uint32_t SegmentSlots(uint32_t num_partitions);

/// A shuffle's parameters and where its partitions live.
struct ShufflePlacement {
  std::string shuffle_id;
  uint32_t num_partitions = 0;
  uint32_t num_mappers = 0;  ///< 0 = not known in advance
  uint32_t replication = 1;
  std::vector<std::string> nodes;  ///< the node ids placement chose from (epochs add to it)
  /// Per partition, indexes into `nodes` of its replicas in the newest epoch, primary first
  /// (what new attempts push to and readers read). A partition may have fewer than
  /// `replication` after an epoch that had too few live servers to fill it.
  std::vector<std::vector<uint32_t>> replicas;
  /// Epoch 0's replicas (the placement made at create) and the epochs after it, oldest first.
  std::vector<std::vector<uint32_t>> first_replicas;
  std::vector<PlacementEpoch> epochs;
  /// Huge partitions: a segment whose stored frames pass this many bytes on its servers is
  /// followed by another (0: the shuffle's partitions are never split), recorded at create from
  /// the creating server's --partition_split_mb.
  uint64_t split_bytes = 0;
  /// The most segments the shuffle may make (SegmentSlots; 0 when split_bytes is 0).
  uint32_t segment_slots = 0;
  /// The segments made, oldest first: segment k is partition num_partitions + k. `replicas` and
  /// `first_replicas` hold theirs after the partitions' (first_replicas: as made).
  std::vector<PartitionSegment> segments;
  /// Recorded by a server that knows revocations (every store of it takes REVOKE records): its
  /// decisions may be revoked. False for a shuffle created before (PlanRevocation refuses).
  bool revocable = false;
  /// The record's mod revision in etcd (not part of the record; 0 when not read from etcd).
  int64_t revision = 0;

  /// The newest epoch's number: 0 until a server is taken out.
  uint32_t epoch() const { return static_cast<uint32_t>(epochs.size()); }
  /// Partitions and segments made: the stored partition ids in use.
  uint32_t total() const { return num_partitions + static_cast<uint32_t>(segments.size()); }
  /// The stored partition ids a store of it must take: partitions and every segment slot.
  uint32_t slots() const { return num_partitions + segment_slots; }
  /// The partition a stored partition id belongs to (itself for a partition).
  uint32_t ParentOf(uint32_t q) const {
    return q < num_partitions ? q : segments[q - num_partitions].parent;
  }
  /// The epoch stored partition `q` was made in (0 for a partition).
  uint32_t BornAt(uint32_t q) const {
    return q < num_partitions || q >= total() ? 0 : segments[q - num_partitions].born;
  }
  /// Partition `p`'s stored ids: p, then its segments oldest first.
  std::vector<uint32_t> ChainOf(uint32_t p) const;
  /// Partition `p`'s replicas in epoch `e` (at most epoch()).
  std::vector<uint32_t> ReplicasAt(uint32_t p, uint32_t e) const;
  /// Per epoch (0 to epoch()), per stored partition (total()): whether `node_id` holds a
  /// replica of it then (never before a segment was made).
  std::vector<std::vector<bool>> HeldBy(const std::string& node_id) const;
  /// Whether `node_id` holds a replica of any partition in the newest epoch.
  bool Holds(const std::string& node_id) const;
  /// Whether an epoch took `node_id` out.
  bool Removed(const std::string& node_id) const;
  /// Every (mapper, attempt) revoked by epochs after `after` (0: all), oldest first.
  std::vector<std::pair<uint32_t, uint64_t>> RevokedAfter(uint32_t after = 0) const;
};

/// A mapper's winning attempt and the placement epoch it was pushed in (its data lives on that
/// epoch's replicas).
struct MapperDecision {
  uint64_t attempt = 0;
  uint32_t epoch = 0;
  bool operator==(const MapperDecision& o) const {
    return attempt == o.attempt && epoch == o.epoch;
  }
};

/// The replication a shuffle gets when its creator does not say: 2 with two or more servers.
uint32_t DefaultReplication(size_t servers);

}  // namespace sluice

#endif  // SLUICE_CLUSTER_SHUFFLE_PLACEMENT_H_
