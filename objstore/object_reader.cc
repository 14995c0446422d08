#include "objstore/object_reader.h"

#include <algorithm>
#include <deque>
#include <future>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace sluice::objstore {

absl::StatusOr<std::unique_ptr<PartitionObjectReader>> PartitionObjectReader::Open(
    S3Store* store, ObjectRef object, absl::string_view shuffle_id, uint32_t partition,
    ReadOptions options) {
  if (options.parallel < 1 || options.parallel > 64 || options.range_bytes == 0 ||
      options.tail_bytes < kTrailerBytes) {
    return absl::InvalidArgumentError("object read: parallel 1 to 64, ranges and tail non-zero");
  }
  std::unique_ptr<PartitionObjectReader> r(
      new PartitionObjectReader(store, std::move(object), options));
  const uint64_t size = r->object_.size;
  if (size < kTrailerBytes) {
    return absl::DataLossError(absl::StrCat("partition object ", r->object_.key, " of ", size,
                                            " bytes is shorter than a trailer"));
  }
  const uint64_t tail_at = size - std::min(size, options.tail_bytes);
  ++r->open_requests_;
  SLUICE_ASSIGN_OR_RETURN(std::string tail, store->Get(r->object_.key, tail_at, size - tail_at));
  SLUICE_ASSIGN_OR_RETURN(
      const uint64_t footer_size,
      FooterSize(absl::string_view(tail).substr(tail.size() - kTrailerBytes), size));
  const uint64_t footer_at = size - kTrailerBytes - footer_size;
  std::string footer_bytes;
  if (footer_at >= tail_at) {
    footer_bytes = tail.substr(footer_at - tail_at, footer_size);
  } else {
    ++r->open_requests_;
    SLUICE_ASSIGN_OR_RETURN(footer_bytes, store->Get(r->object_.key, footer_at, footer_size));
  }
  absl::StatusOr<PartitionObjectFooter> footer =
      DecodeFooter(footer_bytes, size, shuffle_id, partition);
  if (!footer.ok()) {
    return absl::DataLossError(
        absl::StrCat("object ", r->object_.key, ": ", footer.status().message()));
  }
  r->footer_ = *std::move(footer);
  return r;
}

absl::Status PartitionObjectReader::ReadFrames(
    size_t first, size_t last, const std::function<absl::Status(size_t, absl::string_view)>& each) {
  const std::vector<ObjectFrame>& frames = footer_.frames;
  if (first > last || last > frames.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("object read: frames [", first, ", ", last, ") of ", frames.size()));
  }
  // Ranges of neighbouring frames, each at most range_bytes (or one frame).
  struct Range {
    size_t first, last;
    uint64_t offset, bytes;
  };
  std::vector<Range> ranges;
  for (size_t i = first; i < last; ++i) {
    const ObjectFrame& f = frames[i];
    if (!ranges.empty() && ranges.back().bytes + f.size <= options_.range_bytes) {
      ranges.back().last = i + 1;
      ranges.back().bytes += f.size;
    } else {
      ranges.push_back(Range{i, i + 1, f.offset, f.size});
    }
  }
  std::deque<std::future<absl::StatusOr<std::string>>> in_flight;
  size_t next = 0;
  const auto launch = [&] {
    const Range r = ranges[next++];
    in_flight.push_back(std::async(
        std::launch::async, [this, r] { return store_->Get(object_.key, r.offset, r.bytes); }));
  };
  absl::Status st;
  for (size_t done = 0; done < ranges.size() && st.ok(); ++done) {
    while (next < ranges.size() && in_flight.size() < static_cast<size_t>(options_.parallel)) {
      launch();
    }
    absl::StatusOr<std::string> bytes = in_flight.front().get();
    in_flight.pop_front();
    if (!bytes.ok()) {
      st = bytes.status();
      break;
    }
    const Range& r = ranges[done];
    for (size_t i = r.first; i < r.last && st.ok(); ++i) {
      st = each(i, absl::string_view(*bytes).substr(frames[i].offset - r.offset, frames[i].size));
    }
  }
  for (auto& f : in_flight) f.wait();  // (a failed read leaves none running behind it)
  return st;
}

}  // namespace sluice::objstore
