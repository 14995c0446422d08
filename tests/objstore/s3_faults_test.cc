// The store's retries against faults a real store shows (a fault-injecting proxy in front of a
// real S3 server, tests/harness/s3_server.h): SlowDown and 5xx answers, a 200
// CompleteMultipartUpload carrying an error, a stalled answer, a reset connection, a store that
// keeps failing. s3rver always, moto_server where present.
#include <gtest/gtest.h>

#include "objstore/object_upload.h"
#include "tests/harness/s3_server.h"
#include "tests/harness/status_matchers.h"

namespace sluice::objstore {
namespace {

using ::sluice::testing::RandomBytes;
using ::sluice::testing::S3FaultProxy;
using ::sluice::testing::S3Server;
using ::sluice::testing::S3ServerKinds;
using ::sluice::testing::S3ServerName;
using ::sluice::testing::S3ServerTest;
using ::sluice::testing::StatusIs;

class S3FaultsTest : public S3ServerTest {
 protected:
  void SetUp() override {
    S3ServerTest::SetUp();
    if (s3_ == nullptr) return;
    ASSERT_OK_AND_ASSIGN(proxy_, S3FaultProxy::Start(*s3_));
    S3Options o = proxy_->Options("f");
    o.backoff_first_s = 0.05;
    o.backoff_max_s = 0.2;
    o.stall_timeout_s = 1;
    ASSERT_OK_AND_ASSIGN(store_, S3Store::Make(o));
    ASSERT_OK_AND_ASSIGN(direct_, S3Store::Make(s3_->Options("f")));
  }
  absl::StatusOr<ObjectInfo> Upload(const std::string& key, const std::string& bytes) {
    UploadOptions o;
    o.part_bytes = kMinPartBytes;
    o.parallel_parts = 2;
    SLUICE_ASSIGN_OR_RETURN(auto up, ObjectUpload::Start(store_.get(), key, o));
    SLUICE_RETURN_IF_ERROR(up->Append(bytes));
    return up->Finish();
  }
  std::unique_ptr<S3FaultProxy> proxy_;
  std::unique_ptr<S3Store> store_, direct_;  // (direct_: the real server, no proxy)
};

TEST_P(S3FaultsTest, SlowDownAndServerErrorsAreRetriedToOneWholeObject) {
  ASSERT_TRUE(proxy_->Inject(
      R"({"method": "PUT", "query": "partNumber", "count": 2, "status": 503, "code": "SlowDown"})"));
  ASSERT_TRUE(
      proxy_->Inject(R"({"method": "POST", "query": "uploads", "count": 1, "status": 500})"));
  ASSERT_TRUE(proxy_->Inject(
      R"({"method": "POST", "query": "uploadId", "count": 1, "status": 200, "code": "InternalError"})"))
      << "a 200 CompleteMultipartUpload carrying an error";
  const std::string all = RandomBytes(2 * kMinPartBytes + 1000, 1);
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, Upload("s/p", all));
  EXPECT_EQ(info.size, all.size());
  EXPECT_EQ(store_->counters().retries, 4u);
  ASSERT_OK_AND_ASSIGN(std::string back, direct_->Get("s/p"));
  EXPECT_TRUE(back == all);
}

TEST_P(S3FaultsTest, AStalledAnswerIsAbandonedAndAskedAgain) {
  ASSERT_OK(direct_->Put("k", RandomBytes(100000, 2)));
  ASSERT_TRUE(proxy_->Inject(R"({"method": "GET", "count": 1, "stall_s": 4})"));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(std::string back, store_->Get("k"));
  EXPECT_EQ(back, RandomBytes(100000, 2));
  EXPECT_EQ(store_->counters().get, 2u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(3900))
      << "given up at the stall timeout (1 s here), not at the stall's end";
}

TEST_P(S3FaultsTest, AResetConnectionIsRetried) {
  ASSERT_TRUE(proxy_->Inject(R"({"method": "PUT", "count": 1, "reset": true})"));
  ASSERT_OK(store_->Put("r", "value"));
  EXPECT_EQ(store_->counters().put, 2u);
  ASSERT_OK_AND_ASSIGN(std::string back, direct_->Get("r"));
  EXPECT_EQ(back, "value");
}

TEST_P(S3FaultsTest, AStoreThatKeepsFailingFailsTheUploadUnavailableAndLeavesNoUpload) {
  ASSERT_TRUE(proxy_->Inject(
      R"({"method": "PUT", "query": "partNumber", "count": -1, "status": 503, "code": "SlowDown"})"));
  EXPECT_THAT(Upload("s/never", RandomBytes(2 * kMinPartBytes, 3)).status(),
              StatusIs(absl::StatusCode::kUnavailable, "SlowDown"));
  EXPECT_THAT(direct_->Head("s/never"), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_EQ(store_->counters().abort_upload, 1u);
  if (s3_->lists_uploads()) {
    ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, direct_->ListUploads(""));
    EXPECT_TRUE(open.empty()) << "aborted";
  }
}

TEST_P(S3FaultsTest, ARefusalIsNotRetried) {
  ASSERT_TRUE(
      proxy_->Inject(R"({"method": "PUT", "count": 1, "status": 403, "code": "AccessDenied"})"));
  EXPECT_THAT(store_->Put("denied", "x"),
              StatusIs(absl::StatusCode::kPermissionDenied, "AccessDenied"));
  EXPECT_EQ(store_->counters().put, 1u);
  EXPECT_EQ(store_->counters().retries, 0u);
}

INSTANTIATE_TEST_SUITE_P(Servers, S3FaultsTest, S3ServerKinds(), S3ServerName);

}  // namespace
}  // namespace sluice::objstore
