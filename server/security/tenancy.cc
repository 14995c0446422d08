#include "server/security/tenancy.h"

#include "absl/strings/str_cat.h"

namespace sluice {

absl::Status Tenants::Enter(const std::string& tenant, uint64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& n = open_[tenant];
  if (limit != 0 && n >= limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant '", tenant, "' has ", n,
                     " push and fetch streams open on this server, its quota "
                     "(streams: its quota line in --auth_file, else --tenant_max_streams); retry "
                     "once some end"));
  }
  ++n;
  return absl::OkStatus();
}

std::shared_ptr<std::mutex> Tenants::CreateMutex(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& m = create_mu_[tenant];
  if (m == nullptr) m = std::make_shared<std::mutex>();
  return m;
}

void Tenants::Leave(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(tenant);
  if (it != open_.end() && --it->second == 0) open_.erase(it);
}

}  // namespace sluice
