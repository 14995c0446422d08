#include "client/store_fallback.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/store_reader.h"
#include "client/transport.h"

namespace sluice::client_internal {
namespace {

// A reader that keeps the shuffle's manifest it reads by.
class Holding final : public ShuffleReader {
 public:
  Holding(std::shared_ptr<StoreShuffle> shuffle, std::unique_ptr<ShuffleReader> reader)
      : shuffle_(std::move(shuffle)), reader_(std::move(reader)) {}
  absl::StatusOr<bool> Next(Record* out) override { return reader_->Next(out); }

 private:
  std::shared_ptr<StoreShuffle> shuffle_;
  std::unique_ptr<ShuffleReader> reader_;
};

}  // namespace

absl::StatusOr<objstore::S3Store*> StoreFallback::Store() {
  std::lock_guard<std::mutex> lock(mu_);
  if (store_ == nullptr) {
    SLUICE_ASSIGN_OR_RETURN(store_, objstore::S3Store::Open({url_, endpoint_}));
  }
  return store_.get();
}

absl::StatusOr<std::shared_ptr<StoreShuffle>> StoreFallback::Shuffle(const std::string& id) {
  SLUICE_ASSIGN_OR_RETURN(objstore::S3Store * store, Store());
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = manifests_.find(id);
    if (it != manifests_.end() && now - it->second.at < ttl_) return it->second.shuffle;
  }
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<StoreShuffle> shuffle, StoreShuffle::Open(store, id));
  std::lock_guard<std::mutex> lock(mu_);
  manifests_[id] = Manifest{shuffle, now};
  return shuffle;
}

absl::StatusOr<std::unique_ptr<ShuffleReader>> StoreFallback::Open(const std::string& id,
                                                                   uint32_t partition,
                                                                   const ReaderOptions& options,
                                                                   bool stored) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<StoreShuffle> shuffle, Shuffle(id));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<ShuffleReader> reader,
                          stored ? shuffle->OpenStoredReader(partition, options)
                                 : shuffle->OpenReader(partition, options));
  return std::unique_ptr<ShuffleReader>(new Holding(std::move(shuffle), std::move(reader)));
}

absl::StatusOr<std::unique_ptr<ShuffleReader>> StoreFallback::Or(
    StoreFallback* fallback, bool servers_down, const Read& read_servers, const std::string& id,
    uint32_t partition, const ReaderOptions& options) {
  if (fallback != nullptr && servers_down) {
    auto stored = fallback->Open(id, partition, options, /*stored=*/false);
    if (stored.ok()) return stored;
  }
  absl::StatusOr<std::unique_ptr<ShuffleReader>> read = read_servers();
  if (read.ok() || fallback == nullptr || !absl::IsUnavailable(read.status())) return read;
  auto stored = fallback->Open(id, partition, options, /*stored=*/false);
  if (stored.ok()) return stored;
  return absl::UnavailableError(
      absl::StrCat(read.status().message(), "; the object store: ", Describe(stored.status())));
}

FailoverReader::StoreReader StoreFallback::Of(StoreFallback* fallback, const std::string& id,
                                              uint32_t stored) {
  if (fallback == nullptr) return {};
  return [fallback, id, stored](const ReaderOptions& o) {
    return fallback->Open(id, stored, o, /*stored=*/true);
  };
}

}  // namespace sluice::client_internal
