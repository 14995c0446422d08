// PartitionObjectReader: reads a partition's object (partition_object.h) back from an S3Store by
// byte ranges, with no server that wrote it (docs/object-store.md, "Reads"). Opening it reads
// the object's tail once (the trailer and, for all but very large footers, the footer with it:
// one GET); frames are then read in order, neighbours coalesced into GETs of up to `range_bytes`,
// up to `parallel` GETs in flight, each handed to the caller in order. The caller checks each
// frame (its own checksums: the codec decodes it); the reader checks that every range came back
// whole.
//
//   ASSIGN_OR_RETURN(auto r, PartitionObjectReader::Open(store, {key, size}, "job", 7));
//   RETURN_IF_ERROR(r->ReadFrames(0, r->footer().frames.size(),
//                                 [&](size_t i, absl::string_view frame) { ... }));
#ifndef SLUICE_OBJSTORE_OBJECT_READER_H_
#define SLUICE_OBJSTORE_OBJECT_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "objstore/partition_object.h"
#include "objstore/s3_store.h"

namespace sluice::objstore {

struct ObjectRef {
  std::string key;
  uint64_t size = 0;
};

struct ReadOptions {
  /// Bytes one GET asks for at most (frames larger than it are one GET each).
  uint64_t range_bytes = 8u << 20;
  /// GETs in flight at once (1 to 64). Memory: about parallel x range_bytes.
  int parallel = 4;
  /// Bytes of the object's tail the open reads in its first GET.
  uint64_t tail_bytes = 256u << 10;
};

class PartitionObjectReader {
 public:
  /// Reads and checks the footer (DATA_LOSS naming the damage; the store's errors as they are).
  static absl::StatusOr<std::unique_ptr<PartitionObjectReader>> Open(S3Store* store,
                                                                     ObjectRef object,
                                                                     absl::string_view shuffle_id,
                                                                     uint32_t partition,
                                                                     ReadOptions options = {});

  const PartitionObjectFooter& footer() const { return footer_; }
  /// GETs the open took (1, or 2 for a footer larger than the tail read).
  int open_requests() const { return open_requests_; }

  /// Frames [first, last) of the footer's list, each handed to `each(index, bytes)` in order;
  /// the first error (the store's, or `each`'s) stops the read and is returned.
  absl::Status ReadFrames(size_t first, size_t last,
                          const std::function<absl::Status(size_t, absl::string_view)>& each);

 private:
  PartitionObjectReader(S3Store* store, ObjectRef object, ReadOptions options)
      : store_(store), object_(std::move(object)), options_(options) {}
  S3Store* const store_;
  const ObjectRef object_;
  const ReadOptions options_;
  PartitionObjectFooter footer_;
  int open_requests_ = 0;
};

}  // namespace sluice::objstore

#endif  // SLUICE_OBJSTORE_OBJECT_READER_H_
