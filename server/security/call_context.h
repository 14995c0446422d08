// CallContext: who one call is, worked out once, at the gRPC edge, from its credentials and its
// peer (server/service/call_edge.cc), and handed to the transport-free rules. It is also the one
// place that knows how a caller addresses shuffles (docs/security.md, "Isolation"): a tenant's
// shuffle `job` is kept as `tenant~job` (server/storage/shuffle_id.h), so that another tenant's
// shuffles are simply not there for it (NOT_FOUND, absent from its listings) and it cannot take
// their ids first. Admins, and every caller of a server without --auth_file, address the kept
// names (a tenant's shuffle as `tenant~job`).
//
//   SLUICE_ASSIGN_OR_RETURN(CallContext call,
//                           CallContext::Resolve(auth, defaults, authorization, cert, peer));
//   SLUICE_ASSIGN_OR_RETURN(std::string id, call.Kept(request.shuffle_id()));
//   response.set_shuffle_id(call.Shown(id));
//
// What a caller is told of an error is decided where the error is made: messages name a shuffle
// by ShuffleName (as its tenant knows it) and files by their place in it, never a server path;
// the log lines beside them carry the kept id and the data directory.
#ifndef SLUICE_SERVER_SECURITY_CALL_CONTEXT_H_
#define SLUICE_SERVER_SECURITY_CALL_CONTEXT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/security/auth.h"
#include "server/security/tenancy.h"

namespace sluice {

class CallContext {
 public:
  /// Everyone, as an admin: a server without --auth_file, and tests of the rules.
  CallContext() = default;
  /// `who` calling from `peer` (gRPC's form, for the log); `local`: from the server's own host.
  /// Its quotas are its quota line's, else `defaults`; none for admins.
  CallContext(Identity who, const TenantLimits& defaults, std::string peer = "",
              bool local = false);

  /// The caller of a call that presented `authorization` (its metadata value, empty if none)
  /// and `cert_name` (the verified client certificate's common name, empty if none): anyone, as
  /// an admin, without `auth`; else whom `auth` knows, or UNAUTHENTICATED.
  static absl::StatusOr<CallContext> Resolve(const Authenticator* auth,
                                             const TenantLimits& defaults,
                                             absl::string_view authorization,
                                             absl::string_view cert_name, std::string peer,
                                             bool local);

  const Identity& who() const { return who_; }
  const std::string& tenant() const { return who_.tenant; }
  bool admin() const { return who_.admin(); }
  /// The quotas in force for this caller (0 = no limit).
  const TenantLimits& limits() const { return limits_; }
  const std::string& peer() const { return peer_; }
  bool local() const { return local_; }

  /// "tenant~" for a tenant: every shuffle it has starts with it; "" for those that address
  /// kept names.
  const std::string& prefix() const { return prefix_; }
  /// Shuffle `id` as the server keeps it for this caller. A tenant's id may not hold '~'.
  absl::StatusOr<std::string> Kept(absl::string_view id) const;
  /// A kept id as this caller knows it (its prefix taken off).
  std::string Shown(absl::string_view kept_id) const;

 private:
  Identity who_;
  TenantLimits limits_;
  std::string peer_;
  bool local_ = false;
  std::string prefix_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SECURITY_CALL_CONTEXT_H_
