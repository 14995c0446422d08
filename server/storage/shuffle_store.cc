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
#include "codec/endian.h"
#include "codec/status_macros.h"

namespace sluice {
namespace {

constexpr char kParamsMagic[4] = {'S', 'L', 'S', 'H'};
constexpr char kBlockMagic[4] = {'S', 'L', 'B', 'K'};
// Block version 2 names its partition (bytes 5-6); version 1 blocks, of the per-partition
// files, had zeros there.
constexpr uint8_t kBlockVersion = 2;
constexpr uint8_t kLegacyBlockVersion = 1;
// SHUFFLE's version: 3 since the blocks live in one data file; 2 had one file per partition
// and commits.log's header; 1 had no header. Older shuffles are moved into the current layout
// when opened.
constexpr uint8_t kParamsVersion = 3;
constexpr char kParamsFile[] = "SHUFFLE";
constexpr char kDataFile[] = "data";
// Bytes a legacy block is copied with at a time when a shuffle is moved into the data file.
constexpr size_t kCopyChunk = 1 << 20;
constexpr size_t kMaxParamsFile = 1 << 16;

uint32_t Check32(const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(PayloadChecksum(p, n));
}

// Block header: magic, version, u16 partition, a zero byte, u32 mapper, u64 attempt, u32 frame
// size, u32 records, u32 check of the first 28 bytes.
void WriteBlockHeader(uint32_t partition, uint32_t mapper, uint64_t attempt, uint32_t frame_size,
                      uint32_t records, uint8_t* h) {
  std::memset(h, 0, kBlockHeaderSize);
  std::memcpy(h, kBlockMagic, 4);
  h[4] = kBlockVersion;
  h[5] = static_cast<uint8_t>(partition & 0xff);
  h[6] = static_cast<uint8_t>(partition >> 8);
  StoreLE32(h + 8, mapper);
  StoreLE64(h + 12, attempt);
  StoreLE32(h + 20, frame_size);
  StoreLE32(h + 24, records);
  StoreLE32(h + 28, Check32(h, 28));
}

std::string EncodeParams(const ShuffleParams& p) {
  std::string s(kParamsMagic, 4);
  s.push_back(static_cast<char>(kParamsVersion));
  AppendLE32(&s, p.num_partitions);
  AppendLE32(&s, p.num_mappers);
  AppendLE32(&s, static_cast<uint32_t>(p.shuffle_id.size()));
  s += p.shuffle_id;
  AppendLE64(&s, PayloadChecksum(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  return s;
}

absl::StatusOr<ShuffleParams> DecodeParams(const std::string& s, const std::string& path,
                                           uint8_t* version) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  if (s.size() < 4 + 1 + 12 + 8 || std::memcmp(p, kParamsMagic, 4) != 0) {
    return bad("not a Sluice shuffle parameters file");
  }
  if (p[4] < 1 || p[4] > kParamsVersion) return bad(absl::StrCat("unsupported version ", p[4]));
  *version = p[4];
  const uint32_t id_len = LoadLE32(p + 13);
  if (s.size() != 17 + static_cast<size_t>(id_len) + 8) return bad("wrong size");
  if (LoadLE64(p + 17 + id_len) != PayloadChecksum(p, 17 + id_len)) return bad("bad checksum");
  ShuffleParams params;
  params.num_partitions = LoadLE32(p + 5);
  if (params.num_partitions == 0 || params.num_partitions > kMaxPartitions) {
    return bad(absl::StrCat("impossible partition count ", params.num_partitions));
  }
  params.num_mappers = LoadLE32(p + 9);
  params.shuffle_id.assign(s.data() + 17, id_len);
  return params;
}

// Whether the block header at h is the one `expected` (version, partition where the version
// has it, mapper, attempt, sizes, checksum).
bool BlockHeaderMatches(const uint8_t* h, uint8_t version, uint32_t partition, uint32_t mapper,
                        uint64_t attempt, const BlockRef& b) {
  const uint32_t stored_partition =
      version == kLegacyBlockVersion ? partition : (h[5] | static_cast<uint32_t>(h[6]) << 8);
  return std::memcmp(h, kBlockMagic, 4) == 0 && h[4] == version &&
         LoadLE32(h + 28) == Check32(h, 28) && stored_partition == partition && h[7] == 0 &&
         LoadLE32(h + 8) == mapper && LoadLE64(h + 12) == attempt &&
         LoadLE32(h + 20) == b.frame_size && LoadLE32(h + 24) == b.records;
}

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

}  // namespace

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

ShuffleStore::ShuffleStore(std::string dir, ShuffleParams params, StoreOptions options)
    : dir_(std::move(dir)),
      params_(std::move(params)),
      options_(std::move(options)),
      partitions_(params_.num_partitions) {
  Touch();
}

ShuffleStore::~ShuffleStore() { ReleaseHeld(); }

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
  return absl::NotFoundError(absl::StrCat("shuffle '", params_.shuffle_id, "' was deleted"));
}

std::string ShuffleStore::DataPath() const { return absl::StrCat(dir_, "/", kDataFile); }

CommitLog::Options ShuffleStore::LogOptions() {
  CommitLog::Options o;
  o.fsync = options_.fsync;
  o.shuffle_id = params_.shuffle_id;
  o.sync_data = [this] { return SyncDataFile(); };
  if (Histogram* h = options_.commit_sync_seconds; h != nullptr) {
    o.observe_batch = [h](double s) { h->Observe(s); };
  }
  return o;
}

absl::Status ShuffleStore::SyncDataFile() {
  const int fd = data_fd_.get();
  return options_.sync_data ? options_.sync_data(fd, DataPath()) : file::SyncData(fd, DataPath());
}

absl::StatusOr<std::unique_ptr<ShuffleStore>> ShuffleStore::Create(const std::string& dir,
                                                                   const ShuffleParams& params,
                                                                   const StoreOptions& options) {
  if (params.num_partitions == 0 || params.num_partitions > kMaxPartitions) {
    return absl::InvalidArgumentError(absl::StrCat("a shuffle has 1 to ", kMaxPartitions,
                                                   " partitions, not ", params.num_partitions));
  }
  if (file::Exists(absl::StrCat(dir, "/", kParamsFile))) {
    return absl::AlreadyExistsError(absl::StrCat("shuffle directory ", dir, " already exists"));
  }
  SLUICE_RETURN_IF_ERROR(file::MakeDirs(dir));
  SLUICE_RETURN_IF_ERROR(file::WriteFileAtomically(dir, kParamsFile, Bytes(EncodeParams(params))));
  // The new directory's own entry in its parent must be durable too.
  const std::string parent = dir.substr(0, dir.find_last_of('/'));
  if (!parent.empty() && parent != dir) SLUICE_RETURN_IF_ERROR(file::SyncDir(parent));
  std::unique_ptr<ShuffleStore> store(new ShuffleStore(dir, params, options));
  SLUICE_ASSIGN_OR_RETURN(file::Fd dir_fd, file::OpenDirectory(dir));
  SLUICE_ASSIGN_OR_RETURN(store->data_fd_,
                          file::OpenAt(dir_fd.get(), kDataFile, store->DataPath()));
  // (CommitLog::Create syncs the directory, the data file's entry with the log's.)
  SLUICE_ASSIGN_OR_RETURN(store->log_, CommitLog::Create(dir_fd.get(), dir, store->LogOptions()));
  return store;
}

absl::StatusOr<std::unique_ptr<ShuffleStore>> ShuffleStore::Open(const std::string& dir,
                                                                 const StoreOptions& options) {
  uint8_t version = 0;
  SLUICE_ASSIGN_OR_RETURN(ShuffleParams params, ReadParams(dir, &version));
  std::unique_ptr<ShuffleStore> store(new ShuffleStore(dir, params, options));
  SLUICE_ASSIGN_OR_RETURN(file::Fd dir_fd, file::OpenDirectory(dir));
  SLUICE_RETURN_IF_ERROR(store->Recover(dir_fd.get(), version));
  return store;
}

absl::StatusOr<ShuffleParams> ShuffleStore::ReadParams(const std::string& dir, uint8_t* version) {
  const std::string params_path = absl::StrCat(dir, "/", kParamsFile);
  SLUICE_ASSIGN_OR_RETURN(std::string encoded, file::ReadFile(params_path, kMaxParamsFile));
  uint8_t ignored = 0;
  return DecodeParams(encoded, params_path, version != nullptr ? version : &ignored);
}

absl::StatusOr<BlockRef> ShuffleStore::Append(uint32_t mapper, uint64_t attempt, uint32_t partition,
                                              absl::Span<const uint8_t> frame, uint32_t records) {
  std::vector<BlockRef> blocks;
  const FrameToAppend one{partition, frame, records};
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
    blocks->push_back(BlockRef{f.partition, size, total, f.records, h->uncompressed_size});
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
  absl::Status st = file::PwritevAll(data_fd_.get(), DataPath(), at, pieces);
  if (!st.ok()) {
    (void)file::PunchHole(data_fd_.get(), DataPath(), at, total);
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
  Hold(static_cast<int64_t>(total));
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
  const absl::Status written = log_->Append(mapper, attempt, blocks);
  std::vector<BlockRef> losers;
  {
    std::lock_guard<std::mutex> lock(commit_mu_);
    inflight_mappers_.erase(mapper);
    commit_cv_.notify_all();
    if (!written.ok()) return written;
    if (destroyed_.load()) return DeletedError();
    AddCommitLocked(mapper, attempt, blocks);
    // (On a server of its own a caller may mix both ways: prepared attempts of the mapper lost.)
    DropPreparedLocked(mapper, attempt, &losers);
  }
  PunchBlocks(losers);
  return CommitOutcome::kCommitted;
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
      return absl::FailedPreconditionError(absl::StrCat("attempt ", attempt, " of mapper ", mapper,
                                                        " of shuffle ", params_.shuffle_id,
                                                        " is not prepared on this server"));
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
    // All of them claimed at once (never some held while waiting for others: no deadlock
    // between two callers).
    commit_cv_.wait(lock, [&] {
      return std::none_of(winners.begin(), winners.end(),
                          [&](const auto& w) { return inflight_mappers_.count(w.first) != 0; });
    });
    if (destroyed_.load()) return DeletedError();
    const bool broken = log_->broken();  // (nothing to write is no error even then)
    for (const auto& [mapper, attempt] : winners) {
      if (committed_.count(mapper) != 0 || !IsPreparedLocked(mapper, attempt)) continue;
      if (broken) return log_->BrokenError();
      if (!inflight_mappers_.insert(mapper).second) continue;  // named twice
      records.push_back(CommitRecord{mapper, attempt, prepared_[mapper][attempt], false});
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

void ShuffleStore::AddCommitLocked(uint32_t mapper, uint64_t attempt,
                                   absl::Span<const BlockRef> blocks) {
  for (const BlockRef& b : blocks) {
    Partition& p = partitions_.Get(b.partition);
    p.stats.records += b.records;
    p.stats.bytes += b.frame_size;
    p.stats.frames += 1;
    if (!p.index.empty() && p.index.back().mapper > mapper) p.sorted = false;
    p.index.push_back(IndexEntry{mapper, b.frame_size, b.offset, b.records, b.uncompressed});
  }
  committed_.emplace(mapper, attempt);
}

void ShuffleStore::Discard(absl::Span<const BlockRef> blocks) { PunchBlocks(blocks); }

void ShuffleStore::PunchBlocks(absl::Span<const BlockRef> blocks) {
  if (!data_fd_.valid()) return;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  ranges.reserve(blocks.size());
  int64_t given_back = 0;
  for (const BlockRef& b : blocks) {
    ranges.emplace_back(b.offset, b.offset + kBlockHeaderSize + b.frame_size);
    given_back += static_cast<int64_t>(kBlockHeaderSize + b.frame_size);
  }
  Hold(-given_back);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 0; i < ranges.size();) {
    const uint64_t from = ranges[i].first;
    uint64_t to = ranges[i].second;
    for (++i; i < ranges.size() && ranges[i].first <= to; ++i) to = std::max(to, ranges[i].second);
    // Best effort: a file system without hole punching keeps the bytes until the next Open.
    (void)file::PunchHole(data_fd_.get(), DataPath(), from, to - from);
  }
}

std::vector<BlockRef> ShuffleStore::CommittedBlocks(uint32_t partition) const {
  std::vector<uint32_t> mappers;
  return *CommittedBlocksOf(partition, {}, &mappers);  // (all mappers: it cannot fail)
}

absl::StatusOr<std::vector<BlockRef>> ShuffleStore::CommittedBlocksOf(
    uint32_t partition, const std::vector<uint32_t>& only, std::vector<uint32_t>* mappers) const {
  std::vector<BlockRef> out;
  std::lock_guard<std::mutex> lock(commit_mu_);
  mappers->clear();
  if (only.empty()) {
    for (const auto& [mapper, attempt] : committed_) mappers->push_back(mapper);
  } else {
    for (uint32_t m : only) {
      if (committed_.count(m) == 0) {
        return absl::AbortedError(absl::StrCat("mapper ", m, " of shuffle ", params_.shuffle_id,
                                               " is not committed on this server"));
      }
    }
    *mappers = only;
  }
  Partition* p = partitions_.Find(partition);
  if (p == nullptr) return out;
  if (!p->sorted) {  // ordered by mapper id, each mapper's blocks in arrival order
    std::stable_sort(p->index.begin(), p->index.end(),
                     [](const IndexEntry& a, const IndexEntry& b) { return a.mapper < b.mapper; });
    p->sorted = true;
  }
  out.reserve(p->index.size());
  for (const IndexEntry& e : p->index) {
    if (!only.empty() && !std::binary_search(only.begin(), only.end(), e.mapper)) continue;
    out.push_back(BlockRef{partition, e.frame_size, e.offset, e.records, e.uncompressed});
  }
  return out;
}

std::vector<uint32_t> ShuffleStore::CommittedMappers() const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  std::vector<uint32_t> out;
  out.reserve(committed_.size());
  for (const auto& [mapper, attempt] : committed_) out.push_back(mapper);
  return out;
}

PartitionStats ShuffleStore::Stats(uint32_t partition) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  const Partition* p = partitions_.Find(partition);
  return p != nullptr ? p->stats : PartitionStats{};
}

size_t ShuffleStore::indexed_blocks() const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  size_t n = 0;
  partitions_.ForEach([&n](uint32_t, Partition& p) { n += p.index.size(); });
  return n;
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
  auto made = file::Mapping::Make(data_fd_.get(), DataPath(), length);
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
  if (view != nullptr && block.frame_size <= kViewReadMax && at <= view->length() &&
      block.frame_size <= view->length() - at) {
    SLUICE_RETURN_IF_ERROR(view->Copy(at, block.frame_size, out));
  } else {
    SLUICE_RETURN_IF_ERROR(file::PreadAll(data_fd_.get(), DataPath(), at, block.frame_size, out));
  }
  const auto bytes = Bytes(*frame);
  auto h = ParseFrameHeader(bytes, StoredFrameLimits(options_.limits));
  if (!h.ok() || h->frame_size() != frame->size() ||
      PayloadChecksum(bytes.data() + kFrameHeaderSize, h->stored_size) != h->payload_checksum) {
    return absl::DataLossError(absl::StrCat(
        "stored frame of partition ", block.partition, " at ", DataPath(), ":", block.offset,
        " is corrupt", h.ok() ? "" : absl::StrCat(": ", h.status().message())));
  }
  if (header != nullptr) *header = *h;
  return absl::OkStatus();
}

absl::Status ShuffleStore::VerifyBlock(uint32_t mapper, uint64_t attempt,
                                       BlockRef* block_ref) const {
  const BlockRef& block = *block_ref;
  uint8_t h[kBlockHeaderSize];
  SLUICE_RETURN_IF_ERROR(
      file::PreadAll(data_fd_.get(), DataPath(), block.offset, kBlockHeaderSize, h));
  if (!BlockHeaderMatches(h, kBlockVersion, block.partition, mapper, attempt, block)) {
    return absl::DataLossError(absl::StrCat("committed block of mapper ", mapper, " attempt ",
                                            attempt, " for partition ", block.partition, " at ",
                                            DataPath(), ":", block.offset,
                                            " does not match its commit record"));
  }
  std::string frame;
  FrameHeader header;
  SLUICE_RETURN_IF_ERROR(ReadFrame(block, &frame, &header));
  block_ref->uncompressed = header.uncompressed_size;
  return absl::OkStatus();
}

absl::Status ShuffleStore::Recover(int dir_fd, uint8_t version) {
  // 1. The files there are: the data file, and a legacy shuffle's partition files (one
  //    listing, not a lookup per declared partition).
  SLUICE_ASSIGN_OR_RETURN(const std::vector<uint32_t> legacy_files, ListPartitionFiles());
  const bool data_existed = file::Exists(DataPath());
  uint64_t data_size = 0;
  if (data_existed) {
    SLUICE_ASSIGN_OR_RETURN(data_fd_, file::OpenAt(dir_fd, kDataFile, DataPath()));
    SLUICE_ASSIGN_OR_RETURN(data_size, file::FileSize(data_fd_.get(), DataPath()));
  }

  // 2. The commit log (CommitLog::Open refuses a log that lost acknowledged records, cuts a
  //    torn tail and refuses corruption before it). A legacy log comes back read-only.
  CommitLog::Recovery recovery;
  recovery.version1_allowed = version == 1;
  recovery.version2_allowed = version <= 2;
  recovery.data_files_exist = data_size > 0 || !legacy_files.empty();
  std::vector<CommitRecord> records;
  SLUICE_ASSIGN_OR_RETURN(log_, CommitLog::Open(dir_fd, dir_, LogOptions(), recovery, &records));
  const std::string log_path = log_->path();

  // 3. The first commit record of each mapper is its commit; prepared attempts of mappers
  //    without one wait for their decision.
  std::vector<CommitRecord> commits, prepared;
  SLUICE_RETURN_IF_ERROR(SortRecords(std::move(records), &commits, &prepared));
  const bool legacy = log_->legacy();
  if (!data_existed && !legacy && !(commits.empty() && prepared.empty())) {
    return absl::DataLossError(
        absl::StrCat(log_path, " commits ", commits.size(), " mappers and prepares ",
                     prepared.size(), " attempts but the data file ", DataPath(), " is missing"));
  }
  if (!data_existed) {
    SLUICE_ASSIGN_OR_RETURN(data_fd_, file::OpenAt(dir_fd, kDataFile, DataPath()));
    if (options_.fsync) SLUICE_RETURN_IF_ERROR(file::SyncFd(dir_fd, dir_));
  }
  if (legacy) SLUICE_RETURN_IF_ERROR(MoveLegacyBlocks(dir_fd, &commits));

  // 4. Every committed block must be there and whole (before a legacy shuffle's log is
  //    replaced: until then the shuffle is exactly as it was).
  for (auto* list : {&commits, &prepared}) {
    for (CommitRecord& c : *list) {
      for (BlockRef& b : c.blocks) SLUICE_RETURN_IF_ERROR(VerifyBlock(c.mapper, c.attempt, &b));
    }
  }
  if (legacy || version < kParamsVersion) {
    // The new log is the switch to the current layout; SHUFFLE and the old files follow it (a
    // crash in between finds a current log and finishes here).
    if (legacy) {
      if (options_.fsync) SLUICE_RETURN_IF_ERROR(SyncDataFile());
      SLUICE_ASSIGN_OR_RETURN(log_, CommitLog::Rewrite(dir_fd, dir_, LogOptions(), commits));
    }
    SLUICE_RETURN_IF_ERROR(
        file::WriteFileAtomically(dir_, kParamsFile, Bytes(EncodeParams(params_))));
  }
  for (uint32_t i : legacy_files) {
    const std::string name = absl::StrCat("p", i, ".data");
    if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return file::ErrnoStatus(errno, "remove", absl::StrCat(dir_, "/", name));
    }
  }
  if (!legacy_files.empty()) SLUICE_RETURN_IF_ERROR(file::SyncFd(dir_fd, dir_));

  std::lock_guard<std::mutex> lock(commit_mu_);
  for (const CommitRecord& c : commits) AddCommitLocked(c.mapper, c.attempt, c.blocks);
  for (CommitRecord& c : prepared) prepared_[c.mapper][c.attempt] = std::move(c.blocks);
  return ReclaimUnowned();
}

absl::Status ShuffleStore::SortRecords(std::vector<CommitRecord> records,
                                       std::vector<CommitRecord>* commits,
                                       std::vector<CommitRecord>* prepared) const {
  const std::string& log_path = log_->path();
  std::set<uint32_t> committed, taken;
  std::set<std::pair<uint32_t, uint64_t>> seen_prepared;
  for (const CommitRecord& r : records) {
    if (!r.prepared) committed.insert(r.mapper);
  }
  for (CommitRecord& r : records) {
    if (params_.num_mappers != 0 && r.mapper >= params_.num_mappers) {
      return absl::DataLossError(absl::StrCat(log_path, " commits mapper ", r.mapper,
                                              ", beyond the ", params_.num_mappers,
                                              " mappers of the shuffle"));
    }
    for (const BlockRef& b : r.blocks) {
      if (b.partition >= params_.num_partitions) {
        return absl::DataLossError(absl::StrCat(log_path, " commits mapper ", r.mapper,
                                                " to partition ", b.partition, ", beyond the ",
                                                params_.num_partitions, " of the shuffle"));
      }
      // Not the cap in force now: it may have been lowered since (StoredFrameLimits).
      if (b.frame_size > kFrameHeaderSize + uint64_t{kMaxFrameCapBytes}) {
        return absl::DataLossError(absl::StrCat(log_path, " lists a frame of ", b.frame_size,
                                                " bytes, beyond any frame cap"));
      }
    }
    if (r.prepared) {
      // Decided already (its blocks, if it won, are the commit's), or a repeat: not pending.
      if (committed.count(r.mapper) != 0 || !seen_prepared.emplace(r.mapper, r.attempt).second) {
        continue;
      }
      prepared->push_back(std::move(r));
    } else if (taken.insert(r.mapper).second) {
      commits->push_back(std::move(r));  // a later record for a mapper is never visible
    }
  }
  return absl::OkStatus();
}

absl::Status ShuffleStore::MoveLegacyBlocks(int dir_fd, std::vector<CommitRecord>* commits) {
  // The data file is not referenced by a legacy log: start it afresh (an earlier move may
  // have been cut short by a crash). Blocks are copied partition by partition, so each legacy
  // file is open only while it is copied and a partition's blocks end up together.
  SLUICE_RETURN_IF_ERROR(file::Truncate(data_fd_.get(), DataPath(), 0));
  std::map<uint32_t, std::vector<std::pair<BlockRef*, const CommitRecord*>>> by_partition;
  for (CommitRecord& c : *commits) {
    for (BlockRef& b : c.blocks) by_partition[b.partition].emplace_back(&b, &c);
  }
  std::vector<uint8_t> buf(kCopyChunk);
  uint64_t out = 0;
  for (auto& [partition, blocks] : by_partition) {
    const std::string name = absl::StrCat("p", partition, ".data");
    const std::string path = absl::StrCat(dir_, "/", name);
    const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) {
        return absl::DataLossError(absl::StrCat(log_->path(), " commits mapper ",
                                                blocks.front().second->mapper, " to partition ",
                                                partition, " whose data file is missing"));
      }
      return file::ErrnoStatus(errno, "open", path);
    }
    const file::Fd in(fd);
    for (auto& [b, c] : blocks) {
      uint8_t h[kBlockHeaderSize];
      SLUICE_RETURN_IF_ERROR(file::PreadAll(in.get(), path, b->offset, kBlockHeaderSize, h));
      if (!BlockHeaderMatches(h, kLegacyBlockVersion, partition, c->mapper, c->attempt, *b)) {
        return absl::DataLossError(absl::StrCat("committed block of mapper ", c->mapper,
                                                " attempt ", c->attempt, " at ", path, ":",
                                                b->offset, " does not match its commit record"));
      }
      WriteBlockHeader(partition, c->mapper, c->attempt, b->frame_size, b->records, h);
      SLUICE_RETURN_IF_ERROR(
          file::PwriteAll(data_fd_.get(), DataPath(), out, absl::MakeConstSpan(h, sizeof h)));
      for (uint64_t done = 0; done < b->frame_size;) {
        const size_t n = std::min<uint64_t>(buf.size(), b->frame_size - done);
        SLUICE_RETURN_IF_ERROR(
            file::PreadAll(in.get(), path, b->offset + kBlockHeaderSize + done, n, buf.data()));
        SLUICE_RETURN_IF_ERROR(file::PwriteAll(data_fd_.get(), DataPath(),
                                               out + kBlockHeaderSize + done,
                                               absl::MakeConstSpan(buf.data(), n)));
        done += n;
      }
      b->offset = out;
      out += kBlockHeaderSize + b->frame_size;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> ShuffleStore::ListPartitionFiles() const {
  std::vector<uint32_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    uint32_t n = 0;
    if (name.size() < 7 || name[0] != 'p' || name.compare(name.size() - 5, 5, ".data") != 0 ||
        !absl::SimpleAtoi(absl::string_view(name).substr(1, name.size() - 6), &n) ||
        name != absl::StrCat("p", n, ".data")) {
      continue;
    }
    if (n >= params_.num_partitions) {
      return absl::DataLossError(absl::StrCat(dir_, "/", name, " is beyond the shuffle's ",
                                              params_.num_partitions, " partitions"));
    }
    out.push_back(n);
  }
  if (ec) return file::ErrnoStatus(ec.value(), "list", dir_);
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status ShuffleStore::ReclaimUnowned() {
  // Bytes no commit owns belong to attempts that broke or were in flight at a crash: cut the
  // data file after its last committed block and punch out the gaps.
  std::vector<std::pair<uint64_t, uint64_t>> owned;
  partitions_.ForEach([&owned](uint32_t, Partition& p) {
    for (const IndexEntry& e : p.index) {
      owned.emplace_back(e.offset, e.offset + kBlockHeaderSize + e.frame_size);
    }
  });
  for (const auto& [mapper, attempts] : prepared_) {  // waiting for their decision
    for (const auto& [attempt, blocks] : attempts) {
      for (const BlockRef& b : blocks) {
        owned.emplace_back(b.offset, b.offset + kBlockHeaderSize + b.frame_size);
      }
    }
  }
  std::sort(owned.begin(), owned.end());
  const std::string path = DataPath();
  SLUICE_ASSIGN_OR_RETURN(const uint64_t size, file::FileSize(data_fd_.get(), path));
  uint64_t cursor = 0, kept = 0;
  for (const auto& [from, to] : owned) {
    if (from > cursor)
      SLUICE_RETURN_IF_ERROR(file::PunchHole(data_fd_.get(), path, cursor, from - cursor));
    if (to > cursor) kept += to - std::max(cursor, from);
    cursor = std::max(cursor, to);
  }
  Hold(static_cast<int64_t>(kept) - held_.load());
  if (size > cursor) {
    SLUICE_RETURN_IF_ERROR(file::Truncate(data_fd_.get(), path, cursor));
    if (options_.fsync) SLUICE_RETURN_IF_ERROR(file::SyncData(data_fd_.get(), path));
  }
  std::lock_guard<std::mutex> lock(data_mu_);
  data_end_ = cursor;
  return absl::OkStatus();
}

size_t ShuffleStore::open_files() const {
  return (data_fd_.valid() ? 1 : 0) + (log_ != nullptr ? 1 : 0);
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
  });
}

}  // namespace sluice
