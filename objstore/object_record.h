// A partition's object in the object store, as its commit record says (docs/object-store.md,
// "The commit point"): the object's key, size and ETag, the server that uploaded it, its frame
// count and the winners it stands for; and a shuffle's manifest, the records of all its
// partitions once every one is uploaded, kept in the store beside the objects so that a reader
// with no server and no etcd finds them ("Reads with no server"). One JSON encoding of a record,
// in etcd and in manifests alike.
//
// The record, not the object, is the commit point: it is created once per partition
// (create-if-absent in etcd, PlacementStore::RecordObject), so any S3-compatible store works,
// conditional writes or not, and racing uploaders agree on one object (the others delete
// theirs). Whether a record stands for its partition is the cluster's to say
// (cluster/object_record.h: StandsFor).
#ifndef SLUICE_OBJSTORE_OBJECT_RECORD_H_
#define SLUICE_OBJSTORE_OBJECT_RECORD_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice {

/// The winners an object stands for, as its record keeps them: how many, and the XXH3-64 of
/// the list ((mapper, attempt) pairs, mappers ascending, each as u32 and u64 little-endian), not
/// the list itself: every partition's record names the same M winners, and listed, a shuffle of
/// P partitions would keep P x M pairs in etcd (and in its manifest). The object's footer holds
/// the list; a record is compared with a footer or with the decisions by this.
struct WinnerSet {
  uint32_t count = 0;
  uint64_t hash = 0;
  WinnerSet() = default;
  WinnerSet(const std::vector<std::pair<uint32_t, uint64_t>>& winners);  // (implicit)
  WinnerSet(std::initializer_list<std::pair<uint32_t, uint64_t>> winners)
      : WinnerSet(std::vector<std::pair<uint32_t, uint64_t>>(winners)) {}
  friend bool operator==(const WinnerSet& a, const WinnerSet& b) {
    return a.count == b.count && a.hash == b.hash;
  }
  friend bool operator!=(const WinnerSet& a, const WinnerSet& b) { return !(a == b); }
};

struct ObjectRecord {
  std::string key;  ///< relative to the store's prefix
  uint64_t size = 0;
  std::string etag;
  std::string by;  ///< the uploading server's node id
  uint32_t frames = 0;
  /// Every winner the object stands for (its footer lists them).
  WinnerSet winners;
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

/// A shuffle's objects, every stored partition's (its partitions, then its huge partitions'
/// segments: segment k is stored partition `partitions + k`, of partition segment_parents[k]).
struct ShuffleManifest {
  std::string shuffle_id;
  uint32_t partitions = 0;
  uint32_t mappers = 0;
  std::vector<uint32_t> segment_parents;
  std::map<uint32_t, ObjectRecord> objects;  ///< by stored partition: one each
  uint32_t stored() const { return partitions + static_cast<uint32_t>(segment_parents.size()); }
  /// Partition `p`'s stored partitions: p, then its segments in order.
  std::vector<uint32_t> ChainOf(uint32_t p) const;
  bool operator==(const ShuffleManifest& o) const {
    return shuffle_id == o.shuffle_id && partitions == o.partitions && mappers == o.mappers &&
           segment_parents == o.segment_parents && objects == o.objects;
  }
};

/// The manifest's JSON, and back: DATA_LOSS naming the damage unless it is the manifest of
/// `shuffle_id` with exactly one object for every stored partition, each with a valid key and
/// `mappers` winners.
std::string EncodeShuffleManifest(const ShuffleManifest& m);
absl::StatusOr<ShuffleManifest> DecodeShuffleManifest(const std::string& json,
                                                      absl::string_view shuffle_id);

/// Where a shuffle's objects lie in the store (relative to its prefix): everything under
/// "<shuffle id>/"; partition q's object, uploaded by `node` ("<id>/p<q>-<node>-<nonce>": racing
/// uploaders never write one key); the manifest ("<id>/manifest.json").
std::string ShuffleObjectsPrefix(absl::string_view shuffle_id);
std::string PartitionObjectKey(absl::string_view shuffle_id, uint32_t partition,
                               absl::string_view node, uint64_t nonce);
std::string ManifestKey(absl::string_view shuffle_id);
/// The node that uploaded the partition object `key` names (PartitionObjectKey's; node ids may
/// hold '-', the nonce does not); empty for any other key (the manifest).
std::string PartitionObjectUploader(absl::string_view key);

}  // namespace sluice

#endif  // SLUICE_OBJSTORE_OBJECT_RECORD_H_
