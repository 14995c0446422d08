// PushAttempt's rules with no transport: a registry on a real temporary directory, frames
// handed in as bytes. Each rule the push stream relies on, and its error, is here.
#include "server/rules/push_attempt.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "server/storage/file_util.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice {
namespace {

using absl::StatusCode;
using testing::Bytes;
using testing::EncodeRows;
using testing::Rows;
using testing::StatusIs;
using testing::TempDir;

// A frame of ~64 KiB that zstd cannot shrink much: its space on disk is measurable.
std::string BigFrame() {
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  std::string value(64 << 10, '\0');
  for (char& c : value) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return EncodeRows({{"big", value}});
}

Rows MakeRows(uint32_t mapper, int n) {
  Rows rows;
  for (int i = 0; i < n; ++i) {
    rows.emplace_back("m" + std::to_string(mapper) + "-" + std::to_string(i), "v");
  }
  return rows;
}

class PushAttemptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(registry_, ShuffleRegistry::Open(dir_.path(), StoreOptions{}));
    ASSERT_OK(registry_->Create(ShuffleParams{"s", 2, 4}).status());
  }
  std::shared_ptr<ShuffleStore> Store() { return *registry_->Get("s"); }
  // Bytes of disk the data file takes (punched-out blocks take none).
  uint64_t DiskBytes() {
    struct stat st;
    if (::stat((dir_.path() + "/shuffles/s/data").c_str(), &st) != 0) return 0;
    return static_cast<uint64_t>(st.st_blocks) * 512;
  }
  uint64_t CommittedRecords() { return Store()->Stats(0).records + Store()->Stats(1).records; }

  TempDir dir_;
  std::unique_ptr<ShuffleRegistry> registry_;
  PushLimits limits_;
};

TEST_F(PushAttemptTest, ACommittedAttemptIsVisibleAndCounted) {
  PushAttempt attempt(registry_.get(), limits_);
  ASSERT_OK(attempt.Open("s", 1, 7));
  ASSERT_OK(attempt.AddFrame(0, Bytes(EncodeRows(MakeRows(1, 3)))));
  ASSERT_OK(attempt.AddFrame(1, Bytes(EncodeRows(MakeRows(1, 4)))));
  ASSERT_OK_AND_ASSIGN(PushSummary summary, attempt.Commit(2, 7));
  EXPECT_FALSE(summary.duplicate);
  EXPECT_EQ(summary.frames, 2u);
  EXPECT_EQ(summary.records, 7u);
  EXPECT_GT(summary.bytes, 0u);
  EXPECT_EQ(Store()->CommittedMappers(), std::vector<uint32_t>{1});
  EXPECT_EQ(CommittedRecords(), 7u);
}

TEST_F(PushAttemptTest, MessagesOutOfOrderAreRefused) {
  const std::string frame = EncodeRows(MakeRows(0, 2));
  PushAttempt a(registry_.get(), limits_);
  EXPECT_THAT(a.AddFrame(0, Bytes(frame)),
              StatusIs(StatusCode::kInvalidArgument, "frames before the open message"));
  EXPECT_THAT(a.Commit(0, 0), StatusIs(StatusCode::kInvalidArgument, "commit before the open"));
  ASSERT_OK(a.Open("s", 0, 1));
  EXPECT_THAT(a.Open("s", 0, 1), StatusIs(StatusCode::kInvalidArgument, "second open message"));
}

TEST_F(PushAttemptTest, OpenChecksTheShuffleAndTheMapper) {
  PushAttempt a(registry_.get(), limits_);
  EXPECT_THAT(a.Open("nope", 0, 1), StatusIs(StatusCode::kNotFound, "'nope' not found"));
  EXPECT_THAT(a.Open("s", 4, 1),
              StatusIs(StatusCode::kInvalidArgument, "mapper 4 is out of range [0, 4)"));
  EXPECT_FALSE(a.opened());
}

TEST_F(PushAttemptTest, BadFramesAreNamedAndNothingOfTheAttemptStays) {
  PushAttempt a(registry_.get(), limits_);
  ASSERT_OK(a.Open("s", 2, 1));
  ASSERT_OK(a.AddFrame(0, Bytes(EncodeRows(MakeRows(2, 5)))));
  EXPECT_THAT(
      a.AddFrame(2, Bytes(EncodeRows(MakeRows(2, 1)))),
      StatusIs(StatusCode::kInvalidArgument, "frame 1: partition 2 is out of range [0, 2)"));
  std::string corrupt = EncodeRows(MakeRows(2, 5));
  corrupt.back() ^= 1;
  const absl::Status st = a.AddFrame(1, Bytes(corrupt));
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, "frame 1 for partition 1: "));
  ASSERT_OK(a.AddFrame(0, Bytes(BigFrame())));
  EXPECT_GE(DiskBytes(), 48u << 10);
  a.Abort(st);
  EXPECT_LT(DiskBytes(), 16u << 10);
  EXPECT_TRUE(Store()->CommittedMappers().empty());
  EXPECT_EQ(CommittedRecords(), 0u);
}

TEST_F(PushAttemptTest, TheCommitMustNameWhatWasReceived) {
  PushAttempt a(registry_.get(), limits_);
  ASSERT_OK(a.Open("s", 0, 1));
  ASSERT_OK(a.AddFrame(0, Bytes(EncodeRows(MakeRows(0, 5)))));
  EXPECT_THAT(a.Commit(1, 6),
              StatusIs(StatusCode::kInvalidArgument,
                       "commit says 1 frames and 6 records, the server received 1 frames and 5"));
  EXPECT_TRUE(Store()->CommittedMappers().empty());
}

TEST_F(PushAttemptTest, FramesPastTheLimitAndOverTheCapAreRefused) {
  limits_.max_frames_per_attempt = 2;
  limits_.frame.max_uncompressed_bytes = 4096;
  PushAttempt a(registry_.get(), limits_);
  ASSERT_OK(a.Open("s", 0, 1));
  const std::string big = EncodeRows({{"k", std::string(10000, 'x')}});
  EXPECT_THAT(a.AddFrame(0, Bytes(big)),
              StatusIs(StatusCode::kInvalidArgument, "exceeds the cap of 4096"));
  const std::string small = EncodeRows(MakeRows(0, 1));
  ASSERT_OK(a.AddFrame(0, Bytes(small)));
  ASSERT_OK(a.AddFrame(0, Bytes(small)));
  EXPECT_THAT(a.AddFrame(0, Bytes(small)),
              StatusIs(StatusCode::kResourceExhausted, "--max_frames_per_attempt"));
}

// A frame larger than a push message comes announced, then in pieces: it is checked when
// announced (before the caller reserves its size), assembled, and validated and appended as a
// whole; nothing else of the attempt may come in between.
TEST_F(PushAttemptTest, ALargeFrameInPiecesIsCheckedWhenAnnouncedAndAppendedWhenWhole) {
  const std::string frame = BigFrame();
  PushAttempt a(registry_.get(), limits_);
  EXPECT_THAT(a.BeginLargeFrame(0, frame.size()),
              StatusIs(StatusCode::kInvalidArgument, "a large frame before the open message"));
  ASSERT_OK(a.Open("s", 1, 1));
  EXPECT_THAT(a.AddPiece(Bytes(frame.substr(0, 10))),
              StatusIs(StatusCode::kInvalidArgument, "a frame piece with no large frame"));
  EXPECT_THAT(a.BeginLargeFrame(2, frame.size()),
              StatusIs(StatusCode::kInvalidArgument, "partition 2 is out of range [0, 2)"));
  EXPECT_THAT(a.BeginLargeFrame(0, 32),
              StatusIs(StatusCode::kInvalidArgument, "announced as 32 bytes"));
  EXPECT_THAT(a.BeginLargeFrame(0, (uint64_t{64} << 20) + 33),
              StatusIs(StatusCode::kInvalidArgument, "at most 67108896 bytes"));
  EXPECT_EQ(a.large_frame_size(), 0u);

  ASSERT_OK(a.BeginLargeFrame(1, frame.size()));
  EXPECT_EQ(a.large_frame_size(), frame.size());
  ASSERT_OK(a.AddPiece(Bytes(frame.substr(0, 1000))));
  EXPECT_THAT(a.AddFrame(0, Bytes(EncodeRows(MakeRows(1, 1)))),
              StatusIs(StatusCode::kInvalidArgument,
                       "frames before the last piece of the large frame for partition 1 (1000 of"));
  EXPECT_THAT(a.Commit(0, 0), StatusIs(StatusCode::kInvalidArgument, "the commit before the last"));
  EXPECT_THAT(a.BeginLargeFrame(0, frame.size()),
              StatusIs(StatusCode::kInvalidArgument, "another large frame before the last"));
  EXPECT_THAT(a.AddPiece({}), StatusIs(StatusCode::kInvalidArgument, "an empty frame piece"));
  ASSERT_OK(a.AddPiece(Bytes(frame.substr(1000, 30000))));
  EXPECT_EQ(Store()->Stats(1).frames, 0u);
  ASSERT_OK(a.AddPiece(Bytes(frame.substr(31000))));
  EXPECT_EQ(a.large_frame_size(), 0u);
  ASSERT_OK_AND_ASSIGN(PushSummary summary, a.Commit(1, 1));
  EXPECT_EQ(summary.bytes, frame.size());
  EXPECT_EQ(Store()->Stats(1).records, 1u);

  // Pieces past the announced size, and a frame whose pieces are whole but corrupt.
  PushAttempt b(registry_.get(), limits_);
  ASSERT_OK(b.Open("s", 2, 1));
  ASSERT_OK(b.BeginLargeFrame(0, frame.size()));
  EXPECT_THAT(b.AddPiece(Bytes(frame + "x")),
              StatusIs(StatusCode::kInvalidArgument,
                       "exceed its announced " + std::to_string(frame.size()) + " bytes"));
  PushAttempt c(registry_.get(), limits_);
  ASSERT_OK(c.Open("s", 3, 1));
  std::string corrupt = frame;
  corrupt.back() ^= 1;
  ASSERT_OK(c.BeginLargeFrame(0, corrupt.size()));
  EXPECT_THAT(c.AddPiece(Bytes(corrupt)),
              StatusIs(StatusCode::kInvalidArgument, "frame 0 for partition 0: "));
  EXPECT_EQ(c.large_frame_size(), 0u);
}

TEST_F(PushAttemptTest, ALaterAttemptIsADuplicateAndItsBlocksGo) {
  for (uint64_t attempt : {1, 2}) {
    PushAttempt a(registry_.get(), limits_);
    ASSERT_OK(a.Open("s", 3, attempt));
    ASSERT_OK(a.AddFrame(0, Bytes(EncodeRows(MakeRows(3, 10)))));
    ASSERT_OK_AND_ASSIGN(PushSummary summary, a.Commit(1, 10));
    EXPECT_EQ(summary.duplicate, attempt == 2);
  }
  EXPECT_EQ(CommittedRecords(), 10u);  // once
  EXPECT_EQ(Store()->CommittedBlocks(0).size(), 1u);
}

TEST_F(PushAttemptTest, AnAttemptDroppedBeforeItsCommitLeavesNothing) {
  {
    PushAttempt a(registry_.get(), limits_);
    ASSERT_OK(a.Open("s", 0, 1));
    ASSERT_OK(a.AddFrame(0, Bytes(BigFrame())));
    EXPECT_GE(DiskBytes(), 48u << 10);
  }  // neither committed nor aborted: its space is given back
  EXPECT_LT(DiskBytes(), 16u << 10);
  // Another attempt of the same mapper is then the first, not a duplicate.
  PushAttempt b(registry_.get(), limits_);
  ASSERT_OK(b.Open("s", 0, 2));
  ASSERT_OK(b.AddFrame(0, Bytes(EncodeRows(MakeRows(0, 4)))));
  ASSERT_OK_AND_ASSIGN(PushSummary summary, b.Commit(1, 4));
  EXPECT_FALSE(summary.duplicate);
  EXPECT_EQ(CommittedRecords(), 4u);
}

// A failed commit-log sync wedges the shuffle only until the disk works again and no push
// writes to it: the next push reopens it (re-verifying what is on disk, reclaiming the refused
// attempt's blocks) and goes on, without a restart.
TEST(WedgedShuffleTest, TheNextPushReopensAWedgedShuffleAndItsSpaceComesBack) {
  TempDir dir;
  std::atomic<bool> fail_sync{false};
  StoreOptions options;
  options.sync_data = [&](int fd, const std::string& path) -> absl::Status {
    if (fail_sync.load()) return absl::InternalError("fdatasync " + path + ": EIO");
    return file::SyncData(fd, path);
  };
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), options));
  ASSERT_OK(registry->Create(ShuffleParams{"s", 1, 0}).status());
  auto disk_bytes = [&] {
    struct stat st;
    if (::stat((dir.path() + "/shuffles/s/data").c_str(), &st) != 0) return uint64_t{0};
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  auto push = [&](uint32_t mapper, const std::string& frame) -> absl::Status {
    PushAttempt a(registry.get(), PushLimits{});
    SLUICE_RETURN_IF_ERROR(a.Open("s", mapper, 1));
    SLUICE_RETURN_IF_ERROR(a.AddFrame(0, Bytes(frame)));
    auto summary = a.Commit(1, 1);
    if (!summary.ok()) a.Abort(summary.status());
    return summary.status();
  };
  ASSERT_OK(push(0, BigFrame()));
  const uint64_t committed_bytes = disk_bytes();

  fail_sync = true;  // the disk fails one commit
  EXPECT_THAT(push(1, BigFrame()), StatusIs(StatusCode::kInternal, "EIO"));
  fail_sync = false;
  ASSERT_OK_AND_ASSIGN(auto wedged, registry->Get("s"));
  EXPECT_TRUE(wedged->wedged());
  EXPECT_GT(disk_bytes(), committed_bytes);  // the refused attempt's blocks, left for recovery
  wedged.reset();

  // The disk works again: the next push reopens the shuffle and commits.
  ASSERT_OK(push(2, BigFrame()));
  ASSERT_OK_AND_ASSIGN(auto store, registry->Get("s"));
  EXPECT_FALSE(store->wedged());
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{0, 2}));
  EXPECT_LE(disk_bytes(), 2 * committed_bytes + 8192) << "the refused attempt was not reclaimed";
}

// While a push still writes to a wedged shuffle, it is not reopened under it: others are told
// to retry.
TEST(WedgedShuffleTest, AWedgedShuffleWithARunningPushSaysRetry) {
  TempDir dir;
  std::atomic<bool> fail_sync{false};
  StoreOptions options;
  options.sync_data = [&](int fd, const std::string& path) -> absl::Status {
    if (fail_sync.load()) return absl::InternalError("fdatasync: EIO");
    return file::SyncData(fd, path);
  };
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), options));
  ASSERT_OK(registry->Create(ShuffleParams{"s", 1, 0}).status());
  const std::string frame = EncodeRows(MakeRows(0, 10));
  PushAttempt running(registry.get(), PushLimits{});
  ASSERT_OK(running.Open("s", 5, 1));
  ASSERT_OK(running.AddFrame(0, Bytes(frame)));
  {
    fail_sync = true;
    PushAttempt a(registry.get(), PushLimits{});
    ASSERT_OK(a.Open("s", 1, 1));
    ASSERT_OK(a.AddFrame(0, Bytes(frame)));
    EXPECT_FALSE(a.Commit(1, 10).ok());
    fail_sync = false;
  }
  PushAttempt refused(registry.get(), PushLimits{});
  EXPECT_THAT(refused.Open("s", 2, 1), StatusIs(StatusCode::kUnavailable, "retry"));
  running.Abort(absl::CancelledError("gone"));
  PushAttempt next(registry.get(), PushLimits{});
  ASSERT_OK(next.Open("s", 2, 1));
  ASSERT_OK(next.AddFrame(0, Bytes(frame)));
  ASSERT_OK(next.Commit(1, 10).status());
}

}  // namespace
}  // namespace sluice
