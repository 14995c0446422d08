// ObjectUpload against real S3 servers (s3rver always, moto_server where present): parts of
// one size, a small object as one PUT, an upload dropped or failed leaving nothing, the rate
// limit; and a partition object read back by byte ranges, as a reader with no server does.
#include "objstore/object_upload.h"

#include <gtest/gtest.h>

#include <chrono>

#include "objstore/partition_object.h"
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

class ObjectUploadTest : public S3ServerTest {
 protected:
  void SetUp() override {
    S3ServerTest::SetUp();
    if (s3_ == nullptr) return;
    ASSERT_OK_AND_ASSIGN(store_, S3Store::Make(s3_->Options("up")));
  }
  UploadOptions Parts(int parallel = 2) {
    UploadOptions o;
    o.part_bytes = kMinPartBytes;
    o.parallel_parts = parallel;
    return o;
  }
  std::unique_ptr<S3Store> store_;
};

TEST_P(ObjectUploadTest, BytesBecomePartsOfOneSizeAndOneObject) {
  const std::string all = RandomBytes(2 * kMinPartBytes + 123457, 1);
  ASSERT_OK_AND_ASSIGN(auto up, ObjectUpload::Start(store_.get(), "s/p1", Parts()));
  for (size_t at = 0; at < all.size(); at += 777777) ASSERT_OK(up->Append(all.substr(at, 777777)));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, up->Finish());
  EXPECT_EQ(info.size, all.size());
  EXPECT_EQ(up->parts_sent(), 3);
  const S3Counters c = store_->counters();
  EXPECT_EQ(c.start_upload, 1u);
  EXPECT_EQ(c.upload_part, 3u);
  EXPECT_EQ(c.complete_upload, 1u);
  EXPECT_EQ(c.put, 0u);
  if (s3_->kind() == S3Server::kMoto) {
    EXPECT_EQ(info.etag.substr(info.etag.size() - 2), "-3");
  }
  ASSERT_OK_AND_ASSIGN(std::string back, store_->Get("s/p1"));
  EXPECT_TRUE(back == all) << "the object's bytes are the appended bytes";
}

TEST_P(ObjectUploadTest, ExactlyFullPartsSendNoEmptyLastPart) {
  const std::string all = RandomBytes(2 * kMinPartBytes, 2);
  ASSERT_OK_AND_ASSIGN(auto up, ObjectUpload::Start(store_.get(), "s/p2", Parts(1)));
  ASSERT_OK(up->Append(all));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, up->Finish());
  EXPECT_EQ(info.size, all.size());
  EXPECT_EQ(store_->counters().upload_part, 2u);
}

TEST_P(ObjectUploadTest, ASmallObjectIsOnePut) {
  ASSERT_OK_AND_ASSIGN(auto up, ObjectUpload::Start(store_.get(), "s/small", Parts()));
  ASSERT_OK(up->Append("hello "));
  ASSERT_OK(up->Append("object"));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, up->Finish());
  EXPECT_EQ(info.size, 12u);
  EXPECT_EQ(store_->counters().put, 1u);
  EXPECT_EQ(store_->counters().start_upload, 0u);
  EXPECT_THAT(up->Append("more"), StatusIs(absl::StatusCode::kFailedPrecondition, "is over"));
}

TEST_P(ObjectUploadTest, AnUploadDroppedBeforeItsEndLeavesNothing) {
  {
    ASSERT_OK_AND_ASSIGN(auto up, ObjectUpload::Start(store_.get(), "s/dropped", Parts()));
    ASSERT_OK(up->Append(RandomBytes(kMinPartBytes + 10, 3)));
  }  // (dropped: aborted)
  EXPECT_EQ(store_->counters().start_upload, 1u);
  EXPECT_EQ(store_->counters().abort_upload, 1u);
  EXPECT_THAT(store_->Head("s/dropped"), StatusIs(absl::StatusCode::kNotFound, ""));
  if (s3_->lists_uploads()) {
    ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, store_->ListUploads(""));
    EXPECT_TRUE(open.empty()) << "no multipart upload left open";
  }
}

TEST_P(ObjectUploadTest, AStoreThatFailsMidUploadFailsItUnavailable) {
  store_->set_retries(2, 0.01, 0.01);
  ASSERT_OK_AND_ASSIGN(auto up, ObjectUpload::Start(store_.get(), "s/failed", Parts(1)));
  ASSERT_OK(up->Append(RandomBytes(kMinPartBytes, 4)));
  s3_->Stop();
  absl::Status st = up->Append(RandomBytes(kMinPartBytes, 5));
  if (st.ok()) st = up->Finish().status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "after 2 tries"));
  EXPECT_GE(store_->counters().abort_upload, 1u) << "it tried to abort";
}

TEST_P(ObjectUploadTest, TheRateLimitHoldsUploadsBack) {
  RateLimiter limit(20e6);  // 20 MB/s
  UploadOptions o = Parts(4);
  o.limiter = &limit;
  const std::string all = RandomBytes(4 * kMinPartBytes, 6);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(auto up, ObjectUpload::Start(store_.get(), "s/slow", o));
  ASSERT_OK(up->Append(all));
  ASSERT_OK(up->Finish().status());
  // 21 MB at 20 MB/s from an empty bucket: about a second, whatever the store's speed.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(800));
}

TEST_P(ObjectUploadTest, BadOptionsAreRefused) {
  UploadOptions o;
  o.part_bytes = 1 << 20;
  EXPECT_THAT(ObjectUpload::Start(store_.get(), "k", o),
              StatusIs(absl::StatusCode::kInvalidArgument, "5 MiB to 5 GiB"));
  o = UploadOptions();
  o.parallel_parts = 0;
  EXPECT_THAT(ObjectUpload::Start(store_.get(), "k", o),
              StatusIs(absl::StatusCode::kInvalidArgument, "parallel parts"));
  EXPECT_THAT(ObjectUpload::Start(store_.get(), "a b", UploadOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, "key"));
}

// A partition object as the tier writes it (frames, footer, trailer, over part seams), read by
// byte ranges as a reader with no server does: trailer, footer, then one frame.
TEST_P(ObjectUploadTest, APartitionObjectIsReadBackByRanges) {
  PartitionObjectFooter f;
  f.shuffle_id = "job";
  f.partition = 3;
  f.winners = {{0, 11}, {1, 12}};
  std::string frames;
  for (int i = 0; i < 40; ++i) {
    ObjectFrame fr{static_cast<uint32_t>(i % 2),
                   static_cast<uint64_t>(11 + i % 2),
                   frames.size(),
                   static_cast<uint32_t>(200000 + i * 1000),
                   7,
                   0,
                   {}};
    frames += RandomBytes(fr.size, 100 + i);
    f.frames.push_back(fr);
  }
  ASSERT_OK_AND_ASSIGN(auto up, ObjectUpload::Start(store_.get(), "job/p3", Parts(3)));
  ASSERT_OK(up->Append(frames));
  ASSERT_OK(up->Append(EncodeFooter(f)));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, up->Finish());
  ASSERT_OK_AND_ASSIGN(std::string trailer,
                       store_->Get("job/p3", info.size - kTrailerBytes, kTrailerBytes));
  ASSERT_OK_AND_ASSIGN(uint64_t footer_size, FooterSize(trailer, info.size));
  ASSERT_OK_AND_ASSIGN(std::string footer_bytes,
                       store_->Get("job/p3", info.size - kTrailerBytes - footer_size, footer_size));
  ASSERT_OK_AND_ASSIGN(PartitionObjectFooter back, DecodeFooter(footer_bytes, info.size, "job", 3));
  ASSERT_EQ(back.frames, f.frames);
  const ObjectFrame& across = back.frames[25];  // (past the first part's end)
  ASSERT_GT(across.offset, kMinPartBytes);
  ASSERT_OK_AND_ASSIGN(std::string frame, store_->Get("job/p3", across.offset, across.size));
  EXPECT_TRUE(frame == frames.substr(across.offset, across.size));
}

INSTANTIATE_TEST_SUITE_P(Servers, ObjectUploadTest, S3ServerKinds(), S3ServerName);

}  // namespace
}  // namespace sluice::objstore
