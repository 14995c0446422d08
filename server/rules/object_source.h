// ObjectSource: the object store as the source of a repair (docs/object-store.md, "Restoring
// from the store"). When no server holds a mapper's data of a partition any more (every replica
// lost), the repairer copies it from the partition's recorded object instead of marking it lost:
// the record (in etcd) names the object and the winners it holds; the object's frames of the
// mappers asked for are read by byte ranges, in the object's order (mappers ascending), each
// handed over as stored for the repairer to check and append as it does a peer's.
//
//   ObjectSource objects(&node, s3.get(), {});
//   ASSIGN_OR_RETURN(auto records, objects.Records("job"));
//   RETURN_IF_ERROR(objects.Read("job", 3, records.at(3), {0, 2}, each));
//
// Thread-safe (the store is).
#ifndef SLUICE_SERVER_RULES_OBJECT_SOURCE_H_
#define SLUICE_SERVER_RULES_OBJECT_SOURCE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "objstore/object_reader.h"
#include "objstore/object_record.h"
#include "objstore/s3_store.h"
#include "server/rules/cluster_node.h"
#include "server/storage/shuffle_registry.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

class ObjectSource {
 public:
  /// `registry`: where a server without etcd reads its records (the shuffles' OBJECTS files).
  ObjectSource(ClusterNode* node, objstore::S3Store* store, objstore::ReadOptions ranges,
               ShuffleRegistry* registry = nullptr)
      : node_(node), store_(store), ranges_(ranges), registry_(registry) {}

  /// The shuffle's object records, by stored partition (read from etcd, etcd's errors as they
  /// are; on a server without etcd, from the shuffle's OBJECTS file: NOT_FOUND without one).
  absl::StatusOr<std::map<uint32_t, ObjectRecord>> Records(const std::string& id);
  /// Of `want` (mapper -> attempt), the mappers the object `record` names (stored partition
  /// `partition` of shuffle `id`) holds at those attempts (its footer's winners); calls
  /// `each(mapper, frame, bounds)` with every frame of those and its key bounds as the footer
  /// gives them (empty: not known), in the object's order. Stops at the first
  /// error (the store's, the object's, or `each`'s) and returns it. DATA_LOSS when the object
  /// is not the one its record says (its footer's winners, shuffle or partition).
  absl::StatusOr<std::set<uint32_t>> Read(
      const std::string& id, uint32_t partition, const ObjectRecord& record,
      const std::map<uint32_t, uint64_t>& want,
      const std::function<absl::Status(uint32_t, absl::string_view, absl::string_view)>& each);
  /// Copies the `want` pairs of stored partition `partition` that the object `record` names
  /// holds into `store` (Read, each mapper's frames checked and appended by a FrameCopy and
  /// made visible with a REPAIR record; a mapper it holds with no frame in the partition is
  /// recorded with none). `pace(bytes)` before each frame: false stops (CANCELLED). What was
  /// restored stays restored when a later mapper fails: `status` says why it stopped.
  struct Restored {
    std::set<uint32_t> mappers;
    uint64_t bytes = 0;
    absl::Status status;
  };
  Restored RestoreInto(ShuffleStore& store, const std::string& id, uint32_t partition,
                       const ObjectRecord& record, const std::map<uint32_t, uint64_t>& want,
                       const std::function<bool(uint64_t)>& pace);
  const std::string& name() const { return name_; }

 private:
  ClusterNode* const node_;
  objstore::S3Store* const store_;
  const objstore::ReadOptions ranges_;
  ShuffleRegistry* const registry_;
  const std::string name_ = "the object store";
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_OBJECT_SOURCE_H_
