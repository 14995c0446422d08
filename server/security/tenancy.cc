#include "server/security/tenancy.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace sluice {

std::string TenantPrefix(const Identity& who) {
  if (who.admin() || who.tenant.empty()) return "";
  return absl::StrCat(who.tenant, std::string(1, kTenantSeparator));
}

absl::StatusOr<std::string> QualifiedId(const Identity& who, const std::string& id) {
  const std::string prefix = TenantPrefix(who);
  if (prefix.empty()) return id;
  if (id.find(kTenantSeparator) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shuffle id '", id, "' may only use letters, digits, '.', '_' and '-'"));
  }
  return absl::StrCat(prefix, id);
}

std::string CallerId(const Identity& who, absl::string_view kept_id) {
  const std::string prefix = TenantPrefix(who);
  if (!prefix.empty() && absl::StartsWith(kept_id, prefix)) kept_id.remove_prefix(prefix.size());
  return std::string(kept_id);
}

std::string ForCaller(const Identity& who, absl::string_view text) {
  const std::string prefix = TenantPrefix(who);
  if (prefix.empty()) return std::string(text);
  return absl::StrReplaceAll(text, {{prefix, ""}});
}

absl::Status ForCaller(const Identity& who, const absl::Status& st) {
  if (st.ok() || TenantPrefix(who).empty()) return st;
  return absl::Status(st.code(), ForCaller(who, st.message()));
}

TenantLimits LimitsOf(const Identity& who, const TenantLimits& defaults) {
  if (TenantPrefix(who).empty()) return TenantLimits{};
  return TenantLimits{who.quota.shuffles.value_or(defaults.shuffles),
                      who.quota.stored_bytes.value_or(defaults.stored_bytes),
                      who.quota.streams.value_or(defaults.streams)};
}

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
