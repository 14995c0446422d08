// Evictor: with --object_store, a server's disks are a cache of the object store
// (docs/object-store.md, "Disks as a cache"):
//   - MakeRoom: while a data directory's file system is fuller than --object_evict_pct, the
//     shuffles held there whose every partition is in the store (the Uploader found every
//     record standing at their placement: Uploader::IsSettled) are evicted, least recently used
//     first (ShuffleRegistry::Evict: their data let go, what their status reports kept). Run
//     every second, and by a push that finds its directory past --disk_high_water_pct before
//     it is refused (ShuffleRegistry::set_room_maker).
//   - ReadBack: an evicted shuffle's partition is read back from its object before it is served
//     (ClusterNode::set_evicted_restore), once however many readers ask at once.
//
//   Evictor evictor(&registry, &node, &objects, &uploader, {.evict_pct = 85}, &metrics);
//   Periodic every(Evictor::kPeriod, [&] { evictor.MakeRoom(); });
//
// Thread-safe.
#ifndef SLUICE_SERVER_RULES_EVICTOR_H_
#define SLUICE_SERVER_RULES_EVICTOR_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/metrics/server_metrics.h"
#include "server/rules/cluster_node.h"
#include "server/rules/object_source.h"
#include "server/rules/uploader.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

class Evictor {
 public:
  struct Options {
    /// Shuffles in the store are evicted while their data directory is fuller than this, in
    /// percent (--object_evict_pct; 0: never).
    uint32_t evict_pct = 85;
  };
  static constexpr std::chrono::milliseconds kPeriod{1000};
  /// A shuffle used this recently is not evicted (a reader between the read back of its
  /// partition and its fetch).
  static constexpr std::chrono::milliseconds kMinIdle{1000};
  /// `metrics` may be null.
  Evictor(ShuffleRegistry* registry, ClusterNode* node, ObjectSource* objects, Uploader* uploader,
          Options options, ServerMetrics* metrics)
      : registry_(registry),
        node_(node),
        objects_(objects),
        uploader_(uploader),
        options_(options),
        metrics_(metrics) {
    registry_->KeepEvictReserves();
  }

  /// Evicts until every data directory is at most --object_evict_pct full or nothing more can
  /// go. OK when it is (or was) below the mark; else UNAVAILABLE when shuffles here are
  /// complete and not in the store yet (room comes once they are uploaded: retry), or
  /// RESOURCE_EXHAUSTED naming why nothing can go.
  absl::Status MakeRoom() { return MakeRoom(SIZE_MAX, 0); }
  /// With `free_bytes` > 0: evicts from data directory `dir` (an index of
  /// ShuffleRegistry::DataDirs()) until it has at least `free_bytes` free, whatever the mark
  /// (a read back's room).
  absl::Status MakeRoom(size_t dir, uint64_t free_bytes);
  /// Reads the `lacking` (mapper, winning attempt) pairs of partition `partition` of evicted
  /// shuffle `id` back from the partition's object (ClusterNode::EvictedRestore). A second
  /// caller for the same partition waits for the first and returns OK (it checks again).
  absl::Status ReadBack(const std::string& id, uint32_t partition,
                        const std::vector<std::pair<uint32_t, uint64_t>>& lacking);
  /// Ends a read back at its next frame. Idempotent.
  void Stop() { stopping_.store(true); }

 private:
  // How full data directory `path`'s file system is (percent; 0 when unknown).
  static double UsedPct(const ShuffleRegistry::DataDir& d);
  // Whether shuffle `id` may be evicted: the uploader found it all in the store at its
  // placement now, or it is evicted already and holds nothing pushed since (only what came
  // back from the store).
  bool Evictable(const std::string& id);

  ShuffleRegistry* const registry_;
  ClusterNode* const node_;
  ObjectSource* const objects_;
  Uploader* const uploader_;
  const Options options_;
  ServerMetrics* const metrics_;
  std::atomic<bool> stopping_{false};
  std::mutex room_mu_;  // one MakeRoom at a time
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::pair<std::string, uint32_t>> reading_;  // partitions being read back, guarded
  uint64_t reserved_ = 0;  // the room those take (their objects' sizes and margins), guarded
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_EVICTOR_H_
