// Status propagation macros for Sluice.
//
// Abseil 20220623 (the version Debian's gRPC is built with) ships no status macros, so the
// project keeps exactly this one pair. Usage:
//
//   absl::StatusOr<int> Parse(std::string_view s);
//   absl::Status Use(std::string_view s) {
//     SLUICE_ASSIGN_OR_RETURN(int n, Parse(s));
//     SLUICE_RETURN_IF_ERROR(Check(n));
//     return absl::OkStatus();
//   }
#ifndef SLUICE_BASE_STATUS_MACROS_H_
#define SLUICE_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SLUICE_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status sluice_status_ = (expr);          \
    if (!sluice_status_.ok()) return sluice_status_; \
  } while (0)

#define SLUICE_STATUS_CONCAT_INNER_(a, b) a##b
#define SLUICE_STATUS_CONCAT_(a, b) SLUICE_STATUS_CONCAT_INNER_(a, b)

#define SLUICE_ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(SLUICE_STATUS_CONCAT_(sluice_statusor_, __LINE__), lhs, expr)

#define SLUICE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // SLUICE_BASE_STATUS_MACROS_H_
