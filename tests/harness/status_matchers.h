// Status assertions for tests, for absl::Status, absl::StatusOr<T> and grpc::Status alike:
//
//   ASSERT_OK(store->Commit(...));
//   EXPECT_OK(stub->CreateShuffle(&ctx, req, &resp));            // a grpc::Status
//   ASSERT_OK_AND_ASSIGN(auto client, server->Client());
//   EXPECT_THAT(attempt.Open("s", 9, 1), StatusIs(absl::StatusCode::kInvalidArgument, "mapper 9"));
#ifndef SLUICE_TESTS_HARNESS_STATUS_MATCHERS_H_
#define SLUICE_TESTS_HARNESS_STATUS_MATCHERS_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"

namespace sluice::testing {

inline absl::Status AsStatus(const absl::Status& s) { return s; }
template <typename T>
absl::Status AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
/// A grpc::Status (anything with error_code() and error_message()), without including gRPC.
template <typename G, typename = decltype(std::declval<const G&>().error_message())>
absl::Status AsStatus(const G& g) {
  return absl::Status(static_cast<absl::StatusCode>(g.error_code()), g.error_message());
}

template <typename S>
::testing::AssertionResult IsOk(const char* expr, const S& s) {
  const absl::Status st = AsStatus(s);
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << " is " << st;
}

/// Matches a status (of any of the kinds above) with `code` whose message contains `substr`.
MATCHER_P2(StatusIs, code, substr,
           std::string("is ") + absl::StatusCodeToString(code) + " containing \"" + substr + "\"") {
  const absl::Status st = ::sluice::testing::AsStatus(arg);
  *result_listener << "which is " << st;
  return st.code() == code && st.message().find(substr) != absl::string_view::npos;
}

}  // namespace sluice::testing

#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::sluice::testing::IsOk, expr)
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::sluice::testing::IsOk, expr)
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                                          \
  SLUICE_ASSERT_OK_AND_ASSIGN_IMPL_(SLUICE_STATUS_CONCAT_(sluice_test_statusor_, __LINE__), lhs, \
                                    expr)
#define SLUICE_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                      \
  ASSERT_OK(statusor);                                         \
  lhs = std::move(statusor).value()

#endif  // SLUICE_TESTS_HARNESS_STATUS_MATCHERS_H_
