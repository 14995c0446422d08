// PlacementStore: a cluster's shuffles in etcd, each with its placement (docs/cluster.md).
// The first CreateShuffle of an id places its partitions on the servers registered then and
// records the result with create-if-absent, so that concurrent creates on different servers
// agree on one placement, and every later reader (any server, any worker) gets that one.
//
//   EtcdPlacementStore store(etcd, "/sluice/v1/");
//   SLUICE_ASSIGN_OR_RETURN(auto placed, store.Create({"job", 64, 8}, 2, {"n0", "n1", "n2"}));
//   // placed.created: this call placed it; placed.placement: the recorded one either way
#ifndef SLUICE_CLUSTER_PLACEMENT_STORE_H_
#define SLUICE_CLUSTER_PLACEMENT_STORE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/etcd_client.h"

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
};

/// The most epochs a shuffle's record takes (each a server lost while it lives).
inline constexpr uint32_t kMaxPlacementEpochs = 64;

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
/// FAILED_PRECONDITION: a mapper not decided, or the record at kMaxPlacementEpochs; ABORTED
/// (ErrorReason::kPlacementChanged): the record moved past `seen` otherwise than by revoking
/// them (the caller reads the status again).
absl::StatusOr<Revocation> PlanRevocation(const ShufflePlacement& now,
                                          const std::map<uint32_t, MapperDecision>& decided,
                                          const std::vector<uint32_t>& mappers, uint32_t seen);

/// The record's JSON, and back (DATA_LOSS naming what is wrong with a malformed record).
/// Errors about a shuffle's record do not name the shuffle: the caller, who knows how its caller
/// names it, says which.
std::string EncodePlacement(const ShufflePlacement& p);
absl::StatusOr<ShufflePlacement> DecodePlacement(const std::string& shuffle_id,
                                                 const std::string& json);

/// The replication a shuffle gets when its creator does not say: 2 with two or more servers.
uint32_t DefaultReplication(size_t servers);

/// The cluster's record of its shuffles and of each mapper's winning attempt, as a server asks
/// it: in etcd (EtcdPlacementStore), or in memory in the tests of the node's rules. Every call
/// decides once for everyone: of concurrent creates of an id one placement is recorded, of
/// concurrent decisions of a mapper one attempt.
class PlacementStore {
 public:
  virtual ~PlacementStore() = default;

  struct Created {
    bool created = false;  ///< false: it was recorded before (with what `placement` says)
    ShufflePlacement placement;
  };
  /// Places a new shuffle on `nodes` with `replication` (0 = DefaultReplication) and records
  /// it, unless it is recorded already: then the recorded one, whatever its parameters (the
  /// caller compares). INVALID_ARGUMENT for a replication the nodes cannot give.
  virtual absl::StatusOr<Created> Create(const std::string& shuffle_id, uint32_t num_partitions,
                                         uint32_t num_mappers, uint32_t replication,
                                         const std::vector<std::string>& nodes,
                                         uint64_t split_bytes = 0) = 0;
  /// Recorded shuffles whose ids start with `id_prefix` (a tenant's: "tenant~").
  virtual absl::StatusOr<size_t> CountWithPrefix(const std::string& id_prefix) = 0;
  /// Removes the shuffle's record and its mappers' decisions; whether it was recorded.
  virtual absl::StatusOr<bool> Delete(const std::string& shuffle_id) = 0;
  /// The recorded placement, or nullopt if the shuffle is not recorded. A `deadline` (> 0)
  /// other than etcd's: a caller with an answer of its own to fall back on asks briefly.
  virtual absl::StatusOr<std::optional<ShufflePlacement>> Get(
      const std::string& shuffle_id,
      std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) = 0;
  /// The revision of the shuffle's record (ShufflePlacement::revision; 0: not recorded), without
  /// reading the record where the store can.
  virtual absl::StatusOr<int64_t> Revision(
      const std::string& shuffle_id,
      std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) {
    auto p = Get(shuffle_id, deadline);
    if (!p.ok()) return p.status();
    return p->has_value() ? (*p)->revision : int64_t{0};
  }
  /// Decides mapper `mapper`'s winning attempt, pushed in placement epoch `epoch`: the first
  /// attempt decided, which this call returns, whoever decided it. NOT_FOUND once the shuffle
  /// is not recorded (deleted). UNAVAILABLE (ErrorReason::kPlacementChanged) when the mapper
  /// is not decided and `epoch` is not the shuffle's newest: the attempt pushed to servers that
  /// are no longer all of its placement, and is retried on the new one.
  virtual absl::StatusOr<MapperDecision> DecideMapper(const std::string& shuffle_id,
                                                      uint32_t mapper, uint64_t attempt,
                                                      uint32_t epoch) = 0;
  /// Every decided mapper of the shuffle and its winning attempt.
  virtual absl::StatusOr<std::map<uint32_t, MapperDecision>> Decisions(
      const std::string& shuffle_id) = 0;
  /// Takes `removed` out of the shuffle's placement with a new epoch whose partitions keep
  /// their other replicas and are filled back from `live` (ReplaceReplicas), decided once
  /// whoever asks (idempotent: when the newest epoch holds none of `removed`, nothing changes).
  /// The newest record either way; nullopt when the shuffle is not recorded. UNAVAILABLE when
  /// no live server is left to move to, or the record has kMaxPlacementEpochs.
  virtual absl::StatusOr<std::optional<ShufflePlacement>> AddEpoch(
      const std::string& shuffle_id, const std::vector<std::string>& removed,
      const std::vector<std::string>& live) = 0;
  /// Revokes the winning decisions of `mappers` as PlanRevocation says, in one write of the
  /// record (a new epoch) that also removes their decisions, so that a later attempt of each can
  /// win; of callers that race, each gets the same attempts. NOT_FOUND when the shuffle is not
  /// recorded. The attempts revoked and the newest record.
  virtual absl::StatusOr<std::pair<std::vector<uint64_t>, ShufflePlacement>> Revoke(
      const std::string& shuffle_id, const std::vector<uint32_t>& mappers, uint32_t seen) = 0;
  /// Adds a segment after `full` as NextSegment says, decided once whoever asks (write if
  /// unchanged; no new epoch: attempts in flight go on). The newest record either way; nullopt
  /// when the shuffle is not recorded.
  virtual absl::StatusOr<std::optional<ShufflePlacement>> AddSegment(
      const std::string& shuffle_id, uint32_t full, const std::vector<std::string>& live) = 0;
  /// Records that `node_id` is being decommissioned (docs/cluster.md, "Decommission"): it
  /// takes no new partitions and is taken out of every placement. Kept until the server's
  /// record is cleared by an operator (it is not leased: a restart does not undo it).
  virtual absl::Status SetDecommissioning(const std::string& node_id) = 0;
  /// The servers being decommissioned.
  virtual absl::StatusOr<std::vector<std::string>> Decommissioning() = 0;
};

/// The placement with a new epoch that takes `removed` out (see AddEpoch); unchanged (same
/// epoch) when its newest epoch holds none of them. UNAVAILABLE as AddEpoch.
absl::StatusOr<ShufflePlacement> NextEpoch(const ShufflePlacement& p,
                                           const std::vector<std::string>& removed,
                                           const std::vector<std::string>& live);

/// A decision as etcd holds it ("<attempt>" for epoch 0, "<attempt>@<epoch>"), and back.
std::string EncodeDecision(const MapperDecision& d);
std::optional<MapperDecision> DecodeDecision(std::string_view value);

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
/// RESOURCE_EXHAUSTED: every segment slot is taken; FAILED_PRECONDITION: the shuffle does not
/// split; UNAVAILABLE: no live server to take it.
absl::StatusOr<ShufflePlacement> NextSegment(const ShufflePlacement& p, uint32_t full,
                                             const std::vector<std::string>& live);

/// The record in etcd: shuffles/<id> (the placement's JSON), shuffles/<id>/mappers/<m> (a
/// decision, created only if absent and only while shuffles/<id> exists) and owners/<id> (an
/// index of ids, made and removed in the record's transactions; shuffles recorded before the
/// index existed are not counted by CountWithPrefix).
class EtcdPlacementStore final : public PlacementStore {
 public:
  EtcdPlacementStore(std::shared_ptr<EtcdClient> etcd, std::string prefix)
      : etcd_(std::move(etcd)), prefix_(std::move(prefix)) {}

  absl::StatusOr<Created> Create(const std::string& shuffle_id, uint32_t num_partitions,
                                 uint32_t num_mappers, uint32_t replication,
                                 const std::vector<std::string>& nodes,
                                 uint64_t split_bytes = 0) override;
  absl::StatusOr<size_t> CountWithPrefix(const std::string& id_prefix) override;
  absl::StatusOr<bool> Delete(const std::string& shuffle_id) override;
  absl::StatusOr<int64_t> Revision(
      const std::string& shuffle_id,
      std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) override;
  absl::StatusOr<std::optional<ShufflePlacement>> Get(
      const std::string& shuffle_id,
      std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) override;
  absl::StatusOr<MapperDecision> DecideMapper(const std::string& shuffle_id, uint32_t mapper,
                                              uint64_t attempt, uint32_t epoch) override;
  absl::StatusOr<std::map<uint32_t, MapperDecision>> Decisions(
      const std::string& shuffle_id) override;
  absl::StatusOr<std::optional<ShufflePlacement>> AddEpoch(
      const std::string& shuffle_id, const std::vector<std::string>& removed,
      const std::vector<std::string>& live) override;
  absl::StatusOr<std::pair<std::vector<uint64_t>, ShufflePlacement>> Revoke(
      const std::string& shuffle_id, const std::vector<uint32_t>& mappers, uint32_t seen) override;
  absl::StatusOr<std::optional<ShufflePlacement>> AddSegment(
      const std::string& shuffle_id, uint32_t full, const std::vector<std::string>& live) override;
  absl::Status SetDecommissioning(const std::string& node_id) override;
  absl::StatusOr<std::vector<std::string>> Decommissioning() override;

 private:
  std::string Key(const std::string& shuffle_id) const {
    return prefix_ + "shuffles/" + shuffle_id;
  }
  std::string IndexKey(const std::string& shuffle_id) const {
    return prefix_ + "owners/" + shuffle_id;
  }
  std::string MappersPrefix(const std::string& shuffle_id) const {
    return Key(shuffle_id) + "/mappers/";
  }
  // The decisions under `prefix` (MappersPrefix) that `kvs` hold.
  static absl::StatusOr<std::map<uint32_t, MapperDecision>> ParseDecisions(
      const std::string& prefix, const std::vector<EtcdKeyValue>& kvs);
  // At most this many key ranges of revoked decisions in one revocation (etcd's transaction
  // takes 128 operations by default; the record and the epoch key are two more).
  static constexpr size_t kMaxRevokeRanges = 120;
  // The newest epoch's number ("" = 0: the key is made by the first epoch change), which a
  // decision compares in its transaction.
  std::string EpochKey(const std::string& shuffle_id) const { return Key(shuffle_id) + "/epoch"; }
  std::string DecommissionPrefix() const { return prefix_ + "decommissioning/"; }
  const std::shared_ptr<EtcdClient> etcd_;
  const std::string prefix_;
};

}  // namespace sluice

#endif  // SLUICE_CLUSTER_PLACEMENT_STORE_H_
