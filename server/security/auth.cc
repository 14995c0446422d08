#include "server/security/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

constexpr size_t kDigestBytes = 32;
constexpr size_t kMaxTokenBytes = 4096;
constexpr std::streamsize kMaxFileBytes = 16 << 20;

std::string Sha256(absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), n);
}

}  // namespace

namespace {

// A quota line's fields after the tenant: key=value, each key at most once.
absl::Status ParseQuota(absl::Span<const absl::string_view> fields, TenantQuota* q) {
  for (absl::string_view f : fields) {
    const size_t eq = f.find('=');
    const absl::string_view key = f.substr(0, eq);
    uint64_t v = 0;
    const absl::string_view digits = eq == absl::string_view::npos ? "" : f.substr(eq + 1);
    if (digits.empty() || digits.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(digits, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("'", f, "' is not key=number"));
    }
    std::optional<uint64_t>* slot = key == "shuffles"    ? &q->shuffles
                                    : key == "stored_mb" ? &q->stored_bytes
                                    : key == "streams"   ? &q->streams
                                                         : nullptr;
    if (slot == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown quota '", key, "' (the quotas are shuffles, stored_mb and streams)"));
    }
    if (slot->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("quota '", key, "' given twice"));
    }
    if (key == "stored_mb") {
      if (v > (uint64_t{1} << 43)) {
        return absl::InvalidArgumentError("stored_mb is at most 8796093022208 (8 EiB)");
      }
      v <<= 20;
    }
    *slot = v;
  }
  return absl::OkStatus();
}

void LogUnusedQuotas(const std::vector<std::string>& tenants) {
  for (const std::string& t : tenants) {
    spdlog::warn(
        "event=auth_quota_unused tenant={} error=\"a quota line names a tenant that no credential "
        "has (misspelt?): it applies to nobody\"",
        t);
  }
}

absl::StatusOr<std::string> HexDigest(absl::string_view hex) {
  if (hex.size() != 2 * kDigestBytes) return absl::InvalidArgumentError("not 64 hex digits");
  std::string out(kDigestBytes, '\0');
  for (size_t i = 0; i < kDigestBytes; ++i) {
    int v = 0;
    for (char c : hex.substr(2 * i, 2)) {
      const int d = absl::ascii_isdigit(static_cast<unsigned char>(c)) ? c - '0'
                    : (c >= 'a' && c <= 'f')                           ? c - 'a' + 10
                    : (c >= 'A' && c <= 'F')                           ? c - 'A' + 10
                                                                       : -1;
      if (d < 0) return absl::InvalidArgumentError("not 64 hex digits");
      v = v * 16 + d;
    }
    out[i] = static_cast<char>(v);
  }
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const std::string where = absl::StrCat("--auth_file=", path);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": cannot read it (", std::strerror(errno), ")"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a regular file"));
  }
  if (st.st_size > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": larger than 16 MiB"));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream data;
  if (!in || !(data << in.rdbuf()) || in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": cannot read it"));
  }
  return data.str();
}

}  // namespace

absl::StatusOr<std::vector<Credential>> ParseCredentials(absl::string_view text,
                                                         absl::string_view source,
                                                         std::vector<std::string>* unused_quotas) {
  std::vector<Credential> out;
  absl::flat_hash_set<std::string> seen;
  std::map<std::string, TenantQuota> quotas;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " line ", line_no, ": ", why,
                       " (a line is: sha256:<64 hex digits> | cn:<name>, tenant, tenant|admin)"));
    };
    if (f[0] == "quota") {
      if (f.size() < 3 || !ValidTenantName(f[1])) {
        return bad("a quota line is: quota <tenant> key=number... (shuffles, stored_mb, streams)");
      }
      TenantQuota& q = quotas[std::string(f[1])];
      if (q.shuffles || q.stored_bytes || q.streams)
        return bad("a second quota line of the tenant");
      if (absl::Status st = ParseQuota(absl::MakeConstSpan(f).subspan(2), &q); !st.ok()) {
        return bad(st.message());
      }
      continue;
    }
    if (f.size() != 3) return bad("expected 3 fields");
    Credential c;
    if (absl::StartsWith(f[0], "sha256:")) {
      absl::StatusOr<std::string> digest = HexDigest(f[0].substr(7));
      if (!digest.ok()) return bad("the token's SHA-256 is not 64 hex digits");
      c.kind = Credential::Kind::kTokenSha256;
      c.key = *std::move(digest);
    } else if (absl::StartsWith(f[0], "cn:") && f[0].size() > 3) {
      c.kind = Credential::Kind::kCertName;
      c.key = std::string(f[0].substr(3));
    } else {
      return bad("the credential must start with sha256: or cn:");
    }
    if (!ValidTenantName(f[1])) {
      return bad("a tenant is 1-64 of letters, digits, '.', '_', '-', not starting with '.'");
    }
    c.identity.tenant = std::string(f[1]);
    if (f[2] == "tenant") {
      c.identity.role = Role::kTenant;
    } else if (f[2] == "admin") {
      c.identity.role = Role::kAdmin;
    } else {
      return bad("the role is tenant or admin");
    }
    if (!seen.insert(absl::StrCat(c.kind == Credential::Kind::kCertName ? "c" : "t", c.key))
             .second) {
      return bad("the credential is listed twice");
    }
    out.push_back(std::move(c));
  }
  for (Credential& c : out) {
    if (auto q = quotas.find(c.identity.tenant); q != quotas.end()) c.identity.quota = q->second;
  }
  for (const auto& entry : quotas) {
    const std::string& tenant = entry.first;
    if (unused_quotas != nullptr && std::none_of(out.begin(), out.end(), [&](const Credential& c) {
          return c.identity.tenant == tenant;
        })) {
      unused_quotas->push_back(tenant);
    }
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": no credentials in it, so every call would be refused (a file caught while "
                     "being written? replace it by renaming a complete one into place)"));
  }
  return out;
}

Authenticator::Authenticator(std::vector<Credential> credentials)
    : credentials_(std::make_shared<const std::vector<Credential>>(std::move(credentials))) {}

Authenticator::~Authenticator() { watcher_.reset(); }

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Open(
    const std::string& path, std::chrono::milliseconds reload_interval) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::vector<std::string> unused;
  absl::StatusOr<std::vector<Credential>> creds =
      ParseCredentials(*text, absl::StrCat("--auth_file=", path), &unused);
  if (!creds.ok()) return creds.status();
  LogUnusedQuotas(unused);
  auto a = std::make_unique<Authenticator>(*std::move(creds));
  a->path_ = path;
  a->text_ = *std::move(text);
  Authenticator* self = a.get();
  a->watcher_ = std::make_unique<Periodic>(reload_interval, [self] { self->Check(); });
  return a;
}

void Authenticator::Reload() {
  if (watcher_ != nullptr) watcher_->RunNow();
}

void Authenticator::Check() {
  absl::StatusOr<std::string> text = ReadFile(path_);
  std::vector<std::string> unused;
  absl::StatusOr<std::vector<Credential>> creds =
      text.ok() ? ParseCredentials(*text, absl::StrCat("--auth_file=", path_), &unused)
                : absl::StatusOr<std::vector<Credential>>(text.status());
  if (!creds.ok()) {
    const std::string error(creds.status().message());
    if (error != last_error_) {
      spdlog::error("event=auth_reload_failed error=\"{}\" action=\"keeping the previous file\"",
                    error);
      last_error_ = error;
    }
    return;
  }
  last_error_.clear();
  if (*text == text_) return;
  text_ = *std::move(text);
  LogUnusedQuotas(unused);
  const size_t n = creds->size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    credentials_ = std::make_shared<const std::vector<Credential>>(*std::move(creds));
  }
  spdlog::info("event=auth_reloaded credentials={}", n);
}

absl::StatusOr<Identity> Authenticator::Authenticate(absl::string_view authorization,
                                                     absl::string_view cert_name) const {
  std::shared_ptr<const std::vector<Credential>> creds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    creds = credentials_;
  }
  if (!authorization.empty()) {
    absl::string_view a = authorization;
    if (a.size() < 7 || !absl::EqualsIgnoreCase(a.substr(0, 7), "bearer ")) {
      return absl::UnauthenticatedError(
          "the authorization metadata must be 'Bearer <token>' (a Sluice token)");
    }
    const absl::string_view token = absl::StripAsciiWhitespace(a.substr(7));
    if (token.empty() || token.size() > kMaxTokenBytes) {
      return absl::UnauthenticatedError("the bearer token is empty or longer than 4096 bytes");
    }
    const std::string digest = Sha256(token);
    // Every token line is compared, each in constant time: how long this takes says nothing of
    // which line (or how much of one) matched.
    const Credential* found = nullptr;
    for (const Credential& c : *creds) {
      if (c.kind != Credential::Kind::kTokenSha256) continue;
      if (CRYPTO_memcmp(c.key.data(), digest.data(), kDigestBytes) == 0) found = &c;
    }
    if (found == nullptr) {
      return absl::UnauthenticatedError("the bearer token is not one this server knows");
    }
    return found->identity;
  }
  if (!cert_name.empty()) {
    for (const Credential& c : *creds) {
      if (c.kind == Credential::Kind::kCertName && c.key == cert_name) return c.identity;
    }
    return absl::UnauthenticatedError(
        absl::StrCat("the client certificate's common name '", cert_name,
                     "' is not one this server knows (and no bearer token was sent)"));
  }
  return absl::UnauthenticatedError(
      "this server requires credentials: send a token (authorization: Bearer <token>: the "
      "CLI's --token-file or $SLUICE_TOKEN, the Python client's token=) or connect with a "
      "client certificate it knows");
}

}  // namespace sluice
