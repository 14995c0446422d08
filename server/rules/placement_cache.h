// PlacementCache: what this server holds of each shuffle of its cluster (docs/cluster.md), the
// part of the ClusterNode (cluster_node.h) that reads the placement record and remembers it:
//   - which partitions of a shuffle this server keeps, in its newest placement epoch and in any
//     (Holding), read from the record once and remembered until a newer epoch or segment shows
//     (a caller routing by a newer epoch, a partition it does not keep, a segment made since);
//   - a recorded shuffle's store is made here on its first push, read or status call if this
//     server keeps any of its partitions (EnsureLocal);
//   - a partition kept on other servers is neither pushed nor read here (FAILED_PRECONDITION,
//     kNotKept: whoever follows the placement would never see it);
//   - where a shuffle's partitions are (GetPlacement), from the record or, with etcd down, as
//     remembered (with its age);
//   - huge partitions (placement_segments.cc; docs/cluster.md, "Huge partitions"): the meter of
//     what each stored partition holds here, the split asked of the record near the size, and
//     the record read again when a call names a segment made since.
// On its own (no cluster) every shuffle is held here whole: HoldingOf is null.
//
//   PlacementCache cache(&registry, &membership);
//   SLUICE_ASSIGN_OR_RETURN(auto holding, cache.HoldingOf("job"));
//   SLUICE_RETURN_IF_ERROR(cache.CheckKept(holding.get(), "job", /*partition=*/3));
//
// Thread-safe. Tests drive it with an in-memory record (tests/harness/fake_cluster.h).
#ifndef SLUICE_SERVER_RULES_PLACEMENT_CACHE_H_
#define SLUICE_SERVER_RULES_PLACEMENT_CACHE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/membership.h"
#include "cluster/placement_store.h"
#include "server/rules/cluster_membership.h"
#include "server/rules/segment_meter.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

class PlacementCache {
 public:
  /// What this server holds of one shuffle, and the placement it was read from. Partitions are
  /// by stored id: the shuffle's partitions, then its segments (docs/cluster.md, "Huge
  /// partitions"); the vectors by partition take every slot (false for one not made).
  struct Holding {
    uint32_t partitions = 0, mappers = 0;  ///< partitions: the store's (with the segment slots)
    std::vector<bool> partition;           ///< kept here in the newest epoch, by partition
    std::vector<bool> ever;  ///< kept here in some epoch (its data may be here), by partition
    std::vector<std::vector<bool>> held;  ///< kept here, by epoch and partition (HeldBy)
    bool any = false;
    ShufflePlacement placement;
    Clock::time_point read_at;         ///< when it was read from the record
    std::vector<std::string> holders;  ///< node ids holding a replica in the newest epoch
  };
  /// A shuffle's placement with each server's address now (empty: not registered).
  struct Placement {
    bool clustered = false;
    uint32_t partitions = 0, mappers = 0, replication = 1;
    std::vector<NodeEntry> nodes;
    std::vector<std::vector<uint32_t>> replicas;  ///< per partition, indexes into `nodes`
    /// Huge partitions' further segments (stored partition partitions + k), and the split size.
    struct Segment {
      uint32_t parent = 0;
      std::vector<uint32_t> replicas;
    };
    std::vector<Segment> segments;
    uint64_t split_bytes = 0;
    /// 0: read now; else etcd was down and this is the placement read that long ago.
    std::chrono::milliseconds age{0};
    uint32_t epoch = 0;     ///< the newest placement epoch, whose replicas `replicas` are
    uint64_t revision = 0;  ///< of the record in etcd
    bool unchanged =
        false;  ///< the record is still the caller's `known_revision`: nothing else set
  };
  /// A shuffle's partitions and its stored partitions made (with its huge partitions' segments).
  struct Sizes {
    uint32_t partitions = 0, listed = 0;
  };

  PlacementCache(ShuffleRegistry* registry, ClusterMembership* membership)
      : registry_(registry), membership_(membership) {}
  /// `forget(id)` runs whenever a shuffle is forgotten here (deleted, or holding nothing here
  /// any more), outside this cache's lock: what else is kept of it goes too.
  void OnForget(std::function<void(const std::string& id)> forget) {
    on_forget_ = std::move(forget);
  }

  /// What this server holds of shuffle `id`: null on its own (it holds everything) and for a
  /// shuffle the cluster has no record of. From memory after the first read of the record.
  absl::StatusOr<std::shared_ptr<const Holding>> HoldingOf(const std::string& id);
  /// As remembered (null: not read, or on its own).
  std::shared_ptr<const Holding> Remembered(const std::string& id) const;
  /// Remembers `p`, read from the record now, unless a newer epoch or segment is remembered.
  std::shared_ptr<const Holding> Remember(const std::string& id, const ShufflePlacement& p,
                                          const std::string& node_id);
  /// Reads the record again (a newer epoch): what this server holds now (null: not recorded).
  absl::StatusOr<std::shared_ptr<const Holding>> Reread(const std::string& id);
  /// A caller routes by placement epoch `epoch`: when it is newer than the one remembered of
  /// `id`, reads the record again (its epochs may take servers out or revoke decisions).
  absl::Status ReadUpTo(const std::string& id, uint32_t epoch);
  /// The store of a recorded shuffle made here when this server keeps any part of it.
  absl::Status EnsureLocal(const std::string& id);
  /// FAILED_PRECONDITION (kNotKept) for a partition this server never kept.
  absl::Status CheckKept(const Holding* holding, const std::string& id, uint32_t partition) const;
  /// Forgets `id` (deleted, or not held here).
  void Forget(const std::string& id);
  /// Every shuffle remembered, and what this server holds of it.
  std::vector<std::pair<std::string, std::shared_ptr<const Holding>>> All() const;
  /// The servers of every shuffle remembered.
  std::set<std::string> PlacedNodes() const;

  /// The placement epoch this server knows of `id` (0 on its own or before reading it).
  uint32_t KnownEpoch(const std::string& id) const;
  /// Whether this server keeps partition `partition` of `id` in some epoch (true on its own,
  /// or for a shuffle it has not read the placement of).
  bool KeepsEver(const std::string& id, uint32_t partition) const;
  /// Where the shuffle's partitions are (on its own: all here). NOT_FOUND for an unknown one.
  /// With etcd down, the remembered placement and the last addresses seen (Placement::age).
  absl::StatusOr<Placement> GetPlacement(const std::string& id, uint64_t known_revision = 0);

  // Huge partitions (placement_segments.cc).
  /// A shuffle's partitions and its stored partitions made, as the record remembered here says;
  /// both `stored` (its store's) when it says nothing.
  Sizes SizesOf(const std::string& id, uint32_t stored) const;
  /// The huge-partition meter of a shuffle whose partitions split (null: they do not, or the
  /// shuffle is not known here), its counts seeded from the committed bytes here.
  std::shared_ptr<SegmentMeter> Meter(const std::string& id);
  /// Asks the record for a segment after stored partition `full`, which passed the split size
  /// here (decided once: every replica of `full` asks, one segment is made). Remembered here
  /// at once, for push streams to tell their writers.
  absl::Status Split(const std::string& id, uint32_t full);
  /// The partitions kept here as a push finds a frame for a stored partition its open did not
  /// know (a segment made since): the record read again when `partition` is a segment slot not
  /// made in the one remembered (UNAVAILABLE when it was read in the last 10 ms: retry).
  absl::StatusOr<std::shared_ptr<const std::vector<bool>>> KeptNow(const std::string& id,
                                                                   uint32_t partition);
  /// UNAVAILABLE (kNotKept): a call names a segment of `id` made after the record was read,
  /// which was read too recently to read again.
  absl::Status SegmentNotReadYet(const std::string& id, uint32_t partition) const;

 private:
  ShuffleRegistry* const registry_;
  ClusterMembership* const membership_;
  std::function<void(const std::string&)> on_forget_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Holding>> held_;  // guarded by mu_
  // Per shuffle whose partitions split (mu_); each seeded once from its store (Meter).
  struct Metered {
    std::shared_ptr<SegmentMeter> meter;
    bool seeded = false;
  };
  std::map<std::string, Metered> meters_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_PLACEMENT_CACHE_H_
