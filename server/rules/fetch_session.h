// FetchSession: the rules of one partition's fetch, apart from any transport. The gRPC fetch
// reactor (server/service/fetch_reactor.cc) converts the request, asks for one frame at a time
// and writes it; tests drive the same rules without a stream.
//
//   FetchSpec spec{.shuffle_id = "job", .partition = 3, .key_order = true};
//   SLUICE_ASSIGN_OR_RETURN(auto session, FetchSession::Make(spec, deps));
//   std::string frame;
//   while (*session->Next(&frame)) { Send(frame); session->Sent(); }
//
// Make checks the request (partition in range, require_complete, the zstd level) and takes the
// partition's committed blocks as they are now. UNORDERED: Next hands out the stored frames as
// they were pushed, each read and checksum-verified. KEY: a k-way merge of the partition's runs
// (server/rules/merge.h), re-encoded in chunks of the size and layout asked for. A KEY session may
// hold up to fan-in decoded frames: callers admit at most so many at once (the server's merge
// gate) before the first Next.
//
// Budget: the frame Next returns is charged to the server's memory budget until Sent(); a
// merge's resident frames are charged while they are held. The destructor returns every charge.
// Not thread-safe: one caller at a time.
#ifndef SLUICE_SERVER_RULES_FETCH_SESSION_H_
#define SLUICE_SERVER_RULES_FETCH_SESSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/frame_format.h"
#include "server/rules/merge.h"
#include "server/runtime/memory_budget.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

/// What a reducer asked for (the transport-free FetchRequest).
struct FetchSpec {
  std::string shuffle_id;
  uint32_t partition = 0;
  bool key_order = false;
  /// FAILED_PRECONDITION unless every mapper has committed (needs the shuffle's mapper count).
  bool require_complete = false;
  LayoutChoice layout = LayoutChoice::kAuto;  ///< of the frames a KEY fetch builds
  bool uncompressed = false;
  uint32_t zstd_level = 0;          ///< 0 = 3; at most kMaxFetchZstdLevel
  uint32_t target_chunk_bytes = 0;  ///< 0 = 1 MiB of records per frame (KEY)
  /// The first records of the partition, in this fetch's order, that are not returned.
  uint64_t skip_records = 0;
  /// Only these mappers' records (sorted, no repeats; empty: every committed mapper). ABORTED
  /// if one of them is not committed here.
  std::vector<uint32_t> only_mappers;
  /// With only_mappers: the attempt of each the read began with (empty: any). ABORTED
  /// (ErrorReason::kRevoked) when one's committed attempt here is another.
  std::vector<uint64_t> only_attempts;
  /// KEY only: the records with keys in [from_key, to_key) (no to_key: to the end). Only the
  /// stored frames whose key bounds meet the range are read (codec/key_bounds.h);
  /// skip_records counts within the range.
  std::string from_key;
  std::optional<std::string> to_key;
  /// Whose share of the memory budget the session's frames are counted in.
  std::string tenant;
};

/// The chunk a KEY fetch asks for by default, and what pre-merged runs' frames hold
/// (PremergeOptions::frame_bytes): such a fetch of one run sends its frames as stored.
inline constexpr size_t kPremergedChunkBytes = 1u << 20;
/// Fetches compress at most at this zstd level: the server compresses for every reducer.
inline constexpr uint32_t kMaxFetchZstdLevel = 9;
/// Longest from_key or to_key a fetch may name.
inline constexpr size_t kMaxRangeKeyBytes = 64u << 10;

struct FetchDeps {
  ShuffleRegistry* registry = nullptr;
  MemoryBudget* budget = nullptr;
  FrameLimits limits;  ///< the cap in force: chunk sizes follow it
  MergeOptions merge;
};

class FetchSession {
 public:
  /// Fewest frames small enough to read through the store's ReadView() for a fetch to take one.
  static constexpr size_t kMinViewBlocks = 16;
  /// `cancelled` (may be null) stops a merge's intermediate passes once set.
  static absl::StatusOr<std::unique_ptr<FetchSession>> Make(const FetchSpec& spec,
                                                            const FetchDeps& deps,
                                                            const std::atomic<bool>* cancelled);
  ~FetchSession();
  FetchSession(const FetchSession&) = delete;
  FetchSession& operator=(const FetchSession&) = delete;

  /// Whether the session merges (and so must be admitted before its first Next): a KEY read,
  /// unless one pre-merged run is all it reads (its frames go out as stored).
  bool key_order() const { return !stored_order_; }
  /// KEY: the runs its merge reads (a pre-merged run, or a sorted flush cut into frames, is
  /// one), once the merge started; 1 when one pre-merged run is sent as stored.
  size_t runs() const { return runs_; }
  /// The pre-merged runs it reads.
  size_t premerged_runs() const { return merged_runs_.size(); }

  /// Puts the next frame in *frame, charged to the budget until Sent(); false once done.
  absl::StatusOr<bool> Next(std::string* frame);
  /// Whether the frame the last Next gave is the last one (a small partition's only chunk):
  /// the transport can send it with the end of the stream. False when not known.
  bool last() const;
  /// The frame from the last Next is sent: its charge goes back.
  void Sent();
  /// The size of the stored frame the next Next reads (UNORDERED), to wait for room for it
  /// first; 0 when done or not known (KEY).
  uint64_t next_frame_bytes() const;
  /// The committed mappers this fetch serves (only_mappers, or every one committed when it
  /// started), in order.
  const std::vector<uint32_t>& mappers() const { return mappers_; }
  /// Their committed attempts, one per mapper.
  const std::vector<uint64_t>& attempts() const { return attempts_; }
  /// A KEY session's intermediate merge passes so far, and the bytes they spilled.
  size_t merge_passes() const { return merged_ == nullptr ? 0 : merged_->intermediate_passes(); }
  uint64_t spill_bytes() const { return merged_ == nullptr ? 0 : merged_->spill_bytes(); }
  /// The stored frames this fetch reads (of a key range: those whose bounds meet it), and
  /// their bytes.
  size_t frames_to_read() const { return blocks_.size(); }
  uint64_t bytes_to_read() const;

 private:
  FetchSession(const FetchSpec& spec, const FetchDeps& deps, const std::atomic<bool>* cancelled)
      : spec_(spec), deps_(deps), cancelled_(cancelled) {}
  absl::Status Setup();
  absl::StatusOr<bool> NextStored(std::string* frame);
  // Whether every key of stored frame `b` is in the key range asked for (its bounds say so).
  bool InsideRange(const BlockRef& b) const;
  // The stored frame `b` without its first skip_ records (and, `to_range`, only its records in
  // the key range asked for), re-encoded; false when nothing of it is left.
  absl::StatusOr<bool> CutInto(const BlockRef& b, bool to_range, std::string* frame);
  absl::StatusOr<bool> NextMerged(std::string* frame);
  absl::Status StartMerge();
  void Charge(uint64_t n);

  const FetchSpec spec_;
  const FetchDeps deps_;
  const std::atomic<bool>* const cancelled_;
  std::shared_ptr<ShuffleStore> store_;
  std::shared_ptr<const file::Mapping> view_;  // the store's ReadView()
  EncodeOptions encode_;
  size_t chunk_bytes_ = 1 << 20;
  std::vector<BlockRef> blocks_;
  // The pre-merged runs among blocks_ (held: a run retired meanwhile keeps its bytes).
  std::vector<std::shared_ptr<const MergedRun>> merged_runs_;
  bool stored_order_ = true;    // stored frames go out as they are (UNORDERED, one pre-merged run)
  bool ranged_stored_ = false;  // ... of a key range: those at its ends cut to it
  size_t runs_ = 0;
  std::vector<uint32_t> mappers_;
  std::vector<uint64_t> attempts_;  // mappers_' committed attempts
  size_t next_ = 0;
  uint64_t skip_ = 0;     // records still to leave out (FetchSpec::skip_records)
  uint64_t charged_ = 0;  // the frame handed out, until Sent()
  // KEY order only.
  std::unique_ptr<FrameDecoder> decoder_;
  RunDecoder run_decoder_;  // shared by the merge's runs
  std::unique_ptr<MergedStream> merged_;
  std::unique_ptr<FrameEncoder> encoder_;
  std::vector<Record> batch_;
  uint64_t merge_charged_ = 0;  // the runs' resident bytes, counted in the budget
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_FETCH_SESSION_H_
