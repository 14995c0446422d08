#include "server/shuffle_store.h"

#include <fcntl.h>

#include <algorithm>
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
constexpr uint8_t kBlockVersion = 1;
// SHUFFLE's version: 2 since commits.log has its header (version 1 shuffles are upgraded when
// opened; CommitLog::Recovery).
constexpr uint8_t kParamsVersion = 2;
constexpr char kParamsFile[] = "SHUFFLE";
constexpr size_t kMaxParamsFile = 1 << 16;

uint32_t Check32(const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(PayloadChecksum(p, n));
}

// Block header: magic, version, 3 zero bytes, u32 mapper, u64 attempt, u32 frame size,
// u32 records, u32 check of the first 28 bytes.
void WriteBlockHeader(uint32_t mapper, uint64_t attempt, uint32_t frame_size, uint32_t records,
                      uint8_t* h) {
  std::memset(h, 0, kBlockHeaderSize);
  std::memcpy(h, kBlockMagic, 4);
  h[4] = kBlockVersion;
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
      options_(options),
      partitions_(params_.num_partitions) {}

ShuffleStore::~ShuffleStore() = default;

absl::Status ShuffleStore::DeletedError() const {
  return absl::NotFoundError(absl::StrCat("shuffle '", params_.shuffle_id, "' was deleted"));
}

std::string ShuffleStore::PartitionPath(uint32_t partition) const {
  return absl::StrCat(dir_, "/p", partition, ".data");
}
CommitLog::Options ShuffleStore::LogOptions() {
  CommitLog::Options o;
  o.fsync = options_.fsync;
  o.shuffle_id = params_.shuffle_id;
  o.sync_partitions = [this](const std::set<uint32_t>& parts) { return SyncPartitions(parts); };
  return o;
}

absl::Status ShuffleStore::SyncPartitions(const std::set<uint32_t>& partitions) {
  for (uint32_t part : partitions) {
    Partition* p = partitions_.Find(part);
    if (p == nullptr) continue;  // (blocks are only ever in made partitions)
    const int fd = p->fd.get();
    SLUICE_RETURN_IF_ERROR(options_.sync_data ? options_.sync_data(fd, PartitionPath(part))
                                              : file::SyncData(fd, PartitionPath(part)));
  }
  return absl::OkStatus();
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
  const std::string encoded = EncodeParams(params);
  SLUICE_RETURN_IF_ERROR(file::WriteFileAtomically(
      dir, kParamsFile,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size())));
  // The new directory's own entry in its parent must be durable too.
  const std::string parent = dir.substr(0, dir.find_last_of('/'));
  if (!parent.empty() && parent != dir) SLUICE_RETURN_IF_ERROR(file::SyncDir(parent));
  std::unique_ptr<ShuffleStore> store(new ShuffleStore(dir, params, options));
  SLUICE_ASSIGN_OR_RETURN(store->dir_fd_, file::OpenDirectory(dir));
  SLUICE_ASSIGN_OR_RETURN(store->log_,
                          CommitLog::Create(store->dir_fd_.get(), dir, store->LogOptions()));
  return store;
}

absl::StatusOr<std::unique_ptr<ShuffleStore>> ShuffleStore::Open(const std::string& dir,
                                                                 const StoreOptions& options) {
  uint8_t version = 0;
  SLUICE_ASSIGN_OR_RETURN(ShuffleParams params, ReadParams(dir, &version));
  std::unique_ptr<ShuffleStore> store(new ShuffleStore(dir, params, options));
  SLUICE_ASSIGN_OR_RETURN(store->dir_fd_, file::OpenDirectory(dir));
  SLUICE_RETURN_IF_ERROR(store->Recover(/*version1=*/version == 1));
  if (version == 1) {  // its log was upgraded by Recover: the shuffle is version 2 now
    const std::string encoded = EncodeParams(params);
    SLUICE_RETURN_IF_ERROR(file::WriteFileAtomically(
        dir, kParamsFile,
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size())));
  }
  return store;
}

absl::StatusOr<ShuffleParams> ShuffleStore::ReadParams(const std::string& dir, uint8_t* version) {
  const std::string params_path = absl::StrCat(dir, "/", kParamsFile);
  SLUICE_ASSIGN_OR_RETURN(std::string encoded, file::ReadFile(params_path, kMaxParamsFile));
  uint8_t ignored = 0;
  return DecodeParams(encoded, params_path, version != nullptr ? version : &ignored);
}

absl::Status ShuffleStore::EnsureOpen(uint32_t partition, Partition& p) {
  if (p.fd.valid()) return absl::OkStatus();
  if (destroyed_.load()) return DeletedError();
  const std::string path = PartitionPath(partition);
  const bool existed = file::Exists(path);
  SLUICE_ASSIGN_OR_RETURN(file::Fd fd,
                          file::OpenAt(dir_fd_.get(), absl::StrCat("p", partition, ".data"), path));
  SLUICE_ASSIGN_OR_RETURN(const uint64_t end, file::FileSize(fd.get(), path));
  // A new file's directory entry must survive a crash before any commit relies on it; keep the
  // descriptor only once it does, so a failed sync is retried by the next append.
  if (!existed && options_.fsync) SLUICE_RETURN_IF_ERROR(file::SyncFd(dir_fd_.get(), dir_));
  p.fd = std::move(fd);
  p.end = end;
  return absl::OkStatus();
}

absl::StatusOr<BlockRef> ShuffleStore::Append(uint32_t mapper, uint64_t attempt, uint32_t partition,
                                              absl::Span<const uint8_t> frame, uint32_t records) {
  if (partition >= params_.num_partitions) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", partition, " is out of range [0, ",
                                                   params_.num_partitions, ")"));
  }
  if (params_.num_mappers != 0 && mapper >= params_.num_mappers) {
    return absl::InvalidArgumentError(
        absl::StrCat("mapper ", mapper, " is out of range [0, ", params_.num_mappers, ")"));
  }
  if (destroyed_.load()) return DeletedError();
  SLUICE_ASSIGN_OR_RETURN(FrameHeader h, ParseFrameHeader(frame, options_.limits));
  if (h.frame_size() != frame.size()) {
    return absl::InvalidArgumentError("Append takes exactly one whole frame");
  }
  Partition& p = partitions_.Get(partition);
  BlockRef ref;
  ref.partition = partition;
  ref.frame_size = static_cast<uint32_t>(frame.size());
  ref.records = records;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    SLUICE_RETURN_IF_ERROR(EnsureOpen(partition, p));
    ref.offset = p.end;  // reserve the range; the write itself runs outside the lock
    p.end += kBlockHeaderSize + frame.size();
  }
  uint8_t header[kBlockHeaderSize];
  WriteBlockHeader(mapper, attempt, ref.frame_size, records, header);
  absl::Status st = file::PwriteAll(p.fd.get(), PartitionPath(partition), ref.offset,
                                    absl::MakeConstSpan(header, kBlockHeaderSize), frame);
  if (!st.ok()) {
    Discard({ref});
    return st;
  }
#ifdef __linux__
  if (options_.fsync) {
    // Start writing the block to disk now, without waiting: by the time the attempt commits,
    // its fdatasync finds little left to write, so disk time overlaps the push instead of
    // stalling the commit. Best effort: the commit's fdatasync is what guarantees durability
    // and reports errors.
    (void)::sync_file_range(p.fd.get(), static_cast<off64_t>(ref.offset),
                            static_cast<off64_t>(kBlockHeaderSize + frame.size()),
                            SYNC_FILE_RANGE_WRITE);
  }
#endif
  return ref;
}

absl::StatusOr<CommitOutcome> ShuffleStore::Commit(uint32_t mapper, uint64_t attempt,
                                                   absl::Span<const BlockRef> blocks) {
  {
    std::unique_lock<std::mutex> lock(commit_mu_);
    // Another attempt of this mapper on its way: its outcome decides whether ours is a duplicate.
    commit_cv_.wait(lock, [&] { return inflight_mappers_.count(mapper) == 0; });
    if (destroyed_.load()) return DeletedError();
    if (committed_.count(mapper) != 0) return CommitOutcome::kDuplicate;
    if (log_->broken()) return log_->BrokenError();
    inflight_mappers_.insert(mapper);
  }
  // Durable once Append returns OK (it syncs the data first); visible once recorded below.
  const absl::Status written = log_->Append(mapper, attempt, blocks);
  std::lock_guard<std::mutex> lock(commit_mu_);
  inflight_mappers_.erase(mapper);
  commit_cv_.notify_all();
  if (!written.ok()) return written;
  if (destroyed_.load()) return DeletedError();
  AddCommitLocked(mapper,
                  CommittedAttempt{attempt, std::vector<BlockRef>(blocks.begin(), blocks.end())});
  return CommitOutcome::kCommitted;
}

void ShuffleStore::AddCommitLocked(uint32_t mapper, CommittedAttempt commit) {
  for (const BlockRef& b : commit.blocks) {
    PartitionStats& s = partitions_.Get(b.partition).stats;
    s.records += b.records;
    s.bytes += b.frame_size;
    s.frames += 1;
  }
  committed_.emplace(mapper, std::move(commit));
}

void ShuffleStore::Discard(absl::Span<const BlockRef> blocks) {
  for (const BlockRef& b : blocks) {
    Partition* found = partitions_.Find(b.partition);
    if (found == nullptr || !found->fd.valid()) continue;
    Partition& p = *found;
    // Best effort: a file system without hole punching keeps the bytes until the next Open.
    (void)file::PunchHole(p.fd.get(), PartitionPath(b.partition), b.offset,
                          kBlockHeaderSize + b.frame_size);
  }
}

std::vector<BlockRef> ShuffleStore::CommittedBlocks(uint32_t partition) const {
  std::vector<BlockRef> out;
  std::lock_guard<std::mutex> lock(commit_mu_);
  for (const auto& [mapper, commit] : committed_) {  // ordered by mapper id
    for (const BlockRef& b : commit.blocks) {
      if (b.partition == partition) out.push_back(b);  // blocks are in arrival order
    }
  }
  return out;
}

std::vector<uint32_t> ShuffleStore::CommittedMappers() const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  std::vector<uint32_t> out;
  for (const auto& [mapper, commit] : committed_) out.push_back(mapper);
  return out;
}

PartitionStats ShuffleStore::Stats(uint32_t partition) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  const Partition* p = partitions_.Find(partition);
  return p != nullptr ? p->stats : PartitionStats{};
}

absl::Status ShuffleStore::ReadFrame(const BlockRef& block, std::string* frame) const {
  if (block.partition >= params_.num_partitions) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition ", block.partition, " is out of range"));
  }
  const Partition* found = partitions_.Find(block.partition);
  if (found == nullptr || !found->fd.valid()) {
    return absl::NotFoundError("partition file is not open");
  }
  const Partition& p = *found;
  const std::string path = PartitionPath(block.partition);
  frame->resize(block.frame_size);
  SLUICE_RETURN_IF_ERROR(file::PreadAll(p.fd.get(), path, block.offset + kBlockHeaderSize,
                                        block.frame_size,
                                        reinterpret_cast<uint8_t*>(frame->data())));
  const auto bytes =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame->data()), frame->size());
  auto h = ParseFrameHeader(bytes, StoredFrameLimits(options_.limits));
  if (!h.ok() || h->frame_size() != frame->size() ||
      PayloadChecksum(bytes.data() + kFrameHeaderSize, h->stored_size) != h->payload_checksum) {
    return absl::DataLossError(
        absl::StrCat("stored frame at ", path, ":", block.offset, " is corrupt",
                     h.ok() ? "" : absl::StrCat(": ", h.status().message())));
  }
  return absl::OkStatus();
}

absl::StatusOr<FrameHeader> ShuffleStore::ReadFrameHeader(const BlockRef& block) const {
  const Partition* part = partitions_.Find(block.partition);
  if (part == nullptr || !part->fd.valid() || block.frame_size < kFrameHeaderSize) {
    return absl::InvalidArgumentError("not a committed block");
  }
  const std::string path = PartitionPath(block.partition);
  uint8_t h[kFrameHeaderSize];
  SLUICE_RETURN_IF_ERROR(
      file::PreadAll(part->fd.get(), path, block.offset + kBlockHeaderSize, kFrameHeaderSize, h));
  auto header = ParseFrameHeader(absl::MakeConstSpan(h, kFrameHeaderSize),
                                 StoredFrameLimits(options_.limits));
  if (!header.ok()) {
    return absl::DataLossError(absl::StrCat("stored frame at ", path, ":", block.offset,
                                            " is corrupt: ", header.status().message()));
  }
  return header;
}

absl::Status ShuffleStore::VerifyBlock(uint32_t mapper, uint64_t attempt, const BlockRef& block,
                                       bool check_frame) const {
  const std::string path = PartitionPath(block.partition);
  const Partition& p = *partitions_.Find(block.partition);  // (Recover checked it is open)
  uint8_t h[kBlockHeaderSize];
  SLUICE_RETURN_IF_ERROR(file::PreadAll(p.fd.get(), path, block.offset, kBlockHeaderSize, h));
  if (std::memcmp(h, kBlockMagic, 4) != 0 || h[4] != kBlockVersion ||
      LoadLE32(h + 28) != Check32(h, 28) || LoadLE32(h + 8) != mapper ||
      LoadLE64(h + 12) != attempt || LoadLE32(h + 20) != block.frame_size ||
      LoadLE32(h + 24) != block.records) {
    return absl::DataLossError(absl::StrCat("committed block of mapper ", mapper, " attempt ",
                                            attempt, " at ", path, ":", block.offset,
                                            " does not match its commit record"));
  }
  if (!check_frame) return absl::OkStatus();
  std::string frame;
  return ReadFrame(block, &frame);
}

absl::Status ShuffleStore::Recover(bool version1) {
  // 1. The data files there are (one listing, not a lookup per declared partition).
  SLUICE_ASSIGN_OR_RETURN(const std::vector<uint32_t> present, ListPartitionFiles());
  for (uint32_t i : present) {
    Partition& p = partitions_.Get(i);
    std::lock_guard<std::mutex> lock(p.mu);
    SLUICE_RETURN_IF_ERROR(EnsureOpen(i, p));
  }

  // 2. The commit log (CommitLog::Open refuses a log that lost acknowledged records, cuts a
  //    torn tail and refuses corruption before it).
  CommitLog::Recovery recovery;
  recovery.version1_allowed = version1;
  recovery.data_files_exist = !present.empty();
  std::vector<CommitRecord> commits;
  SLUICE_ASSIGN_OR_RETURN(log_,
                          CommitLog::Open(dir_fd_.get(), dir_, LogOptions(), recovery, &commits));
  const std::string& log_path = log_->path();

  // 3. Every committed block must be there and whole.
  std::lock_guard<std::mutex> lock(commit_mu_);
  for (CommitRecord& commit : commits) {
    const uint32_t m = commit.mapper;
    if (committed_.count(m) != 0) continue;  // a later record for a mapper: never visible
    if (params_.num_mappers != 0 && m >= params_.num_mappers) {
      return absl::DataLossError(absl::StrCat(log_path, " commits mapper ", m, ", beyond the ",
                                              params_.num_mappers, " mappers of the shuffle"));
    }
    for (const BlockRef& b : commit.blocks) {
      const Partition* part =
          b.partition < params_.num_partitions ? partitions_.Find(b.partition) : nullptr;
      if (part == nullptr || !part->fd.valid()) {
        return absl::DataLossError(absl::StrCat(log_path, " commits mapper ", m, " to partition ",
                                                b.partition, " whose data file is missing"));
      }
      // Not the cap in force now: it may have been lowered since (StoredFrameLimits).
      if (b.frame_size > kFrameHeaderSize + uint64_t{kMaxFrameCapBytes}) {
        return absl::DataLossError(absl::StrCat(log_path, " lists a frame of ", b.frame_size,
                                                " bytes, beyond any frame cap"));
      }
      SLUICE_RETURN_IF_ERROR(VerifyBlock(m, commit.attempt, b, /*check_frame=*/true));
    }
    AddCommitLocked(m, CommittedAttempt{commit.attempt, std::move(commit.blocks)});
  }
  return ReclaimUnowned();
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
  // tail of each data file after its last committed block and punch out the gaps.
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> owned;  // by partition
  for (const auto& [m, commit] : committed_) {
    for (const BlockRef& b : commit.blocks) {
      owned[b.partition].emplace_back(b.offset, b.offset + kBlockHeaderSize + b.frame_size);
    }
  }
  absl::Status status;
  partitions_.ForEach([&](uint32_t i, Partition& part) {
    if (!status.ok() || !part.fd.valid()) return;
    const std::string path = PartitionPath(i);
    auto& ranges = owned[i];
    std::sort(ranges.begin(), ranges.end());
    uint64_t cursor = 0;
    for (const auto& [from, to] : ranges) {
      if (from > cursor) status.Update(file::PunchHole(part.fd.get(), path, cursor, from - cursor));
      cursor = std::max(cursor, to);
    }
    if (status.ok() && part.end > cursor) {
      status.Update(file::Truncate(part.fd.get(), path, cursor));
      if (status.ok() && options_.fsync) status.Update(file::SyncData(part.fd.get(), path));
    }
    part.end = cursor;
  });
  return status;
}

size_t ShuffleStore::open_files() const {
  size_t n = (dir_fd_.valid() ? 1 : 0) + (log_ != nullptr ? 1 : 0);
  partitions_.ForEach([&n](uint32_t, Partition& p) {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.fd.valid()) ++n;
  });
  return n;
}

void ShuffleStore::MarkDeleted() {
  std::lock_guard<std::mutex> lock(commit_mu_);
  destroyed_.store(true);
  committed_.clear();
  partitions_.ForEach([](uint32_t, Partition& p) { p.stats = PartitionStats{}; });
}

}  // namespace sluice
