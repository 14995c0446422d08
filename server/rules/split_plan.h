// PlanSplits: keys that cut a partition into slices of nearly equal stored bytes, from the key
// bounds of its committed frames alone (codec/key_bounds.h; docs/api.md, "Split
// reads"): no frame is read.
//
// The keys the frames name (each frame's least and greatest key and the samples between them,
// taken at even steps of its records) sample the partition's keys by bytes, so a key's rank
// among all of them measures how far into the partition it is: each frame is taken to hold its
// bytes in equal shares between each two of its keys in order, spread evenly by that rank. The
// cuts are chosen among those keys (and the key just past each, so that a key of many records
// can end a slice): for each slice's share of the bytes, the one whose bytes below come nearest.
// Frames with unknown bounds (older logs, large repaired copies) are counted evenly over all
// slices.
// Slice i is the records with keys in [cut[i-1], cut[i]), so each key's records are in exactly
// one slice and the slices together are the partition, whatever the estimate's error (about one
// share of each frame that spans a cut). A key holding more than a slice's share cannot be cut:
// the plan then has fewer slices.
#ifndef SLUICE_SERVER_RULES_SPLIT_PLAN_H_
#define SLUICE_SERVER_RULES_SPLIT_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

/// The most slices a plan may be asked for.
inline constexpr uint32_t kMaxSplitSlices = 4096;
/// About the most keys a plan works from (past it, fewer samples of each frame), and the most
/// frames (past it, a sample of them: ShuffleStore::SampleBlocks): its memory (about 20 MB at
/// most) and time stay bounded however many frames a partition holds.
inline constexpr uint64_t kMaxPlanKeys = uint64_t{1} << 17;
inline constexpr size_t kMaxPlanFrames = 32768;

struct SplitPlan {
  std::vector<std::string> keys;      ///< increasing, at most slices - 1
  std::vector<uint64_t> slice_bytes;  ///< keys.size() + 1 estimates
  uint64_t bytes = 0;                 ///< of every frame
  uint32_t frames = 0;
  uint32_t frames_without_bounds = 0;  ///< (of a sample: as many as it stands for)
};

/// The plan for a partition from a sample of its frames (ShuffleStore::SampleBlocks, at most
/// kMaxPlanFrames). INVALID_ARGUMENT for slices outside [1, kMaxSplitSlices].
absl::StatusOr<SplitPlan> PlanSplits(const ShuffleStore::BlockSample& sample, uint32_t slices);

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_SPLIT_PLAN_H_
