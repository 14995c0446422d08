// Shuffle ids as the server keeps them. An id names a directory, so it is 1-128 of
// [A-Za-z0-9._-], not starting with '.'. With tenants (server/security/tenancy.h) a tenant's
// shuffle `job` is kept as `tenant~job`: '~' is outside the id alphabet, so each tenant has a
// namespace of its own, and the part before it is always a valid tenant name.
//
//   ValidateShuffleId("team-a~job");   // OK
//   TenantOf("team-a~job");            // "team-a"
//   ShuffleName("team-a~job");         // "job": the id as its tenant knows it
//
// Storage knows ids only as strings: which caller may see which is the security layer's
// business, not storage's.
#ifndef SLUICE_SERVER_STORAGE_SHUFFLE_ID_H_
#define SLUICE_SERVER_STORAGE_SHUFFLE_ID_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sluice {

inline constexpr char kTenantSeparator = '~';
/// The longest id a caller gives (a tenant's `job`), and the longest kept id (`tenant~job`).
inline constexpr size_t kMaxShuffleIdBytes = 128;
inline constexpr size_t kMaxKeptIdBytes = 64 + 1 + kMaxShuffleIdBytes;

/// `id` quoted for a message: whole when short, else its first characters and its length (a
/// message must not grow with what a caller sends: gRPC refuses large status messages).
std::string QuotedId(absl::string_view id);

/// A tenant name: 1-64 of letters, digits, '.', '_', '-', not starting with '.'.
bool ValidTenantName(absl::string_view s);

/// INVALID_ARGUMENT unless `id` is a shuffle id the server may keep (see above).
absl::Status ValidateShuffleId(absl::string_view id);

/// The tenant a kept id belongs to; "" for one outside every tenant's namespace.
absl::string_view TenantOf(absl::string_view kept_id);

/// The id as its tenant addresses it: the tenant part taken off ("job" for "t~job").
absl::string_view ShuffleName(absl::string_view kept_id);

/// The tenant of a kept id for a log line's tenant= field: "-" for none.
std::string TenantField(absl::string_view kept_id);

}  // namespace sluice

#endif  // SLUICE_SERVER_STORAGE_SHUFFLE_ID_H_
