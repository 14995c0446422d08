#include "server/rules/push_attempt.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/key_bounds.h"
#include "rpc/error_reason.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

// Scratch a thread's validating decoder may keep between frames.
constexpr size_t kKeptDecoderScratch = 8u << 20;

// Every thread keeps one decoder and one decoded frame for validating pushed frames, so that
// validation allocates nothing per stream and a stream holds no decoded memory between
// messages. Remade when asked for other limits (tests run servers with different caps in one
// process).
struct Validator {
  std::unique_ptr<FrameDecoder> decoder;
  FrameLimits limits;
  DecodedFrame decoded;
  // Threads live as long as the server: after an unusually large frame, let its memory go
  // rather than keep a cap's worth per thread.
  void Trim() {
    decoder->TrimScratch(kKeptDecoderScratch);
    if (decoded.memory_bytes() > kKeptDecoderScratch) decoded = DecodedFrame();
  }
};

Validator& ThreadValidator(const FrameLimits& limits) {
  thread_local Validator v;
  if (v.decoder == nullptr || v.limits.max_uncompressed_bytes != limits.max_uncompressed_bytes ||
      v.limits.max_records != limits.max_records) {
    DecodeOptions opts;
    opts.limits = limits;
    opts.keys_only = true;  // every byte checked; values are not needed to accept a frame
    v.decoder = std::make_unique<FrameDecoder>(opts);
    v.limits = limits;
  }
  return v;
}

}  // namespace

PushAttempt::~PushAttempt() {
  if (!ended_) Abort(absl::CancelledError("push attempt dropped before its commit"));
}

absl::Status PushAttempt::Open(std::string_view shuffle_id, uint32_t mapper, uint64_t attempt,
                               std::shared_ptr<const std::vector<bool>> kept) {
  if (store_ != nullptr)
    return absl::InvalidArgumentError("second open message in one push stream");
  SLUICE_RETURN_IF_ERROR(
      registry_->CheckRoom(std::string(shuffle_id), limits_.disk_high_water_pct));
  auto store = registry_->GetForWriting(std::string(shuffle_id));
  if (!store.ok()) return store.status();
  const ShuffleParams& params = (*store)->params();
  if (params.num_mappers != 0 && mapper >= params.num_mappers) {
    (*store)->EndWriter();
    return absl::InvalidArgumentError(
        absl::StrCat("mapper ", mapper, " is out of range [0, ", params.num_mappers, ")"));
  }
  if (mapper == kMergedMapper) {
    (*store)->EndWriter();
    return absl::InvalidArgumentError(absl::StrCat(
        "mapper id ", mapper, " is reserved (the server's pre-merged runs): use a smaller id"));
  }
  store_ = std::move(store).value();
  store_->Touch();
  kept_ = std::move(kept);
  mapper_ = mapper;
  attempt_ = attempt;
  return absl::OkStatus();
}

absl::Status PushAttempt::AddFrame(uint32_t partition, absl::Span<const uint8_t> frame) {
  const Frame one{partition, frame};
  return AddFrames(absl::MakeConstSpan(&one, 1));
}

absl::Status PushAttempt::AddFrames(absl::Span<const Frame> frames) {
  if (store_ == nullptr) return absl::InvalidArgumentError("frames before the open message");
  SLUICE_RETURN_IF_ERROR(NoLargeFramePending("frames"));
  validated_.clear();
  bounds_.clear();
  bounds_at_.clear();
  uint64_t records = 0, bytes = 0;
  for (const Frame& f : frames) {
    const uint64_t n = frames_ + validated_.size();  // the frame's number in the attempt
    if (n >= limits_.max_frames_per_attempt) {
      // Its list of blocks is kept until the commit (24 bytes a frame), then indexed.
      return absl::ResourceExhaustedError(absl::StrCat(
          "attempt reached ", limits_.max_frames_per_attempt,
          " frames, the most one attempt may push (--max_frames_per_attempt): send larger "
          "frames"));
    }
    if (f.partition >= store_->params().num_partitions) {
      return absl::InvalidArgumentError(absl::StrCat("frame ", n, ": partition ", f.partition,
                                                     " is out of range [0, ",
                                                     store_->params().num_partitions, ")"));
    }
    SLUICE_RETURN_IF_ERROR(Kept(f.partition));
    Validator& v = ThreadValidator(limits_.frame);
    absl::Status st = v.decoder->Decode(f.bytes, &v.decoded);
    const auto count = static_cast<uint32_t>(v.decoded.size());
    bounds_at_.push_back(bounds_.size());
    if (st.ok()) AppendFrameBounds(v.decoded, &bounds_, &bound_keys_);
    v.Trim();
    if (!st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("frame ", n, " for partition ", f.partition, ": ", st.message()));
    }
    validated_.push_back(ShuffleStore::FrameToAppend{f.partition, f.bytes, count, {}});
    records += count;
    bytes += f.bytes.size();
  }
  bounds_at_.push_back(bounds_.size());
  for (size_t i = 0; i < validated_.size(); ++i) {
    validated_[i].bounds =
        std::string_view(bounds_).substr(bounds_at_[i], bounds_at_[i + 1] - bounds_at_[i]);
  }
  SLUICE_RETURN_IF_ERROR(store_->AppendAll(mapper_, attempt_, validated_, &blocks_));
  store_->Touch();
  frames_ += validated_.size();
  records_ += records;
  bytes_ += bytes;
  return absl::OkStatus();
}

absl::Status PushAttempt::NoLargeFramePending(const char* what) const {
  if (large_size_ == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " before the last piece of the large frame for partition ", large_partition_, " (",
      large_bytes_.size(), " of its announced ", large_size_, " bytes came)"));
}

absl::Status PushAttempt::Kept(uint32_t partition) const {
  if (kept_ == nullptr || partition >= kept_->size() || (*kept_)[partition]) {
    return absl::OkStatus();
  }
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat(
          "partition ", partition, " of shuffle '", ShuffleName(store_->params().shuffle_id),
          "' is kept on other servers of the cluster, not this one (GetPlacement "
          "says which)")),
      ErrorReason::kNotKept);
}

absl::Status PushAttempt::BeginLargeFrame(uint32_t partition, uint64_t size) {
  if (store_ == nullptr) return absl::InvalidArgumentError("a large frame before the open message");
  SLUICE_RETURN_IF_ERROR(NoLargeFramePending("another large frame"));
  if (partition >= store_->params().num_partitions) {
    return absl::InvalidArgumentError(absl::StrCat("large frame: partition ", partition,
                                                   " is out of range [0, ",
                                                   store_->params().num_partitions, ")"));
  }
  SLUICE_RETURN_IF_ERROR(Kept(partition));
  // A frame is its header and at most the cap of stored payload (docs/frame-format.md).
  const uint64_t cap = kFrameHeaderSize + uint64_t{limits_.frame.max_uncompressed_bytes};
  if (size <= kFrameHeaderSize || size > cap) {
    return absl::InvalidArgumentError(absl::StrCat(
        "large frame for partition ", partition, " announced as ", size,
        " bytes; a frame is more than its ", kFrameHeaderSize, "-byte header and at most ", cap,
        " bytes with this server's cap (--max_frame_mb)"));
  }
  large_partition_ = partition;
  large_size_ = size;
  large_bytes_.clear();
  return absl::OkStatus();
}

absl::Status PushAttempt::AddPiece(absl::Span<const uint8_t> piece) {
  if (large_size_ == 0) {
    return absl::InvalidArgumentError("a frame piece with no large frame announced before it");
  }
  if (piece.empty()) return absl::InvalidArgumentError("an empty frame piece");
  if (piece.size() > large_size_ - large_bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the pieces of the large frame for partition ", large_partition_, " exceed its announced ",
        large_size_, " bytes (", large_bytes_.size() + piece.size(), " came)"));
  }
  if (large_bytes_.empty()) large_bytes_.reserve(large_size_);
  large_bytes_.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  if (large_bytes_.size() < large_size_) return absl::OkStatus();
  const Frame frame{large_partition_,
                    absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(large_bytes_.data()),
                                        large_bytes_.size())};
  large_size_ = 0;  // complete: AddFrames takes it like any other frame
  absl::Status st = AddFrames(absl::MakeConstSpan(&frame, 1));
  std::string().swap(large_bytes_);  // a large frame's memory is not kept for the next
  return st;
}

absl::StatusOr<PushSummary> PushAttempt::Commit(uint64_t frame_count, uint64_t record_count,
                                                bool prepare) {
  if (!prepare && limits_.require_prepare) {
    return absl::FailedPreconditionError(
        "this server is part of a cluster: an attempt is prepared on every server of its "
        "shuffle (a commit message with prepare) and then decided with CommitMapper; use a "
        "client that takes the server list");
  }
  if (store_ == nullptr) return absl::InvalidArgumentError("commit before the open message");
  SLUICE_RETURN_IF_ERROR(NoLargeFramePending("the commit"));
  if (frame_count != frames_ || record_count != records_) {
    return absl::InvalidArgumentError(absl::StrCat("commit says ", frame_count, " frames and ",
                                                   record_count, " records, the server received ",
                                                   frames_, " frames and ", records_, " records"));
  }
  commit_tried_ = true;
  auto outcome = prepare ? store_->Prepare(mapper_, attempt_, blocks_)
                         : store_->Commit(mapper_, attempt_, blocks_);
  if (!outcome.ok()) {
    // Refused before anything was written: the blocks are ours to discard.
    if (absl::IsAlreadyExists(outcome.status())) commit_tried_ = false;
    return outcome.status();
  }
  PushSummary summary;
  summary.duplicate = *outcome == CommitOutcome::kDuplicate;
  summary.prepared = prepare && !summary.duplicate;
  if (summary.duplicate) store_->Discard(blocks_);
  summary.frames = frames_;
  summary.records = records_;
  summary.bytes = bytes_;
  ended_ = true;
  store_->EndWriter();
  spdlog::info(
      "event={} tenant={} shuffle={} mapper={} attempt={} frames={} records={} bytes={} "
      "duplicate={}",
      prepare ? "prepare" : "commit", TenantField(store_->params().shuffle_id),
      store_->params().shuffle_id, mapper_, attempt_, frames_, records_, bytes_, summary.duplicate);
  return summary;
}

void PushAttempt::Abort(const absl::Status& why) {
  if (ended_) return;
  ended_ = true;
  if (store_ == nullptr) return;
  // After a failed commit its record may be on disk anyway: leave the blocks for recovery to
  // judge rather than punching out data a durable record might point at.
  if (!blocks_.empty() && !commit_tried_) store_->Discard(blocks_);
  store_->EndWriter();
  spdlog::info("event=push_failed tenant={} shuffle={} mapper={} attempt={} code={} error=\"{}\"",
               TenantField(store_->params().shuffle_id), store_->params().shuffle_id, mapper_,
               attempt_, absl::StatusCodeToString(why.code()), std::string(why.message()));
}

}  // namespace sluice
