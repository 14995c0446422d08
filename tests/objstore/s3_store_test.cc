// S3Store against real S3 servers (tests/harness/s3_server.h): npm's s3rver always, moto_server
// where the machine has one: objects, ranges, lists by page, multipart uploads completed and
// aborted, what a call says when the store is down or comes back, and what it counts.
#include "objstore/s3_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/harness/s3_server.h"
#include "tests/harness/status_matchers.h"

namespace sluice::objstore {
namespace {

using ::sluice::testing::RandomBytes;
using ::sluice::testing::S3Server;
using ::sluice::testing::S3ServerKinds;
using ::sluice::testing::S3ServerName;
using ::sluice::testing::S3ServerTest;
using ::sluice::testing::StatusIs;

class S3StoreTest : public S3ServerTest {
 protected:
  void SetUp() override {
    S3ServerTest::SetUp();
    if (s3_ == nullptr) return;
    ASSERT_OK_AND_ASSIGN(store_, S3Store::Make(s3_->Options("shuffles/t")));
  }
  std::unique_ptr<S3Store> store_;
};

TEST_P(S3StoreTest, AnObjectIsWrittenReadInRangesAndDeleted) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  all += RandomBytes(100000, 1);
  ASSERT_OK(store_->Put("a/b.obj", all));
  ASSERT_OK_AND_ASSIGN(std::string back, store_->Get("a/b.obj"));
  EXPECT_EQ(back, all);
  ASSERT_OK_AND_ASSIGN(std::string mid, store_->Get("a/b.obj", 1000, 5000));
  EXPECT_EQ(mid, all.substr(1000, 5000));
  ASSERT_OK_AND_ASSIGN(std::string tail, store_->Get("a/b.obj", all.size() - 7));
  EXPECT_EQ(tail, all.substr(all.size() - 7));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, store_->Head("a/b.obj"));
  EXPECT_EQ(info.size, all.size());
  EXPECT_FALSE(info.etag.empty());
  EXPECT_THAT(store_->Get("a/b.obj", all.size() - 10, 20),
              StatusIs(absl::StatusCode::kOutOfRange, "asked 20 bytes"));
  ASSERT_OK(store_->Delete("a/b.obj"));
  EXPECT_THAT(store_->Get("a/b.obj"), StatusIs(absl::StatusCode::kNotFound, "GET a/b.obj"));
  EXPECT_THAT(store_->Head("a/b.obj"), StatusIs(absl::StatusCode::kNotFound, "HEAD a/b.obj"));
  EXPECT_OK(store_->Delete("a/b.obj")) << "deleting what is gone is done";
}

TEST_P(S3StoreTest, ATenantsShuffleIdIsAKeySegment) {
  ASSERT_OK(store_->Put("team-a~job..7/p3", "tilde"));
  ASSERT_OK_AND_ASSIGN(std::string back, store_->Get("team-a~job..7/p3"));
  EXPECT_EQ(back, "tilde");
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, store_->List("team-a~job..7/"));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].key, "team-a~job..7/p3");
}

TEST_P(S3StoreTest, KeysOutsideTheSafeAlphabetAreRefusedBeforeAnyRequest) {
  S3Options bad = s3_->Options();
  bad.prefix = "a b/";
  EXPECT_THAT(S3Store::Make(bad), StatusIs(absl::StatusCode::kInvalidArgument, "prefix 'a b/'"));
  bad.prefix = "nodelimiter";
  EXPECT_THAT(S3Store::Make(bad), StatusIs(absl::StatusCode::kInvalidArgument, "ending in '/'"));
  EXPECT_THAT(store_->Put("a b", "x"), StatusIs(absl::StatusCode::kInvalidArgument, "'a b'"));
  EXPECT_THAT(store_->Get("../x"), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_EQ(store_->counters().requests(), 0u);
}

TEST_P(S3StoreTest, AListReadsEveryPageUnderItsPrefixOnly) {
  store_->set_list_page(2);
  for (int i = 0; i < 5; ++i) ASSERT_OK(store_->Put("job/p" + std::to_string(i), "x"));
  ASSERT_OK(store_->Put("other/q", "y"));
  ASSERT_OK_AND_ASSIGN(auto other, S3Store::Make(s3_->Options("elsewhere")));
  ASSERT_OK(other->Put("job/p9", "z"));
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> listed, store_->List("job/"));
  ASSERT_EQ(listed.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(listed[i].key, "job/p" + std::to_string(i)) << "relative to the prefix, in order";
    EXPECT_EQ(listed[i].size, 1u);
  }
  EXPECT_GE(store_->counters().list, 3u) << "five keys at two a page";
  ASSERT_OK_AND_ASSIGN(std::vector<ObjectInfo> everything, store_->List(""));
  EXPECT_EQ(everything.size(), 6u);
}

TEST_P(S3StoreTest, AMultipartUploadCompletesToOneObject) {
  const std::string first = RandomBytes(kMinPartBytes, 2), second = RandomBytes(1 << 20, 3);
  ASSERT_OK_AND_ASSIGN(std::string id, store_->StartUpload("big/obj"));
  ASSERT_OK_AND_ASSIGN(std::string e1, store_->UploadPart("big/obj", id, 1, first));
  ASSERT_OK_AND_ASSIGN(std::string e2, store_->UploadPart("big/obj", id, 2, second));
  if (s3_->lists_uploads()) {
    ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, store_->ListUploads("big/"));
    ASSERT_EQ(open.size(), 1u);
    EXPECT_EQ(open[0].key, "big/obj");
    EXPECT_EQ(open[0].upload_id, id);
  }
  ASSERT_OK(store_->CompleteUpload("big/obj", id, {e1, e2}));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, store_->Head("big/obj"));
  EXPECT_EQ(info.size, first.size() + second.size());
  ASSERT_OK_AND_ASSIGN(std::string across, store_->Get("big/obj", first.size() - 100, 200));
  EXPECT_EQ(across, first.substr(first.size() - 100) + second.substr(0, 100));
  if (s3_->lists_uploads()) {
    ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, store_->ListUploads("big/"));
    EXPECT_TRUE(open.empty());
  }
  if (s3_->kind() == S3Server::kMoto) {
    // (s3rver gives a multipart object a plain MD5; a retried complete there fails, and the
    // uploader uploads again)
    EXPECT_EQ(info.etag, MultipartEtag({e1, e2}))
        << "what a retried complete whose first answer was lost checks the object by";
  }
}

TEST_P(S3StoreTest, AnAbortedUploadLeavesNothing) {
  if (!s3_->lists_uploads()) GTEST_SKIP() << "s3rver has no AbortMultipartUpload";
  ASSERT_OK_AND_ASSIGN(std::string id, store_->StartUpload("gone/obj"));
  ASSERT_OK(store_->UploadPart("gone/obj", id, 1, RandomBytes(1000, 4)).status());
  ASSERT_OK(store_->AbortUpload("gone/obj", id));
  ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, store_->ListUploads(""));
  EXPECT_TRUE(open.empty());
  EXPECT_THAT(store_->Head("gone/obj"), StatusIs(absl::StatusCode::kNotFound, ""));
  store_->set_retries(2, 0.01, 0.01);
  EXPECT_FALSE(store_->CompleteUpload("gone/obj", id, {"x"}).ok());
  EXPECT_THAT(store_->Head("gone/obj"), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_OK(store_->AbortUpload("gone/obj", id)) << "aborting what is gone is done";
  EXPECT_THAT(store_->UploadPart("gone/obj", id, 0, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "part 0"));
}

TEST_P(S3StoreTest, AStoreThatIsDownIsUnavailableAfterItsTries) {
  store_->set_retries(3, 0.01, 0.02);
  s3_->Stop();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(store_->Put("k", "v"), StatusIs(absl::StatusCode::kUnavailable, "after 3 tries"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(store_->counters().put, 3u);
  EXPECT_EQ(store_->counters().retries, 2u);
  ASSERT_OK(s3_->Restart());
  EXPECT_OK(store_->Put("k", "v"));
}

TEST_P(S3StoreTest, ACallRidesOutAStoreThatComesBack) {
  if (s3_->kind() == S3Server::kMoto) GTEST_SKIP() << "moto keeps nothing across a restart";
  store_->set_retries(8, 0.2, 1.0);
  s3_->Stop();
  std::thread back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    ASSERT_OK(s3_->Restart());
  });
  EXPECT_OK(store_->Put("k", RandomBytes(1000, 5)));
  back.join();
  EXPECT_GE(store_->counters().retries, 1u);
  ASSERT_OK_AND_ASSIGN(std::string v, store_->Get("k"));
  EXPECT_EQ(v, RandomBytes(1000, 5));
}

TEST_P(S3StoreTest, ErrorsNameTheCallNeverTheSecret) {
  S3Options o = s3_->Options("p");
  o.credentials.secret_access_key = "very-secret-value-1234";
  ASSERT_OK_AND_ASSIGN(auto store, S3Store::Make(o));
  absl::Status st = store->Get("missing/key").status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound, "s3://sluice-test/p/: GET missing/key"));
  EXPECT_EQ(std::string(st.message()).find("very-secret"), std::string::npos);
}

TEST_P(S3StoreTest, CountersCountRequestsByType) {
  ASSERT_OK(store_->Put("c/1", "abc"));
  ASSERT_OK(store_->Get("c/1").status());
  ASSERT_OK(store_->Head("c/1").status());
  ASSERT_OK(store_->List("c/").status());
  ASSERT_OK(store_->Delete("c/1"));
  const S3Counters c = store_->counters();
  EXPECT_EQ(c.put, 1u);
  EXPECT_EQ(c.get, 1u);
  EXPECT_EQ(c.head, 1u);
  EXPECT_EQ(c.list, 1u);
  EXPECT_EQ(c.del, 1u);
  EXPECT_EQ(c.requests(), 5u);
  EXPECT_EQ(c.bytes_sent, 3u);
  EXPECT_GE(c.bytes_received, 3u);
}

INSTANTIATE_TEST_SUITE_P(Servers, S3StoreTest, S3ServerKinds(), S3ServerName);

}  // namespace
}  // namespace sluice::objstore
