// ShuffleStore's index (shuffle_store.h): each partition's committed blocks as the commits and
// the recovery add them (with their key bounds and the partition's hot-key sketch), and what is
// read from it (committed blocks, samples for a split plan, stats, hot keys). The write path and
// the decisions are in shuffle_store.cc, the recovery in store_recovery.cc.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/key_bounds.h"
#include "server/storage/shuffle_id.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

void ShuffleStore::AddCommitLocked(uint32_t mapper, uint64_t attempt,
                                   absl::Span<const BlockRef> blocks) {
  for (const BlockRef& b : blocks) {
    Partition& p = partitions_.Get(b.partition);
    p.stats.records += b.records;
    p.stats.bytes += b.frame_size;
    p.stats.frames += 1;
    if (!p.index.empty() && p.index.back().mapper > mapper) p.sorted = false;
    const size_t capacity = p.index.capacity();
    const size_t bounds_capacity = p.bounds.capacity();
    const size_t hot_capacity = p.hot.capacity();
    // (Bounds that are not one whole valid encoding are taken as not known.)
    uint32_t at = kNoBounds;
    if (!b.bounds.empty() && KeyBoundsSize(b.bounds) == b.bounds.size() &&
        p.bounds.size() + b.bounds.size() < kNoBounds) {
      at = static_cast<uint32_t>(p.bounds.size());
      p.bounds += b.bounds;
      AddHotKey(p, b.bounds);
    }
    p.index.push_back(IndexEntry{mapper, b.frame_size, b.offset, b.records, b.uncompressed, at});
    if (p.index.capacity() != capacity || p.bounds.capacity() != bounds_capacity ||
        p.hot.capacity() != hot_capacity) {
      AddIndexBytes(static_cast<int64_t>((p.index.capacity() - capacity) * sizeof(IndexEntry)) +
                    static_cast<int64_t>(p.bounds.capacity() - bounds_capacity) +
                    static_cast<int64_t>((p.hot.capacity() - hot_capacity) * sizeof(HotKey)));
    }
  }
  for (const BlockRef& b : blocks) {
    Partition& p = partitions_.Get(b.partition);
    p.read_since_commit = false;
    MarkMergeCandidateLocked(b.partition, p);
  }
  committed_.emplace(mapper, attempt);
  if (params_.num_mappers != 0 && committed_.size() == params_.num_mappers) {
    // The last mapper: a partition's whole range may be merged now.
    partitions_.ForEach([this](uint32_t i, Partition& p) {
      if (!p.index.empty()) MarkMergeCandidateLocked(i, p);
    });
  }
}

void ShuffleStore::ReserveIndexLocked(Partition& p, size_t frames, uint64_t bounds_bytes) {
  const size_t capacity = p.index.capacity();
  const size_t bounds_capacity = p.bounds.capacity();
  p.index.reserve(p.index.size() + frames);
  p.bounds.reserve(p.bounds.size() + std::min<uint64_t>(bounds_bytes, kNoBounds));
  AddIndexBytes(static_cast<int64_t>((p.index.capacity() - capacity) * sizeof(IndexEntry)) +
                static_cast<int64_t>(p.bounds.capacity() - bounds_capacity));
}

void ShuffleStore::AddIndexBytes(int64_t delta) {
  if (delta == 0) return;
  index_bytes_.fetch_add(static_cast<uint64_t>(delta), std::memory_order_relaxed);
  if (options_.index_total != nullptr) options_.index_total->fetch_add(delta);
}

std::string_view ShuffleStore::BoundsOf(const Partition& p, const IndexEntry& e) {
  if (e.bounds_at == kNoBounds) return {};
  const std::string_view rest = std::string_view(p.bounds).substr(e.bounds_at);
  return rest.substr(0, KeyBoundsSize(rest));
}

BlockRef ShuffleStore::RefOf(uint32_t partition, const Partition& p, const IndexEntry& e,
                             bool with_bounds) {
  return BlockRef{partition,      e.frame_size,
                  e.offset,       e.records,
                  e.uncompressed, with_bounds ? std::string(BoundsOf(p, e)) : std::string()};
}

void ShuffleStore::SortIndexLocked(Partition& p) {
  if (p.sorted) return;
  std::stable_sort(p.index.begin(), p.index.end(),
                   [](const IndexEntry& a, const IndexEntry& b) { return a.mapper < b.mapper; });
  p.sorted = true;
}

std::vector<BlockRef> ShuffleStore::CommittedBlocks(uint32_t partition) const {
  std::vector<uint32_t> mappers;
  return *CommittedBlocksOf(partition, {}, &mappers);  // (all mappers: it cannot fail)
}

absl::StatusOr<std::vector<BlockRef>> ShuffleStore::CommittedBlocksOf(
    uint32_t partition, const std::vector<uint32_t>& only, std::vector<uint32_t>* mappers,
    std::vector<uint64_t>* attempts, bool with_bounds,
    std::vector<std::shared_ptr<const MergedRun>>* merged) const {
  std::vector<BlockRef> out;
  std::lock_guard<std::mutex> lock(commit_mu_);
  mappers->clear();
  if (attempts != nullptr) attempts->clear();
  if (only.empty()) {
    for (const auto& [mapper, attempt] : committed_) {
      mappers->push_back(mapper);
      if (attempts != nullptr) attempts->push_back(attempt);
    }
  } else {
    for (size_t i = 0; i < only.size(); ++i) {
      const uint32_t m = only[i];
      auto c = committed_.find(m);
      if (c == committed_.end()) {
        return absl::AbortedError(absl::StrCat("mapper ", m, " of shuffle '",
                                               ShuffleName(params_.shuffle_id), "'",
                                               " is not committed on this server"));
      }
      if (attempts != nullptr) attempts->push_back(c->second);
    }
    *mappers = only;
  }
  Partition* p = partitions_.Find(partition);
  if (p == nullptr) return out;
  SortIndexLocked(*p);
  // The pre-merged runs whose whole range is read (the mappers read are sorted, without repeats).
  std::vector<const MergedRun*> runs;
  if (merged != nullptr) {
    p->read_since_commit = true;  // (its reduce has begun: the pre-merge leaves it alone)
    for (const auto& r : p->merged) {
      auto at = std::lower_bound(mappers->begin(), mappers->end(), r->first);
      const size_t span = r->last - r->first;
      if (at != mappers->end() && *at == r->first &&
          static_cast<size_t>(mappers->end() - at) > span && *(at + span) == r->last) {
        runs.push_back(r.get());
        merged->push_back(r);
      }
    }
  }
  out.reserve(p->index.size());
  size_t run = 0;
  const auto take_runs_before = [&](uint64_t m) {
    for (; run < runs.size() && runs[run]->first <= m; ++run) {
      for (const BlockRef& b : runs[run]->blocks) {
        out.push_back(b);
        if (!with_bounds) out.back().bounds.clear();
      }
    }
  };
  for (const IndexEntry& e : p->index) {
    if (!only.empty() && !std::binary_search(only.begin(), only.end(), e.mapper)) continue;
    take_runs_before(e.mapper);
    if (run > 0 && e.mapper <= runs[run - 1]->last) continue;  // in a run taken
    out.push_back(RefOf(partition, *p, e, with_bounds));
  }
  take_runs_before(UINT64_MAX);
  return out;
}

std::vector<uint32_t> ShuffleStore::CommittedMappers() const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  std::vector<uint32_t> out;
  out.reserve(committed_.size());
  for (const auto& [mapper, attempt] : committed_) out.push_back(mapper);
  return out;
}

void ShuffleStore::AddHotKey(Partition& p, std::string_view bounds) {
  const HeavyKey h = ReadHeavyKey(bounds);
  if (h.records == 0) return;
  for (HotKey& k : p.hot) {
    if (k.cut == h.cut && k.key == h.key) {
      k.records += h.records;
      k.bytes += h.bytes;
      return;
    }
  }
  if (p.hot.size() < kHotKeysKept) {
    if (p.hot.capacity() == 0) p.hot.reserve(kHotKeysKept);
    p.hot.push_back(HotKey{std::string(h.key), h.cut, h.records, h.bytes, 0});
    return;
  }
  // Space-saving: the key takes the place of the least one, whose count it inherits as its error.
  HotKey& least =
      *std::min_element(p.hot.begin(), p.hot.end(),
                        [](const HotKey& a, const HotKey& b) { return a.records < b.records; });
  least.key.assign(h.key);
  least.cut = h.cut;
  least.error = least.records;
  least.records += h.records;
  least.bytes += h.bytes;
}

std::vector<HotKey> ShuffleStore::HotKeys(uint32_t partition, size_t most) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  const Partition* p = partitions_.Find(partition);
  if (p == nullptr) return {};
  std::vector<HotKey> out = p->hot;
  std::sort(out.begin(), out.end(),
            [](const HotKey& a, const HotKey& b) { return a.records > b.records; });
  if (out.size() > most) out.resize(most);
  return out;
}

ShuffleStore::BlockSample ShuffleStore::SampleBlocks(uint32_t partition, size_t max) const {
  BlockSample out;
  std::lock_guard<std::mutex> lock(commit_mu_);
  Partition* p = partitions_.Find(partition);
  if (p == nullptr || max == 0) return out;
  SortIndexLocked(*p);
  out.stats = p->stats;
  out.stride = std::max<uint64_t>(1, (p->index.size() + max - 1) / max);
  out.blocks.reserve(std::min(max, p->index.size()));
  for (size_t i = 0; i < p->index.size(); i += out.stride) {
    out.blocks.push_back(RefOf(partition, *p, p->index[i], /*with_bounds=*/true));
  }
  return out;
}

PartitionStats ShuffleStore::Stats(uint32_t partition) const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  const Partition* p = partitions_.Find(partition);
  return p != nullptr ? p->stats : PartitionStats{};
}

PartitionStats ShuffleStore::ReportedStats(uint32_t partition) const {
  const PartitionStats here = Stats(partition);
  if (here.frames != 0 || !evicted_ || partition >= evicted_->partitions.size()) return here;
  return evicted_->partitions[partition];
}

std::set<uint32_t> ShuffleStore::RepairedAnywhere() const {
  std::lock_guard<std::mutex> lock(commit_mu_);
  std::set<uint32_t> out;
  for (const auto& [q, mappers] : repaired_) out.insert(mappers.begin(), mappers.end());
  return out;
}

EvictedSummary ShuffleStore::SummaryForEviction() const {
  EvictedSummary out;
  out.partitions.resize(params_.num_partitions);
  for (uint32_t q = 0; q < params_.num_partitions; ++q) out.partitions[q] = ReportedStats(q);
  std::lock_guard<std::mutex> lock(commit_mu_);
  out.winners = committed_;
  if (evicted_) {
    for (const auto& [m, attempt] : evicted_->winners) {
      if (revoked_.count({m, attempt}) == 0) out.winners.emplace(m, attempt);  // (not replaced)
    }
  }
  return out;
}

std::vector<std::pair<uint32_t, uint64_t>> ShuffleStore::EvictedLacking(uint32_t partition) const {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  if (!evicted_) return out;
  const EvictedSummary now = SummaryForEviction();
  std::lock_guard<std::mutex> lock(commit_mu_);
  auto repaired = repaired_.find(partition);
  std::set<uint32_t> repaired_any;
  for (const auto& [q, mappers] : repaired_) repaired_any.insert(mappers.begin(), mappers.end());
  for (const auto& [m, attempt] : now.winners) {
    auto c = committed_.find(m);
    const bool back = repaired != repaired_.end() && repaired->second.count(m) != 0;
    // (Pushed since the eviction: not come by a repair of any partition.)
    const bool pushed = repaired_any.count(m) == 0;
    if (c != committed_.end() && c->second == attempt && (back || pushed)) continue;
    out.emplace_back(m, attempt);
  }
  return out;
}

bool ShuffleStore::EvictedPartitionHere(uint32_t partition) const {
  return EvictedLacking(partition).empty();
}

std::vector<uint32_t> ShuffleStore::ReportedMappers() const {
  const EvictedSummary now = SummaryForEviction();
  std::vector<uint32_t> out;
  for (const auto& [m, attempt] : now.winners) out.push_back(m);
  return out;
}

}  // namespace sluice
