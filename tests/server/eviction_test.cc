// Disks as a cache (docs/object-store.md): an idle shuffle evicted from the registry keeps what
// its status reports and nothing else, survives a reopen as evicted, takes its partitions back
// by repairs one partition at a time, and the replica check tells what each partition lacks; the
// EVICTED file's bytes are checked like every file on disk.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/rules/replica_check.h"
#include "server/storage/block_format.h"
#include "server/storage/shuffle_registry.h"
#include "server/storage/shuffle_store.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice {
namespace {

using testing::StatusIs;
using testing::TempDir;

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;  // (what it takes on the disk)
}

TEST(EvictedFileTest, RoundTripsAndRefusesDamage) {
  EvictedSummary e;
  e.winners = {{0, 7}, {3, 1}};
  e.partitions = {{10, 1000, 2}, {0, 0, 0}, {5, 500, 1}};
  const std::string bytes = EncodeEvicted(e);
  ASSERT_OK_AND_ASSIGN(EvictedSummary back, DecodeEvicted(bytes, 3, "shuffles/j/EVICTED"));
  EXPECT_EQ(back.winners, e.winners);
  ASSERT_EQ(back.partitions.size(), 3u);
  EXPECT_EQ(back.partitions[0].bytes, 1000u);
  EXPECT_EQ(back.partitions[2].records, 5u);
  EXPECT_THAT(DecodeEvicted(bytes, 4, "shuffles/j/EVICTED").status(),
              StatusIs(absl::StatusCode::kDataLoss, "shuffles/j/EVICTED: names 3 partitions"));
  std::string flipped = bytes;
  flipped[20] ^= 1;
  EXPECT_THAT(DecodeEvicted(flipped, 3, "x").status(),
              StatusIs(absl::StatusCode::kDataLoss, "bad checksum"));
  EXPECT_THAT(DecodeEvicted(bytes.substr(0, bytes.size() - 1), 3, "x").status(),
              StatusIs(absl::StatusCode::kDataLoss, "wrong size"));
  EXPECT_THAT(DecodeEvicted("SLSHxxxxxxxxxxxxxxxxxxxxxx", 3, "x").status(),
              StatusIs(absl::StatusCode::kDataLoss, "not a Sluice evicted-shuffle file"));
}

class EvictionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(registry_, ShuffleRegistry::Open(dir_.path(), StoreOptions{}));
    ASSERT_OK(registry_->Create({"job", 3, 2}).status());
    ASSERT_OK_AND_ASSIGN(auto store, registry_->Get("job"));
    // Mapper 0 (attempt 4) writes partitions 0 and 2; mapper 1 (attempt 9) partitions 0 and 1.
    for (const auto& [m, attempt, parts] :
         std::vector<std::tuple<uint32_t, uint64_t, std::vector<uint32_t>>>{{0, 4, {0, 2}},
                                                                            {1, 9, {0, 1}}}) {
      std::vector<BlockRef> blocks;
      for (uint32_t q : parts) {
        const std::string frame = testing::RandomValueFrame(100000, m * 10 + q);
        frames_[{m, q}] = frame;
        ASSERT_OK_AND_ASSIGN(BlockRef b, store->Append(m, attempt, q, testing::Bytes(frame), 1));
        blocks.push_back(b);
      }
      ASSERT_OK(store->Commit(m, attempt, blocks).status());
    }
    for (uint32_t q = 0; q < 3; ++q) before_.push_back(store->Stats(q));
  }
  std::string DataFile() const { return dir_.path() + "/shuffles/job/data"; }
  // Partition q of mapper m back by a repair, as a read back from the store makes it.
  void Restore(ShuffleStore& store, uint32_t m, uint64_t attempt, uint32_t q) {
    std::vector<BlockRef> blocks;
    if (auto f = frames_.find({m, q}); f != frames_.end()) {
      ASSERT_OK_AND_ASSIGN(BlockRef b, store.Append(m, attempt, q, testing::Bytes(f->second), 1));
      blocks.push_back(b);
    }
    ASSERT_OK(store.Repair(m, attempt, q, blocks));
  }

  TempDir dir_;
  std::unique_ptr<ShuffleRegistry> registry_;
  std::map<std::pair<uint32_t, uint32_t>, std::string> frames_;
  std::vector<PartitionStats> before_;
};

TEST_F(EvictionTest, AnIdleShuffleGoesKeepingItsStatusAndComesBackPartitionByPartition) {
  const uint64_t disk_before = FileSize(DataFile());
  ASSERT_GT(disk_before, 400000u);
  {
    // In use (a read holds it): not evicted.
    ASSERT_OK_AND_ASSIGN(auto held, registry_->Get("job"));
    ASSERT_OK_AND_ASSIGN(uint64_t freed, registry_->Evict("job"));
    EXPECT_EQ(freed, 0u);
    EXPECT_EQ(held->evicted(), nullptr);
  }
  {
    ASSERT_OK_AND_ASSIGN(auto store, registry_->Get("job"));
    EXPECT_THAT(store->ReadObjectsFile().status(),
                StatusIs(absl::StatusCode::kNotFound, "no OBJECTS file"));
    ASSERT_OK(store->WriteObjectsFile("{\"a server on its own\": 1}"));
  }
  ASSERT_OK_AND_ASSIGN(uint64_t freed, registry_->Evict("job"));
  EXPECT_EQ(freed, before_[0].bytes + before_[1].bytes + before_[2].bytes);
  EXPECT_LT(FileSize(DataFile()), 8192u) << "its data is let go";
  ASSERT_OK_AND_ASSIGN(auto store, registry_->Get("job"));
  ASSERT_NE(store->evicted(), nullptr);
  EXPECT_EQ(store->evicted()->winners, (std::map<uint32_t, uint64_t>{{0, 4}, {1, 9}}));
  // The record of its objects (a server without etcd's) goes with it.
  ASSERT_OK_AND_ASSIGN(std::string objects, store->ReadObjectsFile());
  EXPECT_EQ(objects, "{\"a server on its own\": 1}");
  // Its status reports what it held; nothing is here.
  EXPECT_EQ(store->ReportedMappers(), (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(store->CommittedMappers().empty());
  for (uint32_t q = 0; q < 3; ++q) {
    EXPECT_EQ(store->ReportedStats(q).bytes, before_[q].bytes) << q;
    EXPECT_EQ(store->Stats(q).frames, 0u) << q;
  }
  // Held: a second eviction of an evicted shuffle holding nothing does nothing.
  store.reset();
  ASSERT_OK_AND_ASSIGN(freed, registry_->Evict("job"));
  EXPECT_EQ(freed, 0u);

  // Each partition lacks both winners until read back; partition 0 comes back alone.
  ASSERT_OK_AND_ASSIGN(store, registry_->Get("job"));
  const std::map<uint32_t, MapperDecision> decided = {{0, {4, 0}}, {1, {9, 0}}};
  ReplicaCheck check = CheckReplicas({}, decided, *store);
  EXPECT_TRUE(check.lost.empty()) << "evicted, not lost";
  EXPECT_TRUE(check.missing.empty()) << "not the repairer's work";
  EXPECT_EQ(check.evicted.size(), 3u);
  Restore(*store, 0, 4, 0);
  Restore(*store, 1, 9, 0);
  check = CheckReplicas({}, decided, *store);
  EXPECT_EQ(check.evicted.count(0), 0u);
  // (What the store alone knows, a server without etcd's check, says the same.)
  EXPECT_TRUE(store->EvictedLacking(0).empty());
  EXPECT_EQ(store->EvictedLacking(1).size(), 2u);
  ASSERT_EQ(check.evicted.count(1), 1u) << "committed now by partition 0's repair, not here";
  EXPECT_EQ(check.evicted.at(1).size(), 2u);
  std::vector<uint32_t> mappers;
  ASSERT_OK_AND_ASSIGN(std::vector<BlockRef> blocks, store->CommittedBlocksOf(0, {}, &mappers));
  ASSERT_EQ(blocks.size(), 2u);
  std::string frame;
  ASSERT_OK(store->ReadFrame(blocks[1], &frame));
  EXPECT_EQ(frame, frames_.at({1, 0}));

  // A reopen (a restart) finds it evicted still, with partition 0 back.
  store.reset();
  registry_.reset();
  ASSERT_OK_AND_ASSIGN(registry_, ShuffleRegistry::Open(dir_.path(), StoreOptions{}));
  ASSERT_OK_AND_ASSIGN(store, registry_->Get("job"));
  ASSERT_NE(store->evicted(), nullptr);
  check = CheckReplicas({}, decided, *store);
  EXPECT_EQ(check.evicted.count(0), 0u);
  EXPECT_EQ(check.evicted.count(2), 1u);
  EXPECT_EQ(store->Stats(0).bytes, before_[0].bytes);
  EXPECT_EQ(store->ReportedStats(2).bytes, before_[2].bytes);

  // Evicted again (what came back goes): the winners stay those it first held.
  store.reset();
  ASSERT_OK_AND_ASSIGN(freed, registry_->Evict("job"));
  EXPECT_EQ(freed, before_[0].bytes);
  ASSERT_OK_AND_ASSIGN(store, registry_->Get("job"));
  EXPECT_EQ(store->evicted()->winners, (std::map<uint32_t, uint64_t>{{0, 4}, {1, 9}}));
  EXPECT_EQ(store->ReportedStats(0).bytes, before_[0].bytes);
}

// A mapper whose decision was revoked runs again after the eviction and pushes here: its new
// attempt's data is here for the partitions it pushed to; the others come from the store.
TEST_F(EvictionTest, AMapperPushedAfterTheEvictionIsHereForWhatItPushed) {
  ASSERT_OK_AND_ASSIGN(uint64_t freed, registry_->Evict("job"));
  ASSERT_GT(freed, 0u);
  ASSERT_OK_AND_ASSIGN(auto store, registry_->Get("job"));
  ASSERT_OK(store->Revoke(1, 9));
  std::vector<BlockRef> blocks;
  for (uint32_t q = 0; q < 3; ++q) {
    const std::string frame = testing::RandomValueFrame(1000, 50 + q);
    ASSERT_OK_AND_ASSIGN(BlockRef b, store->Append(1, 10, q, testing::Bytes(frame), 1));
    blocks.push_back(b);
  }
  ASSERT_OK(store->Commit(1, 10, blocks).status());
  const std::map<uint32_t, MapperDecision> decided = {{0, {4, 0}}, {1, {10, 0}}};
  const ReplicaCheck check = CheckReplicas({}, decided, *store);
  for (uint32_t q = 0; q < 3; ++q) {
    ASSERT_EQ(check.evicted.count(q), 1u) << q;
    EXPECT_EQ(check.evicted.at(q), (std::vector<std::pair<uint32_t, uint64_t>>{{0, 4}})) << q;
  }
  // What its status reports: the revoked attempt is not a winner any more.
  EXPECT_EQ(store->SummaryForEviction().winners, (std::map<uint32_t, uint64_t>{{0, 4}, {1, 10}}));
}

// A disk full to its last block still evicts: the data directory's reserve (kEvictReserve)
// makes room for the eviction's own files, and is made again once the eviction freed room.
TEST(EvictionOnAFullDiskTest, TheReserveLetsAnEvictionBeginOnADiskWithNoBlockLeft) {
  TempDir root;
  const std::string disk = root.path() + "/disk";
  ::mkdir(disk.c_str(), 0755);
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=4m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{disk};
  const std::string reserve = disk + "/evict-reserve";
  {
    ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(disk, StoreOptions{}));
    registry->KeepEvictReserves();
    EXPECT_GE(FileSize(reserve), ShuffleRegistry::kEvictReserve);
    ASSERT_OK(registry->Create({"full", 1, 1}).status());
    ASSERT_OK_AND_ASSIGN(auto store, registry->Get("full"));
    std::vector<BlockRef> blocks;
    for (int i = 0; i < 100; ++i) {  // until the disk has no block left
      const std::string frame = testing::RandomValueFrame(64 << 10, 100 + i);
      absl::StatusOr<BlockRef> b = store->Append(0, 1, 0, testing::Bytes(frame), 1);
      if (!b.ok()) break;
      blocks.push_back(*b);
    }
    ASSERT_OK(store->Commit(0, 1, blocks).status()) << "(the log's record fits the last page)";
    // Fill whatever is left, a byte file at a time.
    for (int i = 0;; ++i) {
      const std::string f = disk + "/filler" + std::to_string(i);
      const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT, 0644);
      ASSERT_GE(fd, 0);
      const bool wrote = ::write(fd, "x", 1) == 1 && ::fsync(fd) == 0;
      ::close(fd);
      if (!wrote) break;
    }
  }
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(disk, StoreOptions{}));
  ASSERT_OK_AND_ASSIGN(uint64_t freed, registry->Evict("full"));
  EXPECT_GT(freed, 1u << 20);
  ASSERT_OK_AND_ASSIGN(auto store, registry->Get("full"));
  EXPECT_NE(store->evicted(), nullptr);
  EXPECT_GE(FileSize(reserve), ShuffleRegistry::kEvictReserve) << "made again";
}

}  // namespace
}  // namespace sluice
