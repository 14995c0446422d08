// ClusterNode: this server as a node of its cluster (docs/cluster.md), apart from any transport.
// It knows who the server is, which partitions of each shuffle it keeps (read from the
// placement record and remembered until a newer placement epoch shows), and the rules that keep
// its stores in step with the cluster's record:
//   - a shuffle recorded in the cluster gets its store here on its first push, read or status
//     call, if this server keeps any of its partitions;
//   - a partition kept on other servers is neither pushed nor read here (FAILED_PRECONDITION:
//     whoever follows the placement would never see it);
//   - a prepared attempt becomes visible once its mapper's winner is decided in the record;
//     the decisions others made are applied here before the shuffle is served, and a server
//     that lost what it had prepared (its data directory replaced) refuses to serve it as if
//     whole (DATA_LOSS: read another replica);
//   - a create places the shuffle once in the record and makes its store here if this server
//     keeps any part of it; a delete removes the record first, so that no server makes the
//     store again from it.
// On its own (no cluster) every call acts on this server's registry alone, and the first
// attempt of a mapper resolved here wins. A clustered server serves before it has joined (the
// port comes first): until Joined, cluster calls answer UNAVAILABLE, "still joining".
//
// etcd down (docs/cluster.md, "Failures"): a placement changes only through etcd, so what the node
// has read it keeps, and it serves the shuffles it has applied and checked without etcd;
// GetPlacement answers from the remembered placement (with its age) when etcd cannot be reached,
// asking etcd only briefly when it has that to fall back on, and not at all while WatchMembers
// finds etcd down. What needs etcd (a create, a decision, a first read of a placement) is
// UNAVAILABLE naming etcd (ErrorReason::kEtcdUnavailable), at once while etcd is known down.
//
// Membership settling: after an etcd stall every lease expires at once, and for a moment fewer
// servers (or none) are registered. A create never places a shuffle on fewer servers than were
// registered before: while a server registered when etcd went down has not registered again,
// for at most Options::settle after etcd came back, a create is UNAVAILABLE (retry), and so a
// replication those servers could give is never INVALID_ARGUMENT because of the stall. (A server
// that dies while etcd is up leaves the list when its lease ends, and holds nothing back.)
//
//   ClusterNode node(&registry, /*clustered=*/true);
//   node.SetSelf({"n0", "10.0.0.5:7070", now_ms});
//   node.Joined(&membership, &placements);
//   SLUICE_RETURN_IF_ERROR(node.PrepareToServe("job", /*partition=*/3));
//
// Thread-safe. Tests drive it with an in-memory record (tests/harness/fake_cluster.h).
// Its code is in three files: cluster_node.cc (shuffles, epochs, serving, decisions),
// cluster_membership.cc (who is registered, etcd's health, the dead taken out) and
// cluster_segments.cc (huge partitions' segments).
#ifndef SLUICE_SERVER_RULES_CLUSTER_NODE_H_
#define SLUICE_SERVER_RULES_CLUSTER_NODE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/membership.h"
#include "cluster/placement_store.h"
#include "server/rules/segment_meter.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

class ClusterNode {
 public:
  /// Who this server is: its node id, the address it is reached at, when it started.
  struct Self {
    std::string node_id;
    std::string address;
    uint64_t started_unix_ms = 0;
  };
  /// What this server keeps of one shuffle, and the placement it was read from.
  /// Partitions are by stored id: the shuffle's partitions, then its segments (docs/cluster.md,
  /// "Huge partitions"); the vectors by partition take every slot (false for one not made).
  struct Kept {
    uint32_t partitions = 0, mappers = 0;  ///< partitions: the store's (with the segment slots)
    std::vector<bool> partition;           ///< kept here in the newest epoch, by partition
    std::vector<bool> ever;  ///< kept here in some epoch (its data may be here), by partition
    std::vector<std::vector<bool>> held;  ///< kept here, by epoch and partition (HeldBy)
    bool any = false;
    ShufflePlacement placement;
    std::chrono::steady_clock::time_point read_at;  ///< when it was read from the record
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
  /// A server of this server's shuffles that is not registered now (ListNodes).
  struct Absent {
    std::string node_id;
    std::chrono::milliseconds absent{0};  ///< not registered for this long, as seen here
    bool dead = false;                    ///< past Options::dead_after
  };

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
    /// The split size recorded in the shuffles this server creates (--partition_split_mb; 0:
    /// their partitions are never split over further servers).
    uint64_t split_bytes = 0;
  };
  ClusterNode(ShuffleRegistry* registry, Options options)
      : registry_(registry), options_(options), clustered_(options.clustered) {}
  ClusterNode(ShuffleRegistry* registry, bool clustered)
      : ClusterNode(registry, Options{clustered}) {}

  void SetSelf(Self self);
  Self self() const;
  bool clustered() const { return clustered_; }
  /// The cluster's servers and record, once this server has joined (both outlive the node's
  /// use of them: the wiring stops serving before it lets them go).
  void Joined(const NodeDirectory* nodes, PlacementStore* placements);
  /// Whether this server has joined its cluster (false on its own).
  bool joined() const;
  /// The cluster's servers: this one alone when on its own; with etcd down, the last list read.
  absl::StatusOr<std::vector<NodeEntry>> Nodes();
  /// Reads the list of servers (briefly) and notes who is registered and whether etcd answers:
  /// run every second or so (the wiring's Periodic), so that an etcd outage is known before a
  /// reader waits on it and a shrunk list after a stall is told from the cluster's size.
  /// Then, for the shuffles this server knows, takes servers unregistered past
  /// Options::dead_after out of their placements (a new epoch, decided once in the record).
  void WatchMembers();
  /// The servers of this server's shuffles not registered now, and for how long.
  std::vector<Absent> AbsentNodes() const;
  /// Whether etcd did not answer the last time it was asked.
  bool etcd_down() const { return etcd_down_.load(); }
  /// Whether this server's registration is live (false on its own or before it joined).
  bool registered() const;

  /// A drain refuses new push streams from now on (the service asks draining()).
  void SetDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  /// Whether an attempt must be prepared and then decided (CommitMapper) rather than committed
  /// by its push: in a cluster, every replica must reflect the same winner.
  bool requires_prepare() const { return clustered_; }

  /// What this server keeps of shuffle `id`: null on its own (it keeps everything) and for a
  /// shuffle the cluster has no record of. From memory after the first read of the record.
  absl::StatusOr<std::shared_ptr<const Kept>> KeptPartitions(const std::string& id);
  /// Before a push of shuffle `id` opens, routed by placement epoch `epoch`: its store here
  /// (made from the record if needed). The partitions kept here (null: every one), for the push
  /// to refuse the others' frames. UNAVAILABLE (kPlacementChanged) when the shuffle has a newer
  /// epoch than `epoch`; a newer `epoch` than the one remembered is read from the record.
  absl::StatusOr<std::shared_ptr<const std::vector<bool>>> PrepareToPush(const std::string& id,
                                                                         uint32_t epoch = 0);
  /// The partitions kept here as a push finds a frame for a stored partition its open did not
  /// know (a segment made since: docs/cluster.md, "Huge partitions"): the record read again
  /// when `partition` is a segment slot not made in the one remembered (UNAVAILABLE when it was
  /// read in the last 10 ms: retry).
  absl::StatusOr<std::shared_ptr<const std::vector<bool>>> KeptNow(const std::string& id,
                                                                   uint32_t partition);
  /// A shuffle's partitions and its stored partitions made (with its huge partitions' segments),
  /// as the record remembered here says; both `stored` (its store's) when it says nothing.
  struct Sizes {
    uint32_t partitions = 0, listed = 0;
  };
  Sizes SizesOf(const std::string& id, uint32_t stored) const;
  /// The huge-partition meter of a shuffle whose partitions split (null: they do not, or the
  /// shuffle is not known here), its counts seeded from the committed bytes here.
  std::shared_ptr<SegmentMeter> Meter(const std::string& id);
  /// Asks the record for a segment after stored partition `full`, which passed the split size
  /// here (decided once: every replica of `full` asks, one segment is made). Remembered here
  /// at once, for push streams to tell their writers.
  absl::Status Split(const std::string& id, uint32_t full);
  /// Before shuffle `id` is read (`partition`) or its status given (nullopt): its store here
  /// (made from the record if needed), the partition kept here, and every decision the cluster
  /// made applied (once per shuffle, start and placement epoch: later decisions all come
  /// through prepares here). A partition this server took over in a later epoch and lacks
  /// committed mappers of is UNAVAILABLE (kIncomplete): another replica has them.
  /// `epoch`: the placement epoch the caller routes by; a newer one than the one remembered is
  /// read from the record first (and the decisions it revoked applied here).
  absl::Status PrepareToServe(const std::string& id, std::optional<uint32_t> partition,
                              uint32_t epoch = 0);
  /// Committed mappers partition `partition` of `id` lacks here, as the last PrepareToServe
  /// found (none on its own or before it), in mapper order.
  std::vector<uint32_t> LackingMappers(const std::string& id, uint32_t partition) const;
  uint32_t MissingMappers(const std::string& id, uint32_t partition) const {
    return static_cast<uint32_t>(LackingMappers(id, partition).size());
  }
  /// Of those, the ones the repairer found no registered server holding (MarkLost): lost,
  /// until a check at a newer epoch or a repair says otherwise.
  std::vector<uint32_t> LostMappers(const std::string& id, uint32_t partition) const;
  /// Only a mapper the partition still lacks as last checked is marked. Returns whether it was
  /// not marked yet.
  bool MarkLost(const std::string& id, uint32_t partition, uint32_t mapper);
  /// Every shuffle's lost (mapper, partition) pairs, as marked.
  uint64_t LostTotal() const;
  /// The placement epoch this server knows of `id` (0 on its own or before reading it).
  uint32_t KnownEpoch(const std::string& id) const;
  /// Whether this server keeps partition `partition` of `id` in some epoch (true on its own,
  /// or for a shuffle it has not read the placement of).
  bool KeepsEver(const std::string& id, uint32_t partition) const;

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

  /// Decommission (docs/cluster.md): records in the cluster that this server is leaving, so
  /// that no create places on it and every server takes it out of its shuffles' placements
  /// (WatchMembers). Idempotent.
  absl::Status StartDecommission();
  bool decommissioning() const { return decommissioning_.load(); }

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
  /// Where the shuffle's partitions are (on its own: all here). NOT_FOUND for an unknown one.
  /// With etcd down, the remembered placement and the last addresses seen (Placement::age).
  absl::StatusOr<Placement> GetPlacement(const std::string& id, uint64_t known_revision = 0);

 private:
  // The cluster as one call sees it.
  struct View {
    const NodeDirectory* nodes = nullptr;
    PlacementStore* placements = nullptr;
    std::string node_id;
    absl::Status Joined() const;
  };
  View view() const;
  std::shared_ptr<const Kept> Remember(const std::string& id, const ShufflePlacement& p,
                                       const std::string& node_id);
  std::shared_ptr<const Kept> Remembered(const std::string& id) const;
  // A caller routes by placement epoch `epoch`: when it is newer than the one remembered of
  // `id`, reads the record again (its epochs may take servers out or revoke decisions).
  absl::Status ReadUpTo(const std::string& id, uint32_t epoch);
  // Reads the record again (a newer epoch): what this server keeps now.
  absl::StatusOr<std::shared_ptr<const Kept>> Reread(const std::string& id);
  // Notes who of the known shuffles' servers is registered; takes the dead out (WatchMembers).
  void TrackAbsent(const std::vector<NodeEntry>& live);
  void RemoveDead(const std::vector<NodeEntry>& live, const std::vector<std::string>& leaving);
  // A call to the record: what it told of etcd noted, an error saying which shuffle.
  template <typename T>
  absl::StatusOr<T> Record(const std::string& id, absl::StatusOr<T> r);
  // Notes what a call to etcd told of etcd's health (a failure of etcd, or an answer).
  void Note(const absl::Status& st);
  // UNAVAILABLE naming etcd while etcd is known down (WatchMembers asks it again every second):
  // what needs etcd is refused at once rather than after etcd's deadline.
  absl::Status EtcdUp() const;
  // Notes a list of registered servers read now.
  void Seen(const std::vector<NodeEntry>& nodes);
  // UNAVAILABLE while a server seen within the settle time is not in `live`.
  absl::Status Settled(const std::vector<NodeEntry>& live) const;
  // The store of a recorded shuffle made here when this server keeps any part of it.
  absl::Status EnsureLocal(const std::string& id);
  absl::Status CheckKept(const Kept* kept, const std::string& id, uint32_t partition) const;
  // UNAVAILABLE (kNotKept): a call names a segment of `id` made after the record was read,
  // which was read too recently to read again.
  absl::Status SegmentNotReadYet(const std::string& id, uint32_t partition) const;
  absl::Status ResolvePending(const std::string& id);
  // Applies to the store here the decisions the remembered placement of `id` revoked (once per
  // epoch read; the store's Revoke is idempotent and durable).
  absl::Status ApplyRevoked(const std::string& id);

  ShuffleRegistry* const registry_;
  const Options options_;
  const bool clustered_;
  std::atomic<bool> etcd_down_{false};
  std::atomic<bool> draining_{false};
  std::atomic<bool> decommissioning_{false};
  mutable std::mutex mu_;
  Self self_;                                                // guarded by mu_
  const NodeDirectory* nodes_ = nullptr;                     // guarded by mu_; set once joined
  PlacementStore* placements_ = nullptr;                     // guarded by mu_; set once joined
  std::map<std::string, std::shared_ptr<const Kept>> kept_;  // guarded by mu_
  // Per shuffle whose partitions split (mu_); each seeded once from its store (Meter).
  struct Metered {
    std::shared_ptr<SegmentMeter> meter;
    bool seeded = false;
  };
  std::map<std::string, Metered> meters_;
  // Shuffles found holding every mapper the cluster decided (ResolvePending), at which placement
  // epoch, and per partition the committed mappers missing here (a partition taken over in a
  // later epoch, not repaired); guarded by mu_.
  struct Checked {
    uint32_t epoch = 0;
    // partition -> the (mapper, winning attempt) pairs missing here
    std::map<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>> missing;
    // partition -> those of its missing mappers no registered server holds (MarkLost)
    std::map<uint32_t, std::set<uint32_t>> lost;
    bool stale = false;  // a repair changed it since (Recheck): checked again at the next serve
    std::map<uint32_t, MapperDecision> decided;  // the decisions it was checked against
  };
  std::map<std::string, Checked> checked_;
  // Per shuffle, the placement epoch whose revoked decisions were applied to the store here.
  std::map<std::string, uint32_t> revoked_applied_;
  // Servers of the known shuffles not registered, since when (as seen here; mu_).
  std::map<std::string, std::chrono::steady_clock::time_point> absent_;
  // Servers being decommissioned, as last read (mu_).
  std::vector<std::string> leaving_;
  // The last list of registered servers read, and when (mu_); the servers registered when etcd
  // went down, and when it came back (mu_).
  std::vector<NodeEntry> members_;
  std::chrono::steady_clock::time_point members_at_;
  std::set<std::string> before_outage_;
  std::chrono::steady_clock::time_point etcd_back_at_;
  // Since when etcd is down, and its last failure (mu_).
  std::chrono::steady_clock::time_point etcd_down_at_;
  std::string etcd_error_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_CLUSTER_NODE_H_
