// ShuffleRegistry on a real temporary directory: a tenant's stored bytes follow its blocks, lazy
// opening at the start, a directory where a shuffle's file should be is damage, and idle
// shuffles close at the open limits and reopen whole.
#include "server/storage/shuffle_registry.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/storage/shuffle_store.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice {
namespace {

using testing::StatusIs;
using testing::TempDir;

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
