#include "rpc/error_reason.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sluice {
namespace {

// "<reason>:<retry after, ms>"
constexpr char kReasonPayload[] = "type.sluice/reason";
constexpr char kServerPayload[] = "type.sluice/from-server";

}  // namespace

absl::Status WithReason(absl::Status st, ErrorReason reason,
                        std::chrono::milliseconds retry_after) {
  if (st.ok()) return st;
  st.SetPayload(kReasonPayload,
                absl::Cord(absl::StrCat(static_cast<int>(reason), ":", retry_after.count())));
  return st;
}

namespace {

std::pair<int, int64_t> Parse(const absl::Status& st) {
  const auto payload = st.GetPayload(kReasonPayload);
  if (!payload.has_value()) return {0, 0};
  const std::pair<std::string, std::string> parts = absl::StrSplit(std::string(*payload), ':');
  int reason = 0;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(parts.first, &reason) || reason < 0 ||
      reason > static_cast<int>(ErrorReason::kNotCommitted)) {
    reason = 0;
  }
  if (!absl::SimpleAtoi(parts.second, &ms) || ms < 0) ms = 0;
  return {reason, ms};
}

}  // namespace

ErrorReason ReasonOf(const absl::Status& st) { return static_cast<ErrorReason>(Parse(st).first); }

std::chrono::milliseconds RetryAfterOf(const absl::Status& st) {
  return std::chrono::milliseconds(Parse(st).second);
}

absl::Status FromServer(absl::Status st) {
  if (!st.ok()) st.SetPayload(kServerPayload, absl::Cord("1"));
  return st;
}

bool IsFromServer(const absl::Status& st) { return st.GetPayload(kServerPayload).has_value(); }

const char* ReasonName(ErrorReason reason) {
  switch (reason) {
    case ErrorReason::kEtcdUnavailable:
      return "ETCD_UNAVAILABLE";
    case ErrorReason::kNotKept:
      return "NOT_KEPT";
    case ErrorReason::kDraining:
      return "DRAINING";
    case ErrorReason::kJoining:
      return "JOINING";
    case ErrorReason::kSettling:
      return "SETTLING";
    case ErrorReason::kPlacementChanged:
      return "PLACEMENT_CHANGED";
    case ErrorReason::kIncomplete:
      return "INCOMPLETE";
    case ErrorReason::kRevoked:
      return "REVOKED";
    case ErrorReason::kNotCommitted:
      return "NOT_COMMITTED";
    case ErrorReason::kNone:
      break;
  }
  return "";
}

std::string Describe(const absl::Status& st) {
  if (st.ok()) return "OK";
  return absl::StrCat(absl::StatusCodeToString(st.code()), ": ", st.message());
}

bool Retryable(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
      return true;
    default:
      return false;
  }
}

}  // namespace sluice
