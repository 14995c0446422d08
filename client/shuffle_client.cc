// The transport-free parts of the client API: partitioners and grouping. The gRPC client is
// in grpc_client.cc, the writer and reader logic in partitioned_writer.cc and
// frame_stream_reader.cc.
#include "client/shuffle_client.h"

#include <algorithm>
#include <utility>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace sluice {

uint32_t HashPartition(std::string_view key, uint32_t num_partitions) {
  return static_cast<uint32_t>(XXH3_64bits(key.data(), key.size()) % num_partitions);
}

Partitioner RangePartitioner(std::vector<std::string> splits) {
  std::sort(splits.begin(), splits.end(),
            [](const std::string& a, const std::string& b) { return KeyLess(a, b); });
  return [splits = std::move(splits)](std::string_view key, uint32_t num_partitions) {
    // The number of splits <= key is the partition.
    const auto it =
        std::upper_bound(splits.begin(), splits.end(), key,
                         [](std::string_view k, const std::string& s) { return KeyLess(k, s); });
    const auto p = static_cast<uint32_t>(it - splits.begin());
    return std::min(p, num_partitions - 1);
  };
}

ReaderOptions SplitKeys::Slice(size_t i, ReaderOptions base) const {
  base.order = FetchOrder::kKey;
  base.from_key = i == 0 || i > keys.size() ? std::string() : keys[i - 1];
  base.to_key.reset();
  if (i < keys.size()) base.to_key = keys[i];
  if (i > keys.size()) base.to_key = std::string();  // no such slice: an empty range
  return base;
}

absl::StatusOr<bool> ShuffleReader::NextGroup(std::string* key, std::vector<std::string>* values) {
  values->clear();
  Record r;
  if (!has_pending_) {
    auto more = Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) return false;
    pending_key_.assign(r.key);
    pending_value_.assign(r.value);
  }
  has_pending_ = false;
  *key = pending_key_;
  values->push_back(pending_value_);
  for (;;) {
    auto more = Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) return true;
    if (r.key != *key) {
      pending_key_.assign(r.key);
      pending_value_.assign(r.value);
      has_pending_ = true;
      return true;
    }
    values->emplace_back(r.value);
  }
}

}  // namespace sluice
