// CommitLog: a shuffle's commits.log (docs/storage.md), the only source of truth of what is
// committed. One record per committed mapper attempt, listing its blocks; the record encoding
// and its parser live here side by side.
//
// Append() is a group commit: concurrent callers queue their records, and whichever finds no
// write in progress leads a batch of everything queued. Outside the lock the leader first has
// the batch's data made durable (Options::sync_partitions, for every partition the batch's
// blocks are in), then appends all its records with one write and syncs the log, and wakes the
// others. All of a shuffle's data syncs happen in batch leaders, one batch at a time: Linux
// reports a writeback error to a single fdatasync, so it must be the one whose failure stops
// the records that depend on those pages.
//
// The broken-log latch: after any failed sync or log write the outcome on disk is unknown (a
// failed fdatasync may have dropped other attempts' pages, and a retry can report success
// without them), so the log takes no more records: this and every later Append fails with
// UNAVAILABLE until a restart re-reads and re-verifies what is on disk.
//
// Thread safety: Append and the accessors may be called concurrently.
#ifndef SLUICE_SERVER_COMMIT_LOG_H_
#define SLUICE_SERVER_COMMIT_LOG_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/file_util.h"

namespace sluice {

/// Where one stored frame lives.
struct BlockRef {
  uint32_t partition = 0;
  uint32_t frame_size = 0;  ///< bytes of the frame; the block adds a 32-byte header
  uint64_t offset = 0;      ///< of the block header in the partition file
  uint32_t records = 0;
};

/// One committed mapper attempt, as its log record lists it.
struct CommitRecord {
  uint32_t mapper = 0;
  uint64_t attempt = 0;
  std::vector<BlockRef> blocks;
};

/// The record's bytes: "SLCM", u32 body size, then the body: u32 mapper, u64 attempt, u32 block
/// count, 20 bytes a block (u32 partition, u64 offset, u32 frame size, u32 records), u64 XXH3 of
/// the body before it. All little-endian.
std::string EncodeCommitRecord(uint32_t mapper, uint64_t attempt,
                               absl::Span<const BlockRef> blocks);
/// Parses one record at [p, end). Returns its size, or 0 if the bytes are not a whole valid
/// record.
size_t ParseCommitRecord(const uint8_t* p, const uint8_t* end, CommitRecord* out);

class CommitLog {
 public:
  struct Options {
    bool fsync = true;
    /// Names the shuffle in errors.
    std::string shuffle_id;
    /// Makes the data of the given partitions durable; called by a batch's leader, outside
    /// every lock, before the batch's records are written (only when fsync is on).
    std::function<absl::Status(const std::set<uint32_t>& partitions)> sync_partitions;
  };

  /// An empty log `name` in the directory `dir_fd` (`dir` is for messages), truncated if it
  /// exists; the directory entry is synced.
  static absl::StatusOr<std::unique_ptr<CommitLog>> Create(int dir_fd, const std::string& dir,
                                                           Options options);
  /// Opens the log and returns its records in order in *records. A bad tail is a torn write
  /// and is cut off; a bad record with valid ones after it is corruption: DATA_LOSS, nothing
  /// is changed.
  static absl::StatusOr<std::unique_ptr<CommitLog>> Open(int dir_fd, const std::string& dir,
                                                         Options options,
                                                         std::vector<CommitRecord>* records);

  /// Appends one record and makes it durable together with the data it lists (see above).
  absl::Status Append(uint32_t mapper, uint64_t attempt, absl::Span<const BlockRef> blocks);

  /// Whether a failed write or sync stopped the log (see above).
  bool broken() const;
  /// The UNAVAILABLE error a broken log answers with.
  absl::Status BrokenError() const;
  const std::string& path() const { return path_; }

 private:
  struct Pending;  // one queued Append
  CommitLog(file::Fd fd, std::string path, Options options, uint64_t end)
      : fd_(std::move(fd)), path_(std::move(path)), options_(std::move(options)), end_(end) {}
  // Syncs the batch's data, writes its records at `at` and syncs the log; no lock held.
  absl::Status WriteBatch(const std::vector<Pending*>& batch, uint64_t at,
                          const std::string& records);

  const file::Fd fd_;
  const std::string path_;
  const Options options_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  uint64_t end_ = 0;      // where the next batch is written
  bool broken_ = false;   // the latch
  bool writing_ = false;  // a batch is being written and synced
  std::vector<Pending*> queue_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMIT_LOG_H_
