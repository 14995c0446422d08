// Who is calling (docs/security.md, "Authentication"). A credentials file, given with
// --auth_file, maps credentials to a tenant and a role, one per line:
//
//   # comments and blank lines are skipped
//   sha256:<64 hex digits>  tenant-a  tenant   # a bearer token, by its SHA-256 (never the token)
//   cn:batch-7              tenant-b  tenant   # a client certificate's common name (mutual TLS)
//   sha256:<...>            ops       admin
//   quota tenant-a shuffles=100 stored_mb=51200 streams=256   # what tenant-a may hold
//
// A call presents a token as gRPC metadata (`authorization: Bearer <token>`), or, under mutual
// TLS, the certificate it connected with. Tokens are hashed and compared with every token line
// in constant time, and never logged. The file is read again when it changes (and on SIGHUP);
// a file that does not parse is logged and the previous one kept. Transport-free: the service
// hands in the metadata value and the certificate's name.
#ifndef SLUICE_SERVER_SECURITY_AUTH_H_
#define SLUICE_SERVER_SECURITY_AUTH_H_

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/runtime/periodic.h"
#include "server/storage/shuffle_id.h"

namespace sluice {

enum class Role { kTenant, kAdmin };

/// A tenant's quotas from a `quota` line of the file; a field not given there takes the
/// server's flag (--tenant_max_shuffles, --tenant_max_stored_mb, --tenant_max_streams). 0 = no
/// limit. Admins have none.
struct TenantQuota {
  std::optional<uint64_t> shuffles;      ///< shuffles it may hold on this server
  std::optional<uint64_t> stored_bytes;  ///< bytes of its shuffles' data on this server's disks
  std::optional<uint64_t> streams;       ///< push and fetch streams it may have open at once
};

struct Identity {
  std::string tenant;  ///< empty when authentication is off
  Role role = Role::kAdmin;
  TenantQuota quota;
  bool admin() const { return role == Role::kAdmin; }
};

struct Credential {
  enum class Kind { kTokenSha256, kCertName } kind = Kind::kTokenSha256;
  std::string key;  ///< the 32 bytes of a token's SHA-256, or a certificate's common name
  Identity identity;
};

/// The lines of a credentials file, each credential's identity with its tenant's quota line
/// applied; an error names the line (of `source`) and the problem.
/// `unused_quotas`, if given, gets the tenants of quota lines that no credential names (a
/// misspelling, or a tenant whose credentials were removed: not an error, so that removing a
/// tenant's last credential always takes effect; the server logs them).
absl::StatusOr<std::vector<Credential>> ParseCredentials(
    absl::string_view text, absl::string_view source,
    std::vector<std::string>* unused_quotas = nullptr);

class Authenticator {
 public:
  /// Reads the file (an error names it and the line) and watches it every `reload_interval`.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Open(
      const std::string& path, std::chrono::milliseconds reload_interval);
  /// From credentials already parsed, not watched (tests).
  explicit Authenticator(std::vector<Credential> credentials);
  ~Authenticator();

  /// The caller's identity. `authorization`: the call's metadata value, empty if none.
  /// `cert_name`: the common name of the client certificate the connection was verified with,
  /// empty if none. A token is used if given; else the certificate. UNAUTHENTICATED otherwise,
  /// saying what was missing or wrong (never the token itself).
  absl::StatusOr<Identity> Authenticate(absl::string_view authorization,
                                        absl::string_view cert_name) const;
  /// Reads the file again now (SIGHUP); returns once it has.
  void Reload();

 private:
  void Check();

  std::string path_;  // empty: not watched
  mutable std::mutex mu_;
  std::shared_ptr<const std::vector<Credential>> credentials_;  // guarded by mu_
  std::string text_, last_error_;                               // the watcher's thread only
  std::unique_ptr<Periodic> watcher_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SECURITY_AUTH_H_
