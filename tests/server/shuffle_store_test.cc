// ShuffleStore on a real temporary directory: commits are visible and durable, nothing else is;
// recovery keeps exactly the committed attempts, cuts torn tails, reclaims the rest, and refuses
// to guess when committed data is damaged.
#include "server/storage/shuffle_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "codec/endian.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/frame_format.h"
#include "server/storage/file_util.h"
#include "server/storage/shuffle_registry.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice {
namespace {

using testing::StatusIs;
using testing::TempDir;

// A frame of `n` records whose keys and values name the mapper, partition and index; with
// `padding`, each value also carries that many pseudo-random (incompressible) bytes.
std::string MakeFrame(uint32_t mapper, uint32_t partition, int n, int salt = 0,
                      size_t padding = 0) {
  std::vector<std::string> keys, values;
  uint64_t x = 0x9e3779b97f4a7c15ULL * (mapper + 1) + partition;
  for (int i = 0; i < n; ++i) {
    keys.push_back("k" + std::to_string(mapper) + "-" + std::to_string(partition) + "-" +
                   std::to_string(i));
    values.push_back("v" + std::to_string(salt) + "-" + std::to_string(i));
    for (size_t k = 0; k < padding; ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      values.back().push_back(static_cast<char>('a' + x % 26));
    }
  }
  std::vector<Record> records;
  for (int i = 0; i < n; ++i) records.push_back(Record{keys[i], values[i]});
  EncodeOptions opts;
  opts.layout = LayoutChoice::kOpaque;
  FrameEncoder enc(opts);
  std::string frame;
  EXPECT_OK(enc.Encode(records, &frame));
  return frame;
}

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// The shuffle's directory as messages name it (relative to the data directory).
constexpr char kShown[] = "shuffles/s1";

class ShuffleStoreTest : public ::testing::Test {
 protected:
  std::string ShuffleDir() const { return dir_.path() + "/shuffles/s1"; }

  std::unique_ptr<ShuffleStore> CreateStore(uint32_t partitions = 4, uint32_t mappers = 8) {
    ShuffleParams params{"s1", partitions, mappers};
    auto store = ShuffleStore::Create(ShuffleDir(), kShown, params, StoreOptions{});
    EXPECT_OK(store);
    return std::move(store).value();
  }
  std::unique_ptr<ShuffleStore> Reopen() {
    auto store = ShuffleStore::Open(ShuffleDir(), kShown, StoreOptions{});
    EXPECT_OK(store);
    return store.ok() ? std::move(store).value() : nullptr;
  }

  // Writes one frame per partition for (mapper, attempt) and returns the blocks.
  std::vector<BlockRef> WriteAttempt(ShuffleStore& store, uint32_t mapper, uint64_t attempt,
                                     int records = 5, size_t padding = 0) {
    std::vector<BlockRef> blocks;
    for (uint32_t p = 0; p < store.params().num_partitions; ++p) {
      const std::string frame = MakeFrame(mapper, p, records, static_cast<int>(attempt), padding);
      auto b = store.Append(mapper, attempt, p, Bytes(frame), records);
      EXPECT_OK(b);
      if (b.ok()) blocks.push_back(*b);
    }
    return blocks;
  }

  // All records of a partition as "key=value" strings, in stored order.
  std::vector<std::string> ReadPartition(const ShuffleStore& store, uint32_t p) {
    std::vector<std::string> out;
    FrameDecoder dec;
    DecodedFrame decoded;
    std::string frame;
    for (const BlockRef& b : store.CommittedBlocks(p)) {
      EXPECT_OK(store.ReadFrame(b, &frame));
      EXPECT_OK(dec.Decode(frame, &decoded));
      for (const Record& r : decoded)
        out.push_back(std::string(r.key) + "=" + std::string(r.value));
    }
    return out;
  }

  TempDir dir_;
};

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

uint64_t Held(ShuffleRegistry& registry, const std::string& tenant) {
  return static_cast<uint64_t>(registry.TenantBytes(tenant)->load());
}

// The bytes a tenant's stores hold, summed in the registry as they change (a quota reads it).
TEST(ShuffleRegistryTest, ATenantsStoredBytesFollowItsBlocks) {
  TempDir dir;
  const std::string frame = testing::RandomValueFrame(1000, 1);
  const uint64_t block = kBlockHeaderSize + frame.size();
  {
    ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
    ASSERT_OK(registry->Create({"t~s", 2, 2}).status());
    ASSERT_OK(registry->Create({"u~s", 2, 2}).status());
    ASSERT_OK(registry->Create({"plain", 2, 2}).status());
    ASSERT_OK_AND_ASSIGN(auto store, registry->Get("t~s"));
    ASSERT_OK_AND_ASSIGN(BlockRef lost, store->Append(0, 1, 0, testing::Bytes(frame), 1));
    EXPECT_EQ(Held(*registry, "t"), block);
    store->Discard({lost});  // an attempt that failed gives its bytes back
    EXPECT_EQ(Held(*registry, "t"), 0u);
    ASSERT_OK_AND_ASSIGN(BlockRef b0, store->Append(0, 2, 0, testing::Bytes(frame), 1));
    ASSERT_OK_AND_ASSIGN(BlockRef b1, store->Append(0, 2, 1, testing::Bytes(frame), 1));
    ASSERT_OK(store->Commit(0, 2, {b0, b1}).status());
    ASSERT_OK_AND_ASSIGN(BlockRef dup, store->Append(0, 3, 0, testing::Bytes(frame), 1));
    ASSERT_OK_AND_ASSIGN(CommitOutcome o, store->Commit(0, 3, {dup}));
    EXPECT_EQ(o, CommitOutcome::kDuplicate);
    store->Discard({dup});
    // An attempt in flight at a stop: held now, reclaimed by the next start.
    ASSERT_OK(store->Append(1, 1, 0, testing::Bytes(frame), 1).status());
    EXPECT_EQ(Held(*registry, "t"), 3 * block);
    EXPECT_EQ(Held(*registry, "u"), 0u);
    EXPECT_EQ(registry->CountWithPrefix("t~"), 1u);
  }
  {  // Opened lazily: a tenant's bytes are asked for before its shuffle was opened.
    ASSERT_OK_AND_ASSIGN(auto lazy, ShuffleRegistry::Open(dir.path(), StoreOptions{},
                                                          ShuffleRegistry::Opening::kLazy));
    EXPECT_EQ(lazy->unopened(), 3u);
    EXPECT_EQ(Held(*lazy, "t"), 2 * block);
    EXPECT_EQ(lazy->unopened(), 2u);  // its shuffle, not the others
  }
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
  EXPECT_EQ(Held(*registry, "t"), 2 * block);
  ASSERT_OK(registry->Delete("t~s"));
  EXPECT_EQ(Held(*registry, "t"), 0u);
  EXPECT_EQ(registry->CountWithPrefix("t~"), 0u);
  EXPECT_EQ(registry->CountWithPrefix("u~"), 1u);
}

// Opening::kLazy: the start lists the shuffles and opens none; a call by id opens its shuffle
// (once, however many ask at the same moment), OpenNextListed opens the rest in id order, a
// damaged one becomes damaged when opened, and one can be deleted before it was ever opened.
TEST(ShuffleRegistryTest, LazyOpeningOpensAShuffleWhenAskedAndTheRestInTheBackground) {
  TempDir dir;
  const std::string frame = testing::RandomValueFrame(100, 1);
  {
    ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
    for (const char* id : {"a", "b", "c", "d", "e"}) {
      ASSERT_OK(registry->Create({id, 2, 2}).status());
      ASSERT_OK_AND_ASSIGN(auto store, registry->Get(id));
      ASSERT_OK_AND_ASSIGN(BlockRef b, store->Append(0, 1, 1, testing::Bytes(frame), 1));
      ASSERT_OK(store->Commit(0, 1, {b}).status());
    }
  }
  // d's commit log loses its header: d is damaged, which only opening it can tell.
  {
    std::fstream f(dir.path() + "/shuffles/d/commits.log",
                   std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(0);
    f.write(std::string(1024, '\0').data(), 1024);
  }
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{},
                                                            ShuffleRegistry::Opening::kLazy));
  EXPECT_EQ(registry->unopened(), 5u);
  EXPECT_TRUE(registry->List().empty());
  EXPECT_EQ(registry->CountWithPrefix(""), 5u);  // (quotas count them all the same)
  // Asked for: opened now, by as many callers as ask at once.
  std::vector<std::thread> askers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    askers.emplace_back([&] {
      auto store = registry->Get("c");
      if (store.ok() && (*store)->CommittedMappers().size() == 1) ok.fetch_add(1);
    });
  }
  for (auto& t : askers) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(registry->unopened(), 4u);
  ASSERT_EQ(registry->List().size(), 1u);
  EXPECT_EQ(registry->List()[0]->params().shuffle_id, "c");
  // Deleted before it was ever opened.
  ASSERT_OK(registry->Delete("e"));
  EXPECT_EQ(registry->unopened(), 3u);
  EXPECT_THAT(registry->Get("e"), StatusIs(absl::StatusCode::kNotFound, "'e'"));
  // The rest, in id order.
  ASSERT_TRUE(registry->OpenNextListed());
  EXPECT_EQ(registry->unopened(), 2u);
  ASSERT_EQ(registry->List().size(), 2u);
  EXPECT_EQ(registry->List()[0]->params().shuffle_id, "a");
  registry->OpenAllListed();
  EXPECT_FALSE(registry->OpenNextListed());
  EXPECT_EQ(registry->unopened(), 0u);
  EXPECT_EQ(registry->List().size(), 3u);  // a, b, c
  ASSERT_TRUE(registry->FindDamaged("d").has_value());
  EXPECT_THAT(registry->Get("d"), StatusIs(absl::StatusCode::kDataLoss, "no valid header"));
  // A create of a listed id that was not opened yet finds it (it is not made again).
  ASSERT_OK_AND_ASSIGN(auto again, ShuffleRegistry::Open(dir.path(), StoreOptions{},
                                                         ShuffleRegistry::Opening::kLazy));
  ASSERT_OK_AND_ASSIGN(bool created, again->Create({"b", 2, 2}));
  EXPECT_FALSE(created);
  EXPECT_THAT(again->Create({"a", 3, 2}),
              StatusIs(absl::StatusCode::kAlreadyExists, "already exists"));
  ASSERT_OK_AND_ASSIGN(auto b, again->Get("b"));
  EXPECT_EQ(b->CommittedMappers().size(), 1u);
}

// A directory where one of a shuffle's files should be is damage no retry mends: the shuffle
// is reported damaged (DATA_LOSS naming the file), never wedged or UNAVAILABLE (issue 50, item
// 9), and the server's other shuffles are served.
TEST(ShuffleRegistryTest, ADirectoryInPlaceOfAShufflesFileIsDamageNotAWedge) {
  for (const char* file : {"data", "commits.log", "SHUFFLE"}) {
    SCOPED_TRACE(file);
    TempDir dir;
    {
      ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
      for (const char* id : {"s", "other"}) {
        ASSERT_OK(registry->Create({id, 2, 2}).status());
        ASSERT_OK_AND_ASSIGN(auto store, registry->Get(id));
        const std::string frame = testing::EncodeRows({{"k", "v"}});
        ASSERT_OK_AND_ASSIGN(BlockRef b, store->Append(0, 1, 0, testing::Bytes(frame), 1));
        ASSERT_OK(store->Commit(0, 1, {b}).status());
      }
    }
    const std::string path = dir.path() + "/shuffles/s/" + file;
    ASSERT_EQ(::unlink(path.c_str()), 0) << path;
    ASSERT_EQ(::mkdir(path.c_str(), 0755), 0) << path;
    ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
    const std::optional<DamagedShuffle> damaged = registry->FindDamaged("s");
    ASSERT_TRUE(damaged.has_value());
    EXPECT_EQ(damaged->reason.code(), absl::StatusCode::kDataLoss) << damaged->reason;
    EXPECT_THAT(registry->Get("s"), StatusIs(absl::StatusCode::kDataLoss, "is a directory"));
    ASSERT_OK_AND_ASSIGN(auto other, registry->Get("other"));
    EXPECT_EQ(other->CommittedMappers().size(), 1u);
  }
}

// Past the open limits, idle shuffles close, least recently used first, and open again from
// their logs when asked for: whole, their tenant's bytes counted all along, their lifetime
// going on. One in use (a holder, a push writing) is never closed.
TEST(ShuffleRegistryTest, IdleShufflesCloseAtTheOpenLimitsAndReopenWhole) {
  TempDir dir;
  using Clock = std::chrono::steady_clock;
  const std::string frame = testing::RandomValueFrame(100, 1);
  const uint64_t block = kBlockHeaderSize + frame.size();
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
  for (const char* id : {"t~a", "t~b", "t~c", "t~d"}) {
    ASSERT_OK(registry->Create({id, 2, 2}).status());
    ASSERT_OK_AND_ASSIGN(auto store, registry->Get(id));
    ASSERT_OK_AND_ASSIGN(BlockRef b, store->Append(0, 1, 1, testing::Bytes(frame), 1));
    ASSERT_OK(store->Commit(0, 1, {b}).status());
    while (Clock::now() <= store->last_used()) {
    }  // (distinct last uses)
  }
  EXPECT_EQ(Held(*registry, "t"), 4 * block);
  EXPECT_EQ(registry->index_bytes(), 4u * 32);
  ASSERT_OK_AND_ASSIGN(auto held_b, registry->Get("t~b"));  // in use: never closed
  registry->set_open_limits(2, 1 << 20);
  // Nothing is idle yet (kMinIdle since its open and its last use).
  EXPECT_EQ(registry->CloseIdle(Clock::now()), 0u);
  const auto later = Clock::now() + ShuffleRegistry::kMinIdle + std::chrono::seconds(1);
  EXPECT_EQ(registry->CloseIdle(later), 2u);  // a and c: the least recently used idle ones
  EXPECT_EQ(registry->unopened(), 2u);
  std::vector<std::string> open;
  for (const auto& s : registry->List()) open.push_back(s->params().shuffle_id);
  EXPECT_EQ(open, (std::vector<std::string>{"t~b", "t~d"}));
  EXPECT_EQ(registry->index_bytes(), 2u * 32);
  EXPECT_EQ(Held(*registry, "t"), 4 * block);  // closed ones' bytes still count
  EXPECT_EQ(registry->CountWithPrefix("t~"), 4u);
  // Lifetimes go on while closed.
  EXPECT_EQ(registry->UnopenedIdleSince(later).size(), 2u);
  // Asked for: opened again, whole; at the limit, d (idle for kMinIdleToMakeRoom) closes to
  // make room for it.
  std::this_thread::sleep_for(ShuffleRegistry::kMinIdleToMakeRoom + std::chrono::milliseconds(50));
  ASSERT_OK_AND_ASSIGN(auto a, registry->Get("t~a"));
  EXPECT_EQ(registry->List().size(), 2u);
  EXPECT_EQ(a->CommittedMappers(), (std::vector<uint32_t>{0}));
  EXPECT_EQ(a->Stats(1).records, 1u);
  EXPECT_LT(a->last_used(), Clock::now() - std::chrono::milliseconds(5));  // not a new use
  EXPECT_EQ(Held(*registry, "t"), 4 * block);
  // Deleted while closed: its bytes leave the tenant's count.
  ASSERT_OK(registry->Delete("t~c"));
  EXPECT_EQ(Held(*registry, "t"), 3 * block);
  EXPECT_EQ(registry->CountWithPrefix("t~"), 3u);
  // The index budget closes idle ones too.
  held_b.reset();
  a.reset();
  registry->set_open_limits(100, 24);
  registry->CloseIdle(Clock::now() + std::chrono::seconds(10));
  EXPECT_LE(registry->index_bytes(), 24u);
  // Expired while closed: deleted only if still closed and unused since.
  const std::vector<std::string> idle = registry->UnopenedIdleSince(Clock::now());
  ASSERT_FALSE(idle.empty());
  ASSERT_OK(registry->Get(idle[0]).status());  // opened meanwhile: not deleted
  EXPECT_FALSE(registry->DeleteIfUnopenedSince(idle[0], Clock::now()));
  EXPECT_OK(registry->Get(idle[0]).status());
}

}  // namespace
}  // namespace sluice
