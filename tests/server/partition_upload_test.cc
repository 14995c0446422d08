// The object tier's upload of a stored partition (server/tier/partition_upload.h): a real
// ShuffleStore on a temporary directory, a real S3 server (s3rver; moto_server where present),
// the object read back with no server and every record the store holds found in it, in order.
#include "server/tier/partition_upload.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "codec/frame_decoder.h"
#include "codec/key_bounds.h"
#include "objstore/object_reader.h"
#include "tests/harness/s3_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/server/shuffle_store_fixture.h"

namespace sluice {
namespace {

using store_test::MakeFrame;
using testing::S3Server;
using testing::S3ServerKinds;
using testing::S3ServerName;
using testing::StatusIs;

class PartitionUploadTest : public store_test::ShuffleStoreTest,
                            public ::testing::WithParamInterface<S3Server::Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == S3Server::kMoto && S3Server::MotoBinary().empty()) {
      GTEST_SKIP() << "no moto_server on this machine";
    }
    ASSERT_OK_AND_ASSIGN(s3_, S3Server::Start("sluice-test", GetParam()));
    ASSERT_OK_AND_ASSIGN(bucket_, objstore::S3Store::Make(s3_->Options("tier")));
    options_.part_bytes = objstore::kMinPartBytes;
  }
  // The records of an object read back, "key=value" each, in object order.
  std::vector<std::string> ReadBack(const UploadedPartition& up, uint32_t partition) {
    std::vector<std::string> out;
    auto reader = objstore::PartitionObjectReader::Open(
        bucket_.get(), {up.object.key, up.object.size}, "s1", partition);
    EXPECT_OK(reader);
    if (!reader.ok()) return out;
    FrameDecoder dec;
    DecodedFrame decoded;
    EXPECT_OK((*reader)->ReadFrames(
        0, (*reader)->footer().frames.size(), [&](size_t, absl::string_view frame) {
          SLUICE_RETURN_IF_ERROR(
              dec.Decode(std::string_view(frame.data(), frame.size()), &decoded));
          for (const Record& r : decoded) {
            out.push_back(std::string(r.key) + "=" + std::string(r.value));
          }
          return absl::OkStatus();
        }));
    return out;
  }
  std::unique_ptr<S3Server> s3_;
  std::unique_ptr<objstore::S3Store> bucket_;
  objstore::UploadOptions options_;
};

TEST_P(PartitionUploadTest, APartitionsWinnersAreUploadedAsStoredAndReadBackInOrder) {
  auto store = CreateStore(4, 4);
  // Mapper 2 writes nothing to partition 1; mapper 3 has a losing attempt too (not committed).
  ASSERT_EQ(*store->Commit(0, 1, WriteAttempt(*store, 0, 1, 300, 64)), CommitOutcome::kCommitted);
  ASSERT_EQ(*store->Commit(1, 7, WriteAttempt(*store, 1, 7, 30000, 400)),
            CommitOutcome::kCommitted);  // (~7 MB stored: the object takes two parts)
  std::vector<BlockRef> none_for_1;
  for (uint32_t p : {0u, 2u, 3u}) {
    const std::string f = MakeFrame(2, p, 3, 5);
    none_for_1.push_back(*store->Append(2, 5, p, testing::Bytes(f), 3));
  }
  ASSERT_EQ(*store->Commit(2, 5, none_for_1), CommitOutcome::kCommitted);
  const auto loser = WriteAttempt(*store, 3, 8, 7);
  ASSERT_EQ(*store->Commit(3, 9, WriteAttempt(*store, 3, 9, 11)), CommitOutcome::kCommitted);
  const std::vector<std::pair<uint32_t, uint64_t>> winners{{0, 1}, {1, 7}, {2, 5}, {3, 9}};
  ASSERT_OK_AND_ASSIGN(
      UploadedPartition up,
      UploadPartition(*store, "s1", 1, winners, bucket_.get(), "s1/p1-n0-a", options_));
  EXPECT_EQ(up.frames, 3u) << "mapper 2 has none here";
  EXPECT_GT(up.object.size, objstore::kMinPartBytes);
  EXPECT_EQ(ReadBack(up, 1), ReadPartition(*store, 1)) << "every record, in the store's order";
  uint64_t stored = 0;
  for (const BlockRef& b : store->CommittedBlocks(1)) stored += b.frame_size;
  EXPECT_EQ(up.frame_bytes, stored) << "frames as stored, no re-encoding";
  ASSERT_OK_AND_ASSIGN(auto reader, objstore::PartitionObjectReader::Open(
                                        bucket_.get(), {up.object.key, up.object.size}, "s1", 1));
  EXPECT_EQ(reader->footer().winners, winners) << "mapper 2 listed, with no frame";
  (void)loser;
}

// Each frame's key bounds, as the store keeps them, go into the footer: the object's index for
// key range reads with no server.
TEST_P(PartitionUploadTest, TheFramesKeyBoundsGoIntoTheFooter) {
  auto store = CreateStore(1, 1);
  const std::string frame = MakeFrame(0, 0, 50, 1);
  FrameDecoder decoder;
  DecodedFrame decoded;
  ASSERT_OK(decoder.Decode(frame, &decoded));
  std::string bounds;
  std::vector<std::string_view> scratch;
  AppendFrameBounds(decoded, &bounds, &scratch);
  ASSERT_FALSE(bounds.empty());
  const ShuffleStore::FrameToAppend one{0, testing::Bytes(frame), 50, bounds};
  std::vector<BlockRef> blocks;
  ASSERT_OK(store->AppendAll(0, 1, absl::MakeConstSpan(&one, 1), &blocks));
  ASSERT_EQ(*store->Commit(0, 1, blocks), CommitOutcome::kCommitted);
  ASSERT_OK_AND_ASSIGN(UploadedPartition up,
                       UploadPartition(*store, "s1", 0, {{0, 1}}, bucket_.get(), "s1/b", options_));
  ASSERT_OK_AND_ASSIGN(auto reader, objstore::PartitionObjectReader::Open(
                                        bucket_.get(), {up.object.key, up.object.size}, "s1", 0));
  ASSERT_EQ(reader->footer().frames.size(), 1u);
  EXPECT_EQ(reader->footer().frames[0].bounds, bounds);
}

TEST_P(PartitionUploadTest, AWinnerNotCommittedHereUploadsNothing) {
  auto store = CreateStore(2, 2);
  ASSERT_EQ(*store->Commit(0, 1, WriteAttempt(*store, 0, 1, 5)), CommitOutcome::kCommitted);
  EXPECT_THAT(UploadPartition(*store, "s1", 0, {{0, 1}, {1, 4}}, bucket_.get(), "s1/p0", options_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "mapper 1 attempt 4"));
  EXPECT_THAT(UploadPartition(*store, "s1", 0, {{0, 2}}, bucket_.get(), "s1/p0", options_),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not the attempt committed"));
  EXPECT_THAT(UploadPartition(*store, "s1", 9, {{0, 1}}, bucket_.get(), "s1/p9", options_),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));
  EXPECT_THAT(bucket_->Head("s1/p0"), StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST_P(PartitionUploadTest, ADamagedFrameFailsTheUploadAndLeavesNoObject) {
  auto store = CreateStore(2, 2);
  ASSERT_EQ(*store->Commit(0, 1, WriteAttempt(*store, 0, 1, 20000, 300)),
            CommitOutcome::kCommitted);
  ASSERT_EQ(*store->Commit(1, 1, WriteAttempt(*store, 1, 1, 50)), CommitOutcome::kCommitted);
  // A byte of mapper 1's frame of partition 0, on disk (after mapper 0's, in the object).
  const BlockRef victim = store->CommittedBlocks(0).back();
  const int fd = ::open((ShuffleDir() + "/data").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, victim.offset + 40), 1);
  c ^= 0x5a;
  ASSERT_EQ(::pwrite(fd, &c, 1, victim.offset + 40), 1);
  ::close(fd);
  EXPECT_THAT(UploadPartition(*store, "s1", 0, {{0, 1}, {1, 1}}, bucket_.get(), "s1/bad", options_),
              StatusIs(absl::StatusCode::kDataLoss, ""));
  EXPECT_THAT(bucket_->Head("s1/bad"), StatusIs(absl::StatusCode::kNotFound, ""));
  if (s3_->lists_uploads()) {
    ASSERT_OK_AND_ASSIGN(auto open, bucket_->ListUploads(""));
    EXPECT_TRUE(open.empty()) << "the upload was aborted";
  }
}

INSTANTIATE_TEST_SUITE_P(Servers, PartitionUploadTest, S3ServerKinds(), S3ServerName);

}  // namespace
}  // namespace sluice
