// Where an S3-compatible object store is and how to sign for it (docs/object-store.md): the
// `--object_store s3://bucket/prefix` URL, the endpoint, region and addressing, and the
// credentials, resolved the way AWS's own tools resolve them (environment variables, then the
// shared credentials and config files, profile AWS_PROFILE or "default"). Resolution is a pure
// function of an environment and two files' text, so it is tested without touching the
// process's own.
//
//   ASSIGN_OR_RETURN(S3Options o, S3OptionsFromUrl("s3://bucket/shuffles"));
//   o.endpoint = "http://127.0.0.1:4569";  // (empty: AWS's regional endpoint)
//   RETURN_IF_ERROR(ResolveFromEnvironment(&o));
//
// Secrets never reach a log or an error: S3Options::DebugString() redacts them.
#ifndef SLUICE_OBJSTORE_S3_OPTIONS_H_
#define SLUICE_OBJSTORE_S3_OPTIONS_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::objstore {

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;  ///< never logged
  std::string session_token;      ///< temporary credentials' token; never logged
  /// Where they came from ("environment", "shared credentials file profile 'x'"), for logs.
  std::string source;
};

struct S3Options {
  std::string bucket;
  /// Every key Sluice writes lies under it ("" or ending in '/').
  std::string prefix;
  /// scheme://host[:port] ("https://storage.googleapis.com", "http://127.0.0.1:4569"); empty:
  /// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else https://s3.<region>.amazonaws.com.
  std::string endpoint;
  /// The signing region; empty: AWS_REGION, AWS_DEFAULT_REGION, the profile's `region`, else
  /// us-east-1 (what S3-compatible stores without regions accept, "auto" for R2).
  std::string region;
  /// Path-style addressing (endpoint/bucket/key) rather than virtual-hosted
  /// (bucket.endpoint/key). nullopt: path-style for a custom endpoint, virtual-hosted for AWS.
  std::optional<bool> path_style;
  /// A CA bundle for the endpoint's TLS (empty: the system's).
  std::string ca_file;
  S3Credentials credentials;

  /// Retries of one call (transport errors, 408, 429, 5xx, SlowDown, InternalError): attempts
  /// in all, and the backoff, doubled each time with jitter, from first_s up to max_s.
  int max_attempts = 6;
  double backoff_first_s = 0.2;
  double backoff_max_s = 10;
  /// A call that moves fewer than 1 KiB/s for this long is abandoned (and retried): a stalled
  /// store. Connecting gives up after connect_timeout_s.
  int stall_timeout_s = 30;
  int connect_timeout_s = 10;

  /// "s3://bucket/prefix at endpoint (region r, path-style, key id AKIA…XYZ)": no secret.
  std::string DebugString() const;
  /// s3://bucket/prefix as given.
  std::string Url() const;
};

/// The bucket and prefix of `url` (s3://bucket[/prefix]); the rest left for the caller.
/// INVALID_ARGUMENT naming what is wrong: another scheme, no bucket, a bucket name S3 refuses,
/// or a prefix with characters other than letters, digits and "/-_.~" or a "." or ".." segment.
absl::StatusOr<S3Options> S3OptionsFromUrl(absl::string_view url);
/// Whether `key` may name an object under a prefix: letters, digits and "/-_.~" (what SigV4
/// leaves unescaped), no empty, "." or ".." path segment, so that it is its own canonical URI
/// when signed. Every shuffle id is such a segment.
bool ValidObjectKey(absl::string_view key);
/// A prefix keys are listed by: empty, or a valid key with or without a '/' after it.
bool ValidKeyPrefix(absl::string_view prefix);

/// Reads a variable of an environment (nullopt: unset).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
/// Reads a file's text (nullopt: no such file).
using FileLookup = std::function<std::optional<std::string>(const std::string&)>;

/// Fills what `options` leaves empty from the environment and the shared files, as the AWS
/// tools do: credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY(/AWS_SESSION_TOKEN), else
/// from AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials) then AWS_CONFIG_FILE (~/.aws/config),
/// profile AWS_PROFILE or "default"; the region and endpoint as S3Options says.
/// INVALID_ARGUMENT: no credentials anywhere, half a pair, a malformed endpoint.
absl::Status ResolveS3Options(S3Options* options, const EnvLookup& env, const FileLookup& files);
/// ResolveS3Options with this process's environment and files.
absl::Status ResolveFromEnvironment(S3Options* options);

}  // namespace sluice::objstore

#endif  // SLUICE_OBJSTORE_S3_OPTIONS_H_
