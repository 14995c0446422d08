// The KEY-ordered read of a partition: a k-way merge over its committed runs.
//
// Every stored frame is a run: a frame flagged sorted is merged as is, an unsorted one is
// sorted (stably) when it is loaded. A run holds at most one decoded frame at a time. Equal keys
// come out in run order — runs are listed by mapper id, then arrival — so the order is stable.
// Past `fan_in` runs, adjacent runs are merged into temporary run files first: far above it
// (more than fan_in^2), in whole levels of consecutive groups (O(n log n) overall); then by
// windows of the smallest adjacent runs, each pass just enough to bring the count toward
// `fan_in`. Any number of runs is served with at most `fan_in` frames in memory; the
// intermediate runs share one scratch file (one descriptor), whose ranges are punched out as
// they are consumed.
#ifndef SLUICE_SERVER_RULES_MERGE_H_
#define SLUICE_SERVER_RULES_MERGE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "server/storage/file_util.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

/// A source of records in key order.
class RunSource {
 public:
  virtual ~RunSource() = default;
  /// Sets *out to the next record or returns false at the end. The views stay valid until
  /// Release() is called after the record was passed.
  virtual absl::StatusOr<bool> Next(Record* out) = 0;
  /// Records returned before the current head are no longer used: frames that hold only such
  /// records may go.
  virtual void Release() = 0;
  /// Bytes this run holds in memory now (its current frame, stored and decoded).
  virtual size_t resident_bytes() const = 0;
  /// How big the run is, in stored bytes (to choose which runs a merge pass rewrites).
  virtual uint64_t size_bytes() const = 0;
};

/// What the runs of one merge share (they load one at a time): a decoder and the buffer
/// stored frames are read into.
struct RunDecoder {
  FrameDecoder* decoder = nullptr;
  std::string bytes;
  const file::Mapping* view = nullptr;  ///< the store's ReadView(), if any
};

/// One stored frame of a shuffle, decoded when first read.
std::unique_ptr<RunSource> StoredFrameRun(std::shared_ptr<ShuffleStore> store, BlockRef block,
                                          RunDecoder* decoder);

/// Runs read one after another as one run: `count` runs, run j made by `open(j)` when the one
/// before it is done, so only one of them is loaded at a time. For stored frames that follow
/// each other in key order (FollowsInKeyOrder of their bounds), in the order they are listed in:
/// equal keys then come out as they would from separate runs. `size` is their stored bytes.
std::unique_ptr<RunSource> ChainedRun(size_t count,
                                      std::function<std::unique_ptr<RunSource>(size_t)> open,
                                      uint64_t size);

/// The records of `run` (in key order, as every run is) with keys in [from, to) only (no `to`:
/// no end): those before `from` are passed over, and the run ends at the first key at or past
/// `to`, without loading the rest. `from` and `to` must outlive the run.
std::unique_ptr<RunSource> KeyRangeRun(std::unique_ptr<RunSource> run, std::string_view from,
                                       const std::optional<std::string>* to);

/// What a frame takes in memory once decoded, from what its header declares (its records'
/// bytes, and a view and an order slot per record): what a merge plans with before it decodes
/// anything.
inline uint64_t DecodedCost(uint32_t uncompressed, uint32_t records) {
  return uint64_t{uncompressed} + uint64_t{records} * 40;
}

struct MergeOptions {
  size_t fan_in = 4096;
  /// Decoded bytes the merge may hold at once (0 = no limit). Runs whose frames do not fit it
  /// together are merged in smaller groups first; a group of two that cannot fit fails the
  /// merge with RESOURCE_EXHAUSTED, before anything is decoded. `limit_name` names the knob.
  uint64_t memory_limit = 0;
  std::string limit_name = "the merge memory limit";
  /// Called with the decoded bytes the merge is about to hold (a pass's group, then the final
  /// runs), before it decodes them: the caller counts them in its budget.
  std::function<void(uint64_t)> reserve;
  std::string tmp_dir;           ///< where intermediate runs go
  size_t chunk_bytes = 1 << 20;  ///< records per intermediate frame, in bytes
  FrameLimits limits;
  /// When set and true, intermediate passes stop with CANCELLED (the reader went away).
  const std::atomic<bool>* cancelled = nullptr;
};

class MergedStream;

/// The merge of a partition's stored blocks, listed in tie-break order (CommittedBlocksOf):
/// blocks listed one after another whose bounds follow each other in key order (a sorted flush
/// cut into frames, a pre-merged run) are one run, loaded a frame at a time; runs are made as
/// the merge reaches them. `blocks` and `decoder` must outlive the stream. `wrap` (may be
/// empty) wraps each run (a key range: KeyRangeRun). *runs (may be null): how many runs.
absl::StatusOr<std::unique_ptr<MergedStream>> MergeStoredBlocks(
    std::shared_ptr<ShuffleStore> store, const std::vector<BlockRef>* blocks, RunDecoder* decoder,
    std::function<std::unique_ptr<RunSource>(std::unique_ptr<RunSource>)> wrap,
    const MergeOptions& options, size_t* runs = nullptr);

/// What a merge of these stored blocks (as MergeStoredBlocks takes them) holds decoded at once
/// with no limit: each run's largest frame (twice, for a chained run).
uint64_t StoredBlocksMergeCost(const std::vector<BlockRef>& blocks);

/// Merges runs into one key-ordered stream.
class MergedStream {
 public:
  /// Takes the runs in tie-break order; reduces them to at most fan_in with intermediate
  /// passes through files in options.tmp_dir (removed when the stream is destroyed).
  static absl::StatusOr<std::unique_ptr<MergedStream>> Make(
      std::vector<std::unique_ptr<RunSource>> runs, const MergeOptions& options);
  /// The same over `count` runs made only when needed: `open(i)` makes run i, whose stored size
  /// is `size_of(i)`. With many runs only the fan-in being merged exist at once, so a merge of
  /// a million tiny frames holds a million small entries, not a million open runs.
  /// `cost_of(i)` is what run i's largest frame takes decoded (DecodedCost of its header); the
  /// merge plans its memory by it (MergeOptions::memory_limit).
  static absl::StatusOr<std::unique_ptr<MergedStream>> Make(
      size_t count, const std::function<uint64_t(size_t)>& size_of,
      const std::function<absl::StatusOr<uint64_t>(size_t)>& cost_of,
      const std::function<std::unique_ptr<RunSource>(size_t)>& open, const MergeOptions& options);
  ~MergedStream();

  /// Appends the next records to `batch`: at most `max_bytes` of keys and values (or one
  /// record, if it alone is bigger) and at most half the frame record limit, so the batch
  /// always fits one frame. Each record counts its key and value plus `per_record` bytes. The
  /// records are views into the runs' decoded frames, valid until the next call (no copy). Returns
  /// false once nothing is left.
  absl::StatusOr<bool> NextBatch(size_t max_bytes, std::vector<Record>* batch,
                                 size_t per_record = 1);

  /// Whether the last NextBatch took everything that was left (the next would return false).
  bool drained() const { return drained_; }

  size_t intermediate_passes() const { return passes_; }
  /// Bytes the intermediate passes wrote to the scratch file.
  uint64_t spill_bytes() const { return scratch_end_; }
  /// Bytes the runs hold in memory now, to count against the server's memory budget.
  size_t resident_bytes() const;

 private:
  struct HeapEntry {
    uint64_t prefix;  // KeyPrefix of the run's head key
    uint32_t run;
  };
  // Whether a's head comes before b's: smaller key, or equal key and earlier run.
  bool Before(const HeapEntry& a, const HeapEntry& b) const {
    const int c =
        CompareKeysWithPrefix(current_[a.run].key, a.prefix, current_[b.run].key, b.prefix);
    return c < 0 || (c == 0 && a.run < b.run);
  }
  void SiftDown(size_t i);
  MergedStream() = default;
  absl::Status Init(std::vector<std::unique_ptr<RunSource>> runs);
  absl::StatusOr<bool> NextRecord(Record* out);
  // Merges `group` into an intermediate run in the scratch file; *max_frame_cost is what its
  // largest frame takes decoded.
  absl::StatusOr<std::unique_ptr<RunSource>> MergeToFile(
      std::vector<std::unique_ptr<RunSource>> group, const MergeOptions& options,
      uint64_t* max_frame_cost);

  // The one scratch file every intermediate run of this merge is written to (declared before
  // the runs, which read it).
  file::Fd scratch_fd_;
  std::string scratch_path_;
  std::string scratch_name_;  // scratch_path_ as messages name it
  uint64_t scratch_end_ = 0;
  std::unique_ptr<FrameDecoder> decoder_;  // for intermediate runs
  RunDecoder file_runs_;                   // what the intermediate runs share
  std::vector<std::unique_ptr<RunSource>> runs_;
  std::vector<Record> current_;  // the head record of each run
  std::vector<HeapEntry> heap_;  // min-heap by (key, run index)
  size_t passes_ = 0;
  bool top_taken_ = false;         // the top run's head was handed out: advance it first
  bool drained_ = false;           // NextBatch found nothing left
  size_t max_records_ = 1u << 20;  // per batch
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_MERGE_H_
