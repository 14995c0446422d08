// ShuffleStore's pre-merged runs (docs/storage.md, "Pre-merged runs"): what a background merge
// reads (PlanMerge), how its output becomes visible atomically (InstallMerge: a MERGE record,
// then the index), when a run stops standing for its mappers (revocations and repairs retire it)
// and how a start finds the runs that still stand (RecoverMergedLocked). The merge itself is
// server/rules/premerge.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/key_bounds.h"
#include "server/storage/block_format.h"
#include "server/storage/shuffle_id.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

std::shared_ptr<MergedRun> ShuffleStore::NewMergedRun(CommitRecord record) {
  auto* run = new MergedRun;
  run->partition = record.partition;
  run->first = record.mapper;
  run->last = record.last_mapper;
  run->level = record.level;
  run->id = record.attempt;
  run->attempts = std::move(record.attempts);
  run->repaired = std::move(record.repaired);
  run->blocks = std::move(record.blocks);
  run->memory = sizeof(MergedRun) + run->attempts.size() * sizeof(uint64_t) +
                run->repaired.size() * sizeof(uint32_t);
  for (const BlockRef& b : run->blocks) {
    run->bytes += kBlockHeaderSize + b.frame_size;
    run->records += b.records;
    run->memory += sizeof(BlockRef) + b.bounds.capacity();
  }
  merged_bytes_.fetch_add(run->bytes, std::memory_order_relaxed);
  AddIndexBytes(static_cast<int64_t>(run->memory));
  // The store outlives every holder: the index, and reads and merges that hold the store.
  return std::shared_ptr<MergedRun>(run, [this](MergedRun* r) {
    // (A run still standing goes with the store or its deletion, which count it out.)
    if (r->retired.load() && !destroyed_.load()) {
      merged_bytes_.fetch_sub(r->bytes, std::memory_order_relaxed);
      AddIndexBytes(-static_cast<int64_t>(r->memory));
      PunchBlocks(r->blocks, /*held=*/false);
    }
    delete r;
  });
}

void ShuffleStore::RetireMergedLocked(Partition& p, uint32_t first, uint32_t last) {
  auto gone = std::remove_if(p.merged.begin(), p.merged.end(), [&](const auto& r) {
    if (r->last < first || r->first > last) return false;
    r->retired.store(true);
    return true;
  });
  p.merged.erase(gone, p.merged.end());
}

void ShuffleStore::AddMergedRunLocked(CommitRecord record) {
  Partition& p = partitions_.Get(record.partition);
  RetireMergedLocked(p, record.mapper, record.last_mapper);  // the runs it took in
  std::shared_ptr<MergedRun> run = NewMergedRun(std::move(record));
  auto at = std::lower_bound(p.merged.begin(), p.merged.end(), run->first,
                             [](const auto& a, uint32_t m) { return a->first < m; });
  p.merged.insert(at, std::move(run));
}

void ShuffleStore::MarkMergeCandidateLocked(uint32_t partition, Partition& p) {
  if (p.merge_candidate) return;
  p.merge_candidate = true;
  merge_candidates_.push_back(partition);
}

std::vector<uint32_t> ShuffleStore::TakeMergeCandidates() {
  std::lock_guard<std::mutex> lock(commit_mu_);
  std::vector<uint32_t> out;
  out.swap(merge_candidates_);
  for (uint32_t i : out) {
    if (Partition* p = partitions_.Find(i); p != nullptr) p->merge_candidate = false;
  }
  std::sort(out.begin(), out.end());
  return out;
}

void ShuffleStore::MarkMergeCandidate(uint32_t partition) {
  std::lock_guard<std::mutex> lock(commit_mu_);
  if (Partition* p = partitions_.Find(partition); p != nullptr)
    MarkMergeCandidateLocked(partition, *p);
}

bool ShuffleStore::complete() const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  return params_.num_mappers != 0 && committed_.size() == params_.num_mappers;
}

bool ShuffleStore::ReadSinceCommit(uint32_t partition) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  const Partition* p = partitions_.Find(partition);
  return p != nullptr && p->read_since_commit;
}

std::vector<std::vector<MergeUnit>> ShuffleStore::MergeStretches(uint32_t partition) const {
  std::vector<std::vector<MergeUnit>> out;
  std::lock_guard<std::mutex> lock(commit_mu_);
  Partition* p = partitions_.Find(partition);
  if (p == nullptr || destroyed_.load() || p->read_since_commit) return out;
  SortIndexLocked(*p);
  size_t e = 0, r = 0;  // the next index entry, the next pre-merged run
  bool have_last = false;
  uint32_t last = 0;
  for (auto c = committed_.begin(); c != committed_.end();) {
    const uint32_t m = c->first;
    if (!have_last || m != last + 1) out.emplace_back();  // a new stretch
    while (r < p->merged.size() && p->merged[r]->last < m) ++r;
    if (r < p->merged.size() && p->merged[r]->first == m) {
      const MergedRun& run = *p->merged[r];
      out.back().push_back(MergeUnit{run.first, run.last, run.bytes, run.level, 1});
      last = run.last;
      have_last = true;
      c = committed_.upper_bound(run.last);
      ++r;
      continue;
    }
    MergeUnit u{m, m, 0, 0, 0};
    while (e < p->index.size() && p->index[e].mapper < m) ++e;
    for (const size_t from = e; e < p->index.size() && p->index[e].mapper == m; ++e) {
      u.bytes += kBlockHeaderSize + p->index[e].frame_size;
      // A new run unless its bounds follow the frame before (as a KEY read chains them).
      if (e == from ||
          !FollowsInKeyOrder(BoundsOf(*p, p->index[e - 1]), BoundsOf(*p, p->index[e]))) {
        ++u.runs;
      }
    }
    out.back().push_back(u);
    last = m;
    have_last = true;
    ++c;
  }
  return out;
}

absl::StatusOr<ShuffleStore::MergePlan> ShuffleStore::PlanMerge(uint32_t partition, uint32_t first,
                                                                uint32_t last) {
  MergePlan plan;
  std::lock_guard<std::mutex> lock(commit_mu_);
  if (destroyed_.load()) return DeletedError();
  if (!merges_supported()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the commit log of shuffle '", ShuffleName(params_.shuffle_id), "' is version ",
        log_->version(), ", older than pre-merged runs (", kFirstMergeLogVersion, ")"));
  }
  if (partition >= params_.num_partitions || last < first) {
    return absl::InvalidArgumentError("a merge of no mapper, or of no partition of the shuffle");
  }
  CommitRecord& r = plan.record;
  r.merge = true;
  r.partition = partition;
  r.mapper = first;
  r.last_mapper = last;
  r.attempt = next_merge_id_++;
  r.level = 1;
  r.attempts.reserve(last - first + 1);
  for (uint64_t m = first; m <= last; ++m) {
    auto c = committed_.find(static_cast<uint32_t>(m));
    if (c == committed_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("mapper ", m, " of the merge's range is not committed"));
    }
    r.attempts.push_back(c->second);
  }
  if (auto it = repaired_.find(partition); it != repaired_.end()) {
    for (auto m = it->second.lower_bound(first); m != it->second.end() && *m <= last; ++m) {
      r.repaired.push_back(*m);
    }
  }
  Partition* p = partitions_.Find(partition);
  if (p == nullptr) return plan;
  SortIndexLocked(*p);
  size_t run = 0;
  for (const auto& m : p->merged) {
    if (m->last < first || m->first > last) continue;
    if (m->first < first || m->last > last) {
      return absl::FailedPreconditionError(
          "a pre-merged run crosses the ends of the merge's range");
    }
    plan.inputs.push_back(m);
    r.level = std::max(r.level, m->level + 1);
  }
  auto e = std::lower_bound(p->index.begin(), p->index.end(), first,
                            [](const IndexEntry& a, uint32_t m) { return a.mapper < m; });
  for (; e != p->index.end() && e->mapper <= last; ++e) {
    // A pre-merged run's blocks in the place of its first mapper's.
    while (run < plan.inputs.size() && plan.inputs[run]->first <= e->mapper) {
      for (const BlockRef& b : plan.inputs[run]->blocks) plan.blocks.push_back(b);
      ++run;
    }
    if (run > 0 && e->mapper <= plan.inputs[run - 1]->last) continue;
    plan.blocks.push_back(RefOf(partition, *p, *e, /*with_bounds=*/true));
  }
  for (; run < plan.inputs.size(); ++run) {
    for (const BlockRef& b : plan.inputs[run]->blocks) plan.blocks.push_back(b);
  }
  for (const BlockRef& b : plan.blocks) plan.bytes += kBlockHeaderSize + b.frame_size;
  return plan;
}

absl::Status ShuffleStore::AppendMerged(uint64_t id, absl::Span<const FrameToAppend> frames,
                                        std::vector<BlockRef>* blocks) {
  return AppendFrames(kMergedMapper, id, frames, blocks, /*held=*/false);
}

bool ShuffleStore::MergeStillHoldsLocked(const CommitRecord& r) const {
  for (uint64_t m = r.mapper; m <= r.last_mapper; ++m) {
    auto c = committed_.find(static_cast<uint32_t>(m));
    if (c == committed_.end() || c->second != r.attempts[m - r.mapper]) return false;
  }
  std::vector<uint32_t> repaired;
  if (auto it = repaired_.find(r.partition); it != repaired_.end()) {
    for (auto m = it->second.lower_bound(r.mapper); m != it->second.end() && *m <= r.last_mapper;
         ++m) {
      repaired.push_back(*m);
    }
  }
  return repaired == r.repaired;
}

absl::StatusOr<bool> ShuffleStore::InstallMerge(MergePlan plan, std::vector<BlockRef> blocks) {
  CommitRecord& r = plan.record;
  r.blocks = std::move(blocks);
  const auto still = [&] {
    if (destroyed_.load() || !MergeStillHoldsLocked(r)) return false;
    return std::none_of(plan.inputs.begin(), plan.inputs.end(),
                        [](const auto& in) { return in->retired.load(); });
  };
  {
    std::lock_guard<std::mutex> lock(commit_mu_);
    if (!still()) {
      DiscardMerged(r.blocks);
      return false;
    }
  }
  // Durable (the data synced first) before it is visible. Should a revocation or repair come
  // between, the record no longer stands, here or at the next start (RecoverMergedLocked).
  const absl::Status written = log_->AppendAll(absl::MakeConstSpan(&r, 1));
  if (!written.ok()) {
    // The record may or may not have reached the disk: the blocks stay until the next open.
    return written;
  }
  std::lock_guard<std::mutex> lock(commit_mu_);
  if (!still()) {
    // A revocation, a repair or a later merge: the record does not stand at a start either.
    DiscardMerged(r.blocks);
    return false;
  }
  AddMergedRunLocked(std::move(r));
  return true;
}

ShuffleStore::MergedStats ShuffleStore::Merged(uint32_t partition) const {
  MergedStats out;
  std::lock_guard<std::mutex> lock(commit_mu_);
  const Partition* p = partitions_.Find(partition);
  if (p == nullptr) return out;
  for (const auto& r : p->merged) {
    ++out.runs;
    out.mappers += r->last - r->first + 1;
    out.bytes += r->bytes;
  }
  return out;
}

void ShuffleStore::RecoverMergedLocked(std::vector<CommitRecord> merges, uint64_t data_size,
                                       bool check) {
  for (CommitRecord& r : merges) {
    next_merge_id_ = std::max(next_merge_id_, r.attempt + 1);
    if (!MergeStillHoldsLocked(r)) continue;  // a mapper of its range changed since
    bool whole = true;
    for (const BlockRef& b : r.blocks) {
      if (b.offset > data_size ||
          kBlockHeaderSize + uint64_t{b.frame_size} > data_size - b.offset) {
        whole = false;  // (its commits' blocks are checked as damage; this is a copy of them)
        break;
      }
      if (check && !ReadBlockHeaders(kMergedMapper, r.attempt, b).ok()) {
        whole = false;
        break;
      }
    }
    if (!whole) continue;
    AddMergedRunLocked(std::move(r));  // (retiring an earlier one that it took in)
  }
  // Every partition with data may have runs to merge (the last start may have stopped them).
  partitions_.ForEach([this](uint32_t i, Partition& p) {
    if (!p.index.empty()) MarkMergeCandidateLocked(i, p);
  });
}

}  // namespace sluice
