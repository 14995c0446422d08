// libFuzzer target for the S3 answers Sluice parses (objstore/s3_xml.h): an object store's
// bytes, not trusted. Every parser sees every input; none may crash, and what they accept is
// sane (a truncated list gives its token or marker).
#include <cstdint>
#include <string>

#include "objstore/s3_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice::objstore;
  const absl::string_view xml(reinterpret_cast<const char*>(data), size);
  auto objects = ParseListObjects(xml);
  if (objects.ok()) {
    if (objects->truncated && objects->next_token.empty()) __builtin_trap();
    for (const ObjectInfo& o : objects->objects) {
      if (o.key.empty()) __builtin_trap();
    }
  }
  auto uploads = ParseListUploads(xml);
  if (uploads.ok()) {
    if (uploads->truncated && uploads->next_key_marker.empty()) __builtin_trap();
    for (const UploadInfo& u : uploads->uploads) {
      if (u.key.empty() || u.upload_id.empty()) __builtin_trap();
    }
  }
  auto id = ParseUploadId(xml);
  if (id.ok() && id->empty()) __builtin_trap();
  (void)ParseError(xml);
  return 0;
}
