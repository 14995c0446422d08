#include "server/rules/merge.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/endian.h"
#include "codec/key_bounds.h"
#include "server/storage/file_util.h"

namespace sluice {
namespace {

// Yields the records of one decoded frame in key order (sorting an index if the frame is not
// flagged sorted; stable, so equal keys keep their arrival order).
class DecodedRun {
 public:
  void Reset() {
    pos_ = 0;
    order_.clear();
    if (!frame_.header().sorted_by_key()) {
      order_.resize(frame_.size());
      for (uint32_t i = 0; i < order_.size(); ++i) order_[i] = i;
      std::stable_sort(order_.begin(), order_.end(), [this](uint32_t a, uint32_t b) {
        return KeyLess(frame_[a].key, frame_[b].key);
      });
    }
  }
  bool Next(Record* out) {
    if (pos_ >= frame_.size()) return false;
    *out = frame_[order_.empty() ? pos_ : order_[pos_]];
    ++pos_;
    return true;
  }
  DecodedFrame* frame() { return &frame_; }
  size_t resident_bytes() const { return resident_; }
  // Call after decoding into frame(): what the decoded frame and the order take.
  void Measure() {
    resident_ = order_.capacity() * sizeof(uint32_t) + frame_.size() * 16;
    for (const Record& r : frame_) resident_ += r.key.size() + r.value.size();
  }

 private:
  DecodedFrame frame_;
  std::vector<uint32_t> order_;
  size_t pos_ = 0;
  size_t resident_ = 0;
};

class StoredRun final : public RunSource {
 public:
  StoredRun(std::shared_ptr<ShuffleStore> store, BlockRef block, RunDecoder* decoder)
      : store_(std::move(store)), block_(block), decoder_(decoder) {}

  absl::StatusOr<bool> Next(Record* out) override {
    if (!loaded_) {
      // The stored bytes are only needed while decoding: read them into the merge's shared
      // buffer (runs load one at a time), so a run holds just its decoded records.
      SLUICE_RETURN_IF_ERROR(store_->ReadFrame(block_, &decoder_->bytes, nullptr, decoder_->view));
      SLUICE_RETURN_IF_ERROR(decoder_->decoder->Decode(decoder_->bytes, run_.frame()));
      run_.Reset();
      run_.Measure();
      loaded_ = true;
    }
    if (run_.Next(out)) return true;
    exhausted_ = true;  // its memory goes at the next Release()
    return false;
  }
  uint64_t size_bytes() const override { return block_.frame_size; }
  void Release() override {
    if (exhausted_ && !released_) {
      run_ = DecodedRun();
      released_ = true;
    }
  }
  size_t resident_bytes() const override {
    return released_ || !loaded_ ? 0 : run_.resident_bytes();
  }

 private:
  std::shared_ptr<ShuffleStore> store_;
  const BlockRef block_;
  RunDecoder* const decoder_;
  bool loaded_ = false;
  bool exhausted_ = false;
  bool released_ = false;
  DecodedRun run_;
};

// An intermediate run: [u32 LE size][frame] ... written by one merge pass into its merge's
// scratch file at [base, base + size), read back one frame at a time. Every intermediate run of
// a merge shares that one file (creating a file per run cost more than the merging itself) and
// its descriptor; a finished run punches its range out, so the disk space goes as it is read.
class FileRun final : public RunSource {
 public:
  FileRun(const file::Fd* fd, const std::string* path, RunDecoder* decoder, uint64_t base,
          uint64_t size)
      : fd_(fd), path_(path), decoder_(decoder), base_(base), size_(size) {}
  ~FileRun() override { (void)file::PunchHole(fd_->get(), *path_, base_, size_); }
  uint64_t size_bytes() const override { return size_; }

  absl::StatusOr<bool> Next(Record* out) override {
    for (;;) {
      if (loaded_ && run_.Next(out)) return true;
      if (offset_ >= size_) return false;  // the pass that wrote it knows its size
      if (loaded_) {  // its records may still be in use: keep the frame until Release()
        retired_.push_back(std::move(run_));
        run_ = DecodedRun();
      }
      uint8_t len[4];
      SLUICE_RETURN_IF_ERROR(file::PreadAll(fd_->get(), *path_, base_ + offset_, 4, len));
      // Like stored runs: the frame's bytes go to the merge's shared buffer, needed only while
      // decoding.
      std::string& bytes = decoder_->bytes;
      bytes.resize(LoadLE32(len));
      SLUICE_RETURN_IF_ERROR(file::PreadAll(fd_->get(), *path_, base_ + offset_ + 4, bytes.size(),
                                            reinterpret_cast<uint8_t*>(bytes.data())));
      offset_ += 4 + bytes.size();
      SLUICE_RETURN_IF_ERROR(decoder_->decoder->Decode(bytes, run_.frame()));
      run_.Reset();
      run_.Measure();
      loaded_ = true;
    }
  }
  void Release() override { retired_.clear(); }
  size_t resident_bytes() const override {
    size_t n = loaded_ ? run_.resident_bytes() : 0;
    for (const DecodedRun& r : retired_) n += r.resident_bytes();
    return n;
  }

 private:
  const file::Fd* const fd_;
  const std::string* const path_;
  RunDecoder* const decoder_;
  const uint64_t base_;
  const uint64_t size_;
  uint64_t offset_ = 0;
  bool loaded_ = false;
  DecodedRun run_;
  std::vector<DecodedRun> retired_;
};

std::atomic<uint64_t> tmp_counter{0};

}  // namespace

std::unique_ptr<RunSource> StoredFrameRun(std::shared_ptr<ShuffleStore> store, BlockRef block,
                                          RunDecoder* decoder) {
  return std::make_unique<StoredRun>(std::move(store), block, decoder);
}

namespace {

class RangeRun final : public RunSource {
 public:
  RangeRun(std::unique_ptr<RunSource> run, std::string_view from,
           const std::optional<std::string>* to)
      : run_(std::move(run)), size_(run_->size_bytes()), from_(from), to_(to) {}
  absl::StatusOr<bool> Next(Record* out) override {
    if (done_) return false;
    for (;;) {
      SLUICE_ASSIGN_OR_RETURN(const bool more, run_->Next(out));
      if (!more) break;
      if (CompareKeys(out->key, from_) < 0) continue;                    // before the range
      if (to_->has_value() && CompareKeys(out->key, **to_) >= 0) break;  // past it: the end
      return true;
    }
    done_ = true;
    return false;
  }
  void Release() override {
    if (done_) {
      run_.reset();  // past the range: its frame goes now, not when the fetch ends
    } else {
      run_->Release();
    }
  }
  size_t resident_bytes() const override { return run_ == nullptr ? 0 : run_->resident_bytes(); }
  uint64_t size_bytes() const override { return size_; }

 private:
  std::unique_ptr<RunSource> run_;
  const uint64_t size_;
  const std::string_view from_;
  const std::optional<std::string>* const to_;
  bool done_ = false;
};

class ChainRun final : public RunSource {
 public:
  ChainRun(size_t count, std::function<std::unique_ptr<RunSource>(size_t)> open, uint64_t size)
      : count_(count), open_(std::move(open)), size_(size) {}
  absl::StatusOr<bool> Next(Record* out) override {
    for (;;) {
      if (current_ == nullptr) {
        if (next_ == count_) return false;
        current_ = open_(next_++);
      }
      SLUICE_ASSIGN_OR_RETURN(const bool more, current_->Next(out));
      if (more) return true;
      retired_.push_back(std::move(current_));  // its records may be in use until Release()
    }
  }
  void Release() override {
    retired_.clear();
    if (current_ != nullptr) current_->Release();
  }
  size_t resident_bytes() const override {
    size_t n = current_ == nullptr ? 0 : current_->resident_bytes();
    for (const auto& r : retired_) n += r->resident_bytes();
    return n;
  }
  uint64_t size_bytes() const override { return size_; }

 private:
  const size_t count_;
  const std::function<std::unique_ptr<RunSource>(size_t)> open_;
  const uint64_t size_;
  size_t next_ = 0;
  std::unique_ptr<RunSource> current_;
  std::vector<std::unique_ptr<RunSource>> retired_;
};

}  // namespace

std::unique_ptr<RunSource> ChainedRun(size_t count,
                                      std::function<std::unique_ptr<RunSource>(size_t)> open,
                                      uint64_t size) {
  return std::make_unique<ChainRun>(count, std::move(open), size);
}

std::unique_ptr<RunSource> KeyRangeRun(std::unique_ptr<RunSource> run, std::string_view from,
                                       const std::optional<std::string>* to) {
  return std::make_unique<RangeRun>(std::move(run), from, to);
}

MergedStream::~MergedStream() {
  runs_.clear();  // (they read the scratch file)
  if (scratch_fd_.valid()) ::unlink(scratch_path_.c_str());
}

absl::StatusOr<std::unique_ptr<MergedStream>> MergedStream::Make(
    std::vector<std::unique_ptr<RunSource>> runs, const MergeOptions& options) {
  const size_t n = runs.size();
  std::vector<uint64_t> sizes(n);
  for (size_t i = 0; i < n; ++i) sizes[i] = runs[i]->size_bytes();
  return Make(
      n, [&sizes](size_t i) { return sizes[i]; },
      [](size_t) -> absl::StatusOr<uint64_t> { return uint64_t{0}; },
      [&runs](size_t i) { return std::move(runs[i]); }, options);
}

absl::StatusOr<std::unique_ptr<RunSource>> MergedStream::MergeToFile(
    std::vector<std::unique_ptr<RunSource>> group, const MergeOptions& options,
    uint64_t* max_frame_cost) {
  *max_frame_cost = 0;
  MergedStream pass;
  pass.max_records_ = max_records_;
  SLUICE_RETURN_IF_ERROR(pass.Init(std::move(group)));
  if (!scratch_fd_.valid()) {
    const std::string name =
        absl::StrCat("merge-", ::getpid(), "-", tmp_counter.fetch_add(1), ".runs");
    scratch_path_ = absl::StrCat(options.tmp_dir, "/", name);
    scratch_name_ = absl::StrCat("tmp/", name);  // (messages reach clients: no server path)
    SLUICE_ASSIGN_OR_RETURN(scratch_fd_, file::OpenForAppend(scratch_path_, scratch_name_));
  }
  EncodeOptions eopts;
  eopts.zstd_level = 1;  // scratch data: fast beats small
  eopts.limits = options.limits;
  FrameEncoder encoder(eopts);
  std::vector<Record> batch;
  std::string frame;
  const uint64_t base = scratch_end_;
  for (;;) {
    if (options.cancelled != nullptr && options.cancelled->load()) {
      return absl::CancelledError("merge cancelled: the reader went away");
    }
    batch.clear();
    // Intermediate frames count what they take decoded (a record alone may be bigger).
    SLUICE_ASSIGN_OR_RETURN(bool more, pass.NextBatch(options.chunk_bytes, &batch, 40));
    if (!more) break;
    uint64_t cost = 0;
    for (const Record& r : batch) cost += r.key.size() + r.value.size() + 40;
    *max_frame_cost = std::max(*max_frame_cost, cost);
    frame.assign(4, '\0');
    SLUICE_RETURN_IF_ERROR(encoder.Encode(batch, &frame));
    StoreLE32(reinterpret_cast<uint8_t*>(frame.data()), static_cast<uint32_t>(frame.size() - 4));
    SLUICE_RETURN_IF_ERROR(file::PwriteAll(
        scratch_fd_.get(), scratch_name_, scratch_end_,
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size())));
    scratch_end_ += frame.size();
  }
  return std::unique_ptr<RunSource>(
      new FileRun(&scratch_fd_, &scratch_name_, &file_runs_, base, scratch_end_ - base));
}

absl::StatusOr<std::unique_ptr<MergedStream>> MergedStream::Make(
    size_t count, const std::function<uint64_t(size_t)>& size_of,
    const std::function<absl::StatusOr<uint64_t>(size_t)>& cost_of,
    const std::function<std::unique_ptr<RunSource>(size_t)>& open, const MergeOptions& options) {
  std::unique_ptr<MergedStream> stream(new MergedStream());
  stream->max_records_ = std::max<size_t>(1, options.limits.max_records / 2);
  const size_t fan_in = std::max<size_t>(options.fan_in, 2);
  DecodeOptions dopts;
  dopts.limits = options.limits;
  // Intermediate runs are our own frames: one decoder reads them back.
  stream->decoder_ = std::make_unique<FrameDecoder>(dopts);
  stream->file_runs_.decoder = stream->decoder_.get();

  // A run not opened yet (index `lazy` for `open`) or an intermediate one.
  struct Pending {
    size_t lazy = 0;
    std::unique_ptr<RunSource> run;
    uint64_t bytes = 0;
    uint64_t cost = 0;  // decoded bytes it holds at once
  };
  const uint64_t limit = options.memory_limit == 0 ? ~uint64_t{0} : options.memory_limit;
  std::vector<Pending> runs(count);
  uint64_t total_cost = 0;
  for (size_t i = 0; i < count; ++i) {
    runs[i].lazy = i;
    runs[i].bytes = size_of(i);
    SLUICE_ASSIGN_OR_RETURN(runs[i].cost, cost_of(i));
    total_cost += runs[i].cost;
  }
  auto reserve = [&](uint64_t bytes) {
    if (options.reserve) options.reserve(bytes);
  };
  auto too_big = [&](uint64_t a, uint64_t b) {
    return absl::ResourceExhaustedError(
        absl::StrCat("merging in key order needs two frames of ", a, " and ", b,
                     " bytes decoded at once, more than the ", limit, " bytes a merge may hold (",
                     options.limit_name, ")"));
  };
  auto take = [&](Pending& p) { return p.run != nullptr ? std::move(p.run) : open(p.lazy); };
  auto merge = [&](size_t from, size_t to) -> absl::StatusOr<Pending> {
    std::vector<std::unique_ptr<RunSource>> group;
    uint64_t bytes = 0, cost = 0;
    for (size_t i = from; i < to; ++i) {
      group.push_back(take(runs[i]));
      bytes += runs[i].bytes;
      cost += runs[i].cost;
    }
    reserve(cost);
    ++stream->passes_;
    uint64_t frame_cost = 0;
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RunSource> merged,
                            stream->MergeToFile(std::move(group), options, &frame_cost));
    // A file run holds its current frame and, until the batch is used, the one before.
    return Pending{0, std::move(merged), bytes, 2 * frame_cost};
  };

  // Far above fan_in, or when the runs' frames do not fit the memory limit together: whole
  // levels, each merging consecutive groups of up to fan_in runs that fit it together
  // (adjacent, so equal keys keep their run order): O(n) per level, log_fan_in(n) levels, and
  // only the group being merged is open. Intermediate runs hold one chunk at a time, so the
  // levels converge; a level where no two neighbours fit together fails the merge.
  while (runs.size() > fan_in * fan_in || (runs.size() > 1 && total_cost > limit)) {
    std::vector<Pending> next;
    next.reserve(runs.size() / 2 + 1);
    total_cost = 0;
    size_t from = 0;
    while (from < runs.size()) {
      size_t to = from + 1;
      uint64_t cost = runs[from].cost;
      while (to < runs.size() && to - from < fan_in && cost + runs[to].cost <= limit) {
        cost += runs[to].cost;
        ++to;
      }
      if (to - from == 1) {
        total_cost += runs[from].cost;
        next.push_back(std::move(runs[from]));
        from = to;
        continue;
      }
      SLUICE_ASSIGN_OR_RETURN(Pending merged, merge(from, to));
      total_cost += merged.cost;
      next.push_back(std::move(merged));
      from = to;
    }
    if (next.size() == runs.size()) {  // no group formed: nothing can shrink
      return too_big(runs[0].cost, runs.size() > 1 ? runs[1].cost : 0);
    }
    runs = std::move(next);
  }
  // Then each pass merges just enough adjacent runs into one file run to bring the count down
  // toward fan_in, choosing the adjacent window with the fewest bytes, so as little data as
  // possible is rewritten (at most about fan_in passes over at most fan_in^2 runs).
  while (runs.size() > fan_in) {
    const size_t group_size = std::min(fan_in, runs.size() - fan_in + 1);
    size_t best = 0;
    uint64_t window = 0, best_bytes = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      window += runs[i].bytes;
      if (i >= group_size) window -= runs[i - group_size].bytes;
      if (i + 1 >= group_size && (i + 1 == group_size || window < best_bytes)) {
        best = i + 1 - group_size;
        best_bytes = window;
      }
    }
    SLUICE_ASSIGN_OR_RETURN(Pending merged, merge(best, best + group_size));
    runs[best] = std::move(merged);
    runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(best) + 1,
               runs.begin() + static_cast<std::ptrdiff_t>(best + group_size));
  }
  std::vector<std::unique_ptr<RunSource>> final_runs;
  final_runs.reserve(runs.size());
  uint64_t final_cost = 0;
  for (Pending& p : runs) {
    final_cost += p.cost;
    final_runs.push_back(take(p));
  }
  reserve(final_cost);
  SLUICE_RETURN_IF_ERROR(stream->Init(std::move(final_runs)));
  return stream;
}

size_t MergedStream::resident_bytes() const {
  // With what the intermediate runs share: their read buffer and decoder scratch.
  size_t n = file_runs_.bytes.capacity() + (decoder_ ? decoder_->scratch_bytes() : 0);
  for (const auto& run : runs_) n += run->resident_bytes();
  return n;
}

absl::Status MergedStream::Init(std::vector<std::unique_ptr<RunSource>> runs) {
  runs_ = std::move(runs);
  current_.resize(runs_.size());
  heap_.clear();
  for (uint32_t i = 0; i < runs_.size(); ++i) {
    SLUICE_ASSIGN_OR_RETURN(bool has, runs_[i]->Next(&current_[i]));
    if (has) heap_.push_back(HeapEntry{KeyPrefix(current_[i].key), i});
  }
  for (size_t i = heap_.size() / 2; i-- > 0;) SiftDown(i);
  return absl::OkStatus();
}

void MergedStream::SiftDown(size_t i) {
  const size_t n = heap_.size();
  const HeapEntry e = heap_[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && Before(heap_[c + 1], heap_[c])) ++c;
    if (!Before(heap_[c], e)) break;
    heap_[i] = heap_[c];
    i = c;
  }
  heap_[i] = e;
}

absl::StatusOr<bool> MergedStream::NextRecord(Record* out) {
  if (top_taken_) {  // advance the run whose head went out, in place: one sift
    const uint32_t r = heap_[0].run;
    SLUICE_ASSIGN_OR_RETURN(bool has, runs_[r]->Next(&current_[r]));
    top_taken_ = false;  // (only now: after a failed read the head is still the one handed out)
    if (has) {
      heap_[0].prefix = KeyPrefix(current_[r].key);
    } else {
      heap_[0] = heap_.back();
      heap_.pop_back();
    }
    if (!heap_.empty()) SiftDown(0);
  }
  if (heap_.empty()) return false;
  *out = current_[heap_[0].run];
  top_taken_ = true;
  return true;
}

absl::StatusOr<bool> MergedStream::NextBatch(size_t max_bytes, std::vector<Record>* batch,
                                             size_t per_record) {
  // The previous batch has been used: frames holding only its records may go.
  for (auto& run : runs_) run->Release();
  size_t added = 0, count = 0;
  Record rec;
  while (added < max_bytes && count < max_records_) {
    SLUICE_ASSIGN_OR_RETURN(bool has, NextRecord(&rec));
    if (!has) {
      drained_ = true;
      break;
    }
    const size_t size = rec.key.size() + rec.value.size() + per_record;  // empty ones count
    if (count > 0 && added + size > max_bytes) {
      // Would overshoot (frames must stay under the cap): leave it for the next batch.
      top_taken_ = false;
      break;
    }
    batch->push_back(rec);
    added += size;
    ++count;
  }
  return count > 0;
}

uint64_t StoredBlocksMergeCost(const std::vector<BlockRef>& b) {
  uint64_t total = 0, largest = 0;
  size_t count = 0;
  for (size_t i = 0; i <= b.size(); ++i) {
    if (i == b.size() || i == 0 || !FollowsInKeyOrder(b[i - 1].bounds, b[i].bounds)) {
      total += count > 1 ? 2 * largest : largest;
      if (i == b.size()) break;
      largest = 0;
      count = 0;
    }
    largest = std::max(largest, DecodedCost(b[i].uncompressed, b[i].records));
    ++count;
  }
  return total;
}

absl::StatusOr<std::unique_ptr<MergedStream>> MergeStoredBlocks(
    std::shared_ptr<ShuffleStore> store, const std::vector<BlockRef>* blocks, RunDecoder* decoder,
    std::function<std::unique_ptr<RunSource>(std::unique_ptr<RunSource>)> wrap,
    const MergeOptions& options, size_t* runs) {
  // The index knows what a frame decodes to (filled at append and at recovery): no read for
  // planning. A chain holds one frame at a time, and the one before it until the merge releases
  // its records: it costs twice its largest.
  struct Chain {
    size_t first, count;
    uint64_t bytes, largest;
  };
  auto chains = std::make_shared<std::vector<Chain>>();
  const std::vector<BlockRef>& b = *blocks;
  for (size_t i = 0; i < b.size(); ++i) {
    const uint64_t cost = DecodedCost(b[i].uncompressed, b[i].records);
    if (i == 0 || !FollowsInKeyOrder(b[i - 1].bounds, b[i].bounds)) {
      chains->push_back(Chain{i, 0, 0, 0});
    }
    Chain& c = chains->back();
    ++c.count;
    c.bytes += b[i].frame_size;
    c.largest = std::max(c.largest, cost);
  }
  if (runs != nullptr) *runs = chains->size();
  return MergedStream::Make(
      chains->size(), [chains](size_t c) { return (*chains)[c].bytes; },
      [chains](size_t c) -> absl::StatusOr<uint64_t> {
        const Chain& chain = (*chains)[c];
        return chain.count > 1 ? 2 * chain.largest : chain.largest;
      },
      [chains, store, blocks, decoder, wrap](size_t c) {
        const Chain& chain = (*chains)[c];
        std::unique_ptr<RunSource> run =
            chain.count == 1 ? StoredFrameRun(store, (*blocks)[chain.first], decoder)
                             : ChainedRun(
                                   chain.count,
                                   [store, blocks, decoder, first = chain.first](size_t j) {
                                     return StoredFrameRun(store, (*blocks)[first + j], decoder);
                                   },
                                   chain.bytes);
        return wrap ? wrap(std::move(run)) : std::move(run);
      },
      options);
}

}  // namespace sluice
