// PartitionObjectReader against real S3 servers: a partition object of real codec frames
// uploaded in parts, read back by ranges (one GET opens it), every record decoded exactly; a
// large footer; a damaged or truncated object named, never half read.
#include "objstore/object_reader.h"

#include <gtest/gtest.h>

#include "objstore/object_upload.h"
#include "tests/harness/frames.h"
#include "tests/harness/s3_server.h"
#include "tests/harness/status_matchers.h"

namespace sluice::objstore {
namespace {

using ::sluice::testing::DecodeRows;
using ::sluice::testing::EncodeRows;
using ::sluice::testing::Rows;
using ::sluice::testing::S3Server;
using ::sluice::testing::S3ServerKinds;
using ::sluice::testing::S3ServerName;
using ::sluice::testing::S3ServerTest;
using ::sluice::testing::StatusIs;

class ObjectReaderTest : public S3ServerTest {
 protected:
  void SetUp() override {
    S3ServerTest::SetUp();
    if (s3_ == nullptr) return;
    ASSERT_OK_AND_ASSIGN(store_, S3Store::Make(s3_->Options("r")));
  }
  // Uploads `frames` (mapper i % mappers, attempt 100 + mapper) as partition 5 of "job" under
  // `key`, in 5 MiB parts; its size.
  uint64_t Upload(const std::string& key, const std::vector<std::string>& frames, uint32_t mappers,
                  std::vector<Rows>* rows = nullptr) {
    PartitionObjectFooter f;
    f.shuffle_id = "job";
    f.partition = 5;
    for (uint32_t m = 0; m < mappers; ++m) f.winners.emplace_back(m, 100 + m);
    UploadOptions o;
    o.part_bytes = kMinPartBytes;
    auto up = ObjectUpload::Start(store_.get(), key, o);
    EXPECT_TRUE(up.ok());
    uint64_t at = 0;
    for (size_t i = 0; i < frames.size(); ++i) {
      const uint32_t m = static_cast<uint32_t>(i % mappers);
      f.frames.push_back(ObjectFrame{m,
                                     100u + m,
                                     at,
                                     static_cast<uint32_t>(frames[i].size()),
                                     static_cast<uint32_t>(rows != nullptr ? (*rows)[i].size() : 0),
                                     0,
                                     {}});
      at += frames[i].size();
      EXPECT_TRUE((*up)->Append(frames[i]).ok());
    }
    EXPECT_TRUE((*up)->Append(EncodeFooter(f)).ok());
    auto info = (*up)->Finish();
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->size : 0;
  }
  std::unique_ptr<S3Store> store_;
};

TEST_P(ObjectReaderTest, EveryRecordComesBackInOrderFromRanges) {
  std::vector<std::string> frames;
  std::vector<Rows> rows;
  for (int i = 0; i < 60; ++i) {
    Rows r;
    for (int j = 0; j < 2000; ++j) {
      r.emplace_back("key-" + std::to_string(i * 2000 + j),
                     std::string(40 + (j % 50), static_cast<char>('a' + (i + j) % 26)) +
                         std::to_string(j * 7919 % 100003));
    }
    frames.push_back(EncodeRows(r));
    rows.push_back(std::move(r));
  }
  const uint64_t size = Upload("job/p5", frames, 3, &rows);
  ReadOptions o;
  o.range_bytes = 256 << 10;  // (several frames a GET, several GETs in flight)
  o.parallel = 3;
  ASSERT_OK_AND_ASSIGN(auto reader,
                       PartitionObjectReader::Open(store_.get(), {"job/p5", size}, "job", 5, o));
  EXPECT_EQ(reader->open_requests(), 1) << "the tail read holds trailer and footer";
  ASSERT_EQ(reader->footer().frames.size(), frames.size());
  const uint64_t gets_before = store_->counters().get;
  size_t seen = 0;
  ASSERT_OK(reader->ReadFrames(0, frames.size(), [&](size_t i, absl::string_view frame) {
    EXPECT_EQ(i, seen++);
    EXPECT_EQ(DecodeRows(std::string_view(frame.data(), frame.size())), rows[i]) << i;
    return absl::OkStatus();
  }));
  EXPECT_EQ(seen, frames.size());
  const uint64_t gets = store_->counters().get - gets_before;
  EXPECT_LT(gets, frames.size()) << "neighbours coalesced";
  EXPECT_GE(gets, size / o.range_bytes) << "no GET past its range size";
  // A slice: frames 10 to 19 alone.
  std::vector<size_t> slice;
  ASSERT_OK(reader->ReadFrames(10, 20, [&](size_t i, absl::string_view) {
    slice.push_back(i);
    return absl::OkStatus();
  }));
  EXPECT_EQ(slice.front(), 10u);
  EXPECT_EQ(slice.size(), 10u);
  // The caller's error stops the read and is what it returns.
  EXPECT_THAT(reader->ReadFrames(0, frames.size(),
                                 [&](size_t i, absl::string_view) {
                                   return i == 7 ? absl::DataLossError("frame 7 is bad")
                                                 : absl::OkStatus();
                                 }),
              StatusIs(absl::StatusCode::kDataLoss, "frame 7 is bad"));
}

TEST_P(ObjectReaderTest, ALargeFooterTakesASecondRead) {
  std::vector<std::string> frames(3000, EncodeRows({{"k", "v"}}));
  const uint64_t size = Upload("job/many", frames, 1000);
  ReadOptions o;
  o.tail_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(auto reader,
                       PartitionObjectReader::Open(store_.get(), {"job/many", size}, "job", 5, o));
  EXPECT_EQ(reader->open_requests(), 2);
  EXPECT_EQ(reader->footer().frames.size(), 3000u);
  EXPECT_EQ(reader->footer().winners.size(), 1000u);
}

TEST_P(ObjectReaderTest, ADamagedOrCutObjectIsNamedNotRead) {
  std::vector<std::string> frames(10, EncodeRows({{"k", "v"}}));
  const uint64_t size = Upload("job/ok", frames, 2);
  ASSERT_OK_AND_ASSIGN(std::string bytes, store_->Get("job/ok"));
  std::string bad = bytes;
  bad[bad.size() - kTrailerBytes - 20] ^= 1;  // (inside the footer)
  ASSERT_OK(store_->Put("job/bad", bad));
  EXPECT_THAT(PartitionObjectReader::Open(store_.get(), {"job/bad", size}, "job", 5),
              StatusIs(absl::StatusCode::kDataLoss, "object job/bad: partition object"));
  ASSERT_OK(store_->Put("job/cut", bytes.substr(0, bytes.size() - 7)));
  EXPECT_FALSE(PartitionObjectReader::Open(store_.get(), {"job/cut", size - 7}, "job", 5).ok());
  EXPECT_THAT(PartitionObjectReader::Open(store_.get(), {"job/ok", size}, "other", 5),
              StatusIs(absl::StatusCode::kDataLoss, "not partition 5 of 'other'"));
  EXPECT_THAT(PartitionObjectReader::Open(store_.get(), {"job/gone", size}, "job", 5),
              StatusIs(absl::StatusCode::kNotFound, "job/gone"));
  // The commit record's size is what is read by: an object that is not that size is refused.
  EXPECT_FALSE(PartitionObjectReader::Open(store_.get(), {"job/ok", size + 100}, "job", 5).ok());
}

INSTANTIATE_TEST_SUITE_P(Servers, ObjectReaderTest, S3ServerKinds(), S3ServerName);

}  // namespace
}  // namespace sluice::objstore
