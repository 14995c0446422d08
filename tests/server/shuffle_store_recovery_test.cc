// ShuffleStore recovery on a real temporary directory: a reopen keeps exactly the committed
// attempts, cuts torn tails, reclaims the rest, and refuses to guess when committed data is
// damaged (corrupt or lost logs, data files cut short, payloads found damaged by a read or the
// scrub); a writer killed mid-attempt loses nothing acknowledged; earlier logs and layouts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "codec/endian.h"
#include "codec/frame_format.h"
#include "server/storage/file_util.h"
#include "server/storage/shuffle_store.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/server/shuffle_store_fixture.h"

namespace sluice {
namespace {

using store_test::kShown;
using store_test::MakeFrame;
using store_test::ShuffleStoreTest;
using testing::Bytes;
using testing::StatusIs;

TEST_F(ShuffleStoreTest, TornCommitLogTailIsCutOff) {
  {
    auto store = CreateStore();
    ASSERT_EQ(*store->Commit(0, 1, WriteAttempt(*store, 0, 1)), CommitOutcome::kCommitted);
  }
  const std::string log = ShuffleDir() + "/commits.log";
  struct stat st;
  ASSERT_EQ(::stat(log.c_str(), &st), 0);
  const auto good_size = static_cast<uint64_t>(st.st_size);
  {
    std::ofstream f(log, std::ios::binary | std::ios::app);
    f.write("SLCM\x40\x00\x00\x00partial", 15);  // a record cut short by a crash
  }
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{0}));
  ASSERT_EQ(::stat(log.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), good_size);
}

TEST_F(ShuffleStoreTest, CorruptionBeforeValidCommitsIsRefusedNotTruncated) {
  {
    auto store = CreateStore();
    ASSERT_EQ(*store->Commit(0, 1, WriteAttempt(*store, 0, 1)), CommitOutcome::kCommitted);
    ASSERT_EQ(*store->Commit(1, 1, WriteAttempt(*store, 1, 1)), CommitOutcome::kCommitted);
  }
  const std::string log = ShuffleDir() + "/commits.log";
  {
    std::fstream f(log, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(1024 + 20);  // inside the first record's body (after the log's 1 KiB header)
    f.put('\x7f');
  }
  auto store = ShuffleStore::Open(ShuffleDir(), kShown, StoreOptions{});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(store.status().message().find("refusing"), absl::string_view::npos) << store.status();
}

// Damage in a committed payload is not looked for at the start (which reads the log, not the
// frames): a fetch's read finds it, and so does the scrub; either marks the partition, whose
// reads then fail at once with DATA_LOSS naming it, while the others serve on.
TEST_F(ShuffleStoreTest, DamagedCommittedDataIsFoundByAReadAndMarksItsPartition) {
  std::vector<BlockRef> blocks;
  {
    auto store = CreateStore();
    blocks = WriteAttempt(*store, 0, 1, 50);
    ASSERT_EQ(*store->Commit(0, 1, blocks), CommitOutcome::kCommitted);
  }
  {
    std::fstream f(ShuffleDir() + "/data", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(blocks[3].offset + kBlockHeaderSize + 40));
    f.put('\x00');
  }
  std::vector<std::tuple<std::string, uint32_t, std::string>> told;
  StoreOptions options;
  options.on_damaged = [&told](const std::string& id, uint32_t p, const absl::Status&,
                               const char* by) { told.emplace_back(id, p, by); };
  auto opened = ShuffleStore::Open(ShuffleDir(), kShown, options);
  ASSERT_OK(opened);  // the start does not read payloads
  ShuffleStore& store = **opened;
  EXPECT_OK(store.PartitionDamage(3));
  std::string frame;
  const absl::Status read = store.ReadFrame(store.CommittedBlocks(3)[0], &frame);
  ASSERT_THAT(read, StatusIs(absl::StatusCode::kDataLoss, "corrupt"));
  // Named by its place in the data directory: clients see this, never a server path.
  EXPECT_NE(
      read.message().find(absl::StrCat("partition 3 at ", kShown, "/data:", blocks[3].offset)),
      absl::string_view::npos)
      << read;
  EXPECT_EQ(read.message().find(dir_.path()), absl::string_view::npos) << read;
  EXPECT_THAT(store.PartitionDamage(3), StatusIs(absl::StatusCode::kDataLoss, "partition 3"));
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0], std::make_tuple(std::string("s1"), 3u, std::string("fetch")));
  // The other partitions are whole and serve.
  for (uint32_t p = 0; p < 3; ++p) {
    EXPECT_OK(store.PartitionDamage(p));
    EXPECT_EQ(ReadPartition(store, p).size(), 50u);
  }
  EXPECT_EQ(store.DamagedPartitions().size(), 1u);
}

TEST_F(ShuffleStoreTest, TheScrubFindsDamageNobodyReadAndChecksEveryByte) {
  std::vector<BlockRef> blocks;
  uint64_t committed = 0;
  {
    auto store = CreateStore(4, 8);
    for (uint32_t m = 0; m < 3; ++m) {
      auto b = WriteAttempt(*store, m, 1, 200, 100);
      ASSERT_EQ(*store->Commit(m, 1, b), CommitOutcome::kCommitted);
      if (m == 1) blocks = b;
      for (const BlockRef& x : b) committed += kBlockHeaderSize + x.frame_size;
    }
  }
  // One payload byte of mapper 1's block of partition 2, and the header of its block of 0.
  {
    std::fstream f(ShuffleDir() + "/data", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(blocks[2].offset + kBlockHeaderSize + blocks[2].frame_size -
                                        7));
    f.put('\x5a');
    f.seekp(static_cast<std::streamoff>(blocks[0].offset + 9));
    f.put('\x7f');
  }
  std::vector<std::pair<uint32_t, std::string>> told;
  StoreOptions options;
  options.on_damaged = [&told](const std::string&, uint32_t p, const absl::Status& why,
                               const char* by) {
    told.emplace_back(p, std::string(by) + ": " + std::string(why.message()));
  };
  auto opened = ShuffleStore::Open(ShuffleDir(), kShown, options);
  ASSERT_OK(opened);
  ShuffleStore& store = **opened;
  ShuffleStore::ScrubCursor cursor;
  std::string buffer;
  uint64_t read = 0;
  int damaged = 0, steps = 0;
  for (;; ++steps) {
    const ShuffleStore::ScrubStep step = store.ScrubNext(&cursor, 4096, &buffer);
    read += step.bytes;
    damaged += step.damaged;
    if (step.done) break;
  }
  EXPECT_GT(steps, 3);  // in steps of about the size asked for
  EXPECT_EQ(damaged, 2);
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[0].first, 0u);
  EXPECT_NE(told[0].second.find("scrub: "), std::string::npos);
  EXPECT_NE(told[0].second.find("does not match its commit record"), std::string::npos)
      << told[0].second;
  EXPECT_EQ(told[1].first, 2u);
  EXPECT_NE(told[1].second.find("payload checksum mismatch"), std::string::npos) << told[1].second;
  // Every byte of the undamaged partitions was read, and each damaged one up to its damage.
  EXPECT_LE(read, committed);
  EXPECT_GE(read, committed - 2 * (kBlockHeaderSize + blocks[0].frame_size));
  EXPECT_LE(buffer.size(), ShuffleStore::kScrubPiece + 64);
  EXPECT_THAT(store.PartitionDamage(2), StatusIs(absl::StatusCode::kDataLoss, "partition 2"));
  EXPECT_OK(store.PartitionDamage(1));
  EXPECT_OK(store.PartitionDamage(3));
  // The next pass leaves the damaged partitions out.
  ShuffleStore::ScrubCursor again;
  uint64_t second = 0;
  for (;;) {
    const ShuffleStore::ScrubStep step = store.ScrubNext(&again, 1 << 30, &buffer);
    second += step.bytes;
    EXPECT_EQ(step.damaged, 0);
    if (step.done) break;
  }
  EXPECT_LT(second, read);
}

// A start reads the commit log, not the data: it still refuses a data file shorter than what
// the log commits, naming the block (and changes nothing).
TEST_F(ShuffleStoreTest, ADataFileCutShortIsRefusedAtOpen) {
  std::vector<BlockRef> blocks;
  {
    auto store = CreateStore();
    blocks = WriteAttempt(*store, 0, 1, 50);
    ASSERT_EQ(*store->Commit(0, 1, blocks), CommitOutcome::kCommitted);
  }
  const uint64_t cut = blocks.back().offset + kBlockHeaderSize + 10;
  ASSERT_EQ(::truncate((ShuffleDir() + "/data").c_str(), static_cast<off_t>(cut)), 0);
  auto store = ShuffleStore::Open(ShuffleDir(), kShown, StoreOptions{});
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kDataLoss, "cut short"));
  struct stat st;
  ASSERT_EQ(::stat((ShuffleDir() + "/data").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), cut);
}

// A log of version 3 (records without the frames' uncompressed sizes, written before layout
// 4's log) still opens: the frames' headers give the sizes, and it keeps its version.
TEST_F(ShuffleStoreTest, AVersion3LogOpensAndStaysVersion3) {
  std::vector<BlockRef> blocks;
  {
    auto store = CreateStore(4, 8);
    blocks = WriteAttempt(*store, 0, 1, 30);
    ASSERT_EQ(*store->Commit(0, 1, blocks), CommitOutcome::kCommitted);
  }
  // The same commit as a version 3 log: its header slot, then its record.
  std::string log(1024, '\0');
  std::string slot("SLLG", 4);
  AppendLE32(&slot, 3);
  AppendLE64(&slot, 1);
  AppendLE64(&slot, 1024);
  AppendLE64(&slot, 0);
  AppendLE64(&slot, PayloadChecksum(reinterpret_cast<const uint8_t*>(slot.data()), slot.size()));
  log.replace(512, slot.size(), slot);
  log += EncodeCommitRecord(0, 1, blocks, false, 3);
  {
    std::ofstream f(ShuffleDir() + "/commits.log", std::ios::binary | std::ios::trunc);
    f << log;
  }
  {
    auto store = Reopen();
    ASSERT_NE(store, nullptr);
    std::vector<uint32_t> mappers;
    auto got = store->CommittedBlocksOf(2, {}, &mappers);
    ASSERT_OK(got);
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ((*got)[0].uncompressed, blocks[2].uncompressed);
    EXPECT_GT(blocks[2].uncompressed, 0u);
    auto more = WriteAttempt(*store, 1, 1, 30);
    ASSERT_EQ(*store->Commit(1, 1, more), CommitOutcome::kCommitted);
  }
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(ReadPartition(*store, 1).size(), 60u);
  std::ifstream f(ShuffleDir() + "/commits.log", std::ios::binary);
  const std::string now((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(LoadLE32(reinterpret_cast<const uint8_t*>(now.data()) + 4), 3u);
}

TEST_F(ShuffleStoreTest, KilledWriterLosesNothingAcknowledged) {
  // A child process commits mapper after mapper and reports each acknowledged commit on a
  // pipe; the parent SIGKILLs it mid-stream, reopens the directory and checks that every
  // acknowledged mapper is there, whole, and that nothing half-written is visible.
  for (int round = 0; round < 3; ++round) {
    const std::string dir = dir_.path() + "/kill" + std::to_string(round);
    ShuffleParams params{"k", 3, 0};
    ASSERT_OK(ShuffleStore::Create(dir, "s", params, StoreOptions{}));
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(fds[0]);
      auto store = ShuffleStore::Open(dir, "s", StoreOptions{});
      if (!store.ok()) ::_exit(2);
      for (uint32_t mapper = 0;; ++mapper) {
        std::vector<BlockRef> blocks;
        for (uint32_t p = 0; p < 3; ++p) {
          const std::string frame = MakeFrame(mapper, p, 200, 0, 16);
          auto b = (*store)->Append(mapper, 1, p, Bytes(frame), 200);
          if (!b.ok()) ::_exit(3);
          blocks.push_back(*b);
        }
        (void)(*store)->Append(mapper + 1000000, 9, 1, Bytes(MakeFrame(9, 1, 50)), 50);  // never
        if (!(*store)->Commit(mapper, 1, blocks).ok()) ::_exit(4);
        if (::write(fds[1], &mapper, sizeof(mapper)) != sizeof(mapper)) ::_exit(5);
      }
    }
    ::close(fds[1]);
    // Killed once it has acknowledged a few commits (more each round), wherever it is then.
    std::vector<uint32_t> acked;
    uint32_t m;
    while (acked.size() < 5u + 40u * round && ::read(fds[0], &m, sizeof(m)) == sizeof(m)) {
      acked.push_back(m);
    }
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
    while (::read(fds[0], &m, sizeof(m)) == sizeof(m)) acked.push_back(m);
    ::close(fds[0]);
    ASSERT_FALSE(acked.empty()) << "the child made no commit before it was killed";

    auto store = ShuffleStore::Open(dir, "s", StoreOptions{});
    ASSERT_OK(store);
    const auto mappers = (*store)->CommittedMappers();
    // Acknowledged ones are all there; at most one more (committed, not yet acknowledged).
    ASSERT_GE(mappers.size(), acked.size());
    ASSERT_LE(mappers.size(), acked.size() + 1);
    for (size_t i = 0; i < mappers.size(); ++i) EXPECT_EQ(mappers[i], i);
    for (uint32_t p = 0; p < 3; ++p) {
      EXPECT_EQ((*store)->Stats(p).records, 200u * mappers.size());
      std::string frame;
      for (const BlockRef& b : (*store)->CommittedBlocks(p)) {
        ASSERT_OK((*store)->ReadFrame(b, &frame));
      }
    }
  }
}

// Committed frames are read back under the largest cap a server takes, not the one in force
// now, which may have been lowered since they were pushed.
TEST_F(ShuffleStoreTest, CommittedFramesAreReadUnderAnyLaterCap) {
  auto store = CreateStore(2);
  const std::vector<BlockRef> blocks = WriteAttempt(*store, 0, 1, /*records=*/20, /*padding=*/400);
  ASSERT_GT(blocks[0].frame_size, 4096u);
  ASSERT_EQ(*store->Commit(0, 1, blocks), CommitOutcome::kCommitted);
  store.reset();
  StoreOptions lower;
  lower.limits.max_uncompressed_bytes = 1024;  // smaller than every frame committed
  auto reopened = ShuffleStore::Open(ShuffleDir(), kShown, lower);
  ASSERT_OK(reopened);
  ASSERT_EQ((*reopened)->CommittedMappers(), std::vector<uint32_t>{0});
  for (const BlockRef& b : blocks) {
    std::string frame;
    EXPECT_OK((*reopened)->ReadFrame(b, &frame));
    EXPECT_EQ(frame.size(), b.frame_size);
  }
  // New input is held to the lower cap.
  const std::string big = MakeFrame(1, 0, 20, 0, 400);
  EXPECT_FALSE((*reopened)->Append(1, 1, 0, Bytes(big), 20).ok());
}

// A commit log that lost acknowledged records (shortened, emptied or deleted) is refused with
// DATA_LOSS and every byte of the shuffle is kept, instead of opening with fewer commits and
// reclaiming their data.
TEST_F(ShuffleStoreTest, ALostOrShortenedCommitLogIsRefusedAndTheDataKept) {
  {
    auto store = CreateStore(3);
    for (uint32_t m = 0; m < 3; ++m) {
      ASSERT_EQ(*store->Commit(m, 1, WriteAttempt(*store, m, 1)), CommitOutcome::kCommitted);
    }
  }
  const std::string log = ShuffleDir() + "/commits.log";
  auto read = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string whole_log = read(log);
  const std::string data = read(ShuffleDir() + "/data");
  const size_t last_record =
      EncodeCommitRecord(2, 1, std::vector<BlockRef>(3)).size();  // same size as mapper 2's
  struct Damage {
    const char* what;
    std::function<void()> apply;
    const char* message;
  };
  const std::vector<Damage> damages = {
      {"last record cut off",
       [&] { ASSERT_EQ(::truncate(log.c_str(), whole_log.size() - last_record), 0); },
       "acknowledged commits are missing"},
      {"emptied", [&] { ASSERT_EQ(::truncate(log.c_str(), 0), 0); }, "commits.log"},
      {"deleted", [&] { ASSERT_EQ(::unlink(log.c_str()), 0); }, "is missing"},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    d.apply();
    auto store = ShuffleStore::Open(ShuffleDir(), kShown, StoreOptions{});
    EXPECT_THAT(store, StatusIs(absl::StatusCode::kDataLoss, d.message));
    EXPECT_EQ(read(ShuffleDir() + "/data"), data) << "the data file was changed";
    std::ofstream(log, std::ios::binary | std::ios::trunc) << whole_log;  // undo the damage
    auto healed = ShuffleStore::Open(ShuffleDir(), kShown, StoreOptions{});
    ASSERT_OK(healed);
    EXPECT_EQ((*healed)->CommittedMappers(), (std::vector<uint32_t>{0, 1, 2}));
  }
}

// A shuffle whose log never got its first bytes (a crash inside CreateShuffle) and that holds
// no data comes up empty.
TEST_F(ShuffleStoreTest, AnEmptyLogWithoutDataIsAFreshShuffle) {
  CreateStore(3);
  const std::string log = ShuffleDir() + "/commits.log";
  for (bool remove : {false, true}) {
    if (remove) {
      ASSERT_EQ(::unlink(log.c_str()), 0);
    } else {
      ASSERT_EQ(::truncate(log.c_str(), 0), 0);
    }
    auto store = ShuffleStore::Open(ShuffleDir(), kShown, StoreOptions{});
    ASSERT_OK(store);
    EXPECT_TRUE((*store)->CommittedMappers().empty());
    ASSERT_EQ(*(*store)->Commit(0, 1, WriteAttempt(**store, 0, 1)), CommitOutcome::kCommitted);
    store->reset();
    const std::string data = ShuffleDir() + "/data";
    ASSERT_EQ(remove ? ::unlink(data.c_str()) : ::truncate(data.c_str(), 0), 0);
  }
}

// Shuffles of the earlier, unreleased layouts are not read. tests/server/testdata/shuffle_v2
// is a real layout 2 shuffle (one file per partition): opening it is DATA_LOSS naming its
// layout, and nothing of it is changed or reclaimed.
TEST_F(ShuffleStoreTest, AShuffleOfAnEarlierLayoutIsRefusedAndLeftAsItIs) {
  auto read = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  ASSERT_OK(file::MakeDirs(ShuffleDir()));
  const std::vector<std::string> names = {"SHUFFLE", "commits.log", "p0.data", "p1.data",
                                          "p2.data"};
  for (const std::string& name : names) {
    std::ofstream(ShuffleDir() + "/" + name, std::ios::binary)
        << read(std::string(SLUICE_TESTDATA_DIR) + "/shuffle_v2/" + name);
  }
  EXPECT_THAT(ShuffleStore::Open(ShuffleDir(), "shuffles/s1", StoreOptions{}),
              StatusIs(absl::StatusCode::kDataLoss,
                       "shuffles/s1/SHUFFLE is of layout 2, written by a pre-release server"));
  for (const std::string& name : names) {
    EXPECT_EQ(read(ShuffleDir() + "/" + name),
              read(std::string(SLUICE_TESTDATA_DIR) + "/shuffle_v2/" + name))
        << name;
  }
  EXPECT_FALSE(file::Exists(ShuffleDir() + "/data"));
}

}  // namespace
}  // namespace sluice
