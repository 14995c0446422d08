#include "server/merge.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/endian.h"
#include "codec/status_macros.h"
#include "server/file_util.h"

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
      SLUICE_RETURN_IF_ERROR(store_->ReadFrame(block_, &decoder_->bytes));
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

// An intermediate run: [u32 LE size][frame] ... written by one merge pass, read back one frame
// at a time.
class FileRun final : public RunSource {
 public:
  FileRun(file::Fd fd, std::string path, RunDecoder* decoder, uint64_t size)
      : fd_(std::move(fd)), path_(std::move(path)), decoder_(decoder), size_(size) {}
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
      SLUICE_RETURN_IF_ERROR(file::PreadAll(fd_.get(), path_, offset_, 4, len));
      // Like stored runs: the frame's bytes go to the merge's shared buffer, needed only while
      // decoding.
      std::string& bytes = decoder_->bytes;
      bytes.resize(LoadLE32(len));
      SLUICE_RETURN_IF_ERROR(file::PreadAll(fd_.get(), path_, offset_ + 4, bytes.size(),
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
  file::Fd fd_;
  const std::string path_;
  RunDecoder* const decoder_;
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

MergedStream::~MergedStream() {
  runs_.clear();
  for (const std::string& f : tmp_files_) ::unlink(f.c_str());
}

absl::StatusOr<std::unique_ptr<MergedStream>> MergedStream::Make(
    std::vector<std::unique_ptr<RunSource>> runs, const MergeOptions& options) {
  std::unique_ptr<MergedStream> stream(new MergedStream());
  stream->max_records_ = std::max<size_t>(1, options.limits.max_records / 2);
  const size_t fan_in = std::max<size_t>(options.fan_in, 2);
  DecodeOptions dopts;
  dopts.limits = options.limits;
  // Intermediate runs are our own frames: one decoder reads them back.
  stream->decoder_ = std::make_unique<FrameDecoder>(dopts);
  stream->file_runs_.decoder = stream->decoder_.get();
  // Each pass merges just enough adjacent runs into one file run to bring the count down
  // toward fan_in, choosing the adjacent window with the fewest bytes (adjacent, so equal keys
  // keep their run order), so as little data as possible is rewritten.
  while (runs.size() > fan_in) {
    ++stream->passes_;
    const size_t group_size = std::min(fan_in, runs.size() - fan_in + 1);
    size_t best = 0;
    uint64_t window = 0, best_bytes = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      window += runs[i]->size_bytes();
      if (i >= group_size) window -= runs[i - group_size]->size_bytes();
      if (i + 1 >= group_size && (i + 1 == group_size || window < best_bytes)) {
        best = i + 1 - group_size;
        best_bytes = window;
      }
    }
    std::vector<std::unique_ptr<RunSource>> group;
    for (size_t i = best; i < best + group_size; ++i) group.push_back(std::move(runs[i]));
    // Merge the group into a file of sorted frames.
    MergedStream pass;
    pass.max_records_ = stream->max_records_;
    SLUICE_RETURN_IF_ERROR(pass.Init(std::move(group)));
    const std::string path =
        absl::StrCat(options.tmp_dir, "/merge-", ::getpid(), "-", tmp_counter.fetch_add(1), ".run");
    SLUICE_ASSIGN_OR_RETURN(file::Fd fd, file::OpenForAppend(path));
    stream->tmp_files_.push_back(path);
    EncodeOptions eopts;
    eopts.zstd_level = 1;  // scratch data: fast beats small
    eopts.limits = options.limits;
    FrameEncoder encoder(eopts);
    std::vector<Record> batch;
    std::string frame;
    uint64_t offset = 0;
    for (;;) {
      if (options.cancelled != nullptr && options.cancelled->load()) {
        return absl::CancelledError("merge cancelled: the reader went away");
      }
      batch.clear();
      SLUICE_ASSIGN_OR_RETURN(bool more, pass.NextBatch(options.chunk_bytes, &batch));
      if (!more) break;
      frame.assign(4, '\0');
      SLUICE_RETURN_IF_ERROR(encoder.Encode(batch, &frame));
      StoreLE32(reinterpret_cast<uint8_t*>(frame.data()), static_cast<uint32_t>(frame.size() - 4));
      SLUICE_RETURN_IF_ERROR(file::PwriteAll(
          fd.get(), path, offset,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size())));
      offset += frame.size();
    }
    runs[best] = std::make_unique<FileRun>(std::move(fd), path, &stream->file_runs_, offset);
    runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(best) + 1,
               runs.begin() + static_cast<std::ptrdiff_t>(best + group_size));
  }
  SLUICE_RETURN_IF_ERROR(stream->Init(std::move(runs)));
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

absl::StatusOr<bool> MergedStream::NextBatch(size_t max_bytes, std::vector<Record>* batch) {
  // The previous batch has been used: frames holding only its records may go.
  for (auto& run : runs_) run->Release();
  size_t added = 0, count = 0;
  Record rec;
  while (added < max_bytes && count < max_records_) {
    SLUICE_ASSIGN_OR_RETURN(bool has, NextRecord(&rec));
    if (!has) break;
    const size_t size = rec.key.size() + rec.value.size() + 1;  // +1: empty records count
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

}  // namespace sluice
