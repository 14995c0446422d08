#include "server/storage/commit_log.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/endian.h"
#include "codec/frame_format.h"
#include "codec/key_bounds.h"

namespace sluice {
namespace {

constexpr char kCommitMagic[4] = {'S', 'L', 'C', 'M'};
constexpr char kPreparedMagic[4] = {'S', 'L', 'P', 'R'};
constexpr char kRepairMagic[4] = {'S', 'L', 'R', 'P'};
constexpr char kRevokeMagic[4] = {'S', 'L', 'R', 'V'};
constexpr char kMergeMagic[4] = {'S', 'L', 'M', 'G'};
constexpr char kHeaderMagic[4] = {'S', 'L', 'L', 'G'};
constexpr char kLogFile[] = "commits.log";
constexpr size_t kCommitFixed = 4 + 8 + 4;  // mapper, attempt, block count
// A block's bounds in a record when not known (no valid encoding starts with it).
constexpr char kUnknownBounds = '\xff';
// A block's bytes in a record: version 4 adds its frame's uncompressed size, so that a start
// builds the index from the log alone.
size_t BlockBytes(uint32_t version) { return version >= 4 ? 24 : 20; }
// The header: two checkpoint slots, each in its own 512-byte sector; records follow it.
constexpr uint64_t kSlotSpacing = 512;
constexpr uint64_t kRecordsStart = 2 * kSlotSpacing;
constexpr size_t kSlotSize = 40;  // magic, version, generation, floor, records, checksum

uint64_t SlotOffset(uint64_t generation) { return (generation % 2) * kSlotSpacing; }

// Parses the records from `p` on until the end or the first bad one; returns where it stopped.
const uint8_t* ParseRecords(const uint8_t* p, const uint8_t* end, uint32_t version,
                            std::vector<CommitRecord>* records) {
  CommitRecord record;
  while (p < end) {
    const size_t n = ParseCommitRecord(p, end, &record, version);
    if (n == 0) break;
    records->push_back(std::move(record));
    p += n;
  }
  return p;
}

absl::Status NothingTouched(const std::string& path, absl::string_view why) {
  return absl::DataLossError(absl::StrCat(
      path, " ", why,
      "; nothing of the shuffle is served or reclaimed (delete the shuffle to drop it)"));
}

}  // namespace

namespace {

std::string EncodeBody(uint32_t mapper, uint64_t attempt, absl::Span<const BlockRef> blocks,
                       const char magic[4], const uint32_t* partition, uint32_t version) {
  std::string body;
  body.reserve(kCommitFixed + BlockBytes(version) * blocks.size() + 8);
  AppendLE32(&body, mapper);
  AppendLE64(&body, attempt);
  AppendLE32(&body, static_cast<uint32_t>(blocks.size()));
  for (const BlockRef& b : blocks) {
    AppendLE32(&body, b.partition);
    AppendLE64(&body, b.offset);
    AppendLE32(&body, b.frame_size);
    AppendLE32(&body, b.records);
    if (version >= 4) AppendLE32(&body, b.uncompressed);
  }
  if (version >= kFirstBoundsLogVersion) {
    for (const BlockRef& b : blocks) {
      if (b.bounds.empty() || KeyBoundsSize(b.bounds) != b.bounds.size()) {
        body.push_back(kUnknownBounds);  // (never a record that would not parse back)
      } else {
        body += b.bounds;
      }
    }
  }
  if (partition != nullptr) AppendLE32(&body, *partition);
  AppendLE64(&body, PayloadChecksum(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  std::string record(magic, 4);
  AppendLE32(&record, static_cast<uint32_t>(body.size()));
  record += body;
  return record;
}

}  // namespace

std::string EncodeCommitRecord(uint32_t mapper, uint64_t attempt, absl::Span<const BlockRef> blocks,
                               bool prepared, uint32_t version) {
  return EncodeBody(mapper, attempt, blocks, prepared ? kPreparedMagic : kCommitMagic, nullptr,
                    version);
}

std::string EncodeRepairRecord(uint32_t mapper, uint64_t attempt, uint32_t partition,
                               absl::Span<const BlockRef> blocks, uint32_t version) {
  return EncodeBody(mapper, attempt, blocks, kRepairMagic, &partition, version);
}

std::string EncodeRevokeRecord(uint32_t mapper, uint64_t attempt, uint32_t version) {
  return EncodeBody(mapper, attempt, {}, kRevokeMagic, nullptr, version);
}

std::string EncodeMergeRecord(const CommitRecord& r) {
  std::string body;
  AppendLE32(&body, r.partition);
  AppendLE32(&body, r.mapper);
  AppendLE32(&body, r.last_mapper);
  AppendLE64(&body, r.attempt);
  AppendLE32(&body, r.level);
  for (uint64_t a : r.attempts) AppendLE64(&body, a);
  AppendLE32(&body, static_cast<uint32_t>(r.repaired.size()));
  for (uint32_t m : r.repaired) AppendLE32(&body, m);
  AppendLE32(&body, static_cast<uint32_t>(r.blocks.size()));
  for (const BlockRef& b : r.blocks) {
    AppendLE32(&body, b.partition);
    AppendLE64(&body, b.offset);
    AppendLE32(&body, b.frame_size);
    AppendLE32(&body, b.records);
    AppendLE32(&body, b.uncompressed);
  }
  for (const BlockRef& b : r.blocks) {
    if (b.bounds.empty() || KeyBoundsSize(b.bounds) != b.bounds.size()) {
      body.push_back(kUnknownBounds);
    } else {
      body += b.bounds;
    }
  }
  AppendLE64(&body, PayloadChecksum(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  std::string record(kMergeMagic, 4);
  AppendLE32(&record, static_cast<uint32_t>(body.size()));
  record += body;
  return record;
}

namespace {

// The body of a MERGE record at b (checksum checked), or false if it is not a whole valid one.
bool ParseMergeBody(const uint8_t* b, size_t body, CommitRecord* out) {
  size_t at = 0;
  const size_t end = body - 8;  // (the checksum)
  const auto need = [&](uint64_t n) { return n <= end - at; };
  if (!need(24)) return false;
  out->partition = LoadLE32(b);
  out->mapper = LoadLE32(b + 4);
  out->last_mapper = LoadLE32(b + 8);
  out->attempt = LoadLE64(b + 12);
  out->level = LoadLE32(b + 20);
  at = 24;
  if (out->last_mapper < out->mapper) return false;
  const uint64_t range = uint64_t{out->last_mapper} - out->mapper + 1;
  if (!need(range * 8 + 4)) return false;
  out->attempts.resize(range);
  for (uint64_t i = 0; i < range; ++i, at += 8) out->attempts[i] = LoadLE64(b + at);
  const uint32_t repaired = LoadLE32(b + at);
  at += 4;
  if (!need(uint64_t{repaired} * 4 + 4)) return false;
  out->repaired.resize(repaired);
  for (uint32_t i = 0; i < repaired; ++i, at += 4) out->repaired[i] = LoadLE32(b + at);
  const uint32_t count = LoadLE32(b + at);
  at += 4;
  if (!need(uint64_t{count} * 24)) return false;
  out->blocks.clear();
  out->blocks.reserve(count);
  for (uint32_t i = 0; i < count; ++i, at += 24) {
    BlockRef r;
    r.partition = LoadLE32(b + at);
    r.offset = LoadLE64(b + at + 4);
    r.frame_size = LoadLE32(b + at + 12);
    r.records = LoadLE32(b + at + 16);
    r.uncompressed = LoadLE32(b + at + 20);
    out->blocks.push_back(std::move(r));
  }
  std::string_view rest(reinterpret_cast<const char*>(b) + at, end - at);
  for (BlockRef& r : out->blocks) {
    if (!rest.empty() && rest[0] == kUnknownBounds) {
      rest.remove_prefix(1);
      continue;
    }
    const size_t n = KeyBoundsSize(rest);
    if (n == 0) return false;
    r.bounds.assign(rest.substr(0, n));
    rest.remove_prefix(n);
  }
  return rest.empty();
}

}  // namespace

std::string EncodeRecord(const CommitRecord& r, uint32_t version) {
  if (r.merge) return EncodeMergeRecord(r);
  if (r.revoke) return EncodeRevokeRecord(r.mapper, r.attempt, version);
  if (r.repair) return EncodeRepairRecord(r.mapper, r.attempt, r.partition, r.blocks, version);
  return EncodeCommitRecord(r.mapper, r.attempt, r.blocks, r.prepared, version);
}

size_t ParseCommitRecord(const uint8_t* p, const uint8_t* end, CommitRecord* out,
                         uint32_t version) {
  const size_t block_bytes = BlockBytes(version);
  const auto avail = static_cast<size_t>(end - p);
  if (avail < 8) return 0;
  const bool prepared = std::memcmp(p, kPreparedMagic, 4) == 0;
  const bool repair = version >= kFirstRepairLogVersion && std::memcmp(p, kRepairMagic, 4) == 0;
  const bool revoke = version >= kFirstRevokeLogVersion && std::memcmp(p, kRevokeMagic, 4) == 0;
  if (version >= kFirstMergeLogVersion && std::memcmp(p, kMergeMagic, 4) == 0) {
    const uint32_t body = LoadLE32(p + 4);
    if (body < 8 || body > avail - 8) return 0;
    const uint8_t* b = p + 8;
    if (LoadLE64(b + body - 8) != PayloadChecksum(b, body - 8)) return 0;
    *out = CommitRecord{};
    out->merge = true;
    return ParseMergeBody(b, body, out) ? 8 + body : 0;
  }
  if (!prepared && !repair && !revoke && std::memcmp(p, kCommitMagic, 4) != 0) return 0;
  const size_t extra = repair ? 4 : 0;  // the partition
  const uint32_t body = LoadLE32(p + 4);
  if (body < kCommitFixed + extra + 8 || body > avail - 8) return 0;
  const uint8_t* b = p + 8;
  if (LoadLE64(b + body - 8) != PayloadChecksum(b, body - 8)) return 0;
  const uint32_t count = LoadLE32(b + 12);
  const uint64_t fixed = static_cast<uint64_t>(count) * block_bytes + kCommitFixed + extra + 8;
  const bool bounds = version >= kFirstBoundsLogVersion;
  if (bounds ? fixed > body : fixed != body) return 0;
  if (revoke && count != 0) return 0;
  out->mapper = LoadLE32(b);
  out->attempt = LoadLE64(b + 4);
  out->prepared = prepared;
  out->repair = repair;
  out->revoke = revoke;
  out->merge = false;
  out->partition = repair ? LoadLE32(b + body - 12) : 0;
  out->blocks.clear();
  out->blocks.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const uint8_t* e = b + kCommitFixed + block_bytes * i;
    BlockRef r;
    r.partition = LoadLE32(e);
    r.offset = LoadLE64(e + 4);
    r.frame_size = LoadLE32(e + 12);
    r.records = LoadLE32(e + 16);
    if (version >= 4) r.uncompressed = LoadLE32(e + 20);
    out->blocks.push_back(std::move(r));
  }
  if (bounds) {  // each block's, back to back, filling the body exactly
    std::string_view rest(reinterpret_cast<const char*>(b) + kCommitFixed + block_bytes * count,
                          body - fixed);
    for (BlockRef& r : out->blocks) {
      if (!rest.empty() && rest[0] == kUnknownBounds) {
        rest.remove_prefix(1);
        continue;
      }
      const size_t n = KeyBoundsSize(rest);
      if (n == 0) return 0;
      r.bounds.assign(rest.substr(0, n));
      rest.remove_prefix(n);
    }
    if (!rest.empty()) return 0;
  }
  return 8 + body;
}

struct CommitLog::Pending {
  std::string record;  // one or more encoded records
  uint64_t count = 1;  // how many
  bool done = false;
  absl::Status result;
};

std::string CommitLog::EncodeCheckpoint(const Checkpoint& c) {
  std::string slot(kHeaderMagic, 4);
  AppendLE32(&slot, c.version);
  AppendLE64(&slot, c.generation);
  AppendLE64(&slot, c.floor);
  AppendLE64(&slot, c.records);
  AppendLE64(&slot, PayloadChecksum(reinterpret_cast<const uint8_t*>(slot.data()), slot.size()));
  return slot;
}

bool CommitLog::ParseCheckpoint(const uint8_t* p, Checkpoint* out) {
  const uint32_t version = LoadLE32(p + 4);
  if (std::memcmp(p, kHeaderMagic, 4) != 0 || version < kOldestLogVersion ||
      version > kLogVersion || LoadLE64(p + 32) != PayloadChecksum(p, 32)) {
    return false;
  }
  out->version = version;
  out->generation = LoadLE64(p + 8);
  out->floor = LoadLE64(p + 16);
  out->records = LoadLE64(p + 24);
  return out->floor >= kRecordsStart;
}

absl::StatusOr<std::unique_ptr<CommitLog>> CommitLog::Create(int dir_fd, const std::string& dir,
                                                             Options options) {
  const std::string path = absl::StrCat(dir, "/", kLogFile);
  SLUICE_ASSIGN_OR_RETURN(file::Fd fd, file::OpenAt(dir_fd, kLogFile, path));
  SLUICE_RETURN_IF_ERROR(file::Truncate(fd.get(), path, 0));
  if (options.version < kOldestLogVersion || options.version > kLogVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("commit log version ", options.version, " is not one this server writes"));
  }
  const Checkpoint first{1, kRecordsStart, 0, options.version};
  std::string header(kRecordsStart, '\0');
  header.replace(SlotOffset(first.generation), kSlotSize, EncodeCheckpoint(first));
  SLUICE_RETURN_IF_ERROR(file::PwriteAll(
      fd.get(), path, 0,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(header.data()), header.size())));
  if (options.fsync) SLUICE_RETURN_IF_ERROR(file::SyncData(fd.get(), path));
  SLUICE_RETURN_IF_ERROR(file::SyncFd(dir_fd, dir));
  return std::unique_ptr<CommitLog>(
      new CommitLog(std::move(fd), path, std::move(options), first, kRecordsStart, 0));
}

absl::StatusOr<std::unique_ptr<CommitLog>> CommitLog::Open(int dir_fd, const std::string& dir,
                                                           Options options, bool has_data,
                                                           std::vector<CommitRecord>* records) {
  records->clear();
  const std::string path = absl::StrCat(dir, "/", kLogFile);
  if (!file::ExistsAt(dir_fd, kLogFile)) {
    if (!has_data) return Create(dir_fd, dir, std::move(options));
    return NothingTouched(path,
                          "is missing while the shuffle has data: which of its blocks "
                          "are committed cannot be known");
  }
  SLUICE_ASSIGN_OR_RETURN(file::Fd fd, file::OpenAt(dir_fd, kLogFile, path));
  SLUICE_ASSIGN_OR_RETURN(uint64_t size, file::FileSize(fd.get(), path));
  std::string log(size, '\0');
  SLUICE_RETURN_IF_ERROR(
      file::PreadAll(fd.get(), path, 0, log.size(), reinterpret_cast<uint8_t*>(log.data())));
  const auto* base = reinterpret_cast<const uint8_t*>(log.data());

  // The header: the newer of the two valid slots.
  Checkpoint durable;
  bool found = false;
  for (uint64_t slot = 0; size >= kRecordsStart && slot < 2; ++slot) {
    Checkpoint c;
    if (ParseCheckpoint(base + slot * kSlotSpacing, &c) &&
        SlotOffset(c.generation) == slot * kSlotSpacing &&
        (!found || c.generation > durable.generation)) {
      durable = c;
      found = true;
    }
  }
  if (!found) {
    if (!has_data) return Create(dir_fd, dir, std::move(options));
    return NothingTouched(
        path, absl::StrCat(size == 0 ? "is empty" : "has no valid header",
                           " while the shuffle has data: its commits were lost (emptied or "
                           "overwritten?)"));
  }

  const uint8_t* end = base + size;
  const uint8_t* p = ParseRecords(base + kRecordsStart, end, durable.version, records);
  const auto valid_end = static_cast<uint64_t>(p - base);
  if (valid_end < durable.floor) {
    const std::string how = p == end ? absl::StrCat("the file ends at byte ", valid_end)
                                     : absl::StrCat("it is corrupt at byte ", valid_end,
                                                    " (refusing to drop what follows)");
    return NothingTouched(path,
                          absl::StrCat("had ", durable.records, " records (", durable.floor,
                                       " bytes) made durable but ", how, " after ", records->size(),
                                       ": acknowledged commits are missing"));
  }
  const uint64_t count = records->size();
  if (p < end) {  // a torn, never acknowledged batch: cut it off
    SLUICE_RETURN_IF_ERROR(file::Truncate(fd.get(), path, valid_end));
    if (options.fsync) SLUICE_RETURN_IF_ERROR(file::SyncData(fd.get(), path));
  }
  std::unique_ptr<CommitLog> out(
      new CommitLog(std::move(fd), path, std::move(options), durable, valid_end, count));
  if (durable.floor < valid_end) {  // what recovery serves from now on is protected too
    const Checkpoint raised{durable.generation + 1, valid_end, count, durable.version};
    SLUICE_RETURN_IF_ERROR(out->WriteCheckpoint(raised));
    if (out->options_.fsync) SLUICE_RETURN_IF_ERROR(file::SyncData(out->fd_.get(), path));
    out->durable_ = raised;
  }
  return out;
}

absl::Status CommitLog::WriteCheckpoint(const Checkpoint& c) {
  const std::string slot = EncodeCheckpoint(c);
  return file::PwriteAll(
      fd_.get(), path_, SlotOffset(c.generation),
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(slot.data()), slot.size()));
}

bool CommitLog::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

absl::Status CommitLog::BrokenError() const {
  return absl::UnavailableError(absl::StrCat(
      "shuffle '", options_.shuffle_name,
      "' stopped taking commits after a failed disk write or sync; it re-verifies itself and "
      "takes pushes again once its running pushes have ended: retry the attempt"));
}

absl::Status CommitLog::Append(uint32_t mapper, uint64_t attempt, absl::Span<const BlockRef> blocks,
                               bool prepared) {
  Pending me;
  me.record = EncodeCommitRecord(mapper, attempt, blocks, prepared, version());  // outside the lock
  return Write(me);
}

absl::Status CommitLog::AppendRepair(uint32_t mapper, uint64_t attempt, uint32_t partition,
                                     absl::Span<const BlockRef> blocks) {
  Pending me;
  me.record = EncodeRepairRecord(mapper, attempt, partition, blocks, version());
  return Write(me);
}

absl::Status CommitLog::AppendAll(absl::Span<const CommitRecord> records) {
  if (records.empty()) return absl::OkStatus();
  Pending me;
  for (const CommitRecord& r : records) {
    me.record += EncodeRecord(r, version());
  }
  me.count = records.size();
  return Write(me);
}

absl::Status CommitLog::Write(Pending& me) {
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
      Checkpoint raise;  // generation 0: the floor is already at `at`
      if (durable_.floor < at) {
        raise = Checkpoint{durable_.generation + 1, at, records_, durable_.version};
      }
      lock.unlock();
      const auto started = std::chrono::steady_clock::now();
      result = WriteBatch(at, records, raise);
      if (options_.observe_batch) {
        options_.observe_batch(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      }
      lock.lock();
      if (result.ok()) {
        end_ = at + records.size();
        for (const Pending* c : batch) records_ += c->count;
        if (raise.generation != 0) durable_ = raise;
      } else {
        broken_ = true;
      }
    }
    for (Pending* c : batch) {
      c->result = result;
      c->done = true;
    }
    cv_.notify_all();
    if (queue_.empty() && !broken_ && durable_.floor < end_) {
      // Nobody is waiting: raise the floor over this batch now rather than with the next one,
      // so that an idle log's floor covers every record (the batch is acknowledged already).
      const Checkpoint raise{durable_.generation + 1, end_, records_, durable_.version};
      lock.unlock();
      absl::Status st = WriteCheckpoint(raise);
      if (st.ok() && options_.fsync) st = file::SyncData(fd_.get(), path_);
      lock.lock();
      if (st.ok()) {
        durable_ = raise;
      } else {
        broken_ = true;
      }
    }
    writing_ = false;
    cv_.notify_all();
  }
  return me.result;
}

absl::Status CommitLog::WriteBatch(uint64_t at, const std::string& records,
                                   const Checkpoint& checkpoint) {
  if (options_.fsync && options_.sync_data) SLUICE_RETURN_IF_ERROR(options_.sync_data());
  const auto bytes =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(records.data()), records.size());
  absl::Status st = file::PwriteAll(fd_.get(), path_, at, bytes);
  if (st.ok() && checkpoint.generation != 0) st = WriteCheckpoint(checkpoint);
  if (st.ok() && options_.fsync) st = file::SyncData(fd_.get(), path_);
  if (!st.ok()) {
    // The records may or may not be on disk: roll the log back (the latch stays set anyway).
    (void)file::Truncate(fd_.get(), path_, at);
  }
  return st;
}

}  // namespace sluice
