// Tenants (docs/security.md, "Isolation" and "Quotas"). With --auth_file every call has a
// tenant, and a tenant's shuffle `job` is kept as `<tenant>~job`: '~' is outside the shuffle id
// alphabet, so each tenant has a namespace of its own. Another tenant's shuffles are simply not
// there for it (NOT_FOUND, absent from its listings), it cannot take their ids first, and no
// message it gets names them: the prefix is added on the way in and taken out of everything on
// the way out. Admins, and every caller of a server without --auth_file, address the raw
// names (a tenant's shuffle as `tenant~job`).
//
// Quotas bound what one tenant makes this server hold: shuffles, bytes stored, open streams.
// Transport-free: the service hands in the caller's identity.
#ifndef SLUICE_SERVER_SECURITY_TENANCY_H_
#define SLUICE_SERVER_SECURITY_TENANCY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/security/auth.h"
#include "server/storage/shuffle_id.h"

namespace sluice {

/// Shuffle `id` as the server keeps it for caller `who`. A tenant's id may not hold '~'.
absl::StatusOr<std::string> QualifiedId(const Identity& who, const std::string& id);
/// The prefix of `who`'s shuffles ("tenant~"), or "" for those that address raw names.
std::string TenantPrefix(const Identity& who);
/// A kept id as `who` knows it (the prefix taken off).
std::string CallerId(const Identity& who, absl::string_view kept_id);
/// `text` as `who` may see it: its tenant's prefix taken out.
std::string ForCaller(const Identity& who, absl::string_view text);
/// `st` as `who` may see it: its tenant's prefix taken out of the message.
absl::Status ForCaller(const Identity& who, const absl::Status& st);

/// What a tenant may hold (0 = no limit): the server's flags as defaults, or one tenant's.
struct TenantLimits {
  uint64_t shuffles = 0;      ///< --tenant_max_shuffles
  uint64_t stored_bytes = 0;  ///< --tenant_max_stored_mb
  uint64_t streams = 0;       ///< --tenant_max_streams
};

/// `who`'s limits: its quota line's, else the defaults; none for admins and without
/// authentication.
TenantLimits LimitsOf(const Identity& who, const TenantLimits& defaults);

/// What the server counts per tenant: open push and fetch streams, and a lock for its creates.
class Tenants {
 public:
  /// Takes a stream for `tenant` if it has fewer than `limit` open (0: no limit), else
  /// RESOURCE_EXHAUSTED naming the quota.
  absl::Status Enter(const std::string& tenant, uint64_t limit);
  void Leave(const std::string& tenant);

  /// The lock a tenant's creates hold while they check its shuffle quota.
  std::shared_ptr<std::mutex> CreateMutex(const std::string& tenant);

 private:
  std::mutex mu_;
  std::map<std::string, uint64_t> open_;  // tenants with streams open
  std::map<std::string, std::shared_ptr<std::mutex>> create_mu_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SECURITY_TENANCY_H_
