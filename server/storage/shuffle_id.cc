#include "server/storage/shuffle_id.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace sluice {

bool ValidTenantName(absl::string_view s) {
  if (s.empty() || s.size() > 64 || s[0] == '.') return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

std::string QuotedId(absl::string_view id) {
  if (id.size() <= 64) return absl::StrCat("'", id, "'");
  return absl::StrCat("'", id.substr(0, 32), "...' (", id.size(), " characters)");
}

absl::Status ValidateShuffleId(absl::string_view id) {
  if (const size_t sep = id.find(kTenantSeparator); sep != absl::string_view::npos) {
    if (!ValidTenantName(id.substr(0, sep))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shuffle id ", QuotedId(id), ": what comes before '~' is not a tenant name"));
    }
    const absl::string_view rest = id.substr(sep + 1);
    if (rest.find(kTenantSeparator) != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("shuffle id ", QuotedId(id), " may hold one '~' (tenant~id), not more"));
    }
    return ValidateShuffleId(rest);
  }
  if (id.empty() || id.size() > kMaxShuffleIdBytes || id[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat(
        "shuffle id ", QuotedId(id), " must be 1-128 characters and not start with '.'"));
  }
  for (char c : id) {
    const bool ok =
        absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("shuffle id '", id, "' may only use letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::string_view TenantOf(absl::string_view kept_id) {
  const size_t at = kept_id.find(kTenantSeparator);
  return at == absl::string_view::npos ? absl::string_view() : kept_id.substr(0, at);
}

absl::string_view ShuffleName(absl::string_view kept_id) {
  const size_t at = kept_id.find(kTenantSeparator);
  return at == absl::string_view::npos ? kept_id : kept_id.substr(at + 1);
}

std::string TenantField(absl::string_view kept_id) {
  const absl::string_view t = TenantOf(kept_id);
  return t.empty() ? std::string("-") : std::string(t);
}

}  // namespace sluice
