// Why a call failed, as data: a reason and a retry time ride on an absl::Status below the gRPC
// edge, cross it in the status's details (google.rpc.Status's wire form holding an
// ErrorDetail), and tell a server's answer from the transport's failure on the client's side.
#include "rpc/error_reason.h"

#include <gtest/gtest.h>

#include <chrono>

#include "rpc/grpc_glue.h"
#include "sluice/v1/shuffle.pb.h"

namespace sluice {
namespace {

TEST(ErrorReasonTest, AReasonAndItsRetryTimeCrossTheGrpcEdge) {
  const absl::Status draining = WithReason(absl::UnavailableError("the server is draining"),
                                           ErrorReason::kDraining, std::chrono::seconds(2));
  const grpc::Status wire = rpc::ToGrpcStatus(draining);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(wire.error_message(), "the server is draining");
  const absl::Status back = rpc::FromGrpcStatus(wire);
  EXPECT_EQ(back.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(back.message(), "the server is draining");
  EXPECT_EQ(ReasonOf(back), ErrorReason::kDraining);
  EXPECT_EQ(RetryAfterOf(back), std::chrono::seconds(2));
  EXPECT_TRUE(IsFromServer(back));
  EXPECT_STREQ(ReasonName(ReasonOf(back)), "DRAINING");
}

// The details are google.rpc.Status's wire form: code, message, and the ErrorDetail in an Any.
TEST(ErrorReasonTest, TheDetailsReadAsGoogleRpcStatus) {
  const grpc::Status wire = rpc::ToGrpcStatus(
      WithReason(absl::FailedPreconditionError("keeps no replica"), ErrorReason::kNotKept));
  v1::StatusDetails details;
  ASSERT_TRUE(details.ParseFromString(wire.error_details()));
  EXPECT_EQ(details.code(), 9);  // FAILED_PRECONDITION
  EXPECT_EQ(details.message(), "keeps no replica");
  ASSERT_EQ(details.details_size(), 1);
  EXPECT_EQ(details.details(0).type_url(), "type.googleapis.com/sluice.v1.ErrorDetail");
  v1::ErrorDetail detail;
  ASSERT_TRUE(details.details(0).UnpackTo(&detail));
  EXPECT_EQ(detail.reason(), v1::ErrorDetail::NOT_KEPT);
}

// Every status a server sends is marked as its answer, a reason or not; one without details
// (the transport's: a refused connection, a broken pipe, a deadline) is not.
TEST(ErrorReasonTest, AServersAnswerIsToldFromTheTransportsFailure) {
  const absl::Status plain =
      rpc::FromGrpcStatus(rpc::ToGrpcStatus(absl::UnavailableError("wedged")));
  EXPECT_TRUE(IsFromServer(plain));
  EXPECT_EQ(ReasonOf(plain), ErrorReason::kNone);
  EXPECT_EQ(RetryAfterOf(plain).count(), 0);
  const absl::Status transport =
      rpc::FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Broken pipe"));
  EXPECT_FALSE(IsFromServer(transport));
  // Details that are not ours, or disagree with the status, are not taken for a server's.
  EXPECT_FALSE(IsFromServer(
      rpc::FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "x", "\xff\xff\xff"))));
  v1::StatusDetails other;
  other.set_code(5);
  EXPECT_FALSE(IsFromServer(rpc::FromGrpcStatus(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "x", other.SerializeAsString()))));
  EXPECT_TRUE(rpc::ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(ErrorReasonTest, RetryableFollowsTheCodeAlone) {
  for (auto code : {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded,
                    absl::StatusCode::kAborted, absl::StatusCode::kResourceExhausted}) {
    EXPECT_TRUE(Retryable(absl::Status(code, "x"))) << code;
  }
  for (auto code : {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
                    absl::StatusCode::kNotFound, absl::StatusCode::kAlreadyExists,
                    absl::StatusCode::kPermissionDenied, absl::StatusCode::kUnauthenticated,
                    absl::StatusCode::kInternal, absl::StatusCode::kDataLoss,
                    absl::StatusCode::kCancelled, absl::StatusCode::kOutOfRange}) {
    EXPECT_FALSE(Retryable(absl::Status(code, "x"))) << code;
  }
  // A reason does not change the code's answer.
  EXPECT_FALSE(Retryable(WithReason(absl::FailedPreconditionError("x"), ErrorReason::kNotKept)));
}

TEST(ErrorReasonTest, AMalformedReasonPayloadReadsAsNone) {
  absl::Status st = absl::UnavailableError("x");
  st.SetPayload("type.sluice/reason", absl::Cord("99:-5"));
  EXPECT_EQ(ReasonOf(st), ErrorReason::kNone);
  EXPECT_EQ(RetryAfterOf(st).count(), 0);
  EXPECT_EQ(ReasonOf(absl::OkStatus()), ErrorReason::kNone);
  EXPECT_TRUE(WithReason(absl::OkStatus(), ErrorReason::kDraining).ok());
}

}  // namespace
}  // namespace sluice
