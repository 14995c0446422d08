#include "server/storage/shuffle_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/endian.h"
#include "codec/key_bounds.h"
#include "server/storage/shuffle_id.h"

namespace sluice {

ShuffleStore::PartitionTable::PartitionTable(uint32_t count)
    : chunks_((count + kChunk - 1) / kChunk) {}

ShuffleStore::PartitionTable::~PartitionTable() {
  for (auto& c : chunks_) {
    Chunk* chunk = c.load();
    if (chunk == nullptr) continue;
    for (auto& slot : chunk->slots) delete slot.load();
    delete chunk;
  }
}

ShuffleStore::Partition* ShuffleStore::PartitionTable::Find(uint32_t i) const {
  if (i / kChunk >= chunks_.size()) return nullptr;
  Chunk* chunk = chunks_[i / kChunk].load(std::memory_order_acquire);
  return chunk == nullptr ? nullptr : chunk->slots[i % kChunk].load(std::memory_order_acquire);
}

ShuffleStore::Partition& ShuffleStore::PartitionTable::Get(uint32_t i) {
  if (Partition* p = Find(i)) return *p;
  std::lock_guard<std::mutex> lock(make_mu_);
  Chunk* chunk = chunks_[i / kChunk].load(std::memory_order_acquire);
  if (chunk == nullptr) {
    chunk = new Chunk();
    chunks_[i / kChunk].store(chunk, std::memory_order_release);
  }
  Partition* p = chunk->slots[i % kChunk].load(std::memory_order_acquire);
  if (p == nullptr) {
    p = new Partition();
    chunk->slots[i % kChunk].store(p, std::memory_order_release);
    made_.fetch_add(1);
  }
  return *p;
}

namespace {
uint64_t NextInstance() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}
}  // namespace

ShuffleStore::ShuffleStore(std::string dir, std::string shown, ShuffleParams params,
                           StoreOptions options)
    : dir_(std::move(dir)),
      shown_dir_(std::move(shown)),
      data_name_(absl::StrCat(shown_dir_, "/", kDataFile)),
      params_(std::move(params)),
      options_(std::move(options)),
      instance_(NextInstance()),
      partitions_(params_.num_partitions) {
  Touch();
}

ShuffleStore::~ShuffleStore() {
  ReleaseHeld();
  AddIndexBytes(-static_cast<int64_t>(index_bytes_.load()));
}

void ShuffleStore::ReleaseHeld() {
  const int64_t h = held_.exchange(0);
  if (options_.held_total != nullptr) options_.held_total->fetch_sub(h);
}

void ShuffleStore::Hold(int64_t delta) {
  if (delta == 0) return;
  held_.fetch_add(delta);
  if (options_.held_total != nullptr) options_.held_total->fetch_add(delta);
}

absl::Status ShuffleStore::DeletedError() const {
  return absl::NotFoundError(
      absl::StrCat("shuffle '", ShuffleName(params_.shuffle_id), "' was deleted"));
}

CommitLog::Options ShuffleStore::LogOptions() {
  CommitLog::Options o;
  o.fsync = options_.fsync;
  o.version = options_.log_version;
  o.shuffle_name = std::string(ShuffleName(params_.shuffle_id));
  o.sync_data = [this] { return SyncDataFile(); };
  if (Histogram* h = options_.commit_sync_seconds; h != nullptr) {
    o.observe_batch = [h](double s) { h->Observe(s); };
  }
  return o;
}

absl::Status ShuffleStore::SyncDataFile() {
  const int fd = data_fd_.get();
  return options_.sync_data ? options_.sync_data(fd, DataName()) : file::SyncData(fd, DataName());
}

absl::StatusOr<std::unique_ptr<ShuffleStore>> ShuffleStore::Create(const std::string& dir,
                                                                   const std::string& shown,
                                                                   const ShuffleParams& params,
                                                                   const StoreOptions& options,
                                                                   const EvictedSummary* evicted) {
  if (params.num_partitions == 0 || params.num_partitions > kMaxPartitions) {
    return absl::InvalidArgumentError(absl::StrCat("a shuffle has 1 to ", kMaxPartitions,
                                                   " partitions, not ", params.num_partitions));
  }
  if (file::Exists(absl::StrCat(dir, "/", kParamsFile))) {
    return absl::AlreadyExistsError(absl::StrCat("shuffle directory ", shown, " already exists"));
  }
  SLUICE_RETURN_IF_ERROR(file::MakeDirs(dir, shown));
  // (Before the parameters: a directory with them is an evicted shuffle's whole, or another.)
  if (evicted != nullptr) {
    SLUICE_RETURN_IF_ERROR(
        file::WriteFileAtomically(dir, kEvictedFile, Bytes(EncodeEvicted(*evicted)), shown));
  }
  SLUICE_RETURN_IF_ERROR(
      file::WriteFileAtomically(dir, kParamsFile, Bytes(EncodeParams(params)), shown));
  // The new directory's own entry in its parent must be durable too.
  const std::string parent = dir.substr(0, dir.find_last_of('/'));
  if (!parent.empty() && parent != dir) {
    SLUICE_RETURN_IF_ERROR(file::SyncDir(parent, shown.substr(0, shown.find_last_of('/'))));
  }
  std::unique_ptr<ShuffleStore> store(new ShuffleStore(dir, shown, params, options));
  if (evicted != nullptr) store->evicted_ = *evicted;
  SLUICE_ASSIGN_OR_RETURN(file::Fd dir_fd, file::OpenDirectory(dir, shown));
  SLUICE_ASSIGN_OR_RETURN(store->data_fd_,
                          file::OpenAt(dir_fd.get(), kDataFile, store->DataName()));
  // (CommitLog::Create syncs the directory, the data file's entry with the log's.)
  SLUICE_ASSIGN_OR_RETURN(store->log_, CommitLog::Create(dir_fd.get(), shown, store->LogOptions()));
  return store;
}

absl::StatusOr<BlockRef> ShuffleStore::Append(uint32_t mapper, uint64_t attempt, uint32_t partition,
                                              absl::Span<const uint8_t> frame, uint32_t records) {
  std::vector<BlockRef> blocks;
  const FrameToAppend one{partition, frame, records, {}};
  SLUICE_RETURN_IF_ERROR(AppendAll(mapper, attempt, absl::MakeConstSpan(&one, 1), &blocks));
  return blocks.front();
}

absl::Status ShuffleStore::AppendAll(uint32_t mapper, uint64_t attempt,
                                     absl::Span<const FrameToAppend> frames,
                                     std::vector<BlockRef>* blocks) {
  if (params_.num_mappers != 0 && mapper >= params_.num_mappers) {
    return absl::InvalidArgumentError(
        absl::StrCat("mapper ", mapper, " is out of range [0, ", params_.num_mappers, ")"));
  }
  if (mapper == kMergedMapper) {
    return absl::InvalidArgumentError(
        absl::StrCat("mapper id ", mapper, " is reserved (the server's pre-merged runs)"));
  }
  return AppendFrames(mapper, attempt, frames, blocks, /*held=*/true);
}

absl::Status ShuffleStore::AppendFrames(uint32_t mapper, uint64_t attempt,
                                        absl::Span<const FrameToAppend> frames,
                                        std::vector<BlockRef>* blocks, bool held) {
  if (destroyed_.load()) return DeletedError();
  // The blocks, with offsets from the start of this write until the range is reserved.
  const size_t first = blocks->size();
  uint64_t total = 0;
  for (const FrameToAppend& f : frames) {
    absl::StatusOr<FrameHeader> h =
        f.partition < params_.num_partitions
            ? ParseFrameHeader(f.frame, options_.limits)
            : absl::InvalidArgumentError(absl::StrCat(
                  "partition ", f.partition, " is out of range [0, ", params_.num_partitions, ")"));
    if (h.ok() && h->frame_size() != f.frame.size()) {
      h = absl::InvalidArgumentError("Append takes exactly one whole frame");
    }
    if (!h.ok()) {
      blocks->resize(first);
      return h.status();
    }
    const auto size = static_cast<uint32_t>(f.frame.size());
    blocks->push_back(BlockRef{
        f.partition, size, total, f.records, h->uncompressed_size,
        log_->version() >= kFirstBoundsLogVersion ? std::string(f.bounds) : std::string()});
    total += kBlockHeaderSize + size;
  }
  if (frames.empty()) return absl::OkStatus();
  uint64_t at = 0;
  {
    std::lock_guard<std::mutex> lock(data_mu_);
    at = data_end_;  // reserve the range; the write itself runs outside the lock
    data_end_ += total;
  }
  // Headers and frames go out with one pwritev (per IOV_MAX pieces).
  std::vector<uint8_t> headers(kBlockHeaderSize * frames.size());
  std::vector<absl::Span<const uint8_t>> pieces;
  pieces.reserve(2 * frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    BlockRef& b = (*blocks)[first + i];
    b.offset += at;
    uint8_t* h = headers.data() + i * kBlockHeaderSize;
    WriteBlockHeader(b.partition, mapper, attempt, b.frame_size, b.records, h);
    pieces.emplace_back(h, kBlockHeaderSize);
    pieces.push_back(frames[i].frame);
  }
  absl::Status st = file::PwritevAll(data_fd_.get(), DataName(), at, pieces);
  if (!st.ok()) {
    (void)file::PunchHole(data_fd_.get(), DataName(), at, total);
    blocks->resize(first);
    return st;
  }
#ifdef __linux__
  if (options_.fsync) {
    // Start writing the blocks to disk now, without waiting: by the time the attempt commits,
    // its fdatasync finds little left to write, so disk time overlaps the push instead of
    // stalling the commit. Best effort: the commit's fdatasync is what guarantees durability
    // and reports errors.
    (void)::sync_file_range(data_fd_.get(), static_cast<off64_t>(at), static_cast<off64_t>(total),
                            SYNC_FILE_RANGE_WRITE);
  }
#endif
  if (held) Hold(static_cast<int64_t>(total));
  return absl::OkStatus();
}

absl::Status ShuffleStore::ClaimMapperLocked(std::unique_lock<std::mutex>& lock, uint32_t mapper) {
  // Another outcome of this mapper on its way: it decides what ours is.
  commit_cv_.wait(lock, [&] { return inflight_mappers_.count(mapper) == 0; });
  if (destroyed_.load()) return DeletedError();
  if (log_->broken()) return log_->BrokenError();
  inflight_mappers_.insert(mapper);
  return absl::OkStatus();
}

absl::Status ShuffleStore::WaitForNoneInflightLocked(
    std::unique_lock<std::mutex>& lock, absl::Span<const std::pair<uint32_t, uint64_t>> pairs) {
  // All of them claimed at once afterwards, never some held while waiting for others: no
  // deadlock between two callers.
  commit_cv_.wait(lock, [&] {
    return std::none_of(pairs.begin(), pairs.end(),
                        [&](const auto& p) { return inflight_mappers_.count(p.first) != 0; });
  });
  return destroyed_.load() ? DeletedError() : absl::OkStatus();
}

absl::StatusOr<CommitOutcome> ShuffleStore::Commit(uint32_t mapper, uint64_t attempt,
                                                   absl::Span<const BlockRef> blocks) {
  {
    std::unique_lock<std::mutex> lock(commit_mu_);
    commit_cv_.wait(lock, [&] { return inflight_mappers_.count(mapper) == 0; });
    if (destroyed_.load()) return DeletedError();
    if (committed_.count(mapper) != 0) return CommitOutcome::kDuplicate;
    SLUICE_RETURN_IF_ERROR(ClaimMapperLocked(lock, mapper));
  }
  // Durable once Append returns OK (it syncs the data first); visible once recorded below.
  // (On a server of its own a caller may mix both ways: prepared attempts of the mapper lost.)
  SLUICE_RETURN_IF_ERROR(
      Recorded(mapper, attempt, blocks, log_->Append(mapper, attempt, blocks), std::nullopt));
  return CommitOutcome::kCommitted;
}

absl::Status ShuffleStore::Recorded(uint32_t mapper, uint64_t attempt,
                                    absl::Span<const BlockRef> blocks, const absl::Status& written,
                                    std::optional<uint32_t> repaired) {
  std::vector<BlockRef> losers;
  {
    std::lock_guard<std::mutex> lock(commit_mu_);
    inflight_mappers_.erase(mapper);
    commit_cv_.notify_all();
    if (!written.ok()) return written;
    if (destroyed_.load()) return DeletedError();
    AddCommitLocked(mapper, attempt, blocks);
    if (repaired.has_value()) {
      repaired_[*repaired].insert(mapper);
      // A pre-merged run of the partition over the mapper lacks what the repair brought.
      if (Partition* p = partitions_.Find(*repaired); p != nullptr) {
        RetireMergedLocked(*p, mapper, mapper);
      }
    }
    DropPreparedLocked(mapper, attempt, &losers);
  }
  PunchBlocks(losers);
  return absl::OkStatus();
}

absl::Status ShuffleStore::Repair(uint32_t mapper, uint64_t attempt, uint32_t partition,
                                  absl::Span<const BlockRef> blocks) {
  const std::string what = absl::StrCat("partition ", partition, " of mapper ", mapper,
                                        " of shuffle '", ShuffleName(params_.shuffle_id), "'");
  if (partition >= params_.num_partitions ||
      std::any_of(blocks.begin(), blocks.end(),
                  [&](const BlockRef& b) { return b.partition != partition; })) {
    return absl::InvalidArgumentError(absl::StrCat("a repair of ", what, " lists other blocks"));
  }
  {
    std::unique_lock<std::mutex> lock(commit_mu_);
    SLUICE_RETURN_IF_ERROR(ClaimMapperLocked(lock, mapper));
    absl::Status refused;
    if (log_->version() < kFirstRepairLogVersion) {
      refused = absl::FailedPreconditionError(
          absl::StrCat("the commit log of shuffle '", ShuffleName(params_.shuffle_id),
                       "' is version ", log_->version(), ", older than repairs (5)"));
    } else if (revoked_.count({mapper, attempt}) != 0) {
      refused = absl::FailedPreconditionError(absl::StrCat("a repair of ", what, " with attempt ",
                                                           attempt, ": its decision was revoked"));
    } else if (auto c = committed_.find(mapper); c != committed_.end() && c->second != attempt) {
      refused = absl::FailedPreconditionError(absl::StrCat("a repair of ", what, " with attempt ",
                                                           attempt, ": attempt ", c->second,
                                                           " is committed here"));
    } else if (repaired_.count(partition) != 0 && repaired_[partition].count(mapper) != 0) {
      refused = absl::AlreadyExistsError(absl::StrCat(what, " is repaired already"));
    }
    if (!refused.ok()) {
      inflight_mappers_.erase(mapper);
      commit_cv_.notify_all();
      return refused;
    }
  }
  // Durable once written (the data synced first); visible once recorded.
  return Recorded(mapper, attempt, blocks, log_->AppendRepair(mapper, attempt, partition, blocks),
                  partition);
}

absl::Status ShuffleStore::Revoke(uint32_t mapper, uint64_t attempt) {
  const std::pair<uint32_t, uint64_t> one(mapper, attempt);
  return RevokeAll(absl::MakeConstSpan(&one, 1));
}

absl::Status ShuffleStore::RevokeAll(absl::Span<const std::pair<uint32_t, uint64_t>> revoked) {
  std::vector<CommitRecord> records;
  {
    std::unique_lock<std::mutex> lock(commit_mu_);
    if (log_->version() < kFirstRevokeLogVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("the commit log of shuffle '", ShuffleName(params_.shuffle_id),
                       "' is version ", log_->version(), ", older than revocations (",
                       kFirstRevokeLogVersion, "): its decisions cannot be revoked here"));
    }
    SLUICE_RETURN_IF_ERROR(WaitForNoneInflightLocked(lock, revoked));
    for (const auto& [mapper, attempt] : revoked) {
      if (revoked_.count({mapper, attempt}) != 0) continue;  // (applied before)
      if (log_->broken()) return log_->BrokenError();
      if (!inflight_mappers_.insert(mapper).second) continue;  // named twice
      CommitRecord r;
      r.mapper = mapper;
      r.attempt = attempt;
      r.revoke = true;
      records.push_back(std::move(r));
    }
  }
  if (records.empty()) return absl::OkStatus();
  const absl::Status written = log_->AppendAll(records);  // one write, one sync
  std::vector<BlockRef> dropped;
  {
    std::lock_guard<std::mutex> lock(commit_mu_);
    for (const CommitRecord& r : records) inflight_mappers_.erase(r.mapper);
    commit_cv_.notify_all();
    if (!written.ok()) return written;
    if (destroyed_.load()) return DeletedError();
    std::set<uint32_t> hidden;  // mappers whose commit here was a revoked attempt
    for (const CommitRecord& r : records) {
      revoked_.emplace(r.mapper, r.attempt);
      if (auto c = committed_.find(r.mapper); c != committed_.end() && c->second == r.attempt) {
        committed_.erase(c);
        hidden.insert(r.mapper);
      }
      // A prepared copy of the attempt (not resolved here yet) never will be.
      if (auto m = prepared_.find(r.mapper); m != prepared_.end()) {
        if (auto a = m->second.find(r.attempt); a != m->second.end()) {
          dropped.insert(dropped.end(), a->second.begin(), a->second.end());
          m->second.erase(a);
          if (m->second.empty()) prepared_.erase(m);
        }
      }
    }
    if (!hidden.empty()) {
      // Out of every partition's index (repaired ones too), in one pass. The bytes stay until
      // the next open: a fetch begun before may still read them (its blocks were taken in one
      // instant).
      partitions_.ForEach([&](uint32_t, Partition& p) {
        for (uint32_t m : hidden) {
          if (!p.merged.empty()) RetireMergedLocked(p, m, m);  // (their readers finish first)
        }
        auto gone = std::remove_if(p.index.begin(), p.index.end(), [&](const IndexEntry& e) {
          return hidden.count(e.mapper) != 0;
        });
        if (gone == p.index.end()) return;  // (nothing of theirs here)
        for (auto e = gone; e != p.index.end(); ++e) {
          p.stats.records -= e->records;
          p.stats.bytes -= e->frame_size;
          p.stats.frames -= 1;
        }
        p.index.erase(gone, p.index.end());
        // The sketch again from the frames left (space-saving cannot take counts away).
        p.hot.clear();
        for (const IndexEntry& e : p.index) {
          if (e.bounds_at != kNoBounds) AddHotKey(p, BoundsOf(p, e));
        }
      });
      for (auto& [partition, mappers] : repaired_) {
        for (uint32_t m : hidden) mappers.erase(m);
      }
    }
  }
  PunchBlocks(dropped);  // never visible: no reader has them
  return absl::OkStatus();
}

bool ShuffleStore::IsRevoked(uint32_t mapper, uint64_t attempt) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  return revoked_.count({mapper, attempt}) != 0;
}

std::vector<uint32_t> ShuffleStore::RepairedMappers(uint32_t partition) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  auto it = repaired_.find(partition);
  if (it == repaired_.end()) return {};
  return std::vector<uint32_t>(it->second.begin(), it->second.end());
}

void ShuffleStore::DropPreparedLocked(uint32_t mapper, uint64_t winner,
                                      std::vector<BlockRef>* losers) {
  auto m = prepared_.find(mapper);
  if (m == prepared_.end()) return;
  for (const auto& [attempt, blocks] : m->second) {
    if (attempt != winner) losers->insert(losers->end(), blocks.begin(), blocks.end());
  }
  prepared_.erase(m);
}

absl::StatusOr<CommitOutcome> ShuffleStore::Prepare(uint32_t mapper, uint64_t attempt,
                                                    absl::Span<const BlockRef> blocks) {
  {
    std::unique_lock<std::mutex> lock(commit_mu_);
    SLUICE_RETURN_IF_ERROR(ClaimMapperLocked(lock, mapper));
    absl::Status refused;
    if (auto c = committed_.find(mapper); c != committed_.end() && c->second == attempt) {
      refused = absl::AlreadyExistsError(
          absl::StrCat("attempt ", attempt, " of mapper ", mapper, " is committed already"));
    } else if (revoked_.count({mapper, attempt}) != 0) {
      refused = absl::AlreadyExistsError(absl::StrCat(
          "attempt ", attempt, " of mapper ", mapper,
          " was committed and its decision revoked; push a retry with a new attempt id"));
    } else if (IsPreparedLocked(mapper, attempt)) {
      refused = absl::AlreadyExistsError(
          absl::StrCat("attempt ", attempt, " of mapper ", mapper,
                       " is prepared already; push a retry with a new attempt id"));
    }
    const bool decided = committed_.count(mapper) != 0;
    if (!refused.ok() || decided) {
      inflight_mappers_.erase(mapper);
      commit_cv_.notify_all();
      if (!refused.ok()) return refused;
      return CommitOutcome::kDuplicate;
    }
  }
  // Durable once Append returns OK; visible only once Resolve commits it.
  const absl::Status written = log_->Append(mapper, attempt, blocks, /*prepared=*/true);
  std::lock_guard<std::mutex> lock(commit_mu_);
  inflight_mappers_.erase(mapper);
  commit_cv_.notify_all();
  if (!written.ok()) return written;
  if (destroyed_.load()) return DeletedError();
  prepared_[mapper][attempt].assign(blocks.begin(), blocks.end());
  return CommitOutcome::kCommitted;
}

absl::StatusOr<CommitOutcome> ShuffleStore::Resolve(uint32_t mapper, uint64_t attempt) {
  {
    std::unique_lock<std::mutex> lock(commit_mu_);
    commit_cv_.wait(lock, [&] { return inflight_mappers_.count(mapper) == 0; });
    if (destroyed_.load()) return DeletedError();
    if (auto c = committed_.find(mapper); c != committed_.end()) {
      return c->second == attempt ? CommitOutcome::kCommitted : CommitOutcome::kDuplicate;
    }
    if (!IsPreparedLocked(mapper, attempt)) {
      return absl::FailedPreconditionError(
          absl::StrCat("attempt ", attempt, " of mapper ", mapper, " of shuffle '",
                       ShuffleName(params_.shuffle_id), "'", " is not prepared on this server"));
    }
  }
  const std::pair<uint32_t, uint64_t> winner(mapper, attempt);
  SLUICE_RETURN_IF_ERROR(ResolveAll(absl::MakeConstSpan(&winner, 1)));
  return Resolve(mapper, attempt);  // what it is now (a concurrent resolve may have come first)
}

absl::Status ShuffleStore::ResolveAll(absl::Span<const std::pair<uint32_t, uint64_t>> winners) {
  std::vector<CommitRecord> records;
  {
    std::unique_lock<std::mutex> lock(commit_mu_);
    SLUICE_RETURN_IF_ERROR(WaitForNoneInflightLocked(lock, winners));
    const bool broken = log_->broken();  // (nothing to write is no error even then)
    for (const auto& [mapper, attempt] : winners) {
      if (committed_.count(mapper) != 0 || !IsPreparedLocked(mapper, attempt)) continue;
      if (broken) return log_->BrokenError();
      if (!inflight_mappers_.insert(mapper).second) continue;  // named twice
      CommitRecord r;
      r.mapper = mapper;
      r.attempt = attempt;
      r.blocks = prepared_[mapper][attempt];
      records.push_back(std::move(r));
    }
  }
  if (records.empty()) return absl::OkStatus();
  // The blocks are durable since their prepare: these records make them visible.
  const absl::Status written = log_->AppendAll(records);
  std::vector<BlockRef> losers;
  {
    std::lock_guard<std::mutex> lock(commit_mu_);
    for (const CommitRecord& r : records) inflight_mappers_.erase(r.mapper);
    commit_cv_.notify_all();
    if (!written.ok()) return written;
    if (destroyed_.load()) return DeletedError();
    for (const CommitRecord& r : records) {
      AddCommitLocked(r.mapper, r.attempt, r.blocks);
      DropPreparedLocked(r.mapper, r.attempt, &losers);
    }
  }
  PunchBlocks(losers);
  return absl::OkStatus();
}

std::optional<uint64_t> ShuffleStore::CommittedAttempt(uint32_t mapper) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  auto c = committed_.find(mapper);
  if (c == committed_.end()) return std::nullopt;
  return c->second;
}

bool ShuffleStore::IsPreparedLocked(uint32_t mapper, uint64_t attempt) const {
  auto m = prepared_.find(mapper);
  return m != prepared_.end() && m->second.count(attempt) != 0;
}

bool ShuffleStore::IsPrepared(uint32_t mapper, uint64_t attempt) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  return IsPreparedLocked(mapper, attempt);
}

std::vector<uint32_t> ShuffleStore::PendingMappers() const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  std::vector<uint32_t> out;
  out.reserve(prepared_.size());
  for (const auto& [mapper, attempts] : prepared_) out.push_back(mapper);
  return out;
}

bool ShuffleStore::MarkDamaged(uint32_t partition, const absl::Status& why,
                               const char* found_by) const {
  {
    std::lock_guard<std::mutex> lock(commit_mu_);
    if (destroyed_.load() || !damaged_.emplace(partition, why).second) return false;
  }
  if (options_.on_damaged) options_.on_damaged(params_.shuffle_id, partition, why, found_by);
  return true;
}

absl::Status ShuffleStore::PartitionDamage(uint32_t partition) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  auto it = damaged_.find(partition);
  if (it == damaged_.end()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("partition ", partition, " of shuffle '",
                                          ShuffleName(params_.shuffle_id),
                                          "' is damaged on this server: ", it->second.message()));
}

std::map<uint32_t, absl::Status> ShuffleStore::DamagedPartitions() const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  return damaged_;
}

ShuffleStore::ScrubStep ShuffleStore::ScrubNext(ScrubCursor* cursor, uint64_t max_bytes,
                                                std::string* buffer) {
  ScrubStep step;
  while (!step.done && (step.bytes == 0 || step.bytes < max_bytes)) {
    if (cursor->next >= cursor->blocks.size()) {
      // The next partition with committed blocks and no damage found yet.
      cursor->blocks.clear();
      cursor->runs.clear();
      cursor->next = 0;
      std::lock_guard<std::mutex> lock(commit_mu_);
      for (; cursor->blocks.empty() && cursor->partition < params_.num_partitions &&
             !destroyed_.load();
           ++cursor->partition) {
        Partition* p = partitions_.Find(cursor->partition);
        if (p == nullptr || damaged_.count(cursor->partition) != 0) continue;
        cursor->blocks.reserve(p->index.size());
        for (const IndexEntry& e : p->index) {
          cursor->blocks.push_back(
              ScrubCursor::Block{RefOf(cursor->partition, *p, e, /*with_bounds=*/false), e.mapper,
                                 committed_.at(e.mapper)});
        }
        // Its pre-merged runs too, held until the partition's scrub is done (a run retired
        // meanwhile keeps its bytes until then).
        cursor->runs.assign(p->merged.begin(), p->merged.end());
        for (const auto& r : p->merged) {
          for (const BlockRef& b : r->blocks) {
            cursor->blocks.push_back(ScrubCursor::Block{b, kMergedMapper, r->id});
          }
        }
      }
      if (cursor->blocks.empty()) step.done = true;
      continue;
    }
    const ScrubCursor::Block& b = cursor->blocks[cursor->next++];
    const absl::Status st = ScrubBlock(b, buffer);
    step.bytes += kBlockHeaderSize + b.ref.frame_size;
    if (st.ok()) continue;
    if (destroyed_.load()) {  // (its file may be going away under it)
      step.done = true;
      break;
    }
    if (MarkDamaged(b.ref.partition, st, "scrub")) ++step.damaged;
    cursor->next = cursor->blocks.size();  // its partition is done with
  }
  return step;
}

absl::Status ShuffleStore::ScrubBlock(const ScrubCursor::Block& b, std::string* buffer) const {
  const BlockRef& block = b.ref;
  SLUICE_ASSIGN_OR_RETURN(const FrameHeader h, ReadBlockHeaders(b.mapper, b.attempt, block));
  buffer->resize(kScrubPiece);
  auto* buf = reinterpret_cast<uint8_t*>(buffer->data());
  PayloadHasher hasher;
  uint64_t at = block.offset + kBlockHeaderSize + kFrameHeaderSize;
  for (uint64_t left = h.stored_size; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kScrubPiece));
    SLUICE_RETURN_IF_ERROR(file::PreadAll(data_fd_.get(), DataName(), at, n, buf));
    hasher.Update(buf, n);
    at += n;
    left -= n;
  }
  if (hasher.Digest() != h.payload_checksum) {
    return absl::DataLossError(absl::StrCat("stored frame of partition ", block.partition, " at ",
                                            DataName(), ":", block.offset,
                                            " is corrupt: payload checksum mismatch"));
  }
  return absl::OkStatus();
}

absl::StatusOr<FrameHeader> ShuffleStore::ReadBlockHeaders(uint32_t mapper, uint64_t attempt,
                                                           const BlockRef& block) const {
  uint8_t h[kBlockHeaderSize + kFrameHeaderSize];
  const size_t n = std::min<size_t>(sizeof(h), kBlockHeaderSize + block.frame_size);
  SLUICE_RETURN_IF_ERROR(file::PreadAll(data_fd_.get(), DataName(), block.offset, n, h));
  if (!BlockHeaderMatches(h, mapper, attempt, block)) {
    return absl::DataLossError(absl::StrCat("committed block of mapper ", mapper, " attempt ",
                                            attempt, " for partition ", block.partition, " at ",
                                            DataName(), ":", block.offset,
                                            " does not match its commit record"));
  }
  auto header = ParseFrameHeader(absl::MakeConstSpan(h + kBlockHeaderSize, n - kBlockHeaderSize),
                                 StoredFrameLimits(options_.limits));
  if (!header.ok() || header->frame_size() != block.frame_size) {
    return absl::DataLossError(absl::StrCat("stored frame of partition ", block.partition, " at ",
                                            DataName(), ":", block.offset, " is corrupt",
                                            header.ok()
                                                ? ": its size is not its commit's"
                                                : absl::StrCat(": ", header.status().message())));
  }
  return *header;
}

void ShuffleStore::Discard(absl::Span<const BlockRef> blocks) { PunchBlocks(blocks); }

void ShuffleStore::PunchBlocks(absl::Span<const BlockRef> blocks, bool held) {
  if (!data_fd_.valid()) return;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  ranges.reserve(blocks.size());
  int64_t given_back = 0;
  for (const BlockRef& b : blocks) {
    ranges.emplace_back(b.offset, b.offset + kBlockHeaderSize + b.frame_size);
    given_back += static_cast<int64_t>(kBlockHeaderSize + b.frame_size);
  }
  if (held) Hold(-given_back);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 0; i < ranges.size();) {
    const uint64_t from = ranges[i].first;
    uint64_t to = ranges[i].second;
    for (++i; i < ranges.size() && ranges[i].first <= to; ++i) to = std::max(to, ranges[i].second);
    // Best effort: a file system without hole punching keeps the bytes until the next Open.
    (void)file::PunchHole(data_fd_.get(), DataName(), from, to - from);
  }
}

std::shared_ptr<const file::Mapping> ShuffleStore::ReadView() {
  if (!data_fd_.valid()) return nullptr;
  uint64_t end;
  {
    std::lock_guard<std::mutex> lock(data_mu_);
    end = data_end_;
  }
  std::lock_guard<std::mutex> lock(view_mu_);
  if (auto view = view_.lock(); view != nullptr && view->length() >= end) return view;
  // Room to grow into: the next power of two, at least 64 MiB (address space, not memory).
  uint64_t length = uint64_t{64} << 20;
  while (length < end) length *= 2;
  auto made = file::Mapping::Make(data_fd_.get(), DataName(), length);
  if (!made.ok()) return nullptr;  // (reads use pread)
  std::shared_ptr<const file::Mapping> view = std::move(*made);
  view_ = view;
  return view;
}

absl::Status ShuffleStore::ReadFrame(const BlockRef& block, std::string* frame, FrameHeader* header,
                                     const file::Mapping* view) const {
  if (block.partition >= params_.num_partitions) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition ", block.partition, " is out of range"));
  }
  if (!data_fd_.valid()) return absl::NotFoundError("the data file is not open");
  frame->resize(block.frame_size);
  const uint64_t at = block.offset + kBlockHeaderSize;
  auto* out = reinterpret_cast<uint8_t*>(frame->data());
  absl::Status read;
  if (view != nullptr && block.frame_size <= kViewReadMax && at <= view->length() &&
      block.frame_size <= view->length() - at) {
    read = view->Copy(at, block.frame_size, out);
  } else {
    read = file::PreadAll(data_fd_.get(), DataName(), at, block.frame_size, out);
  }
  if (!read.ok()) {
    // A page the disk cannot give, or a file cut short under the server.
    if (absl::IsDataLoss(read) && !destroyed_.load()) {
      MarkDamaged(block.partition, read, "fetch");
    }
    return read;
  }
  const auto bytes = Bytes(*frame);
  auto h = ParseFrameHeader(bytes, StoredFrameLimits(options_.limits));
  if (!h.ok() || h->frame_size() != frame->size() ||
      PayloadChecksum(bytes.data() + kFrameHeaderSize, h->stored_size) != h->payload_checksum) {
    const absl::Status damage = absl::DataLossError(absl::StrCat(
        "stored frame of partition ", block.partition, " at ", DataName(), ":", block.offset,
        " is corrupt", h.ok() ? "" : absl::StrCat(": ", h.status().message())));
    MarkDamaged(block.partition, damage, "fetch");
    return damage;
  }
  if (header != nullptr) *header = *h;
  return absl::OkStatus();
}

size_t ShuffleStore::open_files() const {
  return (data_fd_.valid() ? 1 : 0) + (log_ != nullptr ? 1 : 0);
}

absl::Status ShuffleStore::WriteObjectsFile(const std::string& bytes) const {
  return file::WriteFileAtomically(dir_, kObjectsFile, Bytes(bytes), shown_dir_);
}

absl::StatusOr<std::string> ShuffleStore::ReadObjectsFile() const {
  const std::string path = absl::StrCat(dir_, "/", kObjectsFile);
  if (!file::Exists(path)) {
    return absl::NotFoundError(absl::StrCat(shown_dir_, " has no ", kObjectsFile, " file"));
  }
  return file::ReadFile(path, kMaxObjectsFile, absl::StrCat(shown_dir_, "/", kObjectsFile));
}

void ShuffleStore::MarkDeleted() {
  std::lock_guard<std::mutex> lock(commit_mu_);
  destroyed_.store(true);
  // Its bytes are going with its directory. (A push writing at this instant adds its last
  // message after this; the destructor takes that back.)
  ReleaseHeld();
  committed_.clear();
  prepared_.clear();
  partitions_.ForEach([](uint32_t, Partition& p) {
    p.stats = PartitionStats{};
    p.index = {};
    p.bounds = {};
    p.hot = {};
    p.merged = {};  // (not retired: their bytes go with the directory)
  });
  merged_bytes_.store(0);
  AddIndexBytes(-static_cast<int64_t>(index_bytes_.load()));
}

}  // namespace sluice
