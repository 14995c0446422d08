// Uploader: --object_store, the object tier's uploads on one server (docs/object-store.md, "Who
// uploads"). Each round, for every shuffle this server holds whose record has not settled:
//   - the plan (upload_plan.h: a complete shuffle, the first registered server of a
//     partition's newest replicas, a replica whole for it, no record standing) says which of
//     its stored partitions this server uploads; each is uploaded to a key of its own
//     (objstore/object_record.h: PartitionObjectKey) and recorded in etcd
//     (PlacementStore::RecordObject). A racer that lost, and an upload whose shuffle was deleted
//     meanwhile, delete their objects; a record replaced because a revocation made it stale has
//     its object deleted by the replacer. An object whose record could not be made (etcd did
//     not answer) is kept until a record is read that does not name it, then deleted.
//   - once every stored partition's record stands, the server that uploads partition 0 writes
//     the shuffle's manifest to the store (ManifestKey): a reader with no server and no etcd
//     finds the objects by it. The shuffle is then settled at its placement's revision. Once
//     its placement moves, a record found stale (a revocation) has the manifest deleted at
//     once, before the revoked mappers run again.
//   - a shuffle this server held objects of and that is no longer recorded (deleted, or expired)
//     has everything under its prefix deleted from the store.
//
//   Uploader up(&registry, &node, s3.get(), {}, &metrics);
//   Periodic every(Uploader::kPeriod, [&] { up.Run(); });
//
// Not thread-safe: one caller at a time; Stop() may be called from another thread.
#ifndef SLUICE_SERVER_RULES_UPLOADER_H_
#define SLUICE_SERVER_RULES_UPLOADER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "objstore/object_upload.h"
#include "objstore/s3_store.h"
#include "server/metrics/server_metrics.h"
#include "server/rules/cluster_node.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

class Uploader {
 public:
  struct Options {
    objstore::UploadOptions upload;
    /// How long a round's reads of etcd wait.
    std::chrono::milliseconds etcd_deadline{2000};
  };
  /// How often the server runs a round.
  static constexpr std::chrono::milliseconds kPeriod{2000};
  /// `metrics` may be null.
  Uploader(ShuffleRegistry* registry, ClusterNode* node, objstore::S3Store* store, Options options,
           ServerMetrics* metrics);

  /// One round over the shuffles held here. Returns the objects this round recorded.
  uint64_t Run();
  /// Whether every stored partition of shuffle `id` had its record standing in the last round
  /// that looked, at the placement remembered now (its data is all in the store: the Evictor
  /// may let it go). Thread-safe.
  bool IsSettled(const std::string& id) const;
  /// Ends a round in progress before its next upload. Idempotent.
  void Stop() { stopping_.store(true); }

 private:
  // Uploads and records what the plan gives this server of shuffle `id`; writes its manifest
  // once every stored partition's record stands. Returns the objects recorded.
  uint64_t RunShuffle(const std::string& id);
  // A server without etcd (docs/object-store.md, "A server on its own"): a complete shuffle
  // here is uploaded whole, every partition, then recorded in its OBJECTS file (the commit
  // point) after its manifest in the store. Returns the objects recorded.
  uint64_t RunAlone(const std::string& id);
  // Uploads stored partition `partition` of shuffle `id` to a key of its own and returns the
  // record that names it (not made anywhere yet); a failure is counted and logged.
  absl::StatusOr<ObjectRecord> UploadOne(const ShuffleStore& store, const std::string& id,
                                         uint32_t partition, const std::string& node_id,
                                         const std::vector<std::pair<uint32_t, uint64_t>>& winners);
  // Counts an object recorded (in etcd, or a server's own OBJECTS file).
  void CountRecorded(const ObjectRecord& r);
  // Deletes `key` from the store (counted; a failure is logged and left to the lifecycle rule).
  void DeleteObject(const std::string& id, const std::string& key, const char* why);
  // The shuffles held here before that are no longer recorded: everything under their prefix.
  void SweepDeleted(const std::set<std::string>& held_now);

  ShuffleRegistry* const registry_;
  ClusterNode* const node_;
  objstore::S3Store* const store_;
  const Options options_;
  ServerMetrics* const metrics_;
  std::atomic<bool> stopping_{false};
  std::mt19937_64 nonce_;
  // Per shuffle, the placement (its record's revision, epoch and stored partitions) at which
  // its every record stood: nothing to do until the placement changes.
  using Settled = std::tuple<int64_t, uint32_t, uint32_t>;
  mutable std::mutex settled_mu_;  // guards settled_ (IsSettled is asked from other threads)
  std::map<std::string, Settled> settled_;
  // Shuffles whose manifest this server deleted for a stale record (until settled again).
  std::set<std::string> dropped_;
  // Shuffles this server has seen held here with the tier on: swept once no longer recorded.
  std::set<std::string> known_;
  // Objects uploaded here whose record is not known (etcd did not answer), by shuffle:
  // (partition, key).
  std::map<std::string, std::vector<std::pair<uint32_t, std::string>>> unsure_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_UPLOADER_H_
