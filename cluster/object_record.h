// A partition's object in the object store, as its commit record says (docs/object-store.md,
// "The commit point"): the object's key, size and ETag, the server that uploaded it, its frame
// count and the winners it stands for. The record, not the object, is the commit point: it is
// created once per partition (create-if-absent in etcd, PlacementStore::RecordObject), so any
// S3-compatible store works, conditional writes or not, and racing uploaders agree on one
// object (the others delete theirs). A record stands for the partition only while its winners
// are the shuffle's decisions (a revocation makes it stale): StandsFor.
#ifndef SLUICE_CLUSTER_OBJECT_RECORD_H_
#define SLUICE_CLUSTER_OBJECT_RECORD_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/shuffle_placement.h"

namespace sluice {

struct ObjectRecord {
  std::string key;  ///< relative to the store's prefix
  uint64_t size = 0;
  std::string etag;
  std::string by;  ///< the uploading server's node id
  uint32_t frames = 0;
  /// (mapper, attempt) of every winner the object stands for, mappers ascending.
  std::vector<std::pair<uint32_t, uint64_t>> winners;
  /// The record's mod revision in etcd (not part of the record; 0 when not read from etcd):
  /// what replacing it when it no longer stands is conditioned on.
  int64_t revision = 0;
  bool operator==(const ObjectRecord& o) const {
    return key == o.key && size == o.size && etag == o.etag && by == o.by && frames == o.frames &&
           winners == o.winners;
  }
};

/// The record's JSON, and back (DATA_LOSS naming what is wrong with a malformed one).
std::string EncodeObjectRecord(const ObjectRecord& r);
absl::StatusOr<ObjectRecord> DecodeObjectRecord(const std::string& json);

/// Whether `r` stands for the shuffle's partition now: its winners are exactly the decided
/// mappers' winning attempts, and every mapper of the shuffle (`num_mappers`, when known) is
/// decided.
bool StandsFor(const ObjectRecord& r, const std::map<uint32_t, MapperDecision>& decided,
               uint32_t num_mappers);

}  // namespace sluice

#endif  // SLUICE_CLUSTER_OBJECT_RECORD_H_
