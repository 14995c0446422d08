// Premerger: --premerge_mb_per_s (docs/storage.md, "Pre-merged runs"). In the background, as
// commits arrive, merges a partition's committed runs into longer sorted runs, so that a KEY
// fetch merges few runs and, where one run covers what it asks, sends its frames as stored.
//
// What is merged (PickMerge): runs of one stretch of consecutive committed mapper ids, so that
// a pre-merged run's range holds every mapper id in it and a read's key order (equal keys by
// mapper id, then arrival) is kept. While mappers still commit, at least `min_runs` adjacent
// runs of one level (a mapper's own blocks are level 0; a merge of level-L runs is L + 1: each
// record is rewritten about log_min_runs(mappers) times); once every mapper has committed, the
// whole partition into one run when it has at least `min_runs` runs, or two once one of them is
// pre-merged (a partition of fewer mappers than min_runs is never merged: a read merges its few
// runs at once). A mapper with nothing for the partition joins any range. A partition whose KEY
// read began since its last commit is left alone, and a merge of it stops when one begins: its
// reduce has started, and the merge would race that reader to help only a second read.
//
// Budgets: one merge at a time on the caller's thread (its merging at the lowest CPU priority:
// PremergeOptions::yield_cpu); written at most `bytes_per_s` (the reads
// are about as much); its decoded frames within `merge.memory_limit`, reserved from the server's
// memory budget before it starts (a round that finds no room merges nothing). The merge's
// output is a copy: it is not counted in the tenant's held bytes, and the mappers' own blocks
// stay (UNORDERED reads, reads of some mappers, repairs). Not thread-safe: one caller at a time.
//
//   Premerger premerge(&registry, options, &metrics);
//   Periodic every(Premerger::kPeriod, [&] { premerge.Run(); });
#ifndef SLUICE_SERVER_RULES_PREMERGE_H_
#define SLUICE_SERVER_RULES_PREMERGE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/metrics/server_metrics.h"
#include "server/rules/merge.h"
#include "server/runtime/memory_budget.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

struct PremergeOptions {
  uint64_t bytes_per_s = 32u << 20;  ///< > 0
  size_t min_runs = 64;              ///< >= 2
  /// Records (keys and values) per output frame: a KEY fetch's default chunk, so a run that
  /// covers a read goes out as it is stored.
  size_t frame_bytes = 1u << 20;
  MergeOptions merge;  ///< fan-in, scratch directory, read limits, memory_limit
  MemoryBudget* budget = nullptr;
  /// Whose share of the budget the merge's frames take.
  std::string tenant = "(premerge)";
  /// Called with true before the merge's own work (reading, decoding, merging, encoding) and
  /// false after it, on the merging thread: the server lowers that thread's CPU priority
  /// meanwhile (SCHED_IDLE), and keeps the normal one under the store's locks. May be empty.
  std::function<void(bool idle)> yield_cpu;
  /// No merge starts while the shuffle's data directory is fuller than this percentage (0 =
  /// never stops): pushes keep the room up to --disk_high_water_pct.
  uint32_t disk_mark_pct = 85;
};

/// The mapper range of the next merge of a partition with these stretches (ShuffleStore::
/// MergeStretches), or none.
std::optional<std::pair<uint32_t, uint32_t>> PickMerge(
    const std::vector<std::vector<MergeUnit>>& stretches, bool complete, size_t min_runs);

class Premerger {
 public:
  static constexpr std::chrono::milliseconds kPeriod{200};

  /// `metrics` may be null.
  Premerger(ShuffleRegistry* registry, PremergeOptions options, ServerMetrics* metrics)
      : registry_(registry), options_(std::move(options)), metrics_(metrics) {}

  /// Merges what the open shuffles' new commits call for, one merge after another, at the rate.
  /// Returns the merges made.
  size_t Run();
  /// One merge of mappers [first, last] of `partition`: whether its run became visible.
  absl::StatusOr<bool> MergeOne(const std::shared_ptr<ShuffleStore>& store, uint32_t partition,
                                uint32_t first, uint32_t last);
  /// Stops a merge in progress and every later one (at shutdown).
  void Stop();

 private:
  // Waits until the rate allows `written` bytes since `start`; false once stopped.
  bool Pace(std::chrono::steady_clock::time_point start, uint64_t written);

  ShuffleRegistry* const registry_;
  const PremergeOptions options_;
  ServerMetrics* const metrics_;
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_PREMERGE_H_
