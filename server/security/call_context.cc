#include "server/security/call_context.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/storage/shuffle_id.h"

namespace sluice {

CallContext::CallContext(Identity who, const TenantLimits& defaults, std::string peer, bool local)
    : who_(std::move(who)), peer_(std::move(peer)), local_(local) {
  if (who_.admin() || who_.tenant.empty()) return;  // kept names, no quotas
  prefix_ = absl::StrCat(who_.tenant, std::string(1, kTenantSeparator));
  limits_ = TenantLimits{who_.quota.shuffles.value_or(defaults.shuffles),
                         who_.quota.stored_bytes.value_or(defaults.stored_bytes),
                         who_.quota.streams.value_or(defaults.streams)};
}

absl::StatusOr<CallContext> CallContext::Resolve(const Authenticator* auth,
                                                 const TenantLimits& defaults,
                                                 absl::string_view authorization,
                                                 absl::string_view cert_name, std::string peer,
                                                 bool local) {
  if (auth == nullptr) return CallContext(Identity{}, defaults, std::move(peer), local);
  absl::StatusOr<Identity> who = auth->Authenticate(authorization, cert_name);
  if (!who.ok()) return who.status();
  return CallContext(*std::move(who), defaults, std::move(peer), local);
}

absl::StatusOr<std::string> CallContext::Kept(absl::string_view id) const {
  // Checked before anything looks it up or names it in a message.
  if (const size_t max = prefix_.empty() ? kMaxKeptIdBytes : kMaxShuffleIdBytes; id.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("shuffle id ", QuotedId(id), " is too long: an id is 1-128 characters"));
  }
  if (prefix_.empty()) return std::string(id);
  if (id.find(kTenantSeparator) != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shuffle id ", QuotedId(id), " may only use letters, digits, '.', '_' and '-'"));
  }
  return absl::StrCat(prefix_, id);
}

std::string CallContext::Shown(absl::string_view kept_id) const {
  if (!prefix_.empty() && absl::StartsWith(kept_id, prefix_)) kept_id.remove_prefix(prefix_.size());
  return std::string(kept_id);
}

}  // namespace sluice
