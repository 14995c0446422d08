// S3Store: one bucket and prefix of an S3-compatible object store (AWS S3, GCS's XML API with
// HMAC keys, R2, MinIO, s3rver), over HTTP(S) with Debian's libcurl, signed with AWS SigV4 by
// libcurl itself (CURLOPT_AWS_SIGV4). docs/object-store.md.
//
// Every call is retried where retrying can help (transport errors, stalls, 408, 429, 5xx,
// SlowDown, InternalError, also inside a 200 CompleteMultipartUpload), with doubling, jittered
// backoff, and then fails UNAVAILABLE; answers retrying cannot change fail at once: NOT_FOUND
// (no such key or upload), PERMISSION_DENIED (403), FAILED_PRECONDITION (another 4xx, a
// certificate the endpoint's TLS does not pass). Errors name the call, the key and the store's
// code, never a secret. Keys are relative to the prefix and ValidObjectKey.
//
//   ASSIGN_OR_RETURN(auto store, S3Store::Make(options));  // options resolved (s3_options.h)
//   RETURN_IF_ERROR(store->Put("a/b", bytes));
//   ASSIGN_OR_RETURN(std::string tail, store->Get("a/b", 100, 50));  // bytes 100..149
//
// Thread-safe: calls from many threads share a pool of connections.
#ifndef SLUICE_OBJSTORE_S3_STORE_H_
#define SLUICE_OBJSTORE_S3_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "objstore/s3_options.h"
#include "objstore/s3_xml.h"

namespace sluice::objstore {

/// The requests a store was sent, by type (a retry counts again), and the bytes moved: what an
/// S3 bill counts.
struct S3Counters {
  uint64_t put = 0, get = 0, head = 0, del = 0, list = 0;
  uint64_t start_upload = 0, upload_part = 0, complete_upload = 0, abort_upload = 0,
           list_uploads = 0;
  uint64_t retries = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  /// Each request type by its S3 name (PutObject, GetObject, ..., ListMultipartUploads).
  std::vector<std::pair<const char*, uint64_t>> ByRequest() const {
    return {{"PutObject", put},
            {"GetObject", get},
            {"HeadObject", head},
            {"DeleteObject", del},
            {"ListObjectsV2", list},
            {"CreateMultipartUpload", start_upload},
            {"UploadPart", upload_part},
            {"CompleteMultipartUpload", complete_upload},
            {"AbortMultipartUpload", abort_upload},
            {"ListMultipartUploads", list_uploads}};
  }
  uint64_t requests() const {
    uint64_t n = 0;
    for (const auto& [request, count] : ByRequest()) n += count;
    return n;
  }
};

/// S3's limits on multipart uploads: every part but the last at least 5 MiB, at most 10,000.
inline constexpr uint64_t kMinPartBytes = 5u << 20;
inline constexpr int kMaxParts = 10000;

/// S3's ETag of an object completed from parts with these ETags: the hex MD5 of their binary
/// MD5s, "-", their count ("" when one is not an MD5).
std::string MultipartEtag(const std::vector<std::string>& part_etags);

/// A store as a user names it (a flag, a client option): its URL, s3://bucket/prefix, and what
/// is given instead of what the environment says (empty, nullopt: as ResolveS3Options finds it).
struct StoreLocation {
  StoreLocation(std::string u, std::string e = "") : url(std::move(u)), endpoint(std::move(e)) {}
  std::string url;
  std::string endpoint, region, ca_file;
  std::optional<bool> path_style;
};

class S3Store {
 public:
  /// S3OptionsFromUrl, the location's overrides, ResolveFromEnvironment, then Make:
  /// INVALID_ARGUMENT naming what is wrong (the URL, missing credentials, an endpoint).
  static absl::StatusOr<std::unique_ptr<S3Store>> Open(const StoreLocation& where);
  /// `options` resolved (ResolveS3Options); INVALID_ARGUMENT when they are not.
  static absl::StatusOr<std::unique_ptr<S3Store>> Make(S3Options options);
  ~S3Store();
  S3Store(const S3Store&) = delete;
  S3Store& operator=(const S3Store&) = delete;

  const S3Options& options() const { return options_; }

  absl::Status Put(absl::string_view key, absl::string_view data);
  /// The object's bytes from `offset`, `length` of them (nullopt: to its end). OUT_OF_RANGE when
  /// the object is shorter than asked.
  absl::StatusOr<std::string> Get(absl::string_view key, uint64_t offset = 0,
                                  std::optional<uint64_t> length = std::nullopt);
  /// Its size and ETag (key relative to the prefix).
  absl::StatusOr<ObjectInfo> Head(absl::string_view key);
  /// OK when the key was not there.
  absl::Status Delete(absl::string_view key);
  /// Every object whose key starts with `key_prefix` (relative to the prefix, keys returned
  /// relative too), all pages.
  absl::StatusOr<std::vector<ObjectInfo>> List(absl::string_view key_prefix);

  /// A multipart upload: started, parts 1.. uploaded (each but the last >= kMinPartBytes; the
  /// part's ETag returned), completed with the parts' ETags in order, or aborted.
  absl::StatusOr<std::string> StartUpload(absl::string_view key);
  absl::StatusOr<std::string> UploadPart(absl::string_view key, const std::string& upload_id,
                                         int part_number, absl::string_view data);
  /// A retry whose first try completed the upload (its answer lost) finds the upload gone and
  /// the object there: OK.
  absl::Status CompleteUpload(absl::string_view key, const std::string& upload_id,
                              const std::vector<std::string>& etags);
  /// OK when the upload is gone already.
  absl::Status AbortUpload(absl::string_view key, const std::string& upload_id);
  /// Uploads started and neither completed nor aborted, under `key_prefix` (keys relative).
  absl::StatusOr<std::vector<UploadInfo>> ListUploads(absl::string_view key_prefix);

  S3Counters counters() const;
  /// Calls fail faster in tests: attempts and backoff as given.
  void set_retries(int max_attempts, double backoff_first_s, double backoff_max_s);
  /// Keys per page of a list (S3's most: 1,000); smaller in tests, to see several pages.
  void set_list_page(int keys) { list_page_ = keys < 1 ? 1 : keys > 1000 ? 1000 : keys; }

  struct Call;  // (s3_store.cc)
  struct Pool;

 private:
  explicit S3Store(S3Options options);
  absl::StatusOr<std::string> KeyUrl(absl::string_view key, absl::string_view query) const;
  std::string Relative(std::string key) const;

  S3Options options_;
  int list_page_ = 1000;
  std::unique_ptr<Pool> pool_;
  struct Atomics {
    std::atomic<uint64_t> put{0}, get{0}, head{0}, del{0}, list{0}, start_upload{0}, upload_part{0},
        complete_upload{0}, abort_upload{0}, list_uploads{0}, retries{0}, bytes_sent{0},
        bytes_received{0};
  };
  std::unique_ptr<Atomics> counts_;
  friend struct Call;
};

}  // namespace sluice::objstore

#endif  // SLUICE_OBJSTORE_S3_STORE_H_
