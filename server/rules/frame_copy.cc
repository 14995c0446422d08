#include "server/rules/frame_copy.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/key_bounds.h"

namespace sluice {

absl::Status FrameCopy::Add(absl::Span<const uint8_t> frame, const std::string& source,
                            std::string_view bounds) {
  absl::StatusOr<FrameHeader> h = ParseFrameHeader(frame, limits_);
  if (!h.ok() || h->frame_size() != frame.size() ||
      PayloadChecksum(frame.data() + kFrameHeaderSize, h->stored_size) != h->payload_checksum) {
    return absl::DataLossError(
        absl::StrCat("a frame copied from ", source, " failed its checks",
                     h.ok() ? "" : absl::StrCat(": ", h.status().message())));
  }
  bounds_.clear();
  if (!bounds.empty() && KeyBoundsSize(bounds) == bounds.size()) {
    bounds_.assign(bounds);  // (the source's, checked: no decode for them)
  } else if (h->uncompressed_size <= kMaxBoundsDecodeBytes &&
             decoder_->Decode(frame, &decoded_).ok()) {
    AppendFrameBounds(decoded_, &bounds_, &bound_keys_);
  }
  decoded_.Clear();
  const ShuffleStore::FrameToAppend one{partition_, frame, h->record_count, bounds_};
  SLUICE_RETURN_IF_ERROR(
      store_->AppendAll(mapper_, attempt_, absl::MakeConstSpan(&one, 1), &blocks_));
  bytes_ += frame.size();
  return absl::OkStatus();
}

}  // namespace sluice
