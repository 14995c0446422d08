#include "server/rules/fetch_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/key_bounds.h"
#include "rpc/error_reason.h"
#include "server/storage/shuffle_id.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<FetchSession>> FetchSession::Make(
    const FetchSpec& spec, const FetchDeps& deps, const std::atomic<bool>* cancelled) {
  std::unique_ptr<FetchSession> session(new FetchSession(spec, deps, cancelled));
  SLUICE_RETURN_IF_ERROR(session->Setup());
  return session;
}

FetchSession::~FetchSession() { deps_.budget->Release(spec_.tenant, charged_ + merge_charged_); }

absl::Status FetchSession::Setup() {
  SLUICE_ASSIGN_OR_RETURN(store_, deps_.registry->Get(spec_.shuffle_id));
  store_->Touch();
  const ShuffleParams& params = store_->params();
  if (spec_.partition >= params.num_partitions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition ", spec_.partition, " is out of range [0, ", params.num_partitions, ")"));
  }
  // Found damaged by a fetch or the scrub: a cluster reader goes to another replica.
  SLUICE_RETURN_IF_ERROR(store_->PartitionDamage(spec_.partition));
  // An evicted partition is read back before it is served (ClusterNode::PrepareToServe): one not
  // back (evicted since that check) is never served as if empty.
  if (!store_->EvictedPartitionHere(spec_.partition)) {
    return WithReason(
        absl::UnavailableError(absl::StrCat(
            "partition ", spec_.partition, " of shuffle '", ShuffleName(params.shuffle_id),
            "' was evicted from this server's disk and is not read back yet: retry")),
        ErrorReason::kIncomplete);
  }
  if (spec_.require_complete && params.num_mappers == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "require_complete needs the shuffle's mapper count, and shuffle '",
        ShuffleName(params.shuffle_id), "' was created without one (num_mappers = 0)"));
  }
  if (spec_.require_complete) {
    const size_t have = store_->CommittedMappers().size();
    if (have < params.num_mappers) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(params.num_mappers - have,
                                                                   " of ", params.num_mappers,
                                                                   " mappers have not committed")),
                        ErrorReason::kNotCommitted);
    }
  }
  if (spec_.zstd_level > kMaxFetchZstdLevel) {
    return absl::InvalidArgumentError(
        absl::StrCat("zstd_level ", spec_.zstd_level, " is out of range [1, ", kMaxFetchZstdLevel,
                     "] (0 means 3): the server compresses fetches for "
                     "every reducer, so it keeps to the fast levels"));
  }
  encode_.layout = spec_.layout;
  encode_.compression = spec_.uncompressed ? Compression::kNone : Compression::kZstd;
  encode_.zstd_level = spec_.zstd_level == 0 ? 3 : static_cast<int>(spec_.zstd_level);
  // A merged chunk holds at most half the cap in force, or one record if it alone is bigger: a
  // record committed under a larger cap is served whole (StoredFrameLimits).
  encode_.limits = StoredFrameLimits(deps_.limits);
  const size_t cap = deps_.limits.max_uncompressed_bytes / 2;
  chunk_bytes_ = spec_.target_chunk_bytes == 0 ? (1u << 20) : spec_.target_chunk_bytes;
  chunk_bytes_ = std::min(chunk_bytes_, cap);
  const bool ranged = !spec_.from_key.empty() || spec_.to_key.has_value();
  if (ranged && !spec_.key_order) {
    return absl::InvalidArgumentError(
        "a key range (from_key, to_key) is read in KEY order only; UNORDERED reads whole stored "
        "frames");
  }
  if (spec_.from_key.size() > kMaxRangeKeyBytes ||
      (spec_.to_key.has_value() && spec_.to_key->size() > kMaxRangeKeyBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a range key is longer than ", kMaxRangeKeyBytes, " bytes, the most taken"));
  }
  if (spec_.to_key.has_value() && CompareKeys(spec_.from_key, *spec_.to_key) > 0) {
    return absl::InvalidArgumentError(
        "from_key is after to_key: a range [from_key, to_key) must not go backwards");
  }
  if (!std::is_sorted(spec_.only_mappers.begin(), spec_.only_mappers.end()) ||
      std::adjacent_find(spec_.only_mappers.begin(), spec_.only_mappers.end()) !=
          spec_.only_mappers.end()) {
    return absl::InvalidArgumentError("only_mappers must be in increasing order, without repeats");
  }
  if (!spec_.only_attempts.empty() && spec_.only_attempts.size() != spec_.only_mappers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("only_attempts names ", spec_.only_attempts.size(), " attempts for ",
                     spec_.only_mappers.size(), " mappers (one per mapper)"));
  }
  // A decision revoked since the read began: another attempt (or none) is the mapper's now.
  const auto revoked = [&](uint32_t mapper, uint64_t attempt, const std::string& now) {
    return WithReason(absl::AbortedError(absl::StrCat(
                          "mapper ", mapper, " of shuffle '", ShuffleName(spec_.shuffle_id),
                          "' was read at attempt ", attempt, ", whose decision was revoked since (",
                          now, "): read the partition again from its start")),
                      ErrorReason::kRevoked);
  };
  // (Bounds only where they are used: a KEY read's chains and ranges.)
  // A KEY read takes the pre-merged runs that stand for mappers it reads (their records and
  // key order are the same), held while it reads them.
  auto blocks = store_->CommittedBlocksOf(spec_.partition, spec_.only_mappers, &mappers_,
                                          &attempts_, /*with_bounds=*/spec_.key_order,
                                          spec_.key_order ? &merged_runs_ : nullptr);
  if (!blocks.ok()) {  // (a mapper not committed here: revoked, if it was read at an attempt)
    for (size_t i = 0; i < spec_.only_attempts.size(); ++i) {
      if (store_->IsRevoked(spec_.only_mappers[i], spec_.only_attempts[i])) {
        return revoked(spec_.only_mappers[i], spec_.only_attempts[i], "revoked on this server");
      }
    }
    return blocks.status();
  }
  blocks_ = *std::move(blocks);
  if (spec_.to_key.has_value() && CompareKeys(spec_.from_key, *spec_.to_key) == 0) {
    blocks_.clear();  // an empty range: nothing to read
  }
  if (ranged) {  // only the frames whose keys may meet the range: the rest is never read
    blocks_.erase(std::remove_if(blocks_.begin(), blocks_.end(),
                                 [&](const BlockRef& b) {
                                   return !MayHoldKeyIn(b.bounds, spec_.from_key, spec_.to_key);
                                 }),
                  blocks_.end());
  }
  for (size_t i = 0; i < spec_.only_attempts.size() && i < attempts_.size(); ++i) {
    if (attempts_[i] != spec_.only_attempts[i]) {
      return revoked(mappers_[i], spec_.only_attempts[i],
                     absl::StrCat("attempt ", attempts_[i], " is committed here"));
    }
  }
  // A view (after the blocks: it covers every one of them) when enough frames are small
  // enough to read from it: for a few, a pread each costs less than mapping and unmapping.
  size_t small = 0;
  for (const BlockRef& b : blocks_) small += b.frame_size <= ShuffleStore::kViewReadMax ? 1 : 0;
  if (small >= kMinViewBlocks) view_ = store_->ReadView();
  uint64_t records = 0;
  for (const BlockRef& b : blocks_) records += b.records;
  if (spec_.skip_records > records) {
    return absl::OutOfRangeError(absl::StrCat("skip_records ", spec_.skip_records,
                                              " is past the partition's ", records, " records"));
  }
  skip_ = spec_.skip_records;
  // KEY, where one pre-merged run is all there is to read and the chunks asked for are the ones
  // it was written in: its frames go out as stored, not decoded and encoded again (of a key
  // range, the frames inside it; the one or two at its ends are cut to it).
  stored_order_ = !spec_.key_order;
  // (A run's blocks were appended one after another: by offset.)
  const auto in_run = [&](const BlockRef& b) {
    const auto& run = merged_runs_[0]->blocks;
    auto at = std::lower_bound(run.begin(), run.end(), b.offset,
                               [](const BlockRef& r, uint64_t o) { return r.offset < o; });
    return at != run.end() && at->offset == b.offset;
  };
  if (spec_.key_order && merged_runs_.size() == 1 &&
      std::all_of(blocks_.begin(), blocks_.end(), in_run) && !blocks_.empty() &&
      spec_.layout == LayoutChoice::kAuto && !spec_.uncompressed &&
      (spec_.zstd_level == 0 || spec_.zstd_level == 3) && chunk_bytes_ == kPremergedChunkBytes) {
    stored_order_ = true;
    ranged_stored_ = ranged;
    runs_ = 1;
  }
  // Stored frames in order: whole ones left out without reading them (of a key range, only
  // frames inside it: the others' records in it are not known before they are read).
  while (stored_order_ && next_ < blocks_.size() && blocks_[next_].records <= skip_ &&
         (!ranged_stored_ || InsideRange(blocks_[next_]))) {
    skip_ -= blocks_[next_++].records;
  }
  return absl::OkStatus();
}

uint64_t FetchSession::bytes_to_read() const {
  uint64_t n = 0;
  for (const BlockRef& b : blocks_) n += b.frame_size;
  return n;
}

void FetchSession::Charge(uint64_t n) {
  charged_ = n;
  deps_.budget->Charge(spec_.tenant, n);
}

void FetchSession::Sent() {
  deps_.budget->Release(spec_.tenant, charged_);
  charged_ = 0;
}

uint64_t FetchSession::next_frame_bytes() const {
  if (!stored_order_ || next_ == blocks_.size()) return 0;
  return blocks_[next_].frame_size;
}

absl::StatusOr<bool> FetchSession::Next(std::string* frame) {
  Sent();  // (a caller that did not say so is done with the last frame all the same)
  return stored_order_ ? NextStored(frame) : NextMerged(frame);
}

bool FetchSession::last() const {
  if (!stored_order_) return merged_ != nullptr && merged_->drained();
  return next_ == blocks_.size();
}

bool FetchSession::InsideRange(const BlockRef& b) const {
  const KeyBounds k = ReadKeyBounds(b.bounds);
  return k.known && CompareKeys(k.lo, spec_.from_key) >= 0 &&
         (!spec_.to_key.has_value() || (!k.hi_cut && CompareKeys(k.hi, *spec_.to_key) < 0));
}

absl::StatusOr<bool> FetchSession::NextStored(std::string* frame) {
  while (next_ < blocks_.size()) {
    const BlockRef& b = blocks_[next_++];
    const bool cut = ranged_stored_ && !InsideRange(b);
    if (!cut && b.records <= skip_) {  // (a frame inside a range, left out whole)
      skip_ -= b.records;
      continue;
    }
    Charge(b.frame_size);
    if (skip_ == 0 && !cut) {
      SLUICE_RETURN_IF_ERROR(store_->ReadFrame(b, frame, nullptr, view_.get()));
      return true;
    }
    SLUICE_ASSIGN_OR_RETURN(const bool any, CutInto(b, cut, frame));
    if (any) return true;
    Sent();  // (nothing of it in the range, or all of it skipped)
  }
  return false;
}

absl::StatusOr<bool> FetchSession::CutInto(const BlockRef& b, bool to_range, std::string* frame) {
  std::string stored;
  SLUICE_RETURN_IF_ERROR(store_->ReadFrame(b, &stored, nullptr, view_.get()));
  DecodeOptions dopts;
  dopts.limits = StoredFrameLimits(deps_.limits);
  FrameDecoder decoder(dopts);
  DecodedFrame decoded;
  SLUICE_RETURN_IF_ERROR(decoder.Decode(stored, &decoded));
  std::vector<Record> rest;
  for (const Record& r : decoded) {
    if (to_range && (CompareKeys(r.key, spec_.from_key) < 0 ||
                     (spec_.to_key.has_value() && CompareKeys(r.key, *spec_.to_key) >= 0))) {
      continue;
    }
    if (skip_ > 0) {
      --skip_;
      continue;
    }
    rest.push_back(r);
  }
  if (rest.empty()) return false;
  frame->clear();
  FrameEncoder encoder(encode_);
  SLUICE_RETURN_IF_ERROR(encoder.Encode(rest, frame));
  return true;
}

absl::Status FetchSession::StartMerge() {
  DecodeOptions dopts;
  dopts.limits = StoredFrameLimits(deps_.limits);
  decoder_ = std::make_unique<FrameDecoder>(dopts);
  run_decoder_.decoder = decoder_.get();
  run_decoder_.view = view_.get();
  MergeOptions mopts = deps_.merge;
  mopts.cancelled = cancelled_;  // intermediate passes stop when the reducer goes away
  // What the merge is about to decode is counted before it is: pushes slow down at once.
  mopts.reserve = [this](uint64_t bytes) {
    if (bytes > merge_charged_) {
      deps_.budget->Charge(spec_.tenant, bytes - merge_charged_);
      merge_charged_ = bytes;
    }
  };
  // Runs are made as the merge reaches them (a partition may hold a million tiny frames).
  std::function<std::unique_ptr<RunSource>(std::unique_ptr<RunSource>)> wrap;
  if (!spec_.from_key.empty() || spec_.to_key.has_value()) {
    wrap = [this](std::unique_ptr<RunSource> run) {
      return KeyRangeRun(std::move(run), spec_.from_key, &spec_.to_key);
    };
  }
  SLUICE_ASSIGN_OR_RETURN(merged_,
                          MergeStoredBlocks(store_, &blocks_, &run_decoder_, wrap, mopts, &runs_));
  encoder_ = std::make_unique<FrameEncoder>(encode_);
  return absl::OkStatus();
}

absl::StatusOr<bool> FetchSession::NextMerged(std::string* frame) {
  if (merged_ == nullptr) SLUICE_RETURN_IF_ERROR(StartMerge());
  batch_.clear();
  SLUICE_ASSIGN_OR_RETURN(bool more, merged_->NextBatch(chunk_bytes_, &batch_));
  while (more && skip_ > 0) {  // records to leave out: whole batches, then part of one
    const size_t drop = static_cast<size_t>(std::min<uint64_t>(skip_, batch_.size()));
    batch_.erase(batch_.begin(), batch_.begin() + static_cast<std::ptrdiff_t>(drop));
    skip_ -= drop;
    if (!batch_.empty()) break;
    SLUICE_ASSIGN_OR_RETURN(more, merged_->NextBatch(chunk_bytes_, &batch_));
  }
  if (!more) return false;
  frame->clear();
  SLUICE_RETURN_IF_ERROR(encoder_->Encode(batch_, frame));
  Charge(frame->size());
  // The runs' frames stay resident between chunks: keep their count in the budget current.
  // (With the buffer the runs read stored frames into and the decoder's scratch.)
  const size_t resident =
      merged_->resident_bytes() + run_decoder_.bytes.capacity() + decoder_->scratch_bytes();
  if (resident > merge_charged_) {
    deps_.budget->Charge(spec_.tenant, resident - merge_charged_);
  } else {
    deps_.budget->Release(spec_.tenant, merge_charged_ - resident);
  }
  merge_charged_ = resident;
  return true;
}

}  // namespace sluice
