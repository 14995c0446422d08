// Repairer: --repair_mb_per_s, re-replication (docs/cluster.md, "Re-replication"). A server that
// took a partition over in a later placement epoch lacks the mappers committed before it did;
// this copies each of them, one (mapper, partition) at a time, from another replica of the
// partition (PeerFetcher: an UNORDERED fetch of that mapper alone, the stored frames as they
// are), checks every frame (header and payload checksum) as it arrives, appends it, and makes
// the copy visible with one REPAIR record (ShuffleStore::Repair): all of it or nothing. A copy
// that fails (the source gone, a bad frame) gives its space back and is tried from the next
// replica, then in the next round. The partition serves once nothing lacks (INCOMPLETE until
// then), so a half-copied replica is never read.
//
//   Repairer repair(&registry, &node, &fetcher, 64 << 20, &metrics);
//   Periodic every(std::chrono::seconds(1), [&] { repair.Run(); });
//
// The rate is a token bucket over the bytes copied. Not thread-safe: one caller at a time;
// Stop() may be called from another thread.
#ifndef SLUICE_SERVER_RULES_REPAIRER_H_
#define SLUICE_SERVER_RULES_REPAIRER_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/frame_format.h"
#include "server/metrics/server_metrics.h"
#include "server/rules/cluster_node.h"
#include "server/rules/object_source.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

/// What another server says of one partition of a shuffle (GetShuffle).
struct PeerPartition {
  bool usable = false;            ///< kept there in some epoch, not damaged
  std::vector<uint32_t> lacking;  ///< committed mappers it lacks (a later epoch's replica)
  uint64_t bytes = 0;             ///< its frame bytes of the partition
  bool Whole() const { return usable && lacking.empty(); }
  bool Holds(uint32_t mapper) const {
    return usable && std::find(lacking.begin(), lacking.end(), mapper) == lacking.end();
  }
};

/// Reads another server's committed data (the transport is the wiring's).
class PeerFetcher {
 public:
  virtual ~PeerFetcher() = default;
  /// Calls `each` with every stored frame of mapper `mapper`'s committed data for `partition`
  /// of shuffle `id` on the server at `address`, in their order; stops at the first error of
  /// `each` or of the fetch, and returns it. The server refuses unless its committed attempt of
  /// the mapper is `attempt` (a source that has not yet applied a revocation never passes the
  /// revoked attempt's frames off as its re-run's).
  virtual absl::Status Fetch(
      const std::string& address, const std::string& id, uint32_t partition, uint32_t mapper,
      uint64_t attempt, const std::function<absl::Status(absl::Span<const uint8_t>)>& each) = 0;
  /// Per partition of shuffle `id`, what the server at `address` holds of it (GetShuffle's
  /// lacking_mappers); an error when it cannot tell (down, damaged, lost data).
  virtual absl::StatusOr<std::vector<PeerPartition>> MissingOf(const std::string& address,
                                                               const std::string& id) = 0;
};

/// How far a decommission is (docs/cluster.md, "Decommission").
struct DecommissionState {
  bool done = false;              ///< it may be stopped: nothing would be lost
  uint32_t shuffles_placed = 0;   ///< shuffles whose newest epoch still names this server
  uint32_t partitions_short = 0;  ///< partitions kept here, fewer whole replicas elsewhere
  std::string waiting_for;        ///< the first of those, in words
};
/// Looks at every shuffle this server holds: placed here still, or a partition it kept with
/// fewer whole replicas on the other servers of its newest epoch than the replication (or than
/// the servers that epoch could give it).
absl::StatusOr<DecommissionState> CheckDecommission(ShuffleRegistry* registry, ClusterNode* node,
                                                    PeerFetcher* peers);

class Repairer {
 public:
  using Clock = std::chrono::steady_clock;
  /// `bytes_per_s` > 0. `metrics` may be null.
  /// `objects` (may be null): with --object_store, where a mapper no server holds any more is
  /// restored from (its partition's recorded object) before it counts as lost.
  Repairer(ShuffleRegistry* registry, ClusterNode* node, PeerFetcher* fetcher, uint64_t bytes_per_s,
           ServerMetrics* metrics, ObjectSource* objects = nullptr)
      : registry_(registry),
        node_(node),
        fetcher_(fetcher),
        objects_(objects),
        rate_(bytes_per_s),
        metrics_(metrics) {}

  /// One round over the backlog. Returns the (mapper, partition) copies made.
  uint64_t Run();
  /// Ends a round in progress at its next frame. Idempotent.
  void Stop() { stopping_.store(true); }

 private:
  // Copies one mapper's data for one partition from `source`; its blocks appended, checked and
  // recorded, or none of them.
  // What each source said of each shuffle (MissingOf), by (source address, shuffle id).
  using PeerStates =
      std::map<std::pair<std::string, std::string>, absl::StatusOr<std::vector<PeerPartition>>>;
  // What `source` says of the item's partition (asked at the first need); null when it cannot
  // tell.
  const PeerPartition* Ask(PeerStates* peers, const std::string& source,
                           const ClusterDecisions::RepairItem& item);
  // What `items` come to in bytes: per partition, a whole source's frame bytes less those here.
  uint64_t BytesLeft(const std::vector<ClusterDecisions::RepairItem>& items, PeerStates* peers);
  // Whether no server holds `mapper`'s data of the item's partition: every other holder
  // registered answers that it lacks it, and every one not registered was taken out.
  bool Lost(const ClusterDecisions::RepairItem& item, uint32_t mapper, PeerStates* peers);
  absl::Status CopyOne(ShuffleStore& store, const ClusterDecisions::RepairItem& item,
                       uint32_t mapper, uint64_t attempt, const std::string& source,
                       uint64_t* bytes);
  // Each shuffle's object records (ObjectSource::Records), by id.
  using ObjectRecords = std::map<std::string, absl::StatusOr<std::map<uint32_t, ObjectRecord>>>;
  // Copies the `lost` (mapper, winning attempt) pairs of the item's partition from its recorded
  // object (one pass over the object; a REPAIR record per mapper). The mappers restored (with
  // their bytes added to *bytes).
  std::set<uint32_t> Restore(ShuffleStore& store, const ClusterDecisions::RepairItem& item,
                             const std::vector<std::pair<uint32_t, uint64_t>>& lost,
                             ObjectRecords* records, uint64_t* bytes);
  // Waits for the rate to allow `bytes` more (false: stopping).
  bool Pace(uint64_t bytes);

  ShuffleRegistry* const registry_;
  ClusterNode* const node_;
  PeerFetcher* const fetcher_;
  ObjectSource* const objects_;
  const uint64_t rate_;
  ServerMetrics* const metrics_;
  std::atomic<bool> stopping_{false};
  bool paced_ = false;
  Clock::time_point next_;  // when the bytes copied so far are paid for
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_REPAIRER_H_
