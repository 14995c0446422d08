// CommitLog on a real temporary directory: the record encoding and its parser, torn tails and
// mid-log corruption on open, group commit (data synced before the records, one batch at a
// time) and the broken-log latch.
#include "server/storage/commit_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "codec/endian.h"
#include "codec/frame_format.h"
#include "codec/key_bounds.h"
#include "server/storage/file_util.h"
#include "tests/harness/parked_threads.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using testing::StatusIs;
using testing::TempDir;

std::vector<BlockRef> Blocks(uint32_t mapper, int n) {
  std::vector<BlockRef> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(
        BlockRef{static_cast<uint32_t>(i % 3), 100u + mapper, 4096ull * i + mapper, 7u * i});
  }
  return out;
}

bool SameBlocks(const std::vector<BlockRef>& a, const std::vector<BlockRef>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].partition != b[i].partition || a[i].frame_size != b[i].frame_size ||
        a[i].offset != b[i].offset || a[i].records != b[i].records) {
      return false;
    }
  }
  return true;
}

TEST(CommitRecordTest, RoundTripsAndRejectsEveryTruncationAndEveryFlippedByte) {
  const auto blocks = Blocks(5, 4);
  const std::string rec = EncodeCommitRecord(5, 77, blocks);
  const auto* p = reinterpret_cast<const uint8_t*>(rec.data());
  CommitRecord out;
  ASSERT_EQ(ParseCommitRecord(p, p + rec.size(), &out), rec.size());
  EXPECT_EQ(out.mapper, 5u);
  EXPECT_EQ(out.attempt, 77u);
  EXPECT_TRUE(SameBlocks(out.blocks, blocks));
  for (size_t n = 0; n < rec.size(); ++n) {
    EXPECT_EQ(ParseCommitRecord(p, p + n, &out), 0u) << "truncated to " << n;
  }
  for (size_t i = 0; i < rec.size(); ++i) {
    std::string bad = rec;
    bad[i] ^= 0x10;
    const auto* q = reinterpret_cast<const uint8_t*>(bad.data());
    EXPECT_EQ(ParseCommitRecord(q, q + bad.size(), &out), 0u) << "byte " << i;
  }
}

TEST(CommitRecordTest, AMergeRecordRoundTripsAndRejectsEveryTruncationAndFlippedByte) {
  CommitRecord r;
  r.merge = true;
  r.partition = 3;
  r.mapper = 10;
  r.last_mapper = 13;
  r.attempt = 42;  // the merge id
  r.level = 2;
  r.attempts = {1, 7, 1, 2};
  r.repaired = {11};
  r.blocks = Blocks(3, 3);
  AppendKeyBounds({"a", "b"}, HeavyKey{"a", false, 1, 2}, &r.blocks[1].bounds);
  const std::string rec = EncodeRecord(r);
  const auto* p = reinterpret_cast<const uint8_t*>(rec.data());
  CommitRecord out;
  ASSERT_EQ(ParseCommitRecord(p, p + rec.size(), &out), rec.size());
  EXPECT_TRUE(out.merge);
  EXPECT_EQ(out.partition, 3u);
  EXPECT_EQ(out.mapper, 10u);
  EXPECT_EQ(out.last_mapper, 13u);
  EXPECT_EQ(out.attempt, 42u);
  EXPECT_EQ(out.level, 2u);
  EXPECT_EQ(out.attempts, r.attempts);
  EXPECT_EQ(out.repaired, r.repaired);
  EXPECT_TRUE(SameBlocks(out.blocks, r.blocks));
  EXPECT_EQ(out.blocks[1].bounds, r.blocks[1].bounds);
  EXPECT_TRUE(out.blocks[0].bounds.empty());
  // A log before version 8 takes no merge record.
  EXPECT_EQ(ParseCommitRecord(p, p + rec.size(), &out, kFirstMergeLogVersion - 1), 0u);
  for (size_t n = 0; n < rec.size(); ++n) {
    EXPECT_EQ(ParseCommitRecord(p, p + n, &out), 0u) << "truncated to " << n;
  }
  for (size_t i = 0; i < rec.size(); ++i) {
    std::string bad = rec;
    bad[i] ^= 0x10;
    const auto* q = reinterpret_cast<const uint8_t*>(bad.data());
    EXPECT_EQ(ParseCommitRecord(q, q + bad.size(), &out), 0u) << "byte " << i;
  }
}

class CommitLogTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK_AND_ASSIGN(dir_fd_, file::OpenDirectory(dir_.path())); }
  std::string LogPath() const { return dir_.path() + "/commits.log"; }
  CommitLog::Options Options() {
    CommitLog::Options o;
    o.shuffle_name = "s";
    o.sync_data = [this] { return OnSync(); };
    return o;
  }
  absl::StatusOr<std::unique_ptr<CommitLog>> Reopen(std::vector<CommitRecord>* records) {
    // As strict as a shuffle with data.
    return CommitLog::Open(dir_fd_.get(), dir_.path(), Options(), /*has_data=*/true, records);
  }
  uint64_t LogSize() const {
    std::ifstream f(LogPath(), std::ios::binary | std::ios::ate);
    return static_cast<uint64_t>(f.tellg());
  }
  void AppendRaw(const std::string& bytes) {
    std::ofstream f(LogPath(), std::ios::binary | std::ios::app);
    f << bytes;
  }

  // What the data sync does (set by the tests).
  std::function<absl::Status()> on_sync_;
  absl::Status OnSync() { return on_sync_ ? on_sync_() : absl::OkStatus(); }

  TempDir dir_;
  file::Fd dir_fd_;
};

TEST_F(CommitLogTest, AppendedRecordsAreThereAfterReopenInOrder) {
  ASSERT_OK_AND_ASSIGN(auto log, CommitLog::Create(dir_fd_.get(), dir_.path(), Options()));
  for (uint32_t m = 0; m < 5; ++m) ASSERT_OK(log->Append(m, 10 + m, Blocks(m, m + 1)));
  log.reset();
  std::vector<CommitRecord> records;
  ASSERT_OK_AND_ASSIGN(log, Reopen(&records));
  ASSERT_EQ(records.size(), 5u);
  for (uint32_t m = 0; m < 5; ++m) {
    EXPECT_EQ(records[m].mapper, m);
    EXPECT_EQ(records[m].attempt, 10u + m);
    EXPECT_TRUE(SameBlocks(records[m].blocks, Blocks(m, m + 1)));
  }
  ASSERT_OK(log->Append(9, 1, Blocks(9, 1)));  // appends after what was there
  log.reset();
  ASSERT_OK_AND_ASSIGN(log, Reopen(&records));
  EXPECT_EQ(records.size(), 6u);
}

TEST_F(CommitLogTest, DataIsSyncedBeforeTheRecordIsWritten) {
  ASSERT_OK_AND_ASSIGN(auto log, CommitLog::Create(dir_fd_.get(), dir_.path(), Options()));
  int syncs = 0;
  uint64_t size_at_sync = 1;
  on_sync_ = [&] {
    ++syncs;
    size_at_sync = LogSize();
    return absl::OkStatus();
  };
  ASSERT_OK(log->Append(1, 1, Blocks(1, 5)));  // partitions 0, 1, 2: one sync of the data file
  EXPECT_EQ(syncs, 1);
  EXPECT_EQ(size_at_sync, 1024u) << "the record was written before its data was synced";
  EXPECT_GT(LogSize(), 1024u);
}

TEST_F(CommitLogTest, ConcurrentAppendsShareOneWriteAndSyncPerBatch) {
  ASSERT_OK_AND_ASSIGN(auto log, CommitLog::Create(dir_fd_.get(), dir_.path(), Options()));
  // The first batch's data sync waits until every other append has queued behind it: they must
  // then go out together, as the second batch, with one data sync for all their partitions.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<uint64_t> batches;  // the log's size at each data sync
  on_sync_ = [&] {
    std::unique_lock<std::mutex> lock(mu);
    batches.push_back(LogSize());
    cv.notify_all();
    if (batches.size() == 1) cv.wait(lock, [&] { return release; });
    return absl::OkStatus();
  };
  std::thread first([&] { EXPECT_OK(log->Append(0, 1, {BlockRef{7, 10, 0, 1}})); });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return !batches.empty(); });
  }
  std::vector<std::thread> others;
  std::vector<std::atomic<pid_t>> tids(8);
  for (uint32_t m = 1; m <= 8; ++m) {
    others.emplace_back([&, m] {
      tids[m - 1] = ::gettid();
      EXPECT_OK(log->Append(m, 1, {BlockRef{m, 10, 0, 1}}));
    });
  }
  // Until every one of them has queued: all parked at once, with the first batch held and
  // this thread asleep, can only be parked in the queue (on their way to it they wait for
  // nothing but locks that running threads hold).
  const bool queued = testing::Eventually([&] {
    std::vector<pid_t> all;
    for (const auto& t : tids) {
      if (t.load() == 0) return false;
      all.push_back(t.load());
    }
    return testing::ThreadsParked(all);
  });
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  first.join();
  for (auto& t : others) t.join();
  ASSERT_TRUE(queued) << "the appends did not all queue behind the first batch";
  ASSERT_EQ(batches.size(), 2u) << "the 8 queued appends did not share one data sync";
  EXPECT_EQ(batches[0], 1024u);
  EXPECT_GT(batches[1], batches[0]);  // after the first batch's record, before theirs
  log.reset();
  std::vector<CommitRecord> records;
  ASSERT_OK_AND_ASSIGN(log, Reopen(&records));
  EXPECT_EQ(records.size(), 9u);
}

TEST_F(CommitLogTest, AFailedSyncBreaksTheLogAndWritesNothing) {
  ASSERT_OK_AND_ASSIGN(auto log, CommitLog::Create(dir_fd_.get(), dir_.path(), Options()));
  ASSERT_OK(log->Append(0, 1, Blocks(0, 2)));
  const uint64_t before = LogSize();
  on_sync_ = [] { return absl::InternalError("fdatasync: EIO"); };
  EXPECT_THAT(log->Append(1, 1, Blocks(1, 2)), StatusIs(absl::StatusCode::kInternal, "EIO"));
  EXPECT_TRUE(log->broken());
  on_sync_ = nullptr;  // the disk is fine again: the log still refuses, the outcome was unknown
  EXPECT_THAT(log->Append(2, 1, Blocks(2, 2)),
              StatusIs(absl::StatusCode::kUnavailable, "stopped taking commits"));
  EXPECT_EQ(LogSize(), before);
  log.reset();
  std::vector<CommitRecord> records;
  ASSERT_OK_AND_ASSIGN(log, Reopen(&records));  // a restart re-reads what is on disk
  ASSERT_EQ(records.size(), 1u);
  EXPECT_FALSE(log->broken());
  EXPECT_OK(log->Append(2, 1, Blocks(2, 2)));
}

TEST_F(CommitLogTest, ATornTailIsCutAndCorruptionBeforeValidRecordsIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto log, CommitLog::Create(dir_fd_.get(), dir_.path(), Options()));
  ASSERT_OK(log->Append(0, 1, Blocks(0, 2)));
  ASSERT_OK(log->Append(1, 1, Blocks(1, 2)));
  log.reset();
  const uint64_t whole = LogSize();
  const std::string third = EncodeCommitRecord(2, 1, Blocks(2, 3));
  AppendRaw(third.substr(0, third.size() - 5));  // a torn write
  std::vector<CommitRecord> records;
  ASSERT_OK_AND_ASSIGN(log, Reopen(&records));
  EXPECT_EQ(records.size(), 2u);
  EXPECT_EQ(LogSize(), whole);  // cut back to the last whole record
  log.reset();

  // Damage the first record (records start after the 1 KiB header): it was acknowledged, so
  // nothing may be dropped.
  {
    std::fstream f(LogPath(), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(1024 + 12);
    f.put('\x55');
  }
  auto refused = Reopen(&records);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kDataLoss, "corrupt at byte 1024"));
  EXPECT_EQ(LogSize(), whole);  // nothing was truncated
}

// A batch of records torn by a power loss can leave a hole with valid records after it. Past
// the length the log had proven durable it is an unacknowledged tail and is cut; before it, it
// is corruption of acknowledged commits and is refused.
TEST_F(CommitLogTest, AHoleAfterTheDurableLengthIsATornBatchAndIsCut) {
  ASSERT_OK_AND_ASSIGN(auto log, CommitLog::Create(dir_fd_.get(), dir_.path(), Options()));
  ASSERT_OK(log->Append(0, 1, Blocks(0, 2)));
  ASSERT_OK(log->Append(1, 1, Blocks(1, 2)));
  log.reset();
  const uint64_t whole = LogSize();
  // A multi-page batch whose first page never reached the disk.
  AppendRaw(EncodeCommitRecord(2, 1, Blocks(2, 3)).substr(0, 10));
  AppendRaw(std::string(4096, '\0'));
  AppendRaw(EncodeCommitRecord(3, 1, Blocks(3, 3)));
  std::vector<CommitRecord> records;
  ASSERT_OK_AND_ASSIGN(log, Reopen(&records));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].mapper, 1u);
  EXPECT_EQ(LogSize(), whole);
  // What Open kept is now proven durable too: losing it later is refused.
  ASSERT_OK(log->Append(4, 1, Blocks(4, 1)));
  log.reset();
  ASSERT_EQ(::truncate(LogPath().c_str(), static_cast<off_t>(whole)), 0);
  EXPECT_THAT(Reopen(&records),
              StatusIs(absl::StatusCode::kDataLoss, "acknowledged commits are missing"));
}

// Logs of the earlier, unreleased layouts are not read: one whose header has another version
// is refused as headerless (the shuffle has data), and nothing is changed.
TEST_F(CommitLogTest, ALogOfAnotherVersionIsRefusedAndLeftAsItIs) {
  ASSERT_OK_AND_ASSIGN(auto log, CommitLog::Create(dir_fd_.get(), dir_.path(), Options()));
  for (uint32_t m = 0; m < 2; ++m) ASSERT_OK(log->Append(m, 1, Blocks(m, 2)));
  log.reset();
  // Make it what a version 2 server wrote: the same slots with version 2.
  {
    std::fstream f(LogPath(), std::ios::binary | std::ios::in | std::ios::out);
    for (int slot : {0, 1}) {
      char raw[40];
      f.seekg(slot * 512);
      f.read(raw, sizeof raw);
      if (std::memcmp(raw, "SLLG", 4) != 0) continue;
      auto* u = reinterpret_cast<uint8_t*>(raw);
      StoreLE32(u + 4, 2);
      StoreLE64(u + 32, PayloadChecksum(u, 32));
      f.seekp(slot * 512);
      f.write(raw, sizeof raw);
    }
  }
  const uint64_t size = LogSize();
  std::vector<CommitRecord> records;
  EXPECT_THAT(Reopen(&records), StatusIs(absl::StatusCode::kDataLoss, "has no valid header"));
  EXPECT_EQ(LogSize(), size);
  // Nor does a bare log of records from byte 0 (version 1) pass for one.
  ASSERT_EQ(::truncate(LogPath().c_str(), 0), 0);
  AppendRaw(EncodeCommitRecord(0, 1, Blocks(0, 2)));
  EXPECT_THAT(Reopen(&records), StatusIs(absl::StatusCode::kDataLoss, "has no valid header"));
}

// The two header slots are written alternately: a slot torn by a crash leaves the other one,
// one checkpoint older, to go by.
TEST_F(CommitLogTest, ATornHeaderSlotFallsBackToTheOtherOne) {
  ASSERT_OK_AND_ASSIGN(auto log, CommitLog::Create(dir_fd_.get(), dir_.path(), Options()));
  for (uint32_t m = 0; m < 3; ++m) ASSERT_OK(log->Append(m, 1, Blocks(m, 2)));
  log.reset();
  for (int slot : {0, 1}) {
    std::fstream f(LogPath(), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(slot * 512 + 20);
    const char byte = static_cast<char>(f.get());
    f.seekp(slot * 512 + 20);
    f.put(static_cast<char>(byte ^ 0x40));
    f.close();
    std::vector<CommitRecord> records;
    SCOPED_TRACE(slot);
    ASSERT_OK_AND_ASSIGN(log, Reopen(&records));
    EXPECT_EQ(records.size(), 3u);
    log.reset();
  }
  // Both slots gone: the log's commits cannot be trusted to be complete.
  {
    std::fstream f(LogPath(), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(0);
    f.put('X');
    f.seekp(512);
    f.put('X');
  }
  std::vector<CommitRecord> records;
  EXPECT_THAT(Reopen(&records), StatusIs(absl::StatusCode::kDataLoss, "has no valid header"));
}

}  // namespace
}  // namespace sluice
