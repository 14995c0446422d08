#include "server/rules/premerge.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/key_bounds.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

std::optional<std::pair<uint32_t, uint32_t>> PickMerge(
    const std::vector<std::vector<MergeUnit>>& stretches, bool complete, size_t min_runs) {
  min_runs = std::max<size_t>(min_runs, 2);
  for (const std::vector<MergeUnit>& s : stretches) {
    size_t counted = 0;
    bool premerged = false;
    for (const MergeUnit& u : s) {
      counted += u.runs;
      premerged = premerged || u.level > 0;
    }
    // Every mapper committed: the whole partition in one run, once it had min_runs runs.
    if (complete && stretches.size() == 1 && counted >= 2 && (counted >= min_runs || premerged)) {
      return std::make_pair(s.front().first, s.back().last);
    }
    if (counted < min_runs) continue;
    // The first window of adjacent units of one level holding at least min_runs runs (a
    // mapper of many sorted flushes may be one on its own).
    size_t from = 0, runs = 0;
    uint32_t level = 0;
    std::optional<size_t> last;  // the window's last counted unit
    for (size_t i = 0; i <= s.size(); ++i) {
      if (i < s.size() && s[i].runs == 0) continue;
      if (i == s.size() || runs == 0 || s[i].level != level) {
        if (runs >= min_runs) return std::make_pair(s[from].first, s[*last].last);
        if (i == s.size()) break;
        from = i;
        runs = 0;
        level = s[i].level;
      }
      runs += s[i].runs;  // (a mapper with nothing for the partition: 0, it joins any range)
      last = i;
      if (runs >= min_runs && (i + 1 == s.size() || s[i + 1].level != level)) {
        return std::make_pair(s[from].first, s[i].last);
      }
    }
  }
  return std::nullopt;
}

void Premerger::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_.store(true);
  }
  cv_.notify_all();
}

bool Premerger::Pace(std::chrono::steady_clock::time_point start, uint64_t written) {
  const auto due = start + std::chrono::microseconds(written * 1000000 / options_.bytes_per_s);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, due, [this] { return stopped_.load(); });
  return !stopped_.load();
}

size_t Premerger::Run() {
  size_t made = 0;
  registry_->ForEachOpen([&](const std::shared_ptr<ShuffleStore>& store) {
    if (stopped_.load()) return;
    if (!store->merges_supported() || store->wedged()) return;
    const std::vector<uint32_t> candidates = store->TakeMergeCandidates();
    bool later = false;  // no room now: the partitions left wait for a later round
    for (uint32_t partition : candidates) {
      if (stopped_.load() || later ||
          !registry_->CheckRoom(store->params().shuffle_id, options_.disk_mark_pct).ok()) {
        later = true;
        store->MarkMergeCandidate(partition);
        continue;
      }
      if (!store->PartitionDamage(partition).ok()) continue;
      // Merge after merge while the partition calls for one (a level's merge can make the next).
      for (int round = 0;; ++round) {
        if (round == 64 || stopped_.load()) {  // (its turn again next round)
          store->MarkMergeCandidate(partition);
          break;
        }
        const auto pick =
            PickMerge(store->MergeStretches(partition), store->complete(), options_.min_runs);
        if (!pick.has_value()) break;
        const absl::StatusOr<bool> merged = MergeOne(store, partition, pick->first, pick->second);
        if (!merged.ok() && absl::IsResourceExhausted(merged.status())) {
          later = true;  // (no room in the memory budget now)
          store->MarkMergeCandidate(partition);
          break;
        }
        if (!merged.ok() &&
            (absl::IsCancelled(merged.status()) || absl::IsNotFound(merged.status()))) {
          break;  // (the server stops, the shuffle was deleted, a reader came first)
        }
        if (!merged.ok()) {
          spdlog::warn("event=premerge_failed shuffle={} partition={} mappers={}-{} error=\"{}\"",
                       std::string(ShuffleName(store->params().shuffle_id)), partition, pick->first,
                       pick->second, merged.status().ToString());
          break;
        }
        if (!*merged) break;
        ++made;
      }
    }
  });
  return made;
}

absl::StatusOr<bool> Premerger::MergeOne(const std::shared_ptr<ShuffleStore>& store,
                                         uint32_t partition, uint32_t first, uint32_t last) {
  SLUICE_ASSIGN_OR_RETURN(ShuffleStore::MergePlan plan, store->PlanMerge(partition, first, last));
  if (plan.blocks.empty()) return false;
  // Room on the disk for what it will write, or no merge: its run (about its inputs' bytes, an
  // eighth more for a re-encoding that compresses worse, and a frame) and, past the fan-in, a
  // pass's spill as much again. A merge never takes the disk past the mark, and pushes keep the
  // room above it up to --disk_high_water_pct.
  uint64_t planned = plan.bytes + plan.bytes / 8 + 2 * uint64_t{options_.frame_bytes};
  if (plan.blocks.size() > options_.merge.fan_in) planned += plan.bytes;
  if (absl::Status room =
          registry_->CheckRoomFor(store->params().shuffle_id, planned, options_.disk_mark_pct);
      !room.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a pre-merge of ", planned, " bytes: ", room.message()));
  }
  // Room in the server's memory budget for the merge's frames (what it plans to hold, within
  // its limit) and the frame it encodes, or no merge this round: the pre-merge yields to pushes
  // and fetches.
  const uint64_t reserved =
      std::min(StoredBlocksMergeCost(plan.blocks), options_.merge.memory_limit) +
      2 * uint64_t{options_.frame_bytes};
  if (options_.budget != nullptr && !options_.budget->TryReserve(options_.tenant, reserved)) {
    return absl::ResourceExhaustedError("no room in the memory budget for a pre-merge now");
  }
  struct Release {
    const PremergeOptions& o;
    uint64_t n;
    ~Release() {
      if (o.budget != nullptr) o.budget->Release(o.tenant, n);
    }
  } release{options_, reserved};

  struct Active {
    ServerMetrics* m;
    explicit Active(ServerMetrics* metrics) : m(metrics) {
      if (m != nullptr) m->premerging.store(1);
    }
    ~Active() {
      if (m != nullptr) m->premerging.store(0);
    }
  } active(metrics_);
  const auto started = std::chrono::steady_clock::now();
  DecodeOptions dopts;
  dopts.limits = options_.merge.limits;
  FrameDecoder decoder(dopts);
  RunDecoder runs{&decoder, {}, nullptr};
  MergeOptions mopts = options_.merge;
  mopts.cancelled = &stopped_;
  // The merge's own work (reading, decoding, merging, encoding) yields the CPU to every call;
  // what it does under the store's locks and in its group commit runs at the normal priority,
  // so that a commit never waits behind it.
  struct Idle {
    const PremergeOptions& o;
    explicit Idle(const PremergeOptions& options) : o(options) {
      if (o.yield_cpu) o.yield_cpu(true);
    }
    ~Idle() {
      if (o.yield_cpu) o.yield_cpu(false);
    }
  };
  absl::StatusOr<std::unique_ptr<MergedStream>> made;
  {
    Idle idle(options_);
    made = MergeStoredBlocks(store, &plan.blocks, &runs, nullptr, mopts);
  }
  if (!made.ok()) return made.status();
  std::unique_ptr<MergedStream> stream = *std::move(made);
  EncodeOptions eopts;  // what a KEY fetch encodes by default (kPremergedChunkBytes chunks)
  eopts.limits = options_.merge.limits;
  FrameEncoder encoder(eopts);
  std::vector<Record> batch;
  std::string frame, bounds;
  std::vector<std::string_view> keys;
  std::vector<BlockRef> blocks;
  uint64_t written = 0, records = 0;
  const auto fail = [&](absl::Status st) {
    store->DiscardMerged(blocks);
    return st;
  };
  while (true) {
    {
      Idle idle(options_);
      batch.clear();
      absl::StatusOr<bool> more = stream->NextBatch(options_.frame_bytes, &batch);
      if (!more.ok()) return fail(more.status());
      if (!*more) break;
      frame.clear();
      if (absl::Status st = encoder.Encode(batch, &frame); !st.ok()) return fail(st);
      uint64_t uncompressed = 0;
      for (const Record& r : batch) uncompressed += r.key.size() + r.value.size();
      bounds.clear();
      AppendSortedBounds(batch, uncompressed, &bounds, &keys);
    }
    const ShuffleStore::FrameToAppend out{partition, Bytes(frame),
                                          static_cast<uint32_t>(batch.size()), bounds};
    if (absl::Status st =
            store->AppendMerged(plan.record.attempt, absl::MakeConstSpan(&out, 1), &blocks);
        !st.ok()) {
      return fail(st);
    }
    written += frame.size();
    records += batch.size();
    if (!Pace(started, written)) return fail(absl::CancelledError("the server is stopping"));
    if (store->ReadSinceCommit(partition)) {
      return fail(absl::CancelledError("a KEY read of the partition began: it goes first"));
    }
  }
  uint64_t expected = 0;
  for (const BlockRef& b : plan.blocks) expected += b.records;
  if (records != expected) {  // (the index and the frames disagree: never install that)
    return fail(
        absl::InternalError(absl::StrCat("a merge of ", expected, " records made ", records)));
  }
  const size_t inputs = plan.inputs.size();
  const uint64_t read = plan.bytes;
  SLUICE_ASSIGN_OR_RETURN(const bool installed, store->InstallMerge(std::move(plan), blocks));
  if (metrics_ != nullptr) {
    ServerMetrics::Add(metrics_->premerge_read_bytes, read);
    ServerMetrics::Add(metrics_->premerge_bytes, written);
    ServerMetrics::Add(installed ? metrics_->premerges : metrics_->premerges_dropped, 1);
  }
  spdlog::debug(
      "event=premerged shuffle={} partition={} mappers={}-{} runs_in={} records={} bytes={} "
      "installed={} seconds={:.3f}",
      std::string(ShuffleName(store->params().shuffle_id)), partition, first, last, inputs, records,
      written, installed,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return installed;
}

}  // namespace sluice
