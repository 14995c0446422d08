// ObjectUpload: one object written to an S3Store as a stream of bytes (docs/object-store.md,
// "Uploads"). Bytes are cut into parts of exactly `part_bytes` (S3 and R2 want every part but
// the last at least 5 MiB, R2 wants them all the same size), up to `parallel_parts` of them in
// flight at once, each retried by the store; an object smaller than a part is one PUT. A shared
// RateLimiter holds a server's uploads to --object_mb_per_s. An upload that fails, or that is
// dropped before Finish, is aborted: no open multipart upload is left behind by choice (a crash
// leaves one for the bucket's lifecycle rule).
//
//   ASSIGN_OR_RETURN(auto up, ObjectUpload::Start(store, "s/job/p7", {}));
//   RETURN_IF_ERROR(up->Append(frames));
//   RETURN_IF_ERROR(up->Append(footer));
//   ASSIGN_OR_RETURN(ObjectInfo done, up->Finish());
//
// Memory: at most (parallel_parts + 1) x part_bytes, the buffer being filled and those in flight.
#ifndef SLUICE_OBJSTORE_OBJECT_UPLOAD_H_
#define SLUICE_OBJSTORE_OBJECT_UPLOAD_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "objstore/s3_store.h"

namespace sluice::objstore {

/// Bytes a second shared by every upload given it (a token bucket holding up to a second's
/// worth). 0: no limit.
class RateLimiter {
 public:
  explicit RateLimiter(double bytes_per_s) : rate_(bytes_per_s) {}
  /// Waits until `bytes` may be sent.
  void Take(uint64_t bytes);

 private:
  const double rate_;
  std::mutex mu_;
  double tokens_ = 0;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

struct UploadOptions {
  uint64_t part_bytes = 8u << 20;  ///< at least kMinPartBytes
  int parallel_parts = 4;          ///< 1 to 64
  RateLimiter* limiter = nullptr;  ///< shared by a server's uploads; null: none
};

class ObjectUpload {
 public:
  /// INVALID_ARGUMENT: a part under kMinPartBytes or over 5 GiB, parallel parts out of range, a
  /// bad key. Nothing is sent before the first full part (or Finish).
  static absl::StatusOr<std::unique_ptr<ObjectUpload>> Start(S3Store* store, std::string key,
                                                             UploadOptions options);
  ~ObjectUpload();  // aborts an upload not finished
  ObjectUpload(const ObjectUpload&) = delete;
  ObjectUpload& operator=(const ObjectUpload&) = delete;

  /// Adds bytes; a full part is handed to a sender, waiting while `parallel_parts` are in
  /// flight. The first error of any part is returned (by this call or a later one), and the
  /// upload is then aborted.
  absl::Status Append(absl::string_view bytes);
  /// Sends what is left and completes the object: its size and ETag.
  absl::StatusOr<ObjectInfo> Finish();
  /// Stops sending and aborts the multipart upload (if one was started). Idempotent.
  void Abort();

  int parts_sent() const;

 private:
  ObjectUpload(S3Store* store, std::string key, UploadOptions options);
  // Hands the buffer to the senders as the next part (starting the multipart upload and the
  // senders at the first), waiting while parallel_parts are queued or in flight.
  absl::Status SendPart();
  void Sender();
  absl::Status FirstError();
  void StopSenders();

  S3Store* const store_;
  const std::string key_;
  const UploadOptions options_;
  std::string buffer_;
  std::string upload_id_;  // empty until the first full part
  bool finished_ = false, aborted_ = false;

  mutable std::mutex mu_;
  std::condition_variable work_;                    // senders wait for a part or the stop
  std::condition_variable room_;                    // SendPart and Finish wait for a part to end
  std::vector<std::pair<int, std::string>> queue_;  // (part number, bytes)
  int in_flight_ = 0;
  bool stop_ = false;
  absl::Status error_;
  std::vector<std::string> etags_;  // by part number - 1
  std::vector<std::thread> senders_;
};

}  // namespace sluice::objstore

#endif  // SLUICE_OBJSTORE_OBJECT_UPLOAD_H_
