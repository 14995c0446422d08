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
#include "cluster/object_record.h"
#include "cluster/placement_codec.h"
#include "cluster/placement_epochs.h"
#include "cluster/shuffle_placement.h"

namespace sluice {

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
  /// Every decided mapper of the shuffle and its winning attempt. A `deadline` (> 0) other than
  /// etcd's: a caller with somewhere else to go (a reader's other replicas) asks briefly.
  virtual absl::StatusOr<std::map<uint32_t, MapperDecision>> Decisions(
      const std::string& shuffle_id,
      std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) = 0;
  /// Takes `removed` out of the shuffle's placement with a new epoch whose partitions keep
  /// their other replicas and are filled back from `live` (ReplaceReplicas), decided once
  /// whoever asks (idempotent: when the newest epoch holds none of `removed`, nothing changes).
  /// The newest record either way; nullopt when the shuffle is not recorded. UNAVAILABLE when
  /// no live server is left to move to, or the record has kMaxPlacementEpochs.
  virtual absl::StatusOr<std::optional<ShufflePlacement>> AddEpoch(
      const std::string& shuffle_id, const std::vector<std::string>& removed,
      const std::vector<std::string>& live) = 0;
  /// A writer's revive of `node`, routed by epoch `seen` (PlanRevive over `live`), decided once
  /// whoever asks: the newest record and whether this call wrote its epoch. NOT_FOUND when the
  /// shuffle is not recorded; UNAVAILABLE as PlanRevive.
  virtual absl::StatusOr<std::pair<ShufflePlacement, bool>> Revive(
      const std::string& shuffle_id, uint32_t seen, const std::string& node,
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

  /// Records `record` as partition `partition`'s object (docs/object-store.md, "The commit
  /// point") unless one is recorded: the recorded one either way, and whether this call
  /// recorded it (an uploader that lost deletes its own object). With `stale` (the revision of
  /// a record that no longer stands for the partition: StandsFor), replaces that record if it
  /// is still the one recorded. NOT_FOUND once the shuffle is not recorded (a late upload of a
  /// deleted shuffle leaves no record).
  virtual absl::StatusOr<std::pair<ObjectRecord, bool>> RecordObject(const std::string& shuffle_id,
                                                                     uint32_t partition,
                                                                     const ObjectRecord& record,
                                                                     int64_t stale = 0) = 0;
  /// Every partition's recorded object.
  virtual absl::StatusOr<std::map<uint32_t, ObjectRecord>> Objects(
      const std::string& shuffle_id) = 0;
};

/// The record in etcd: shuffles/<id> (the placement's JSON), shuffles/<id>/mappers/<m> (a
/// decision, created only if absent and only while shuffles/<id> exists),
/// shuffles/<id>/objects/<partition> (an object record, the same way) and owners/<id> (an
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
      const std::string& shuffle_id,
      std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) override;
  absl::StatusOr<std::optional<ShufflePlacement>> AddEpoch(
      const std::string& shuffle_id, const std::vector<std::string>& removed,
      const std::vector<std::string>& live) override;
  absl::StatusOr<std::pair<ShufflePlacement, bool>> Revive(
      const std::string& shuffle_id, uint32_t seen, const std::string& node,
      const std::vector<std::string>& live) override;
  absl::StatusOr<std::pair<std::vector<uint64_t>, ShufflePlacement>> Revoke(
      const std::string& shuffle_id, const std::vector<uint32_t>& mappers, uint32_t seen) override;
  absl::StatusOr<std::optional<ShufflePlacement>> AddSegment(
      const std::string& shuffle_id, uint32_t full, const std::vector<std::string>& live) override;
  absl::Status SetDecommissioning(const std::string& node_id) override;
  absl::StatusOr<std::vector<std::string>> Decommissioning() override;
  absl::StatusOr<std::pair<ObjectRecord, bool>> RecordObject(const std::string& shuffle_id,
                                                             uint32_t partition,
                                                             const ObjectRecord& record,
                                                             int64_t stale = 0) override;
  absl::StatusOr<std::map<uint32_t, ObjectRecord>> Objects(const std::string& shuffle_id) override;

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
  std::string ObjectsPrefix(const std::string& shuffle_id) const {
    return Key(shuffle_id) + "/objects/";
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
