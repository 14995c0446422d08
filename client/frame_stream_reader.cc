#include "client/frame_stream_reader.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

DecodeOptions Options(const FrameLimits& limits) {
  DecodeOptions opts;
  opts.limits = limits;
  return opts;
}

}  // namespace

FrameStreamReader::FrameStreamReader(std::unique_ptr<FetchStream> stream, const FrameLimits& limits,
                                     std::string source)
    : stream_(std::move(stream)), source_(std::move(source)), decoder_(Options(limits)) {}

FrameStreamReader::~FrameStreamReader() {
  if (!done_) stream_->Cancel();
}

absl::StatusOr<bool> FrameStreamReader::Next(Record* out) {
  while (pos_ >= frame_.size()) {
    if (done_) return false;
    const std::string* bytes = nullptr;
    auto more = stream_->Next(&bytes);
    if (!more.ok() || !*more) {
      done_ = true;
      return more;
    }
    absl::Status st = decoder_.Decode(*bytes, &frame_);
    if (!st.ok()) {
      return absl::DataLossError(absl::StrCat("bad frame from ", source_, ": ", st.message()));
    }
    pos_ = 0;
  }
  *out = frame_[pos_++];
  return true;
}

}  // namespace sluice
