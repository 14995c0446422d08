// ShuffleStore: one shuffle's durable storage (docs/storage.md).
//
// A directory holds:
//   SHUFFLE       the shuffle's parameters, written once, atomically
//   data          one append-only file for the whole shuffle: every mapper attempt's frames, for
//                 every partition, land in it as they arrive, each as a block: a 32-byte header
//                 (magic, partition, mapper, attempt, frame size, records, header checksum) +
//                 the frame
//   commits.log   one record per committed mapper attempt, listing its blocks (CommitLog)
//
// The commit log is the only source of truth: a block is visible if and only if a durable
// commit record lists it. Commit() has the CommitLog sync the data file (once per group-commit
// batch, however many partitions it touched), then append the record and sync the log, and only
// then reports success. For each mapper the first committed attempt wins; a later commit for the
// same mapper is reported as a duplicate and its blocks discarded. Each partition keeps an index
// of its committed blocks in memory (store_index.cc: 32 bytes a block, and its key bounds). Open()
// rebuilds the state from the log alone (store_recovery.cc): a torn tail record is cut off, every
// committed block must lie within the data file, and all bytes not owned by a commit (broken or
// in-flight attempts) are truncated away or punched out; the frames' bytes are checked where they
// are read (a fetch) and by the scrub (ScrubNext), which mark a partition found damaged
// (MarkDamaged). The files' bytes are block_format.h's and CommitLog's.
//
// Messages name the shuffle's files by their path relative to the data directory (`shown`,
// "shuffles/<id>"): clients see them, and are not told server paths.
//
// Thread safety: Append, Commit, Discard and the readers may be called concurrently.
#ifndef SLUICE_SERVER_STORAGE_SHUFFLE_STORE_H_
#define SLUICE_SERVER_STORAGE_SHUFFLE_STORE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/frame_format.h"
#include "server/metrics/server_metrics.h"
#include "server/storage/block_format.h"
#include "server/storage/commit_log.h"
#include "server/storage/file_util.h"

namespace sluice {

struct StoreOptions {
  /// Sync the data file and the commit log before a commit is acknowledged.
  bool fsync = true;
  /// The version a new shuffle's commit log is written in (kOldestLogVersion for benchmarks
  /// against servers before version 4; an existing log keeps its own).
  uint32_t log_version = kLogVersion;
  FrameLimits limits;
  /// The fdatasync commits use on the data file (tests inject failures here); null =
  /// file::SyncData.
  std::function<absl::Status(int fd, const std::string& path)> sync_data;
  /// Where commit batches' latencies are counted (may be null).
  Histogram* commit_sync_seconds = nullptr;
  /// A total the store's held bytes are added to as they change (its tenant's; may be null).
  std::shared_ptr<std::atomic<int64_t>> held_total;
  /// A total the store's index bytes are added to as they change (the registry's; may be null).
  std::shared_ptr<std::atomic<int64_t>> index_total;
  /// Told when a partition is first found damaged (MarkDamaged): the shuffle, the partition,
  /// why, and what found it ("fetch", "scrub"). May be null.
  std::function<void(const std::string&, uint32_t, const absl::Status&, const char*)> on_damaged;
};

enum class CommitOutcome { kCommitted, kDuplicate };

/// What Open reads of the committed blocks: kLog, nothing (the log says where they are and
/// what they hold; their bytes are checked when read); kEveryByte, each block's header and
/// frame, checksums included (a reopen after a failed disk write, which may have lost pages).
enum class OpenCheck { kLog, kEveryByte };

/// One of a partition's heaviest keys (ShuffleStore::HotKeys).
struct HotKey {
  std::string key;  ///< its first kMaxBoundKey bytes when `cut`
  bool cut = false;
  /// Its records and their bytes (keys and values) over the frames it was the heaviest key of:
  /// at most `error` more than that, where the sketch put it in another key's place.
  uint64_t records = 0, bytes = 0, error = 0;
};
/// Keys a partition's sketch keeps (space-saving over its frames' heaviest keys).
inline constexpr size_t kHotKeysKept = 8;

/// A pre-merged run of one partition (docs/storage.md, "Pre-merged runs"): the records of every
/// mapper from `first` to `last` for it, in key order, in frames of its own (a MERGE record). It
/// stands for those mappers' own blocks in a KEY read that takes all of them; the mappers' blocks
/// stay (UNORDERED reads, reads of some mappers, repairs). Retired when a revocation or repair
/// changes a mapper of its range, or a larger merge takes it in: its bytes are given back once
/// the last read holding it lets go.
struct MergedRun {
  uint32_t partition = 0, first = 0, last = 0, level = 1;
  uint64_t id = 0;
  std::vector<uint64_t> attempts;  ///< the committed attempt of each mapper of the range
  std::vector<uint32_t> repaired;  ///< mappers of the range whose data for it came by repair
  std::vector<BlockRef> blocks;    ///< in key order, with their bounds
  uint64_t bytes = 0, records = 0;
  uint64_t memory = 0;  ///< what it takes in memory, counted in the store's index_bytes()
  std::atomic<bool> retired{false};
};

/// What the pre-merge plans with (ShuffleStore::MergeStretches): a mapper's own blocks (level
/// 0; `bytes` 0 when it has none for the partition) or a pre-merged run, and the runs a KEY read
/// merges of it (a mapper's sorted flushes are a run each; a pre-merged run is one).
struct MergeUnit {
  uint32_t first = 0, last = 0;
  uint64_t bytes = 0;
  uint32_t level = 0;
  uint32_t runs = 0;
};

/// The limits committed frames are read back with. Each frame was checked against the cap in
/// force when it was pushed; a lower cap set later applies to new input only, never to what is
/// committed, so reading uses the largest cap a server accepts (and `input`'s record limit).
inline FrameLimits StoredFrameLimits(const FrameLimits& input) {
  return FrameLimits{kMaxFrameCapBytes, input.max_records};
}

class ShuffleStore {
 public:
  /// Creates `dir` (which must not hold a shuffle yet) and writes the parameters durably.
  /// `shown`: the directory as messages name it. With `evicted`, the store of an evicted
  /// shuffle (its EVICTED file written before its parameters: see evicted()).
  static absl::StatusOr<std::unique_ptr<ShuffleStore>> Create(
      const std::string& dir, const std::string& shown, const ShuffleParams& params,
      const StoreOptions& options, const EvictedSummary* evicted = nullptr);
  /// Opens an existing shuffle directory and recovers its committed state (store_recovery.cc).
  /// DATA_LOSS for damage, and for a shuffle of an earlier, unreleased layout.
  static absl::StatusOr<std::unique_ptr<ShuffleStore>> Open(const std::string& dir,
                                                            const std::string& shown,
                                                            const StoreOptions& options,
                                                            OpenCheck check = OpenCheck::kLog);
  /// Just the parameters of the shuffle in `dir` (e.g. of one that failed to open).
  static absl::StatusOr<ShuffleParams> ReadParams(const std::string& dir, const std::string& shown);

  ~ShuffleStore();
  ShuffleStore(const ShuffleStore&) = delete;
  ShuffleStore& operator=(const ShuffleStore&) = delete;

  const ShuffleParams& params() const { return params_; }

  /// Appends one frame (already validated by the caller) of a mapper attempt to the data file.
  /// Not visible until Commit. RESOURCE_EXHAUSTED when the disk is full.
  absl::StatusOr<BlockRef> Append(uint32_t mapper, uint64_t attempt, uint32_t partition,
                                  absl::Span<const uint8_t> frame, uint32_t records);
  /// One frame of AppendAll.
  struct FrameToAppend {
    uint32_t partition = 0;
    absl::Span<const uint8_t> frame;
    uint32_t records = 0;
    /// Its key bounds, encoded (key_bounds.h; empty: not known). Kept only by a log of version
    /// 7 on (an older log's blocks have none).
    std::string_view bounds{};
  };
  /// Appends several frames of one attempt with one write (a push message's worth); their
  /// blocks are added to *blocks in order. On error nothing is added.
  absl::Status AppendAll(uint32_t mapper, uint64_t attempt, absl::Span<const FrameToAppend> frames,
                         std::vector<BlockRef>* blocks);

  /// Makes the attempt's blocks durable and visible, or reports kDuplicate when the mapper
  /// already has a committed attempt (the caller then Discards its blocks).
  absl::StatusOr<CommitOutcome> Commit(uint32_t mapper, uint64_t attempt,
                                       absl::Span<const BlockRef> blocks);

  /// Cluster mode (docs/cluster.md, the commit protocol): makes the attempt's blocks durable but
  /// not visible, with a PREPARED record, until Resolve names the mapper's winner. kDuplicate
  /// when the mapper has a committed attempt here already (the caller then Discards its
  /// blocks); ALREADY_EXISTS when this attempt is prepared or committed here already.
  absl::StatusOr<CommitOutcome> Prepare(uint32_t mapper, uint64_t attempt,
                                        absl::Span<const BlockRef> blocks);
  /// The mapper's winner is `attempt`: commits its prepared blocks (a commit record) and
  /// discards the mapper's other prepared attempts. kCommitted when `attempt` is now the
  /// mapper's commit here (also when it was already); kDuplicate when another attempt is;
  /// FAILED_PRECONDITION when `attempt` is neither prepared nor committed here.
  absl::StatusOr<CommitOutcome> Resolve(uint32_t mapper, uint64_t attempt);
  /// Resolve for many mappers at once, with one log write: each (mapper, winning attempt) whose
  /// attempt is prepared here and whose mapper has no commit here is committed; the others are
  /// left as they are.
  absl::Status ResolveAll(absl::Span<const std::pair<uint32_t, uint64_t>> winners);
  /// Cluster mode, re-replication (docs/cluster.md): makes `blocks` (all of `partition`,
  /// appended under `mapper` and `attempt`) the mapper's committed data for that partition here,
  /// durably, with a REPAIR record. The mapper's committed attempt here must be `attempt`, or
  /// none: it then becomes `attempt` (its other prepared attempts are discarded).
  /// ALREADY_EXISTS when the partition was repaired for the mapper already; FAILED_PRECONDITION
  /// when another attempt is committed, or the log predates repairs (version < 5).
  absl::Status Repair(uint32_t mapper, uint64_t attempt, uint32_t partition,
                      absl::Span<const BlockRef> blocks);
  /// Cluster mode, a revoked decision (docs/cluster.md, "Revoking decisions"): `attempt` of
  /// `mapper` is no longer its winner. Durably (a REVOKE record), its commit here (all its
  /// partitions, repaired ones included) stops being visible and the mapper is uncommitted, so
  /// that a later attempt can win; a prepare, resolve or repair of `attempt` is refused from then
  /// on. Fetches begun before it go on with what they started with; its bytes are given back at
  /// the next open (a reader may still be reading them). Recorded also when `attempt` is not
  /// committed here (a replica that lacked it must never take it by a repair). Idempotent.
  /// FAILED_PRECONDITION when the log predates revocations (version < 6).
  absl::Status Revoke(uint32_t mapper, uint64_t attempt);
  /// Revoke for many (mapper, attempt) pairs at once: one log write and one pass over the index,
  /// however many (a lost partition's revocation names every mapper of a wide shuffle).
  absl::Status RevokeAll(absl::Span<const std::pair<uint32_t, uint64_t>> revoked);
  /// An evicted shuffle (docs/object-store.md, "Disks as a cache"): the store made afresh when
  /// its data was let go, and what it held then; null for any other. Its partitions come back
  /// by Repair from their objects (every winner's, or the partition is not here), and its
  /// mappers pushed since come by commits as anywhere.
  const EvictedSummary* evicted() const { return evicted_ ? &*evicted_ : nullptr; }
  /// What an eviction of this store keeps: its committed mappers (and, evicted before, the
  /// winners it held then that are not revoked) and each partition's stats (of one not here
  /// since an earlier eviction, those it had then).
  EvictedSummary SummaryForEviction() const;
  /// Of an evicted shuffle: whether partition `partition` is here whole, as far as the store
  /// knows its winners (SummaryForEviction's): each committed here at that attempt, and here
  /// for the partition (read back by a Repair, or pushed since the eviction). True for any
  /// other shuffle. A fetch of an evicted partition not here is refused, never served empty.
  bool EvictedPartitionHere(uint32_t partition) const;
  /// Those winners not here for the partition (mapper, attempt), in mapper order (none for any
  /// other shuffle).
  std::vector<std::pair<uint32_t, uint64_t>> EvictedLacking(uint32_t partition) const;
  /// This store object's own number (a reopen, or an eviction's new store, has another): what
  /// a check of the store remembers it checked.
  uint64_t instance() const { return instance_; }
  /// A server without etcd: the shuffle's OBJECTS file (kObjectsFile: the record of its
  /// objects in the store), written durably (temp file, fsync, rename, fsync dir); NOT_FOUND
  /// when there is none. Kept by an eviction.
  absl::Status WriteObjectsFile(const std::string& bytes) const;
  absl::StatusOr<std::string> ReadObjectsFile() const;
  /// Mappers whose data came by Repair for some partition.
  std::set<uint32_t> RepairedAnywhere() const;
  /// Whether `attempt` of `mapper` was revoked here.
  bool IsRevoked(uint32_t mapper, uint64_t attempt) const;
  /// The mappers whose data for `partition` came by Repair, in order.
  std::vector<uint32_t> RepairedMappers(uint32_t partition) const;
  /// The mapper's committed attempt here, if it has one.
  std::optional<uint64_t> CommittedAttempt(uint32_t mapper) const;
  /// Mappers with prepared attempts that are not resolved yet, in order.
  std::vector<uint32_t> PendingMappers() const;
  /// Whether `attempt` of `mapper` is prepared here, not resolved yet.
  bool IsPrepared(uint32_t mapper, uint64_t attempt) const;

  /// Gives the space of blocks that will never be committed back to the file system.
  void Discard(absl::Span<const BlockRef> blocks);

  /// Pre-merge (docs/storage.md, "Pre-merged runs"; server/rules/premerge.h).
  /// Whether the log takes MERGE records (version 8 on).
  bool merges_supported() const { return log_->version() >= kFirstMergeLogVersion; }
  /// Partitions committed to since the last call (every partition with data after an open, and
  /// once the last mapper commits), taken.
  std::vector<uint32_t> TakeMergeCandidates();
  /// Marks the partition a candidate again (a merge of it put off).
  void MarkMergeCandidate(uint32_t partition);
  /// Whether every mapper of the shuffle has committed here (its mapper count known).
  bool complete() const;
  /// Whether a KEY read of the partition began since a commit last added to it: its reduce has
  /// begun, and a merge now would race that reader for the machine to help only a second read.
  /// MergeStretches then offers nothing.
  bool ReadSinceCommit(uint32_t partition) const;
  /// The partition's runs in mapper order, in stretches of consecutive committed mapper ids: a
  /// merge takes units of one stretch (a pre-merged run's range holds every mapper id in it).
  std::vector<std::vector<MergeUnit>> MergeStretches(uint32_t partition) const;
  /// What a merge of the mappers [first, last] of a partition reads: its MERGE record so far
  /// (no blocks yet), the blocks to merge in CommittedBlocks' order (the pre-merged runs inside
  /// the range in place of their mappers' blocks) and those runs, held while they are read.
  /// FAILED_PRECONDITION when a mapper of the range is not committed, or a pre-merged run
  /// crosses its ends.
  struct MergePlan {
    CommitRecord record;
    std::vector<BlockRef> blocks;
    std::vector<std::shared_ptr<const MergedRun>> inputs;
    uint64_t bytes = 0;
  };
  absl::StatusOr<MergePlan> PlanMerge(uint32_t partition, uint32_t first, uint32_t last);
  /// Appends a merge's output frames (blocks of kMergedMapper, attempt `id`), not counted in
  /// the tenant's held bytes (they are the server's copy).
  absl::Status AppendMerged(uint64_t id, absl::Span<const FrameToAppend> frames,
                            std::vector<BlockRef>* blocks);
  /// Writes the plan's MERGE record (its blocks appended) durably and makes the run visible,
  /// retiring the runs it took in. False, its blocks given back, when a mapper of its range
  /// changed since the plan (revoked, repaired) or a run it took in is gone.
  absl::StatusOr<bool> InstallMerge(MergePlan plan, std::vector<BlockRef> blocks);
  /// Gives back a merge's appended blocks that will never be recorded.
  void DiscardMerged(absl::Span<const BlockRef> blocks) { PunchBlocks(blocks, /*held=*/false); }
  /// The partition's pre-merged runs, and how many mappers they stand for.
  struct MergedStats {
    uint32_t runs = 0, mappers = 0;
    uint64_t bytes = 0;
  };
  MergedStats Merged(uint32_t partition) const;
  /// Stored bytes of the pre-merged runs of the store.
  uint64_t merged_bytes() const { return merged_bytes_.load(std::memory_order_relaxed); }

  /// Committed blocks of a partition, ordered by mapper id, then arrival.
  std::vector<BlockRef> CommittedBlocks(uint32_t partition) const;
  std::vector<uint32_t> CommittedMappers() const;
  /// CommittedBlocks, with the committed mappers in the same instant (*mappers); with `only`
  /// (sorted; empty: all), only those mappers' blocks, and ABORTED naming one that is not
  /// committed here. With `merged` (a KEY read), each pre-merged run whose whole range is read
  /// stands for its mappers' blocks, in the place of its first mapper's, and is added to
  /// *merged (held while read): the records and their key order are the same.
  /// `attempts` (may be null): set to the committed attempt of each of *mappers. Without
  /// `with_bounds`, the blocks' bounds are left empty (no copy).
  absl::StatusOr<std::vector<BlockRef>> CommittedBlocksOf(
      uint32_t partition, const std::vector<uint32_t>& only, std::vector<uint32_t>* mappers,
      std::vector<uint64_t>* attempts = nullptr, bool with_bounds = true,
      std::vector<std::shared_ptr<const MergedRun>>* merged = nullptr) const;
  PartitionStats Stats(uint32_t partition) const;
  /// Stats, or of an evicted shuffle's partition not here now, what it held when evicted (what
  /// status calls report).
  PartitionStats ReportedStats(uint32_t partition) const;
  /// The committed mappers status calls report: CommittedMappers, and an evicted shuffle's
  /// winners that were not revoked since.
  std::vector<uint32_t> ReportedMappers() const;
  /// Every stride-th committed block of the partition (with its bounds; stride the least that
  /// takes at most `max`), in CommittedBlocks' order: what a split plan reads.
  struct BlockSample {
    std::vector<BlockRef> blocks;
    uint64_t stride = 1;   ///< each block taken stands for this many
    PartitionStats stats;  ///< the partition's, in the same instant
  };
  BlockSample SampleBlocks(uint32_t partition, size_t max) const;
  /// The partition's heaviest keys by records, at most `most` (of kHotKeysKept), heaviest first:
  /// a space-saving sketch over its committed frames' heaviest keys (key_bounds.h), so a key
  /// that dominates the frames it is in is counted exactly, and any key with more records than
  /// the sketch's least entry is in it. Frames without bounds count for nothing.
  std::vector<HotKey> HotKeys(uint32_t partition, size_t most = kHotKeysKept) const;

  /// Reads a committed block's frame, checking its frame's checksums (and sets *header, when
  /// given). A frame found damaged (DATA_LOSS) marks its partition (MarkDamaged). With a `view`
  /// (ReadView()), a frame of up to kViewReadMax bytes that lies in it is copied out of it rather
  /// than read with a system call.
  absl::Status ReadFrame(const BlockRef& block, std::string* frame, FrameHeader* header = nullptr,
                         const file::Mapping* view = nullptr) const;
  /// A mapping of the data file covering every block committed so far, shared by the readers
  /// that hold it and unmapped when the last lets go (the pages it touched count in the
  /// server's resident memory while it lives: they are the page cache's, and reclaimable).
  /// Null when the file cannot be mapped (reads then use pread).
  std::shared_ptr<const file::Mapping> ReadView();
  /// Largest frame ReadFrame copies out of a view: a wide shuffle's small frames cost a system
  /// call each to read, larger ones pay for their bytes either way.
  static constexpr uint32_t kViewReadMax = 64u << 10;

  /// Later Appends and Commits fail with NOT_FOUND; the caller removes the (renamed) directory.
  void MarkDeleted();

  /// Descriptors the store holds: its log and its data file, whatever its partition count.
  size_t open_files() const;

  /// Marks the shuffle used now (a push, a fetch, a status call): --shuffle_ttl_s counts from
  /// its last use. Opening or creating the store counts as a use.
  void Touch() { last_used_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count()); }
  /// When it was last used.
  std::chrono::steady_clock::time_point last_used() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(last_used_ns_.load()));
  }
  /// A reopened store's last use is its last use before it was closed.
  void SetLastUsed(std::chrono::steady_clock::time_point t) {
    last_used_ns_.store(t.time_since_epoch().count());
  }
  /// When it was created or opened.
  std::chrono::steady_clock::time_point opened_at() const { return opened_at_; }
  /// Stops counting its held bytes (they stay in options_.held_total: the registry keeps
  /// counting them while the store is closed) and returns them.
  int64_t DetachHeld() { return held_.exchange(0); }

  /// Push attempts writing to this store (the registry counts them, under its lock, to know
  /// when a wedged store may be reopened).
  void BeginWriter() { writers_.fetch_add(1); }
  void EndWriter() { writers_.fetch_sub(1); }
  int writers() const { return writers_.load(); }
  /// A failed disk write or sync stopped the commit log (CommitLog's latch): no commit is
  /// taken until the store is opened again. The reason, for status calls.
  bool wedged() const { return log_ != nullptr && log_->broken(); }
  absl::Status WedgedError() const { return log_->BrokenError(); }

  /// Partitions whose state exists (with committed blocks): memory follows them, not the
  /// declared count.
  size_t partitions_made() const { return partitions_.made(); }
  /// Bytes its partitions' indexes take in memory (capacity included).
  uint64_t index_bytes() const { return index_bytes_.load(std::memory_order_relaxed); }

  /// A partition whose committed data was found damaged (a checksum, a header that does not
  /// match its commit, a read error): from now on its fetches fail at once with DATA_LOSS
  /// naming it (in a cluster, readers then use another replica). The first reason is kept.
  /// Returns whether the partition was not marked before.
  bool MarkDamaged(uint32_t partition, const absl::Status& why, const char* found_by) const;
  /// OK, or the DATA_LOSS of a damaged partition.
  absl::Status PartitionDamage(uint32_t partition) const;
  /// The damaged partitions and why, in order.
  std::map<uint32_t, absl::Status> DamagedPartitions() const;

  /// Where a scrub of this store stands (ScrubNext).
  struct ScrubCursor {
    uint32_t partition = 0;
    size_t next = 0;  ///< the next block of `blocks`
    struct Block {
      BlockRef ref;
      uint32_t mapper;
      uint64_t attempt;
    };
    std::vector<Block> blocks;  ///< `partition`'s committed blocks when its scrub began
    std::vector<std::shared_ptr<const MergedRun>> runs;  ///< its pre-merged runs among them
  };
  struct ScrubStep {
    uint64_t bytes = 0;  ///< read
    bool done = false;   ///< every partition was walked
    int damaged = 0;     ///< partitions newly marked damaged
  };
  /// Reads and checks committed blocks from `cursor` on, about `max_bytes` of them (at least
  /// one block): each block's header against its commit, and its frame's header and payload
  /// checksum, read in pieces of at most kScrubPiece bytes into *buffer (so a scrub's memory is
  /// one piece, whatever the frames' size). A damaged one marks its partition (MarkDamaged),
  /// whose scrub then ends.
  ScrubStep ScrubNext(ScrubCursor* cursor, uint64_t max_bytes, std::string* buffer);
  static constexpr size_t kScrubPiece = 1 << 20;

 private:
  // One committed block of a partition (the partition is implied).
  struct IndexEntry {
    uint32_t mapper;
    uint32_t frame_size;
    uint64_t offset;
    uint32_t records;
    uint32_t uncompressed;
    uint32_t bounds_at;  // where its key bounds start in the partition's `bounds`; kNoBounds
  };
  static constexpr uint32_t kNoBounds = UINT32_MAX;
  // A partition's committed data, guarded by the store's commit_mu_.
  struct Partition {
    PartitionStats stats;
    std::vector<IndexEntry> index;  // in commit order; stable-sorted by mapper when read
    std::string bounds;             // the blocks' key bounds, back to back (key_bounds.h)
    std::vector<HotKey> hot;        // the sketch of its heaviest keys (HotKeys)
    bool sorted = true;
    bool merge_candidate = false;    // in merge_candidates_
    bool read_since_commit = false;  // a KEY read began since its last commit (ReadSinceCommit)
    // Its pre-merged runs, by first mapper (ranges apart).
    std::vector<std::shared_ptr<MergedRun>> merged;
  };
  // The bounds of an entry of `p`, encoded (empty: not known).
  static std::string_view BoundsOf(const Partition& p, const IndexEntry& e);
  // The BlockRef of an entry of `p`, partition `partition` (its bounds copied when asked for).
  static BlockRef RefOf(uint32_t partition, const Partition& p, const IndexEntry& e,
                        bool with_bounds);
  // p's index in CommittedBlocks' order: by mapper id, each mapper's blocks in arrival order.
  static void SortIndexLocked(Partition& p);
  // Adds a frame's heaviest key (its encoded bounds) to p's sketch.
  static void AddHotKey(Partition& p, std::string_view bounds);
  // Partition state, made on first use, in chunks of 256 behind a table of one pointer a chunk:
  // a 65,536-partition shuffle nobody wrote to takes 2 KiB, not a state for each partition.
  class PartitionTable {
   public:
    explicit PartitionTable(uint32_t count);
    ~PartitionTable();
    PartitionTable(const PartitionTable&) = delete;
    PartitionTable& operator=(const PartitionTable&) = delete;
    /// The partition's state, or null if it was never made.
    Partition* Find(uint32_t i) const;
    /// The partition's state, made if needed (i < count).
    Partition& Get(uint32_t i);
    /// Each made partition, in order: f(index, state).
    template <typename F>
    void ForEach(F&& f) const {
      for (size_t c = 0; c < chunks_.size(); ++c) {
        Chunk* chunk = chunks_[c].load(std::memory_order_acquire);
        if (chunk == nullptr) continue;
        for (size_t j = 0; j < kChunk; ++j) {
          Partition* p = chunk->slots[j].load(std::memory_order_acquire);
          if (p != nullptr) f(static_cast<uint32_t>(c * kChunk + j), *p);
        }
      }
    }
    size_t made() const { return made_.load(); }

   private:
    static constexpr size_t kChunk = 256;
    struct Chunk {
      std::atomic<Partition*> slots[kChunk] = {};
    };
    std::vector<std::atomic<Chunk*>> chunks_;
    std::mutex make_mu_;  // making a chunk or a partition
    std::atomic<size_t> made_{0};
  };
  ShuffleStore(std::string dir, std::string shown, ShuffleParams params, StoreOptions options);
  // The data file as messages name it.
  const std::string& DataName() const { return data_name_; }
  CommitLog::Options LogOptions();
  absl::Status SyncDataFile();
  // Rebuilds the state from the log (docs/storage.md, Recovery).
  absl::Status Recover(int dir_fd, OpenCheck check);
  // Checks a committed block's header against its record and its frame's header (and, with
  // `payload`, reads the frame and checks its checksums); sets its uncompressed size.
  absl::Status VerifyBlock(uint32_t mapper, uint64_t attempt, BlockRef* block, bool payload) const;
  // Reads a committed block's header and its frame's, and checks them against the block's
  // commit (mapper, attempt, partition, sizes) and their own checks: the frame's header.
  absl::StatusOr<FrameHeader> ReadBlockHeaders(uint32_t mapper, uint64_t attempt,
                                               const BlockRef& block) const;
  // The scrub's check of one committed block (ScrubNext).
  absl::Status ScrubBlock(const ScrubCursor::Block& b, std::string* buffer) const;
  // Makes room for `frames` more entries in p's index, counted in index_bytes_.
  void ReserveIndexLocked(Partition& p, size_t frames, uint64_t bounds_bytes);
  absl::Status ReclaimUnowned();
  // Adds `delta` to held_ and to options_.held_total.
  void Hold(int64_t delta);
  // Takes everything held_ counts out of options_.held_total (deleted or closed).
  void ReleaseHeld();
  absl::Status DeletedError() const;
  // Punches the blocks' ranges out of the data file, adjacent ones together.
  void PunchBlocks(absl::Span<const BlockRef> blocks, bool held = true);
  // AppendAll's write; `held`: counted in the tenant's held bytes.
  absl::Status AppendFrames(uint32_t mapper, uint64_t attempt,
                            absl::Span<const FrameToAppend> frames, std::vector<BlockRef>* blocks,
                            bool held);
  // A pre-merged run shared with its readers: once retired, its bytes are given back when the
  // last of them lets go.
  std::shared_ptr<MergedRun> NewMergedRun(CommitRecord record);
  // Retires p's runs whose range meets [first, last] (outside the index; the readers holding
  // them keep them until done).
  void RetireMergedLocked(Partition& p, uint32_t first, uint32_t last);
  // Puts a MERGE record's run in its partition's index (by first mapper), retiring the runs
  // whose range it meets.
  void AddMergedRunLocked(CommitRecord record);
  // Whether the MERGE record still stands for its range: the same attempts committed, the same
  // repairs of the partition.
  bool MergeStillHoldsLocked(const CommitRecord& r) const;
  void MarkMergeCandidateLocked(uint32_t partition, Partition& p);
  // Recovery: the MERGE records that stand, as runs (`check`: their blocks' headers read, and a
  // run whose blocks fail is dropped, not the shuffle's damage).
  void RecoverMergedLocked(std::vector<CommitRecord> merges, uint64_t data_size, bool check);
  void AddCommitLocked(uint32_t mapper, uint64_t attempt, absl::Span<const BlockRef> blocks);
  // After a commit's (or, `repaired`, a repair's) record was written with result `written`: the
  // mapper's claim let go; if written, its blocks visible and its other prepared attempts
  // punched out.
  absl::Status Recorded(uint32_t mapper, uint64_t attempt, absl::Span<const BlockRef> blocks,
                        const absl::Status& written, std::optional<uint32_t> repaired);
  // Waits until no outcome of the mapper is being written, then claims it (inflight_mappers_);
  // the error when the store is deleted or its log is broken.
  bool IsPreparedLocked(uint32_t mapper, uint64_t attempt) const;
  // Forgets the mapper's prepared attempts, adding all but `winner`'s blocks to *losers (for
  // PunchBlocks, outside the lock, once the winner's commit record is durable).
  void DropPreparedLocked(uint32_t mapper, uint64_t winner, std::vector<BlockRef>* losers);
  absl::Status ClaimMapperLocked(std::unique_lock<std::mutex>& lock, uint32_t mapper);
  // Waits until no outcome of any of the pairs' mappers is being written (ResolveAll,
  // RevokeAll); the error when the store is deleted.
  absl::Status WaitForNoneInflightLocked(std::unique_lock<std::mutex>& lock,
                                         absl::Span<const std::pair<uint32_t, uint64_t>> pairs);
  // Recovery's step 3: the commits (the first commit record of each mapper) and the prepared
  // attempts of mappers with none, checked against the shuffle's parameters.
  absl::Status SortRecords(std::vector<CommitRecord> records, std::vector<CommitRecord>* commits,
                           std::vector<CommitRecord>* prepared, std::vector<CommitRecord>* repairs,
                           std::set<std::pair<uint32_t, uint64_t>>* revoked,
                           std::vector<CommitRecord>* merges) const;

  const std::string dir_;
  const std::string shown_dir_;  // relative to the data directory, for messages
  const std::string data_name_;  // shown_dir_/data
  std::atomic<bool> destroyed_{false};
  std::atomic<int> writers_{0};
  std::atomic<int64_t> held_{0};  // bytes of its blocks: committed, prepared, being pushed
  std::atomic<std::chrono::steady_clock::rep> last_used_ns_{0};
  std::atomic<uint64_t> index_bytes_{0};
  const std::chrono::steady_clock::time_point opened_at_ = std::chrono::steady_clock::now();
  // Adds to index_bytes_ and options_.index_total.
  void AddIndexBytes(int64_t delta);
  const ShuffleParams params_;
  const StoreOptions options_;
  std::optional<EvictedSummary> evicted_;  // set once, before the store is shared
  const uint64_t instance_;
  file::Fd data_fd_;
  std::mutex data_mu_;                       // guards data_end_
  uint64_t data_end_ = 0;                    // where the next append goes
  std::mutex view_mu_;                       // guards view_
  std::weak_ptr<const file::Mapping> view_;  // ReadView()'s, while a reader holds it

  std::unique_ptr<CommitLog> log_;
  mutable std::mutex commit_mu_;  // guards everything below and the partitions' state
  std::condition_variable commit_cv_;
  PartitionTable partitions_;
  std::set<uint32_t> inflight_mappers_;              // between the duplicate check and the outcome
  std::map<uint32_t, uint64_t> committed_;           // mapper -> its winning attempt
  std::map<uint32_t, std::set<uint32_t>> repaired_;  // partition -> mappers come by Repair
  std::set<std::pair<uint32_t, uint64_t>> revoked_;  // (mapper, attempt) revoked (REVOKE)
  // Cluster mode: mapper -> attempt -> its blocks, prepared and not resolved yet.
  std::map<uint32_t, std::map<uint64_t, std::vector<BlockRef>>> prepared_;
  mutable std::map<uint32_t, absl::Status> damaged_;  // partition -> why (MarkDamaged)
  std::vector<uint32_t> merge_candidates_;            // TakeMergeCandidates
  uint64_t next_merge_id_ = 1;
  std::atomic<uint64_t> merged_bytes_{0};
};

}  // namespace sluice

#endif  // SLUICE_SERVER_STORAGE_SHUFFLE_STORE_H_
