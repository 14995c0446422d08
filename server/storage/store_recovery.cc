// ShuffleStore's recovery (docs/storage.md, "Recovery"): how a shuffle directory becomes a
// store again at a start or a reopen. The commit log is the only source of truth; this file
// rebuilds the store's state from it and the data file and reclaims what no commit owns, and
// nothing else of the store changes here.
#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/storage/block_format.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<ShuffleStore>> ShuffleStore::Open(const std::string& dir,
                                                                 const std::string& shown,
                                                                 const StoreOptions& options,
                                                                 OpenCheck check) {
  SLUICE_ASSIGN_OR_RETURN(ShuffleParams params, ReadParams(dir, shown));
  std::unique_ptr<ShuffleStore> store(new ShuffleStore(dir, shown, params, options));
  if (const std::string evicted = absl::StrCat(dir, "/", kEvictedFile); file::Exists(evicted)) {
    const std::string shown_path = absl::StrCat(shown, "/", kEvictedFile);
    SLUICE_ASSIGN_OR_RETURN(std::string encoded,
                            file::ReadFile(evicted, kMaxEvictedFile, shown_path));
    SLUICE_ASSIGN_OR_RETURN(store->evicted_,
                            DecodeEvicted(encoded, params.num_partitions, shown_path));
  }
  SLUICE_ASSIGN_OR_RETURN(file::Fd dir_fd, file::OpenDirectory(dir, shown));
  SLUICE_RETURN_IF_ERROR(store->Recover(dir_fd.get(), check));
  return store;
}

absl::StatusOr<ShuffleParams> ShuffleStore::ReadParams(const std::string& dir,
                                                       const std::string& shown) {
  const std::string shown_path = absl::StrCat(shown, "/", kParamsFile);
  SLUICE_ASSIGN_OR_RETURN(std::string encoded, file::ReadFile(absl::StrCat(dir, "/", kParamsFile),
                                                              kMaxParamsFile, shown_path));
  return DecodeParams(encoded, shown_path);
}

absl::Status ShuffleStore::VerifyBlock(uint32_t mapper, uint64_t attempt, BlockRef* block_ref,
                                       bool payload) const {
  // The block's header and its frame's: what a version 3 log does not say.
  SLUICE_ASSIGN_OR_RETURN(const FrameHeader header, ReadBlockHeaders(mapper, attempt, *block_ref));
  block_ref->uncompressed = header.uncompressed_size;
  if (!payload) return absl::OkStatus();
  std::string frame;
  return ReadFrame(*block_ref, &frame);
}

absl::Status ShuffleStore::Recover(int dir_fd, OpenCheck check) {
  // 1. The data file, if there is one.
  const bool data_existed = file::ExistsAt(dir_fd, kDataFile);
  uint64_t data_size = 0;
  if (data_existed) {
    SLUICE_ASSIGN_OR_RETURN(data_fd_, file::OpenAt(dir_fd, kDataFile, DataName()));
    SLUICE_ASSIGN_OR_RETURN(data_size, file::FileSize(data_fd_.get(), DataName()));
  }

  // 2. The commit log (CommitLog::Open refuses a log that lost acknowledged records, cuts a
  //    torn tail and refuses corruption before it).
  std::vector<CommitRecord> records;
  SLUICE_ASSIGN_OR_RETURN(
      log_, CommitLog::Open(dir_fd, shown_dir_, LogOptions(), data_size > 0, &records));

  // 3. The first commit record of each mapper is its commit; prepared attempts of mappers
  //    without one wait for their decision.
  std::vector<CommitRecord> commits, prepared, repairs, merges;
  std::set<std::pair<uint32_t, uint64_t>> revoked;
  SLUICE_RETURN_IF_ERROR(
      SortRecords(std::move(records), &commits, &prepared, &repairs, &revoked, &merges));
  if (!data_existed && !(commits.empty() && prepared.empty() && repairs.empty())) {
    return absl::DataLossError(
        absl::StrCat(log_->path(), " commits ", commits.size(), " mappers and prepares ",
                     prepared.size(), " attempts but the data file ", DataName(), " is missing"));
  }
  if (!data_existed) {
    SLUICE_ASSIGN_OR_RETURN(data_fd_, file::OpenAt(dir_fd, kDataFile, DataName()));
    if (options_.fsync) SLUICE_RETURN_IF_ERROR(file::SyncFd(dir_fd, shown_dir_));
  }

  // 4. Every committed block must lie within the data file. Its bytes are not read: a fetch
  //    checks every frame it reads, and the scrub walks them in the background. A version 3
  //    log lacks the frames' uncompressed sizes: their headers are read (not their payloads).
  //    A reopen after a failed disk write reads every byte back (kEveryByte): the failed
  //    sync may have lost pages a record names.
  const bool headers = log_->version() < 4 || check == OpenCheck::kEveryByte;
  for (auto* list : {&commits, &prepared, &repairs}) {
    for (CommitRecord& c : *list) {
      for (BlockRef& b : c.blocks) {
        if (b.offset > data_size ||
            kBlockHeaderSize + uint64_t{b.frame_size} > data_size - b.offset) {
          return absl::DataLossError(
              absl::StrCat("committed block of mapper ", c.mapper, " for partition ", b.partition,
                           " at ", DataName(), ":", b.offset, " ends past the end of the file (",
                           data_size, " bytes): the data file was cut short"));
        }
        if (headers) {
          SLUICE_RETURN_IF_ERROR(
              VerifyBlock(c.mapper, c.attempt, &b, check == OpenCheck::kEveryByte));
        }
      }
    }
  }

  // 5. The index (each partition's sized exactly), and the bytes no commit owns given back.
  std::lock_guard<std::mutex> lock(commit_mu_);
  {
    std::vector<uint32_t> frames(params_.num_partitions, 0);
    std::vector<uint64_t> bounds(params_.num_partitions, 0);
    for (const auto* list : {&commits, &repairs}) {
      for (const CommitRecord& c : *list) {
        for (const BlockRef& b : c.blocks) {
          ++frames[b.partition];
          bounds[b.partition] += b.bounds.size();
        }
      }
    }
    for (uint32_t p = 0; p < params_.num_partitions; ++p) {
      if (frames[p] != 0) ReserveIndexLocked(partitions_.Get(p), frames[p], bounds[p]);
    }
  }
  for (const CommitRecord& c : commits) AddCommitLocked(c.mapper, c.attempt, c.blocks);
  // A repair adds a partition's blocks to its mapper's commit (or is the commit, for a mapper
  // this server never held): the same attempt, once per partition.
  for (const CommitRecord& c : repairs) {
    auto committed = committed_.find(c.mapper);
    if (committed != committed_.end() && committed->second != c.attempt) {
      return absl::DataLossError(absl::StrCat(log_->path(), " repairs mapper ", c.mapper,
                                              " with attempt ", c.attempt, " but attempt ",
                                              committed->second, " is committed"));
    }
    if (!repaired_[c.partition].insert(c.mapper).second) continue;  // (never written twice)
    AddCommitLocked(c.mapper, c.attempt, c.blocks);
  }
  for (CommitRecord& c : prepared) prepared_[c.mapper][c.attempt] = std::move(c.blocks);
  revoked_ = std::move(revoked);
  // The pre-merged runs that still stand for their mappers (a copy of committed data: a run that
  // does not is dropped, not the shuffle's damage).
  RecoverMergedLocked(std::move(merges), data_size, check == OpenCheck::kEveryByte);
  return ReclaimUnowned();
}

absl::Status ShuffleStore::SortRecords(std::vector<CommitRecord> records,
                                       std::vector<CommitRecord>* commits,
                                       std::vector<CommitRecord>* prepared,
                                       std::vector<CommitRecord>* repairs,
                                       std::set<std::pair<uint32_t, uint64_t>>* revoked,
                                       std::vector<CommitRecord>* merges) const {
  const std::string& log_path = log_->path();
  std::set<uint32_t> taken;
  std::set<std::pair<uint32_t, uint64_t>> seen_prepared;
  // A revoked attempt's records own nothing (their bytes are reclaimed below). A prepared record
  // is decided (not pending) when a commit or repair of its mapper follows it: revocations do
  // not bring back an attempt that lost before.
  std::map<uint32_t, size_t> last_commit;  // mapper -> index of its last commit or repair
  for (size_t i = 0; i < records.size(); ++i) {
    const CommitRecord& r = records[i];
    if (r.revoke) revoked->emplace(r.mapper, r.attempt);
    if (!r.prepared && !r.revoke) last_commit[r.mapper] = i;  // (a repair commits it too)
  }
  for (size_t i = 0; i < records.size(); ++i) {
    CommitRecord& r = records[i];
    if (r.merge) {
      const bool fits = r.partition < params_.num_partitions &&
                        (params_.num_mappers == 0 || r.last_mapper < params_.num_mappers) &&
                        r.attempts.size() == uint64_t{r.last_mapper} - r.mapper + 1 &&
                        std::all_of(r.blocks.begin(), r.blocks.end(), [&](const BlockRef& b) {
                          return b.partition == r.partition &&
                                 b.frame_size <= kFrameHeaderSize + uint64_t{kMaxFrameCapBytes};
                        });
      if (!fits) {
        return absl::DataLossError(absl::StrCat(log_path, " lists a pre-merged run of partition ",
                                                r.partition, " beyond the shuffle's ",
                                                params_.num_partitions, " partitions and ",
                                                params_.num_mappers, " mappers"));
      }
      merges->push_back(std::move(r));
      continue;
    }
    if (r.mapper == kMergedMapper) {
      return absl::DataLossError(
          absl::StrCat(log_path, " commits mapper ", r.mapper, ", an id no mapper has"));
    }
    if (r.revoke) {
      if (params_.num_mappers != 0 && r.mapper >= params_.num_mappers) {
        return absl::DataLossError(absl::StrCat(log_path, " revokes mapper ", r.mapper,
                                                ", beyond the ", params_.num_mappers,
                                                " mappers of the shuffle"));
      }
      continue;
    }
    const bool gone = revoked->count({r.mapper, r.attempt}) != 0;
    if (params_.num_mappers != 0 && r.mapper >= params_.num_mappers) {
      return absl::DataLossError(absl::StrCat(log_path, " commits mapper ", r.mapper,
                                              ", beyond the ", params_.num_mappers,
                                              " mappers of the shuffle"));
    }
    for (const BlockRef& b : r.blocks) {
      if (b.partition >= params_.num_partitions || (r.repair && b.partition != r.partition)) {
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
    if (r.repair) {
      if (r.partition >= params_.num_partitions) {
        return absl::DataLossError(absl::StrCat(log_path, " repairs partition ", r.partition,
                                                ", beyond the ", params_.num_partitions,
                                                " of the shuffle"));
      }
      if (!gone) repairs->push_back(std::move(r));
    } else if (r.prepared) {
      // Decided already (its blocks, if it won, are the commit's), or a repeat: not pending.
      auto decided = last_commit.find(r.mapper);
      if (gone || (decided != last_commit.end() && decided->second > i) ||
          !seen_prepared.emplace(r.mapper, r.attempt).second) {
        continue;
      }
      prepared->push_back(std::move(r));
    } else if (!gone && taken.insert(r.mapper).second) {
      commits->push_back(std::move(r));  // a later record for a mapper is never visible
    }
  }
  return absl::OkStatus();
}

absl::Status ShuffleStore::ReclaimUnowned() {
  // Bytes no commit owns belong to attempts that broke or were in flight at a crash: cut the
  // data file after its last committed block and punch out the gaps. (Pre-merged runs are owned
  // too, but are the server's copy: not counted in the tenant's held bytes.)
  struct Owned {
    uint64_t from, to;
    bool held;
    bool operator<(const Owned& o) const { return from < o.from; }
  };
  std::vector<Owned> owned;
  partitions_.ForEach([&owned](uint32_t, Partition& p) {
    for (const IndexEntry& e : p.index) {
      owned.push_back(Owned{e.offset, e.offset + kBlockHeaderSize + e.frame_size, true});
    }
    for (const auto& r : p.merged) {
      for (const BlockRef& b : r->blocks) {
        owned.push_back(Owned{b.offset, b.offset + kBlockHeaderSize + b.frame_size, false});
      }
    }
  });
  for (const auto& [mapper, attempts] : prepared_) {  // waiting for their decision
    for (const auto& [attempt, blocks] : attempts) {
      for (const BlockRef& b : blocks) {
        owned.push_back(Owned{b.offset, b.offset + kBlockHeaderSize + b.frame_size, true});
      }
    }
  }
  std::sort(owned.begin(), owned.end());
  const std::string& name = DataName();
  SLUICE_ASSIGN_OR_RETURN(const uint64_t size, file::FileSize(data_fd_.get(), name));
  uint64_t cursor = 0, kept = 0;
  for (const auto& [from, to, held] : owned) {
    if (from > cursor) {
      SLUICE_RETURN_IF_ERROR(file::PunchHole(data_fd_.get(), name, cursor, from - cursor));
    }
    if (to > cursor && held) kept += to - std::max(cursor, from);
    cursor = std::max(cursor, to);
  }
  Hold(static_cast<int64_t>(kept) - held_.load());
  if (size > cursor) {
    SLUICE_RETURN_IF_ERROR(file::Truncate(data_fd_.get(), name, cursor));
    if (options_.fsync) SLUICE_RETURN_IF_ERROR(file::SyncData(data_fd_.get(), name));
  }
  std::lock_guard<std::mutex> lock(data_mu_);
  data_end_ = cursor;
  return absl::OkStatus();
}

}  // namespace sluice
