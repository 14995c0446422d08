// Reading a shuffle straight from the object store, with no server and no etcd
// (docs/object-store.md, "Reads with no server"): the shuffle's manifest, which the servers
// write beside its objects once every stored partition is uploaded and recorded, names each
// partition's object; each is read by byte ranges (objstore/object_reader.h), every frame
// checked by its checksums as it is decoded, and served as a ShuffleReader: UNORDERED (the
// frames in the objects' order, read ahead in bounded batches) or KEY order (a merge of the
// frames' runs, which holds the partition's decoded frames: refused past a limit), with key
// ranges, skip_records and only_mappers as a server serves them.
//
//   ASSIGN_OR_RETURN(auto store, objstore::S3Store::Make(s3_options));
//   ASSIGN_OR_RETURN(auto shuffle, StoreShuffle::Open(store.get(), "job"));
//   ASSIGN_OR_RETURN(auto reader, shuffle->OpenReader(3, {.order = FetchOrder::kKey}));
//
// A tenant's shuffle is named here by the id the servers keep ("tenant~job"). Thread-safe to
// open readers from several threads; each reader is one thread's.
#ifndef SLUICE_CLIENT_STORE_READER_H_
#define SLUICE_CLIENT_STORE_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/shuffle_client.h"
#include "objstore/object_reader.h"
#include "objstore/object_record.h"
#include "objstore/s3_store.h"

namespace sluice {

struct StoreReadOptions {
  objstore::ReadOptions ranges;  ///< GET sizes and GETs in flight
  /// UNORDERED: stored bytes read ahead at once (at least one frame).
  uint64_t batch_bytes = 16u << 20;
  /// KEY order holds the partition's frames, stored and decoded: refused
  /// (RESOURCE_EXHAUSTED) when their decoded size passes this.
  uint64_t max_merge_bytes = uint64_t{1} << 30;
  /// Frames larger than this (decoded) are refused as damaged.
  uint32_t max_frame_bytes = 1u << 30;
};

class StoreShuffle {
 public:
  /// Reads and checks the shuffle's manifest. NOT_FOUND when the store holds none (the shuffle
  /// is not wholly uploaded yet, or was deleted); DATA_LOSS naming a damaged one; the store's
  /// errors as they are.
  static absl::StatusOr<std::unique_ptr<StoreShuffle>> Open(objstore::S3Store* store,
                                                            const std::string& shuffle_id,
                                                            StoreReadOptions options = {});
  const ShuffleManifest& manifest() const { return manifest_; }

  /// A reader of partition `partition` (its segments too). INVALID_ARGUMENT for a partition out
  /// of range or a key range on an UNORDERED read; ABORTED (reason REVOKED) when only_attempts
  /// names another attempt than the object holds; RESOURCE_EXHAUSTED for a KEY read past
  /// max_merge_bytes.
  absl::StatusOr<std::unique_ptr<ShuffleReader>> OpenReader(uint32_t partition,
                                                            const ReaderOptions& options = {});
  /// A reader of stored partition `stored` alone (a partition without its segments, or one
  /// segment), as a server serves one.
  absl::StatusOr<std::unique_ptr<ShuffleReader>> OpenStoredReader(
      uint32_t stored, const ReaderOptions& options = {});

 private:
  absl::StatusOr<std::unique_ptr<ShuffleReader>> OpenChain(uint32_t partition,
                                                           const std::vector<uint32_t>& chain,
                                                           const ReaderOptions& options);
  StoreShuffle(objstore::S3Store* store, StoreReadOptions options, ShuffleManifest manifest)
      : store_(store), options_(options), manifest_(std::move(manifest)) {}
  objstore::S3Store* const store_;
  const StoreReadOptions options_;
  const ShuffleManifest manifest_;
};

}  // namespace sluice

#endif  // SLUICE_CLIENT_STORE_READER_H_
