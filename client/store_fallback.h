// The cluster client's fallback to the object store (ClientOptions::object_store;
// docs/object-store.md, "Reads with no server"): a reader of a shuffle's partition, or of one
// stored partition, read from the shuffle's objects by its manifest, for a read no server can
// serve. The store is opened at the first need (its credentials resolved then).
#ifndef SLUICE_CLIENT_STORE_FALLBACK_H_
#define SLUICE_CLIENT_STORE_FALLBACK_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "client/cluster_readers.h"
#include "client/shuffle_client.h"
#include "client/store_reader.h"
#include "objstore/s3_store.h"

namespace sluice::client_internal {

class StoreFallback {
 public:
  /// A shuffle's manifest, once read, serves its reads for `manifest_ttl` (a revocation
  /// replaces it: the client's placement_ttl bounds how long a client reads by the old one).
  StoreFallback(std::string url, std::string endpoint,
                std::chrono::milliseconds manifest_ttl = std::chrono::seconds(10))
      : url_(std::move(url)), endpoint_(std::move(endpoint)), ttl_(manifest_ttl) {}
  /// A client's (ClientOptions::object_store; its placement_ttl), or null without one.
  static std::unique_ptr<StoreFallback> For(const ClientOptions& options) {
    if (options.object_store.empty()) return nullptr;
    return std::make_unique<StoreFallback>(options.object_store, options.object_endpoint,
                                           options.placement_ttl);
  }
  /// Partition `partition` of shuffle `id` (`stored`: stored partition `partition` alone).
  /// NOT_FOUND when the store holds no manifest of the shuffle; the store's errors as they are.
  absl::StatusOr<std::unique_ptr<ShuffleReader>> Open(const std::string& id, uint32_t partition,
                                                      const ReaderOptions& options, bool stored);
  /// `read()` (a read through the servers), unless it fails UNAVAILABLE and `fallback` (may be
  /// null) holds the shuffle: then partition `partition` from the store. `servers_down` (every
  /// server failed lately): the store is asked first, the servers only if it lacks the shuffle.
  using Read = std::function<absl::StatusOr<std::unique_ptr<ShuffleReader>>()>;
  static absl::StatusOr<std::unique_ptr<ShuffleReader>> Or(StoreFallback* fallback,
                                                           bool servers_down, const Read& read,
                                                           const std::string& id,
                                                           uint32_t partition,
                                                           const ReaderOptions& options);
  /// What a FailoverReader of stored partition `stored` reads when no replica serves it
  /// (empty without a fallback).
  static FailoverReader::StoreReader Of(StoreFallback* fallback, const std::string& id,
                                        uint32_t stored);

 private:
  absl::StatusOr<objstore::S3Store*> Store();
  // The shuffle's manifest: read again past the TTL.
  absl::StatusOr<std::shared_ptr<StoreShuffle>> Shuffle(const std::string& id);
  const std::string url_, endpoint_;
  const std::chrono::milliseconds ttl_;
  std::mutex mu_;
  std::unique_ptr<objstore::S3Store> store_;
  struct Manifest {
    std::shared_ptr<StoreShuffle> shuffle;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, Manifest> manifests_;  // by shuffle id
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_STORE_FALLBACK_H_
