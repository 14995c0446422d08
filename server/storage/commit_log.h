// CommitLog: a shuffle's commits.log (docs/storage.md), the only source of truth of what is
// committed. One record per committed mapper attempt, listing its blocks; the record encoding
// and its parser live here side by side.
//
// The file starts with a 1 KiB header of two checkpoint slots (written alternately, so a torn
// slot write leaves the other one whole); each names the log length proven durable: the
// "floor". Records follow from byte 1024. Recovery refuses a log that ends before its floor
// (acknowledged commits were lost: truncated, emptied) and cuts everything after the first bad
// record past it (a torn, unacknowledged batch, even one with valid records after a hole).
//
// Append() is a group commit: concurrent callers queue their records, and whichever finds no
// write in progress leads a batch of everything queued. Outside the lock the leader first has
// the shuffle's data file made durable (Options::sync_data, one fdatasync for the whole
// batch), then writes all its records with one write (plus a checkpoint raising the
// floor to where the batch starts, when it is behind) and syncs the log, and wakes the others.
// A leader that finds nobody queued after its batch also raises the floor to the batch's end
// (one more sync), so an idle log's floor covers every record. All of a shuffle's data syncs
// happen in batch leaders, one batch at a time: Linux reports a writeback error to a single
// fdatasync, so it must be the one whose failure stops the records that depend on those pages.
//
// The broken-log latch: after any failed sync or log write the outcome on disk is unknown (a
// failed fdatasync may have dropped other attempts' pages, and a retry can report success
// without them), so the log takes no more records: this and every later Append fails with
// UNAVAILABLE until a restart re-reads and re-verifies what is on disk.
//
// Thread safety: Append and the accessors may be called concurrently.
#ifndef SLUICE_SERVER_STORAGE_COMMIT_LOG_H_
#define SLUICE_SERVER_STORAGE_COMMIT_LOG_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/storage/file_util.h"

namespace sluice {

/// Where one stored frame lives.
struct BlockRef {
  uint32_t partition = 0;
  uint32_t frame_size = 0;  ///< bytes of the frame; the block adds a 32-byte header
  uint64_t offset = 0;      ///< of the block header in the shuffle's data file
  uint32_t records = 0;
  /// The frame's uncompressed payload size (what decoding it takes): in the commit record from
  /// log version 4 on; for a version 3 log, recovery reads it from the frame's header.
  uint32_t uncompressed = 0;
  /// The frame's key bounds, encoded (codec/key_bounds.h; empty: not known): in the
  /// commit record from log version 7 on.
  std::string bounds{};
};

/// One committed (or, in a cluster, prepared) mapper attempt, as its log record lists it.
struct CommitRecord {
  uint32_t mapper = 0;
  uint64_t attempt = 0;
  std::vector<BlockRef> blocks;
  /// A PREPARED record: the blocks are durable but not visible until a commit record of the
  /// same attempt follows (docs/cluster.md, the commit protocol).
  bool prepared = false;
  /// A REPAIR record (log version 5): the mapper's committed data for `partition`, copied from
  /// another replica (docs/cluster.md, "Re-replication"); its blocks are all of that partition.
  bool repair = false;
  uint32_t partition = 0;
  /// A REVOKE record (log version 6): the mapper's committed `attempt` is no longer its winner
  /// (the cluster revoked the decision: docs/cluster.md, "Revoking decisions"); its blocks are
  /// not visible from here on and no longer owned, and the attempt never commits again. No
  /// blocks.
  bool revoke = false;
  /// A MERGE record (log version 8; docs/storage.md, "Pre-merged runs"): `blocks` (all of
  /// `partition`, appended under kMergedMapper and `attempt`, the merge's id) are the records of
  /// every mapper from `mapper` to `last_mapper` for the partition in key order, made from their
  /// committed attempts `attempts` (one per mapper of the range) and, of those, the mappers in
  /// `repaired` whose data for the partition came by REPAIR. Visible only while every mapper of
  /// the range still has that attempt committed and no other repair of the range's mappers
  /// followed; a later valid merge record whose range meets it replaces it. `level`: how many
  /// merges deep its records are (1: made from mappers' own runs).
  bool merge = false;
  uint32_t last_mapper = 0;
  uint32_t level = 0;
  std::vector<uint64_t> attempts;
  std::vector<uint32_t> repaired;
};

/// The mapper id in the header of a pre-merged run's blocks (MERGE records): never a mapper's
/// (a shuffle's mapper ids are below its mapper count, at most 2^31).
inline constexpr uint32_t kMergedMapper = UINT32_MAX;

/// The log version new logs are written in, and the oldest one read (version 3's records lack
/// the frames' uncompressed sizes; version 5 adds REPAIR records, version 6 REVOKE records,
/// which older logs cannot take, version 7 the frames' key bounds, version 8 MERGE records).
inline constexpr uint32_t kLogVersion = 8;
inline constexpr uint32_t kOldestLogVersion = 3;
inline constexpr uint32_t kFirstRepairLogVersion = 5;
inline constexpr uint32_t kFirstRevokeLogVersion = 6;
inline constexpr uint32_t kFirstBoundsLogVersion = 7;
inline constexpr uint32_t kFirstMergeLogVersion = 8;

/// The record's bytes: "SLCM" (a commit; "SLPR" for a prepared attempt), u32 body size, then
/// the body: u32 mapper, u64 attempt, u32 block count, 24 bytes a block (u32 partition, u64
/// offset, u32 frame size, u32 records, u32 uncompressed size; version 3: 20 bytes, without the
/// uncompressed size), from version 7 each block's key bounds (key_bounds.h) back to back, u64
/// XXH3 of the body before it. All little-endian.
std::string EncodeCommitRecord(uint32_t mapper, uint64_t attempt, absl::Span<const BlockRef> blocks,
                               bool prepared = false, uint32_t version = kLogVersion);
/// Parses one record of a log of `version` at [p, end). Returns its size, or 0 if the bytes are
/// not a whole valid record.
size_t ParseCommitRecord(const uint8_t* p, const uint8_t* end, CommitRecord* out,
                         uint32_t version = kLogVersion);
/// A REPAIR record: "SLRP", u32 body size, the body of a commit record with u32 partition after
/// the blocks (before the checksum). Version 5 on.
std::string EncodeRepairRecord(uint32_t mapper, uint64_t attempt, uint32_t partition,
                               absl::Span<const BlockRef> blocks, uint32_t version = kLogVersion);
/// A REVOKE record: "SLRV", u32 body size, the body of a commit record without blocks. Version
/// 6 on.
std::string EncodeRevokeRecord(uint32_t mapper, uint64_t attempt, uint32_t version = kLogVersion);
/// A MERGE record: "SLMG", u32 body size, then the body: u32 partition, u32 first mapper, u32
/// last mapper, u64 merge id, u32 level, u64 committed attempt of each mapper of the range, u32
/// count and the repaired mappers (u32 each), u32 block count, 24 bytes a block, their key
/// bounds back to back (as in a commit record), u64 XXH3 of the body before it. Version 8 on.
std::string EncodeMergeRecord(const CommitRecord& r);
/// Any record, as its fields say.
std::string EncodeRecord(const CommitRecord& r, uint32_t version = kLogVersion);

class CommitLog {
 public:
  struct Options {
    bool fsync = true;
    /// The version Create writes (kOldestLogVersion to kLogVersion); Open keeps the log's own.
    uint32_t version = kLogVersion;
    /// Names the shuffle in errors, as callers know it (ShuffleName).
    std::string shuffle_name;
    /// Makes the shuffle's data durable; called once by a batch's leader, outside every lock,
    /// before the batch's records are written (only when fsync is on).
    std::function<absl::Status()> sync_data;
    /// Told how long each batch's writes and syncs took, in seconds (metrics; may be null).
    std::function<void(double)> observe_batch;
  };

  /// An empty log in the directory `dir_fd`, replacing any file there; the header and the
  /// directory entry are synced. `dir` names the directory in messages (relative to the data
  /// directory: clients see them).
  static absl::StatusOr<std::unique_ptr<CommitLog>> Create(int dir_fd, const std::string& dir,
                                                           Options options);
  /// Opens the log in `dir_fd` and returns its records in order in *records. DATA_LOSS, with
  /// nothing changed, when the log is missing or headerless while `has_data` (the shuffle's data
  /// file is not empty: without it such a log lost nothing, a crash inside Create, and starts
  /// afresh), ends before its floor, or has a bad record before its floor. A bad record past the
  /// floor starts a torn tail, which is cut off; the floor is then raised to cover every record
  /// kept.
  static absl::StatusOr<std::unique_ptr<CommitLog>> Open(int dir_fd, const std::string& dir,
                                                         Options options, bool has_data,
                                                         std::vector<CommitRecord>* records);

  /// Appends one record (a commit, or a PREPARED record) and makes it durable together with the
  /// data it lists (see above).
  absl::Status Append(uint32_t mapper, uint64_t attempt, absl::Span<const BlockRef> blocks,
                      bool prepared = false);
  /// Appends a REPAIR record (version 5 on), made durable with the data it lists.
  absl::Status AppendRepair(uint32_t mapper, uint64_t attempt, uint32_t partition,
                            absl::Span<const BlockRef> blocks);
  /// Appends several records with one write: all durable when it returns OK.
  absl::Status AppendAll(absl::Span<const CommitRecord> records);

  /// Whether a failed write or sync stopped the log (see above).
  bool broken() const;
  /// The UNAVAILABLE error a broken log answers with.
  absl::Status BrokenError() const;
  /// The log as messages name it (`dir`/commits.log).
  const std::string& path() const { return path_; }
  /// The version its header and records are written in (a log keeps the version it was
  /// created with: a version 3 log stays version 3).
  uint32_t version() const { return durable_version_; }

 private:
  struct Pending;  // one queued Append
  /// A header slot's contents.
  struct Checkpoint {
    uint64_t generation = 0;  ///< the newer of the two valid slots wins
    uint64_t floor = 0;       ///< bytes of the file proven durable, header included
    uint64_t records = 0;     ///< records before the floor (for messages)
    uint32_t version = kLogVersion;
  };
  CommitLog(file::Fd fd, std::string path, Options options, Checkpoint durable, uint64_t end,
            uint64_t records)
      : fd_(std::move(fd)),
        path_(std::move(path)),
        options_(std::move(options)),
        durable_(durable),
        durable_version_(durable.version),
        end_(end),
        records_(records) {}
  static std::string EncodeCheckpoint(const Checkpoint& c);
  // Queues `me` and waits until a batch has written it (leading the batch if none is).
  absl::Status Write(Pending& me);
  // 40 bytes at p: a valid slot of this log version.
  static bool ParseCheckpoint(const uint8_t* p, Checkpoint* out);
  // Writes a checkpoint into the slot its generation picks (no sync).
  absl::Status WriteCheckpoint(const Checkpoint& c);
  // Syncs the shuffle's data, writes a batch's records at `at` (and `checkpoint`, when it has
  // a generation) and syncs the log; no lock held.
  absl::Status WriteBatch(uint64_t at, const std::string& records, const Checkpoint& checkpoint);

  const file::Fd fd_;
  const std::string path_;
  const Options options_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  Checkpoint durable_;  // the newest checkpoint on disk
  const uint32_t durable_version_;
  uint64_t end_ = 0;      // where the next batch is written
  uint64_t records_ = 0;  // records before end_
  bool broken_ = false;   // the latch
  bool writing_ = false;  // a batch is being written and synced
  std::vector<Pending*> queue_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_STORAGE_COMMIT_LOG_H_
