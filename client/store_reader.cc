#include "client/store_reader.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/frame_decoder.h"
#include "codec/key_bounds.h"
#include "rpc/error_reason.h"

namespace sluice {
namespace {

// One frame to read: which object of the partition's chain, which frame of its footer.
struct FrameAt {
  size_t object = 0, frame = 0;
  uint32_t mapper = 0;
};

// The partition's objects, opened, and the frames a read takes of them.
struct Chain {
  std::string shuffle_id;
  uint32_t partition = 0;
  std::vector<std::unique_ptr<objstore::PartitionObjectReader>> objects;
  std::vector<FrameAt> frames;

  const objstore::ObjectFrame& Of(const FrameAt& f) const {
    return objects[f.object]->footer().frames[f.frame];
  }
  // Frames [i, j) of `frames`, their bytes appended to *out in order: one read per stretch of
  // neighbours in one object.
  absl::Status Read(size_t i, size_t j, std::vector<std::string>* out) const {
    while (i < j) {
      size_t k = i + 1;
      while (k < j && frames[k].object == frames[i].object &&
             frames[k].frame == frames[k - 1].frame + 1) {
        ++k;
      }
      SLUICE_RETURN_IF_ERROR(objects[frames[i].object]->ReadFrames(
          frames[i].frame, frames[k - 1].frame + 1, [&](size_t, absl::string_view bytes) {
            out->emplace_back(bytes);
            return absl::OkStatus();
          }));
      i = k;
    }
    return absl::OkStatus();
  }
  // Decodes `bytes`, frame `f`, checking it holds the records its footer says.
  absl::Status Decode(FrameDecoder* decoder, const std::string& bytes, const FrameAt& f,
                      DecodedFrame* out) const {
    absl::Status st = decoder->Decode(bytes, out);
    if (st.ok() && out->size() != Of(f).records) {
      st = absl::DataLossError(
          absl::StrCat("holds ", out->size(), " records, its footer says ", Of(f).records));
    }
    if (st.ok()) return st;
    return absl::DataLossError(absl::StrCat("the object store's frame ", f.frame, " of partition ",
                                            partition, " of shuffle '", shuffle_id, "' (mapper ",
                                            f.mapper, "): ", st.message()));
  }
};

// What the frames may decode to: the largest cap a server takes (the cap may have been lowered
// since they were pushed; a COLUMNAR frame rebuilds its records larger than its payload), at
// most the reader's own limit.
DecodeOptions Limits(uint32_t max_frame_bytes) {
  DecodeOptions o;
  o.limits.max_uncompressed_bytes = std::min(kMaxFrameCapBytes, max_frame_bytes);
  o.limits.max_records = UINT32_MAX;
  return o;
}

// UNORDERED: the frames in the objects' order, read ahead a batch at a time.
class UnorderedReader final : public ShuffleReader {
 public:
  UnorderedReader(Chain chain, uint64_t skip, const StoreReadOptions& o)
      : chain_(std::move(chain)),
        decoder_(Limits(o.max_frame_bytes)),
        skip_(skip),
        batch_bytes_(o.batch_bytes) {}

  absl::StatusOr<bool> Next(Record* out) override {
    for (;;) {
      if (record_ < frame_.size()) {
        *out = frame_[record_++];
        if (skip_ > 0) {
          --skip_;
          continue;
        }
        return true;
      }
      if (next_ == chain_.frames.size()) return false;
      if (in_batch_ == batch_.size()) {
        batch_.clear();
        in_batch_ = 0;
        size_t j = next_;
        uint64_t bytes = 0;
        while (j < chain_.frames.size() && (j == next_ || bytes < batch_bytes_)) {
          bytes += chain_.Of(chain_.frames[j++]).size;
        }
        SLUICE_RETURN_IF_ERROR(chain_.Read(next_, j, &batch_));
      }
      SLUICE_RETURN_IF_ERROR(
          chain_.Decode(&decoder_, batch_[in_batch_], chain_.frames[next_], &frame_));
      ++in_batch_;
      ++next_;
      record_ = 0;
    }
  }

 private:
  const Chain chain_;
  FrameDecoder decoder_;
  uint64_t skip_;
  const uint64_t batch_bytes_;
  std::vector<std::string> batch_;  // frames next_ - in_batch_ ... read
  size_t in_batch_ = 0, next_ = 0;
  DecodedFrame frame_;
  size_t record_ = 0;
};

// KEY order: every frame a run (an unsorted one sorted, stably, when loaded), merged; equal
// keys in run order (mapper, then the chain's and the object's order), as a server merges.
class KeyReader final : public ShuffleReader {
  struct Run {
    DecodedFrame frame;
    std::vector<uint32_t> order;
    size_t at = 0;
    std::string_view Head() const { return frame[order[at]].key; }
  };
  // The heap's order: a run comes after another whose head key is smaller, or equal and the
  // run earlier.
  struct After {
    const std::vector<Run>* runs;
    bool operator()(size_t a, size_t b) const {
      const int c = CompareKeys((*runs)[a].Head(), (*runs)[b].Head());
      return c > 0 || (c == 0 && a > b);
    }
  };

 public:
  static absl::StatusOr<std::unique_ptr<ShuffleReader>> Make(Chain chain,
                                                             const ReaderOptions& options,
                                                             const StoreReadOptions& o) {
    std::stable_sort(chain.frames.begin(), chain.frames.end(),
                     [](const FrameAt& a, const FrameAt& b) { return a.mapper < b.mapper; });
    uint64_t decoded = 0;
    for (const FrameAt& f : chain.frames) decoded += chain.Of(f).size + chain.Of(f).uncompressed;
    if (decoded > o.max_merge_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a KEY read of partition ", chain.partition, " of shuffle '",
                       chain.shuffle_id, "' from the object store holds its frames, ", decoded,
                       " bytes, past the reader's ", o.max_merge_bytes,
                       " (StoreReadOptions::max_merge_bytes): read it UNORDERED, or "
                       "through a server"));
    }
    auto r = std::unique_ptr<KeyReader>(new KeyReader(options));
    std::vector<std::string> bytes;
    SLUICE_RETURN_IF_ERROR(chain.Read(0, chain.frames.size(), &bytes));
    FrameDecoder decoder(Limits(o.max_frame_bytes));
    r->runs_.resize(bytes.size());
    for (size_t k = 0; k < bytes.size(); ++k) {
      Run& run = r->runs_[k];
      SLUICE_RETURN_IF_ERROR(chain.Decode(&decoder, bytes[k], chain.frames[k], &run.frame));
      std::string().swap(bytes[k]);
      run.order.resize(run.frame.size());
      for (uint32_t i = 0; i < run.order.size(); ++i) run.order[i] = i;
      if (!run.frame.header().sorted_by_key()) {
        std::stable_sort(run.order.begin(), run.order.end(), [&](uint32_t a, uint32_t b) {
          return CompareKeys(run.frame[a].key, run.frame[b].key) < 0;
        });
      }
      if (!run.order.empty()) r->heap_.push_back(k);
    }
    std::make_heap(r->heap_.begin(), r->heap_.end(), r->Order());
    return r;
  }

  absl::StatusOr<bool> Next(Record* out) override {
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), Order());
      Run& run = runs_[heap_.back()];
      *out = run.frame[run.order[run.at++]];
      if (run.at < run.order.size()) {
        std::push_heap(heap_.begin(), heap_.end(), Order());
      } else {
        heap_.pop_back();
      }
      if (CompareKeys(out->key, from_) < 0) continue;
      if (to_.has_value() && CompareKeys(out->key, *to_) >= 0) {
        heap_.clear();
        return false;
      }
      if (skip_ > 0) {
        --skip_;
        continue;
      }
      return true;
    }
    return false;
  }

 private:
  explicit KeyReader(const ReaderOptions& o)
      : from_(o.from_key), to_(o.to_key), skip_(o.skip_records) {}
  After Order() const { return After{&runs_}; }
  std::vector<Run> runs_;
  std::vector<size_t> heap_;
  const std::string from_;
  const std::optional<std::string> to_;
  uint64_t skip_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StoreShuffle>> StoreShuffle::Open(objstore::S3Store* store,
                                                                 const std::string& shuffle_id,
                                                                 StoreReadOptions options) {
  absl::StatusOr<std::string> json = store->Get(ManifestKey(shuffle_id));
  if (absl::IsNotFound(json.status())) {
    return absl::NotFoundError(absl::StrCat("the object store holds no manifest of shuffle '",
                                            shuffle_id,
                                            "': it is not wholly uploaded yet, or was deleted"));
  }
  if (!json.ok()) return json.status();
  SLUICE_ASSIGN_OR_RETURN(ShuffleManifest m, DecodeShuffleManifest(*json, shuffle_id));
  return std::unique_ptr<StoreShuffle>(new StoreShuffle(store, options, std::move(m)));
}

absl::StatusOr<std::unique_ptr<ShuffleReader>> StoreShuffle::OpenReader(
    uint32_t partition, const ReaderOptions& options) {
  if (partition >= manifest_.partitions) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition ", partition, " of shuffle '", manifest_.shuffle_id,
                     "' is out of range (it has ", manifest_.partitions, ")"));
  }
  return OpenChain(partition, manifest_.ChainOf(partition), options);
}

absl::StatusOr<std::unique_ptr<ShuffleReader>> StoreShuffle::OpenStoredReader(
    uint32_t stored, const ReaderOptions& options) {
  if (stored >= manifest_.stored()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stored partition ", stored, " of shuffle '", manifest_.shuffle_id,
                     "' is out of range (it has ", manifest_.stored(), ")"));
  }
  return OpenChain(stored, {stored}, options);
}

absl::StatusOr<std::unique_ptr<ShuffleReader>> StoreShuffle::OpenChain(
    uint32_t partition, const std::vector<uint32_t>& stored, const ReaderOptions& options) {
  const std::string& id = manifest_.shuffle_id;
  if (options.order == FetchOrder::kUnordered &&
      (!options.from_key.empty() || options.to_key.has_value())) {
    return absl::InvalidArgumentError("a key range is for a KEY-ordered read");
  }
  if (!options.only_attempts.empty() &&
      options.only_attempts.size() != options.only_mappers.size()) {
    return absl::InvalidArgumentError("only_attempts must give one attempt per only_mappers");
  }
  Chain chain;
  chain.shuffle_id = id;
  chain.partition = partition;
  for (uint32_t q : stored) {
    const ObjectRecord& r = manifest_.objects.at(q);
    SLUICE_ASSIGN_OR_RETURN(auto object, objstore::PartitionObjectReader::Open(
                                             store_, {r.key, r.size}, id, q, options_.ranges));
    if (WinnerSet(object->footer().winners) != r.winners) {
      return absl::DataLossError(absl::StrCat("the object store's object ", r.key,
                                              " holds other winners than its manifest names"));
    }
    chain.objects.push_back(std::move(object));
  }
  // The winners the read takes (only_mappers: those, each the attempt asked for).
  const auto& winners = chain.objects.front()->footer().winners;
  for (size_t i = 0; i < options.only_mappers.size(); ++i) {
    const uint32_t m = options.only_mappers[i];
    auto w = std::lower_bound(winners.begin(), winners.end(), std::make_pair(m, uint64_t{0}));
    if (w == winners.end() || w->first != m) {
      return absl::AbortedError(absl::StrCat("mapper ", m, " of shuffle '", id,
                                             "' is not committed in the object store"));
    }
    if (!options.only_attempts.empty() && options.only_attempts[i] != w->second) {
      return WithReason(
          absl::AbortedError(absl::StrCat("mapper ", m, " of shuffle '", id, "' won with attempt ",
                                          w->second, " in the object store, not ",
                                          options.only_attempts[i], ": read it again")),
          ErrorReason::kRevoked);
    }
  }
  const bool ranged =
      options.order == FetchOrder::kKey && (!options.from_key.empty() || options.to_key);
  for (size_t o = 0; o < chain.objects.size(); ++o) {
    const auto& frames = chain.objects[o]->footer().frames;
    for (size_t f = 0; f < frames.size(); ++f) {
      if (!options.only_mappers.empty() &&
          !std::binary_search(options.only_mappers.begin(), options.only_mappers.end(),
                              frames[f].mapper)) {
        continue;
      }
      // A key range reads only the frames whose bounds meet it (the footer's index).
      if (ranged && !frames[f].bounds.empty() &&
          KeyBoundsSize(frames[f].bounds) == frames[f].bounds.size() &&
          !MayHoldKeyIn(frames[f].bounds, options.from_key, options.to_key)) {
        continue;
      }
      chain.frames.push_back(FrameAt{o, f, frames[f].mapper});
    }
  }
  if (options.order == FetchOrder::kKey)
    return KeyReader::Make(std::move(chain), options, options_);
  return std::unique_ptr<ShuffleReader>(
      new UnorderedReader(std::move(chain), options.skip_records, options_));
}

}  // namespace sluice
