// ShuffleStore on a real temporary directory: commits are visible and durable, nothing else is;
// reads through the mapped view; cluster mode's prepared attempts, repairs and revocations;
// bad arguments, memory per partition written, deletes and discarded blocks. (Recovery:
// shuffle_store_recovery_test.cc; the registry of stores: shuffle_registry_test.cc.)
#include "server/storage/shuffle_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codec/frame_format.h"
#include "server/storage/file_util.h"
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

TEST_F(ShuffleStoreTest, CommittedAttemptsAreVisibleInMapperOrder) {
  auto store = CreateStore();
  const auto b3 = WriteAttempt(*store, 3, 1);
  const auto b1 = WriteAttempt(*store, 1, 7);
  EXPECT_TRUE(store->CommittedBlocks(0).empty());  // nothing visible before commit
  ASSERT_EQ(*store->Commit(3, 1, b3), CommitOutcome::kCommitted);
  ASSERT_EQ(*store->Commit(1, 7, b1), CommitOutcome::kCommitted);
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{1, 3}));
  const auto rows = ReadPartition(*store, 2);
  ASSERT_EQ(rows.size(), 10u);
  EXPECT_EQ(rows[0], "k1-2-0=v7-0");  // mapper 1 first, whatever the commit order
  EXPECT_EQ(rows[5], "k3-2-0=v1-0");
  EXPECT_EQ(store->Stats(2).records, 10u);
  EXPECT_EQ(store->Stats(2).frames, 2u);
}

// Fetches read small frames through a mapping of the data file (a copy instead of a pread
// each). What comes out is what pread gives, damage is still found by the frame's checksum, a
// page the file no longer has (cut short under the server: what an I/O error looks like to a
// mapping) is an error of that read and not the process's SIGBUS, and the view is shared while
// held and unmapped when the last reader lets go.
TEST_F(ShuffleStoreTest, ReadsThroughTheViewAreReadsAndItsFaultsAreErrors) {
  auto store = CreateStore(4, 2);
  const auto b0 = WriteAttempt(*store, 0, 1, 20);
  const auto b1 = WriteAttempt(*store, 1, 1, 3);
  ASSERT_EQ(*store->Commit(0, 1, b0), CommitOutcome::kCommitted);
  ASSERT_EQ(*store->Commit(1, 1, b1), CommitOutcome::kCommitted);
  std::shared_ptr<const file::Mapping> view = store->ReadView();
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(store->ReadView(), view) << "one view while it is held";
  for (uint32_t p = 0; p < 4; ++p) {
    for (const BlockRef& b : store->CommittedBlocks(p)) {
      std::string direct, mapped;
      FrameHeader h1, h2;
      ASSERT_OK(store->ReadFrame(b, &direct, &h1));
      ASSERT_OK(store->ReadFrame(b, &mapped, &h2, view.get()));
      EXPECT_EQ(direct, mapped);
      EXPECT_EQ(h1.payload_checksum, h2.payload_checksum);
    }
  }
  // A flipped byte in a frame is DATA_LOSS through the view too.
  const BlockRef victim = store->CommittedBlocks(2)[0];
  {
    std::fstream f(ShuffleDir() + "/data", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(victim.offset + kBlockHeaderSize + victim.frame_size - 1));
    f.put('\x5a');
  }
  std::string frame;
  EXPECT_THAT(store->ReadFrame(victim, &frame, nullptr, view.get()),
              StatusIs(absl::StatusCode::kDataLoss, "corrupt"));
  // The file cut short behind the store's back: the view's pages past the end are gone.
  ASSERT_EQ(::truncate((ShuffleDir() + "/data").c_str(), 0), 0);
  const BlockRef last = store->CommittedBlocks(3).back();
  EXPECT_THAT(store->ReadFrame(last, &frame, nullptr, view.get()),
              StatusIs(absl::StatusCode::kDataLoss, "SIGBUS"));
  EXPECT_THAT(store->ReadFrame(last, &frame),
              StatusIs(absl::StatusCode::kDataLoss, "unexpected end of file"));
  // Released by its last holder, the next reader gets a new view.
  view.reset();
  auto again = store->ReadView();
  ASSERT_NE(again, nullptr);
  EXPECT_THAT(store->ReadFrame(last, &frame, nullptr, again.get()),
              StatusIs(absl::StatusCode::kDataLoss, "SIGBUS"));
}

// The handler a view installs takes only faults inside a copy: a SIGBUS sent to the process
// (or a fault anywhere else) still ends it, as it did before any view was made.
TEST_F(ShuffleStoreTest, ASigbusOutsideAViewCopyStillEndsTheProcess) {
  auto store = CreateStore(1, 1);
  const auto b = WriteAttempt(*store, 0, 1, 3);
  ASSERT_EQ(*store->Commit(0, 1, b), CommitOutcome::kCommitted);
  auto view = store->ReadView();
  ASSERT_NE(view, nullptr);
  EXPECT_DEATH(::raise(SIGBUS), "");
}

TEST_F(ShuffleStoreTest, FirstCommittedAttemptWinsDuplicatesAreDiscarded) {
  auto store = CreateStore();
  const auto first = WriteAttempt(*store, 2, 1);
  const auto speculative = WriteAttempt(*store, 2, 2);
  ASSERT_EQ(*store->Commit(2, 1, first), CommitOutcome::kCommitted);
  ASSERT_EQ(*store->Commit(2, 2, speculative), CommitOutcome::kDuplicate);
  store->Discard(speculative);
  const auto rows = ReadPartition(*store, 0);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0], "k2-0-0=v1-0");
  store.reset();
  auto reopened = Reopen();
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(ReadPartition(*reopened, 0), rows);
}

TEST_F(ShuffleStoreTest, AFailedDataSyncCommitsNothingThatDependsOnIt) {
  // The third data sync fails (as fdatasync does after a writeback error, which it reports
  // once): that commit fails, the shuffle takes no more commits, and what was committed
  // before is intact after a reopen.
  std::atomic<int> syncs{0};
  StoreOptions opts;
  opts.sync_data = [&syncs](int fd, const std::string& path) {
    if (++syncs == 3) return absl::InternalError("injected: fdatasync failed with EIO");
    return file::SyncData(fd, path);
  };
  auto created = ShuffleStore::Create(ShuffleDir(), kShown, ShuffleParams{"s1", 2, 8}, opts);
  ASSERT_OK(created);
  auto store = std::move(created).value();
  // One data sync per commit batch, however many partitions it wrote.
  const auto a = WriteAttempt(*store, 0, 1);  // sync 1
  ASSERT_EQ(*store->Commit(0, 1, a), CommitOutcome::kCommitted);
  ASSERT_EQ(*store->Commit(3, 1, WriteAttempt(*store, 3, 1)), CommitOutcome::kCommitted);
  const auto b = WriteAttempt(*store, 1, 1);  // sync 3 fails
  auto failed = store->Commit(1, 1, b);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("injected"), std::string::npos) << failed.status();
  const auto c = WriteAttempt(*store, 2, 1);
  auto refused = store->Commit(2, 1, c);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_EQ(syncs.load(), 3);
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{0, 3}));
  store.reset();
  auto reopened = Reopen();
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->CommittedMappers(), (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(ReadPartition(*reopened, 1).size(), 10u);
}

TEST_F(ShuffleStoreTest, ReopenRecoversExactlyTheCommittedAttempts) {
  std::vector<std::vector<std::string>> before;
  {
    auto store = CreateStore();
    ASSERT_EQ(*store->Commit(0, 1, WriteAttempt(*store, 0, 1)), CommitOutcome::kCommitted);
    WriteAttempt(*store, 1, 1, 500, 64);  // never committed: a broken stream (~4 x 32 KB)
    ASSERT_EQ(*store->Commit(5, 3, WriteAttempt(*store, 5, 3)), CommitOutcome::kCommitted);
    WriteAttempt(*store, 6, 1);  // in flight at the "crash"
    for (uint32_t p = 0; p < 4; ++p) before.push_back(ReadPartition(*store, p));
  }
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{0, 5}));
  for (uint32_t p = 0; p < 4; ++p) EXPECT_EQ(ReadPartition(*store, p), before[p]);
  // The uncommitted tail (mapper 6) was cut off: the data file ends with mapper 5's last block
  // (its last partition's), and mapper 1's blocks in between were punched out.
  const auto blocks = store->CommittedBlocks(3);
  struct stat st;
  ASSERT_EQ(::stat((ShuffleDir() + "/data").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size),
            blocks.back().offset + kBlockHeaderSize + blocks.back().frame_size);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512 + (64u << 10),
            static_cast<uint64_t>(st.st_size));
  // New attempts append after recovery and commit normally.
  ASSERT_EQ(*store->Commit(6, 2, WriteAttempt(*store, 6, 2)), CommitOutcome::kCommitted);
  EXPECT_EQ(ReadPartition(*store, 1).size(), 15u);
}

// Cluster mode's commit protocol on one store: a prepared attempt is durable but invisible; the
// decided winner becomes visible, the other prepared attempts of its mapper are dropped; and a
// restart keeps an undecided prepared attempt (it may still win) and reclaims a decided loser.
TEST_F(ShuffleStoreTest, PreparedAttemptsAreInvisibleUntilResolvedAndSurviveARestart) {
  std::vector<std::string> winner_rows;
  {
    auto store = CreateStore();
    const auto a = WriteAttempt(*store, 2, 1);
    const auto b = WriteAttempt(*store, 2, 2, 300, 64);  // a speculative twin (~4 x 20 KB)
    const auto c = WriteAttempt(*store, 4, 1);
    ASSERT_EQ(*store->Prepare(2, 1, a), CommitOutcome::kCommitted);
    ASSERT_EQ(*store->Prepare(2, 2, b), CommitOutcome::kCommitted);
    ASSERT_EQ(*store->Prepare(4, 1, c), CommitOutcome::kCommitted);
    EXPECT_THAT(store->Prepare(4, 1, c), StatusIs(absl::StatusCode::kAlreadyExists, "prepared"));
    EXPECT_TRUE(store->CommittedBlocks(0).empty());
    EXPECT_TRUE(store->CommittedMappers().empty());
    EXPECT_EQ(store->PendingMappers(), (std::vector<uint32_t>{2, 4}));
    EXPECT_TRUE(store->IsPrepared(2, 2));
    EXPECT_THAT(store->Resolve(2, 9), StatusIs(absl::StatusCode::kFailedPrecondition,
                                               "attempt 9 of mapper 2 of shuffle 's1' is not "
                                               "prepared"));
    // Attempt 1 of mapper 2 won (decided elsewhere): visible, attempt 2 dropped.
    ASSERT_EQ(*store->Resolve(2, 1), CommitOutcome::kCommitted);
    ASSERT_EQ(*store->Resolve(2, 1), CommitOutcome::kCommitted);  // idempotent
    EXPECT_EQ(*store->Resolve(2, 2), CommitOutcome::kDuplicate);
    EXPECT_FALSE(store->IsPrepared(2, 2));
    EXPECT_EQ(store->CommittedAttempt(2), std::optional<uint64_t>(1));
    EXPECT_EQ(store->PendingMappers(), (std::vector<uint32_t>{4}));
    winner_rows = ReadPartition(*store, 0);
    ASSERT_EQ(winner_rows.size(), 5u);
    EXPECT_EQ(winner_rows[0], "k2-0-0=v1-0");
    // A later prepare of a decided mapper is a duplicate at once.
    EXPECT_EQ(*store->Prepare(2, 3, WriteAttempt(*store, 2, 3)), CommitOutcome::kDuplicate);
  }
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{2}));
  EXPECT_EQ(ReadPartition(*store, 0), winner_rows);
  EXPECT_EQ(store->PendingMappers(), (std::vector<uint32_t>{4}));  // undecided: kept
  EXPECT_TRUE(store->IsPrepared(4, 1));
  EXPECT_FALSE(store->IsPrepared(2, 2));
  // The loser's ~80 KB were given back: the file holds little more than the kept blocks.
  struct stat st;
  ASSERT_EQ(::stat((ShuffleDir() + "/data").c_str(), &st), 0);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 64u << 10);
  // Decided after the restart: several at once, with one log write.
  const std::vector<std::pair<uint32_t, uint64_t>> winners = {{4, 1}, {2, 1}, {7, 1}};
  ASSERT_OK(store->ResolveAll(winners));
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{2, 4}));
  EXPECT_TRUE(store->PendingMappers().empty());
  EXPECT_EQ(ReadPartition(*store, 3).size(), 10u);
  store.reset();
  auto again = Reopen();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->CommittedMappers(), (std::vector<uint32_t>{2, 4}));
  EXPECT_EQ(ReadPartition(*again, 3).size(), 10u);
}

// Re-replication (docs/cluster.md): a partition's data of a mapper copied from another replica
// becomes that mapper's committed data for the partition here, with one REPAIR record, and
// survives a restart; repairs of blocks no record names are reclaimed.
TEST_F(ShuffleStoreTest, ARepairAddsAPartitionOfAMapperAtomicallyAndSurvivesARestart) {
  {
    auto store = CreateStore(4, 8);
    // Mapper 0 committed here for partitions 0 and 1 (what this server held when it was pushed).
    std::vector<BlockRef> own;
    for (uint32_t p : {0u, 1u}) {
      const std::string frame = MakeFrame(0, p, 5, 1);
      ASSERT_OK_AND_ASSIGN(BlockRef b, store->Append(0, 1, p, Bytes(frame), 5));
      own.push_back(b);
    }
    ASSERT_EQ(*store->Commit(0, 1, own), CommitOutcome::kCommitted);
    // Partition 2 of mapper 0 and of mapper 3 (never held here) come by repair, two frames each.
    for (uint32_t m : {0u, 3u}) {
      std::vector<BlockRef> copied;
      for (int i = 0; i < 2; ++i) {
        const std::string frame = MakeFrame(m, 2, 4, i);
        ASSERT_OK_AND_ASSIGN(BlockRef b, store->Append(m, m == 0 ? 1 : 7, 2, Bytes(frame), 4));
        copied.push_back(b);
      }
      ASSERT_OK(store->Repair(m, m == 0 ? 1 : 7, 2, copied));
    }
    EXPECT_EQ(store->RepairedMappers(2), (std::vector<uint32_t>{0, 3}));
    EXPECT_EQ(store->CommittedAttempt(3), std::optional<uint64_t>(7));
    EXPECT_EQ(ReadPartition(*store, 2).size(), 16u);
    // A repair with no frames still names its partition: mapper 3 had nothing for partition 0.
    ASSERT_OK(store->Repair(3, 7, 0, {}));
    EXPECT_EQ(store->RepairedMappers(0), (std::vector<uint32_t>{3}));
    // Refused: twice, another attempt, a block of another partition; nothing changes.
    EXPECT_THAT(store->Repair(3, 7, 2, {}),
                StatusIs(absl::StatusCode::kAlreadyExists, "repaired already"));
    EXPECT_THAT(store->Repair(0, 2, 3, {}),
                StatusIs(absl::StatusCode::kFailedPrecondition, "attempt 1 is committed here"));
    EXPECT_THAT(store->Repair(5, 1, 3, own),
                StatusIs(absl::StatusCode::kInvalidArgument, "lists other blocks"));
    // A repair in flight at a crash: its appended frame has no record.
    const std::string frame = MakeFrame(5, 3, 4, 0, 4000);
    ASSERT_OK(store->Append(5, 1, 3, Bytes(frame), 4).status());
  }
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(store->RepairedMappers(2), (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(store->RepairedMappers(0), (std::vector<uint32_t>{3}));
  EXPECT_EQ(ReadPartition(*store, 2).size(), 16u);
  EXPECT_EQ(ReadPartition(*store, 0).size(), 5u);
  EXPECT_TRUE(store->CommittedBlocks(3).empty()) << "the torn repair is not visible";
  EXPECT_EQ(store->Stats(2).records, 16u);
}

TEST_F(ShuffleStoreTest, ALogOlderThanRepairsRefusesThem) {
  StoreOptions options;
  options.log_version = 4;
  ASSERT_OK_AND_ASSIGN(auto store,
                       ShuffleStore::Create(ShuffleDir(), kShown, {"s1", 4, 8}, options));
  EXPECT_THAT(store->Repair(0, 1, 0, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "older than repairs"));
}

// A revoked decision (docs/cluster.md, "Revoking decisions"): the mapper's commit stops being
// visible at once, everywhere (repaired partitions too), a fetch that took its blocks before
// still reads them, the attempt never commits again, a new attempt of the mapper wins, and a
// restart keeps all of it and gives the revoked bytes back.
TEST_F(ShuffleStoreTest, ARevokedCommitIsHiddenAtOnceNeverReturnsAndItsBytesGoAtTheNextOpen) {
  std::vector<std::vector<std::string>> kept(4);
  {
    auto store = CreateStore(4, 8);
    // Mapper 0, attempt 1 wins (big frames: their bytes show in the file's blocks); mapper 1's
    // attempt 9 lost to it before, and mapper 2 stays committed throughout.
    ASSERT_EQ(*store->Prepare(0, 9, WriteAttempt(*store, 0, 9)), CommitOutcome::kCommitted);
    ASSERT_EQ(*store->Prepare(0, 1, WriteAttempt(*store, 0, 1, 5, 40000)),
              CommitOutcome::kCommitted);
    ASSERT_EQ(*store->Resolve(0, 1), CommitOutcome::kCommitted);
    ASSERT_EQ(*store->Commit(2, 4, WriteAttempt(*store, 2, 4)), CommitOutcome::kCommitted);
    const std::string copied = MakeFrame(0, 3, 2, 1);
    ASSERT_OK_AND_ASSIGN(BlockRef extra, store->Append(0, 1, 3, Bytes(copied), 2));
    // (a second frame of partition 3 for mapper 0, as a repair would add it)
    ASSERT_OK(store->Repair(0, 1, 3, {extra}));
    const std::vector<BlockRef> taken = store->CommittedBlocks(0);  // a fetch under way
    ASSERT_EQ(taken.size(), 2u);

    ASSERT_OK(store->Revoke(0, 1));
    EXPECT_TRUE(store->IsRevoked(0, 1));
    EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{2}));
    EXPECT_EQ(store->CommittedAttempt(0), std::nullopt);
    EXPECT_TRUE(store->RepairedMappers(3).empty());
    for (uint32_t p = 0; p < 4; ++p) {
      EXPECT_EQ(ReadPartition(*store, p).size(), 5u) << "partition " << p;
      EXPECT_EQ(store->Stats(p).records, 5u);
      EXPECT_EQ(store->Stats(p).frames, 1u);
    }
    std::string frame;
    for (const BlockRef& b : taken) EXPECT_OK(store->ReadFrame(b, &frame)) << "read on";
    // The revoked attempt is refused for good; a repeat is nothing new.
    EXPECT_THAT(store->Prepare(0, 1, {}), StatusIs(absl::StatusCode::kAlreadyExists, "revoked"));
    EXPECT_THAT(store->Repair(0, 1, 2, {}),
                StatusIs(absl::StatusCode::kFailedPrecondition, "revoked"));
    EXPECT_THAT(store->Resolve(0, 1),
                StatusIs(absl::StatusCode::kFailedPrecondition, "not prepared"));
    ASSERT_OK(store->Revoke(0, 1));
    // A re-run of the mapper wins; an attempt never committed here can be revoked too (a
    // replica that lacked it must never take it by a repair).
    ASSERT_EQ(*store->Prepare(0, 3, WriteAttempt(*store, 0, 3, 7)), CommitOutcome::kCommitted);
    ASSERT_OK(store->ResolveAll({{0, 3}}));
    EXPECT_EQ(store->CommittedAttempt(0), std::optional<uint64_t>(3));
    ASSERT_OK(store->Revoke(5, 11));
    EXPECT_THAT(store->Repair(5, 11, 1, {}),
                StatusIs(absl::StatusCode::kFailedPrecondition, "revoked"));
    for (uint32_t p = 0; p < 4; ++p) kept[p] = ReadPartition(*store, p);
    EXPECT_EQ(kept[1].size(), 12u);
  }
  struct stat before;
  ASSERT_EQ(::stat((ShuffleDir() + "/data").c_str(), &before), 0);
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(store->CommittedAttempt(0), std::optional<uint64_t>(3));
  EXPECT_TRUE(store->IsRevoked(0, 1));
  EXPECT_TRUE(store->IsRevoked(5, 11));
  EXPECT_TRUE(store->PendingMappers().empty()) << "attempt 9 lost before the revocation";
  for (uint32_t p = 0; p < 4; ++p) EXPECT_EQ(ReadPartition(*store, p), kept[p]);
  EXPECT_THAT(store->Prepare(0, 1, {}), StatusIs(absl::StatusCode::kAlreadyExists, "revoked"));
  struct stat after;
  ASSERT_EQ(::stat((ShuffleDir() + "/data").c_str(), &after), 0);
  EXPECT_LT(after.st_blocks * 512 + 4 * 40000, before.st_blocks * 512)
      << "the revoked attempt's bytes were given back";
}

// Many revocations at once (a lost partition's, every mapper of a wide shuffle): one write,
// one pass over the index; a pair named twice, or revoked before, is nothing new.
TEST_F(ShuffleStoreTest, ManyRevocationsAtOnceHideExactlyThoseMappers) {
  {
    auto store = CreateStore(4, 8);
    for (uint32_t m = 0; m < 6; ++m) {
      ASSERT_EQ(*store->Commit(m, 10 + m, WriteAttempt(*store, m, 10 + m)),
                CommitOutcome::kCommitted);
    }
    ASSERT_OK(store->Revoke(5, 15));
    ASSERT_OK(store->RevokeAll({{1, 11}, {3, 13}, {5, 15}, {3, 13}, {7, 99}}));
    EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{0, 2, 4}));
    for (uint32_t p = 0; p < 4; ++p) EXPECT_EQ(store->Stats(p).records, 15u);
    EXPECT_TRUE(store->IsRevoked(7, 99));
    EXPECT_FALSE(store->IsRevoked(0, 10));
  }
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->CommittedMappers(), (std::vector<uint32_t>{0, 2, 4}));
  for (uint32_t p = 0; p < 4; ++p) EXPECT_EQ(ReadPartition(*store, p).size(), 15u);
  EXPECT_TRUE(store->IsRevoked(1, 11) && store->IsRevoked(3, 13) && store->IsRevoked(5, 15));
}

TEST_F(ShuffleStoreTest, ALogOlderThanRevocationsRefusesThem) {
  StoreOptions options;
  options.log_version = 5;
  ASSERT_OK_AND_ASSIGN(auto store,
                       ShuffleStore::Create(ShuffleDir(), kShown, {"s1", 4, 8}, options));
  EXPECT_THAT(store->Revoke(0, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, "older than revocations"));
}

TEST_F(ShuffleStoreTest, BadArgumentsAreNamed) {
  auto store = CreateStore(4, 8);
  const std::string frame = MakeFrame(0, 0, 3);
  auto out_of_range = store->Append(0, 1, 4, Bytes(frame), 3);
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find("partition 4"), absl::string_view::npos);
  auto bad_mapper = store->Append(8, 1, 0, Bytes(frame), 3);
  EXPECT_NE(bad_mapper.status().message().find("mapper 8"), absl::string_view::npos);
  auto not_a_frame = store->Append(0, 1, 0, Bytes(std::string("hello")), 1);
  EXPECT_EQ(not_a_frame.status().code(), absl::StatusCode::kInvalidArgument);
  auto again =
      ShuffleStore::Create(ShuffleDir(), kShown, ShuffleParams{"s1", 4, 8}, StoreOptions{});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  auto missing = ShuffleStore::Open(dir_.path() + "/nope", "s", StoreOptions{});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// State is made only for the partitions written to, not for every declared one (an empty
// 65,536-partition shuffle holds none), and a restart lists the directory once instead of
// a stat per partition.
TEST_F(ShuffleStoreTest, MemoryFollowsThePartitionsWrittenNotTheDeclaredOnes) {
  {
    auto store = CreateStore(kMaxPartitions, 0);
    EXPECT_EQ(store->partitions_made(), 0u);
    const std::string frame = MakeFrame(0, 7, 3);
    std::vector<BlockRef> blocks;
    for (uint32_t p : {7u, 40000u, 65535u}) {
      auto b = store->Append(0, 1, p, Bytes(MakeFrame(0, p, 3)), 3);
      ASSERT_OK(b);
      blocks.push_back(*b);
    }
    ASSERT_EQ(*store->Commit(0, 1, blocks), CommitOutcome::kCommitted);
    EXPECT_EQ(store->partitions_made(), 3u);
    EXPECT_EQ(store->Stats(40000).records, 3u);
    EXPECT_EQ(store->Stats(40001).records, 0u);
  }
  auto store = Reopen();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->partitions_made(), 3u);
  EXPECT_EQ(ReadPartition(*store, 65535).size(), 3u);
  EXPECT_EQ(store->Stats(7).records, 3u);
}

TEST_F(ShuffleStoreTest, ADeletedStoreTakesNothingMore) {
  auto store = CreateStore();
  ASSERT_EQ(*store->Commit(0, 1, WriteAttempt(*store, 0, 1)), CommitOutcome::kCommitted);
  const std::vector<BlockRef> pending = WriteAttempt(*store, 1, 1);
  store->MarkDeleted();  // the registry renamed its directory away
  EXPECT_TRUE(store->CommittedMappers().empty());
  EXPECT_TRUE(store->CommittedBlocks(0).empty());
  EXPECT_EQ(store->Stats(0).records, 0u);
  auto commit = store->Commit(1, 1, pending);
  EXPECT_EQ(commit.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(commit.status().message().find("was deleted"), std::string::npos) << commit.status();
}

TEST_F(ShuffleStoreTest, DiscardedBlocksGiveTheirSpaceBack) {
  auto store = CreateStore(1, 0);
  const auto keep = WriteAttempt(*store, 0, 1, 2000, 64);
  const auto drop = WriteAttempt(*store, 1, 1, 2000, 64);  // ~100 KB that zstd cannot shrink
  const auto tail = WriteAttempt(*store, 2, 1, 2000, 64);
  ASSERT_EQ(*store->Commit(0, 1, keep), CommitOutcome::kCommitted);
  ASSERT_EQ(*store->Commit(2, 1, tail), CommitOutcome::kCommitted);
  struct stat before, after;
  ASSERT_EQ(::stat((ShuffleDir() + "/data").c_str(), &before), 0);
  store->Discard(drop);
  ASSERT_EQ(::stat((ShuffleDir() + "/data").c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);  // the size stays; the blocks are freed
  EXPECT_LT(after.st_blocks, before.st_blocks - 100 * 1024 / 512 / 2);
  EXPECT_EQ(ReadPartition(*store, 0).size(), 4000u);  // neighbours untouched
}

}  // namespace
}  // namespace sluice
