// The few S3 XML answers Sluice reads (ListObjectsV2, ListMultipartUploads,
// InitiateMultipartUpload, CompleteMultipartUpload, Error), parsed with libxml2: no network,
// no entities loaded, names matched without their namespace. A body that is not the answer
// expected is an error naming what is missing, never a crash: the store is not trusted either.
#ifndef SLUICE_OBJSTORE_S3_XML_H_
#define SLUICE_OBJSTORE_S3_XML_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::objstore {

struct ObjectInfo {
  std::string key;  ///< the whole key, the store's prefix included
  uint64_t size = 0;
  std::string etag;  ///< without its quotes
};

struct ObjectList {
  std::vector<ObjectInfo> objects;
  bool truncated = false;
  std::string next_token;  ///< ListObjectsV2's NextContinuationToken
};

struct UploadInfo {
  std::string key;
  std::string upload_id;
};

struct UploadList {
  std::vector<UploadInfo> uploads;
  bool truncated = false;
  std::string next_key_marker;
  std::string next_upload_id_marker;
};

/// An <Error> body's Code and Message (empty when the body is not one).
struct S3Error {
  std::string code;
  std::string message;
};

absl::StatusOr<ObjectList> ParseListObjects(absl::string_view xml);
absl::StatusOr<UploadList> ParseListUploads(absl::string_view xml);
/// InitiateMultipartUploadResult's UploadId.
absl::StatusOr<std::string> ParseUploadId(absl::string_view xml);
/// Whether the body is an <Error> (CompleteMultipartUpload may answer 200 with one), and its
/// code and message.
S3Error ParseError(absl::string_view xml);

}  // namespace sluice::objstore

#endif  // SLUICE_OBJSTORE_S3_XML_H_
