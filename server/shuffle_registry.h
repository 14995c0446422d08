// ShuffleRegistry: the server's shuffles, by id, each backed by a ShuffleStore directory under
// <data_dir>/shuffles/. On start it opens every shuffle directory it finds (recovering each).
// A shuffle that fails recovery is kept as *damaged*: its files stay as they are, it is listed
// with the reason, its data calls fail with DATA_LOSS, its id stays taken, and Delete removes
// it. The others keep serving.
#ifndef SLUICE_SERVER_SHUFFLE_REGISTRY_H_
#define SLUICE_SERVER_SHUFFLE_REGISTRY_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/shuffle_store.h"

namespace sluice {

/// A shuffle whose recovery failed at start.
struct DamagedShuffle {
  ShuffleParams params;  ///< shuffle_id always; the rest when its parameters could be read
  absl::Status reason;   ///< with paths relative to the data directory
};

class ShuffleRegistry {
 public:
  /// Opens `data_dir` (creating it if needed) and recovers every shuffle in it. Recovery
  /// failures are returned in `*failed` (id -> status, for the log) and those shuffles are kept
  /// as damaged.
  static absl::StatusOr<std::unique_ptr<ShuffleRegistry>> Open(
      const std::string& data_dir, const StoreOptions& options,
      std::map<std::string, absl::Status>* failed);

  /// Creates a shuffle, or returns created=false when one with the same parameters exists.
  absl::StatusOr<bool> Create(const ShuffleParams& params);
  /// NOT_FOUND for an unknown id, DATA_LOSS for a damaged shuffle.
  absl::StatusOr<std::shared_ptr<ShuffleStore>> Get(const std::string& id) const;
  /// Get for a push attempt, counted as a writer of the store (call EndWriter on it when the
  /// attempt ends). A wedged store (a failed disk write stopped its commit log) that no push is
  /// writing to any more is reopened first: its log and committed blocks are re-verified and
  /// every byte no commit owns (the refused attempt's too) is reclaimed, as at a start. While
  /// pushes still write to it: UNAVAILABLE, retry. If re-verifying finds damage, the shuffle
  /// becomes damaged (DATA_LOSS).
  absl::StatusOr<std::shared_ptr<ShuffleStore>> GetForWriting(const std::string& id);
  std::vector<std::shared_ptr<ShuffleStore>> List() const;
  std::optional<DamagedShuffle> FindDamaged(const std::string& id) const;
  std::vector<DamagedShuffle> ListDamaged() const;
  /// Removes a shuffle, damaged or not.
  absl::Status Delete(const std::string& id);

  /// Shuffle ids name directories: 1-128 of [A-Za-z0-9._-], not starting with '.'.
  static absl::Status ValidateId(const std::string& id);
  /// The id and the partition count within their limits (what Create checks first).
  static absl::Status ValidateParams(const ShuffleParams& params);

  /// `st` with the data directory taken out of its paths: what clients are told (they see
  /// names relative to the data directory; the server's log keeps the full paths).
  absl::Status WithRelativePaths(const absl::Status& st) const;

 private:
  ShuffleRegistry(std::string data_dir, StoreOptions options)
      : data_dir_(std::move(data_dir)), options_(options) {}
  std::string ShuffleDir(const std::string& id) const;
  // Renames the shuffle's directory away durably (the delete's one atomic step); returns where.
  absl::StatusOr<std::string> MoveToTrash(const std::string& id);

  const std::string data_dir_;
  const StoreOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<ShuffleStore>> shuffles_;
  std::map<std::string, DamagedShuffle> damaged_;
  std::set<std::string> reopening_;  // wedged stores being reopened
  uint64_t trash_counter_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SHUFFLE_REGISTRY_H_
