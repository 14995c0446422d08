// The cluster client's fallback to the object store (ClientOptions::object_store;
// docs/object-store.md, "Reads with no server"): a reader of a shuffle's partition, or of one
// stored partition, read from the shuffle's objects by its manifest, for a read no server can
// serve. The store is opened at the first need (its credentials resolved then).
#ifndef SLUICE_CLIENT_STORE_FALLBACK_H_
#define SLUICE_CLIENT_STORE_FALLBACK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "client/cluster_readers.h"
#include "client/shuffle_client.h"
#include "objstore/s3_store.h"

namespace sluice::client_internal {

class StoreFallback {
 public:
  StoreFallback(std::string url, std::string endpoint)
      : url_(std::move(url)), endpoint_(std::move(endpoint)) {}
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
  const std::string url_, endpoint_;
  std::mutex mu_;
  std::unique_ptr<objstore::S3Store> store_;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_STORE_FALLBACK_H_
