// Tenants' quotas (docs/security.md, "Quotas"): what one tenant may make this server hold
// (shuffles, bytes stored, open streams), and what the server counts per tenant to enforce
// them. How a tenant addresses its shuffles is CallContext's (server/security/call_context.h).
// Transport-free.
#ifndef SLUICE_SERVER_SECURITY_TENANCY_H_
#define SLUICE_SERVER_SECURITY_TENANCY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"

namespace sluice {

/// What a tenant may hold (0 = no limit): the server's flags as defaults, or one tenant's.
struct TenantLimits {
  uint64_t shuffles = 0;      ///< --tenant_max_shuffles
  uint64_t stored_bytes = 0;  ///< --tenant_max_stored_mb
  uint64_t streams = 0;       ///< --tenant_max_streams
};

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
