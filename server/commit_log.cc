#include "server/commit_log.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/endian.h"
#include "codec/frame_format.h"
#include "codec/status_macros.h"

namespace sluice {
namespace {

constexpr char kCommitMagic[4] = {'S', 'L', 'C', 'M'};
constexpr char kLogFile[] = "commits.log";
constexpr size_t kCommitFixed = 4 + 8 + 4;  // mapper, attempt, block count
constexpr size_t kCommitBlock = 20;

}  // namespace

std::string EncodeCommitRecord(uint32_t mapper, uint64_t attempt,
                               absl::Span<const BlockRef> blocks) {
  std::string body;
  body.reserve(kCommitFixed + kCommitBlock * blocks.size() + 8);
  AppendLE32(&body, mapper);
  AppendLE64(&body, attempt);
  AppendLE32(&body, static_cast<uint32_t>(blocks.size()));
  for (const BlockRef& b : blocks) {
    AppendLE32(&body, b.partition);
    AppendLE64(&body, b.offset);
    AppendLE32(&body, b.frame_size);
    AppendLE32(&body, b.records);
  }
  AppendLE64(&body, PayloadChecksum(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  std::string record(kCommitMagic, 4);
  AppendLE32(&record, static_cast<uint32_t>(body.size()));
  record += body;
  return record;
}

size_t ParseCommitRecord(const uint8_t* p, const uint8_t* end, CommitRecord* out) {
  const auto avail = static_cast<size_t>(end - p);
  if (avail < 8 || std::memcmp(p, kCommitMagic, 4) != 0) return 0;
  const uint32_t body = LoadLE32(p + 4);
  if (body < kCommitFixed + 8 || body > avail - 8) return 0;
  const uint8_t* b = p + 8;
  if (LoadLE64(b + body - 8) != PayloadChecksum(b, body - 8)) return 0;
  const uint32_t count = LoadLE32(b + 12);
  if (static_cast<uint64_t>(count) * kCommitBlock + kCommitFixed + 8 != body) return 0;
  out->mapper = LoadLE32(b);
  out->attempt = LoadLE64(b + 4);
  out->blocks.clear();
  out->blocks.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const uint8_t* e = b + kCommitFixed + kCommitBlock * i;
    BlockRef r;
    r.partition = LoadLE32(e);
    r.offset = LoadLE64(e + 4);
    r.frame_size = LoadLE32(e + 12);
    r.records = LoadLE32(e + 16);
    out->blocks.push_back(r);
  }
  return 8 + body;
}

struct CommitLog::Pending {
  std::string record;
  absl::Span<const BlockRef> blocks;
  bool done = false;
  absl::Status result;
};

absl::StatusOr<std::unique_ptr<CommitLog>> CommitLog::Create(int dir_fd, const std::string& dir,
                                                             Options options) {
  const std::string path = absl::StrCat(dir, "/", kLogFile);
  SLUICE_ASSIGN_OR_RETURN(file::Fd fd, file::OpenAt(dir_fd, kLogFile, path));
  SLUICE_RETURN_IF_ERROR(file::Truncate(fd.get(), path, 0));
  SLUICE_RETURN_IF_ERROR(file::SyncFd(dir_fd, dir));
  return std::unique_ptr<CommitLog>(new CommitLog(std::move(fd), path, std::move(options), 0));
}

absl::StatusOr<std::unique_ptr<CommitLog>> CommitLog::Open(int dir_fd, const std::string& dir,
                                                           Options options,
                                                           std::vector<CommitRecord>* records) {
  const std::string path = absl::StrCat(dir, "/", kLogFile);
  const bool existed = file::Exists(path);
  SLUICE_ASSIGN_OR_RETURN(file::Fd fd, file::OpenAt(dir_fd, kLogFile, path));
  if (!existed && options.fsync) SLUICE_RETURN_IF_ERROR(file::SyncFd(dir_fd, dir));
  SLUICE_ASSIGN_OR_RETURN(uint64_t size, file::FileSize(fd.get(), path));
  std::string log(size, '\0');
  SLUICE_RETURN_IF_ERROR(
      file::PreadAll(fd.get(), path, 0, log.size(), reinterpret_cast<uint8_t*>(log.data())));
  const auto* base = reinterpret_cast<const uint8_t*>(log.data());
  const uint8_t* end = base + log.size();
  const uint8_t* p = base;
  records->clear();
  CommitRecord record;
  while (p < end) {
    const size_t n = ParseCommitRecord(p, end, &record);
    if (n == 0) break;
    records->push_back(std::move(record));
    p += n;
  }
  if (p < end) {
    for (const uint8_t* q = p + 1; q + 8 <= end; ++q) {
      if (ParseCommitRecord(q, end, &record) != 0) {
        return absl::DataLossError(absl::StrCat(path, " is corrupt at byte ", p - base,
                                                " and holds valid commits after it (at byte ",
                                                q - base, "); refusing to drop them"));
      }
    }
    SLUICE_RETURN_IF_ERROR(file::Truncate(fd.get(), path, static_cast<uint64_t>(p - base)));
    if (options.fsync) SLUICE_RETURN_IF_ERROR(file::SyncData(fd.get(), path));
  }
  return std::unique_ptr<CommitLog>(
      new CommitLog(std::move(fd), path, std::move(options), static_cast<uint64_t>(p - base)));
}

bool CommitLog::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

absl::Status CommitLog::BrokenError() const {
  return absl::UnavailableError(absl::StrCat(
      "shuffle ", options_.shuffle_id,
      " stopped taking commits after a failed disk write or sync; restart the server"));
}

absl::Status CommitLog::Append(uint32_t mapper, uint64_t attempt,
                               absl::Span<const BlockRef> blocks) {
  Pending me;
  me.record = EncodeCommitRecord(mapper, attempt, blocks);  // built outside the lock
  me.blocks = blocks;
  std::unique_lock<std::mutex> lock(mu_);
  queue_.push_back(&me);
  while (!me.done) {
    if (writing_) {
      cv_.wait(lock);
      continue;
    }
    // Lead a batch: every record queued so far.
    writing_ = true;
    std::vector<Pending*> batch;
    batch.swap(queue_);
    absl::Status result;
    if (broken_) {
      result = BrokenError();
    } else {
      std::string records;
      for (const Pending* c : batch) records += c->record;
      const uint64_t at = end_;
      lock.unlock();
      result = WriteBatch(batch, at, records);
      lock.lock();
      if (result.ok()) {
        end_ = at + records.size();
      } else {
        broken_ = true;
      }
    }
    for (Pending* c : batch) {
      c->result = result;
      c->done = true;
    }
    writing_ = false;
    cv_.notify_all();
  }
  return me.result;
}

absl::Status CommitLog::WriteBatch(const std::vector<Pending*>& batch, uint64_t at,
                                   const std::string& records) {
  if (options_.fsync && options_.sync_partitions) {
    std::set<uint32_t> touched;
    for (const Pending* c : batch) {
      for (const BlockRef& b : c->blocks) touched.insert(b.partition);
    }
    SLUICE_RETURN_IF_ERROR(options_.sync_partitions(touched));
  }
  const auto bytes =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(records.data()), records.size());
  absl::Status st = file::PwriteAll(fd_.get(), path_, at, bytes);
  if (st.ok() && options_.fsync) st = file::SyncData(fd_.get(), path_);
  if (!st.ok()) {
    // The records may or may not be on disk: roll the log back (the latch stays set anyway).
    (void)file::Truncate(fd_.get(), path_, at);
  }
  return st;
}

}  // namespace sluice
