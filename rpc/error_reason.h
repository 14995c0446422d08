// Why a call failed, beyond its code, as data rather than message text: the reasons a client
// acts on (docs/api.md, "Errors and retries"). Below the gRPC edge a reason rides on an
// absl::Status as a payload; the edge (rpc/grpc_glue.h) carries it in the gRPC status's details
// (sluice.v1.ErrorDetail) and back. No gRPC here: servers' rules and the clients tag and read
// statuses with it.
//
//   return WithReason(absl::UnavailableError("the server is draining"), ErrorReason::kDraining,
//                     std::chrono::seconds(2));
//   if (ReasonOf(st) == ErrorReason::kNotKept) ... refresh the placement, try another replica
#ifndef SLUICE_RPC_ERROR_REASON_H_
#define SLUICE_RPC_ERROR_REASON_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"

namespace sluice {

enum class ErrorReason {
  kNone = 0,
  kEtcdUnavailable = 1,  ///< etcd, not the server, could not be reached (servers share it)
  kNotKept = 2,          ///< the server keeps no replica asked for: the placement names another
  kDraining = 3,         ///< the server drains: retry the attempt elsewhere or later
  kJoining = 4,          ///< the server is still joining its cluster: retry
  kSettling = 5,  ///< fewer servers registered than needed (after an etcd outage): retry later
  kPlacementChanged = 6,  ///< the shuffle's placement has a newer epoch: read it, retry
  kIncomplete = 7,    ///< this replica lacks mappers another has (not yet repaired): read another
  kRevoked = 8,       ///< a mapper's decision was revoked since the read began: read it again
  kNotCommitted = 9,  ///< require_complete, and this server counts fewer committed mappers
};

/// "ETCD_UNAVAILABLE", "NOT_KEPT", "DRAINING", "JOINING", "SETTLING", "PLACEMENT_CHANGED",
/// "INCOMPLETE", "REVOKED", "NOT_COMMITTED"; "" for kNone (the
/// proto's names).
const char* ReasonName(ErrorReason reason);

/// `st` carrying `reason` (and, if known, when a retry may succeed). OK stays OK.
absl::Status WithReason(absl::Status st, ErrorReason reason,
                        std::chrono::milliseconds retry_after = std::chrono::milliseconds(0));
ErrorReason ReasonOf(const absl::Status& st);
/// When a retry may succeed, as the server told (0: not known).
std::chrono::milliseconds RetryAfterOf(const absl::Status& st);

/// Marks a status as a server's answer (the client's gRPC edge does, for a status that carried
/// details), and asks it: a failure that is not a server's came from the transport.
absl::Status FromServer(absl::Status st);
bool IsFromServer(const absl::Status& st);

/// "CODE: message", without the payloads absl's ToString shows (reasons ride on payloads).
std::string Describe(const absl::Status& st);

/// Whether retrying the failed call (for a push: the mapper attempt, under a new attempt id)
/// can succeed, from its code alone (docs/api.md, "Errors and retries"): UNAVAILABLE,
/// DEADLINE_EXCEEDED, ABORTED and RESOURCE_EXHAUSTED yes, after RetryAfterOf or a backoff; the
/// rest no (the caller's mistake, a state only someone can fix, a bug, data lost).
bool Retryable(const absl::Status& st);

}  // namespace sluice

#endif  // SLUICE_RPC_ERROR_REASON_H_
