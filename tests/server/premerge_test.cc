// The background pre-merge (server/rules/premerge.h) on a real registry and data directory, with
// no transport: what it picks, that a KEY read over pre-merged runs gives exactly the records and
// the order it gave without them (skips, key ranges and reads of some mappers included), that a
// run that covers a read is sent as stored, that a restart finds the runs that still stand, that
// revocations and repairs retire a run, and merges racing commits.
#include "server/rules/premerge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "server/rules/fetch_session.h"
#include "server/rules/push_attempt.h"
#include "server/storage/block_format.h"
#include "tests/harness/fetch_fixture.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"

namespace sluice {
namespace {

using testing::DecodeRows;
using testing::EncodeRows;
using testing::Rows;

MergeUnit Own(uint32_t m, uint64_t bytes = 100, uint32_t runs = 1) {
  return MergeUnit{m, m, bytes, 0, bytes == 0 ? 0 : runs};
}
MergeUnit Pre(uint32_t first, uint32_t last, uint32_t level) {
  return MergeUnit{first, last, 1000, level, 1};
}

TEST(PickMergeTest, TakesAdjacentRunsOfOneLevelAndTheWholePartitionOnceComplete) {
  using Pick = std::optional<std::pair<uint32_t, uint32_t>>;
  // Too few runs: nothing, complete or not.
  EXPECT_EQ(PickMerge({{Own(0), Own(1), Own(2)}}, false, 4), Pick());
  EXPECT_EQ(PickMerge({{Own(0), Own(1), Own(2)}}, true, 4), Pick());
  // Four adjacent mappers' own runs; one with nothing for the partition joins the range.
  EXPECT_EQ(PickMerge({{Own(0), Own(1), Own(2, 0), Own(3), Own(4)}}, false, 4), Pick({0, 4}));
  // Runs of another level break a window; the level-1 runs make one of their own.
  EXPECT_EQ(PickMerge({{Pre(0, 9, 1), Own(10), Own(11), Pre(12, 20, 1), Own(21)}}, false, 3),
            Pick());
  EXPECT_EQ(PickMerge({{Pre(0, 9, 1), Pre(10, 19, 1), Pre(20, 29, 1), Own(30)}}, false, 3),
            Pick({0, 29}));
  // A mapper's sorted flushes are runs of their own: one mapper of many is merged alone.
  EXPECT_EQ(PickMerge({{Own(0), Own(1, 100, 5), Own(2)}}, false, 4), Pick({0, 2}));
  EXPECT_EQ(PickMerge({{Pre(0, 0, 1), Own(1, 100, 5), Pre(2, 2, 1)}}, false, 4), Pick({1, 1}));
  // Stretches apart (a mapper between them not committed) are never merged together.
  EXPECT_EQ(PickMerge({{Own(0), Own(1)}, {Own(3), Own(4)}}, false, 3), Pick());
  // Every mapper committed: the whole partition, whatever the levels; with fewer runs than
  // min_runs too once one of them is pre-merged (a partition that never had min_runs: none).
  EXPECT_EQ(PickMerge({{Pre(0, 9, 2), Own(10), Pre(11, 12, 1)}}, true, 3), Pick({0, 12}));
  EXPECT_EQ(PickMerge({{Pre(0, 9, 1), Own(10)}}, true, 16), Pick({0, 10}));
  EXPECT_EQ(PickMerge({{Pre(0, 9, 1), Own(10, 0)}}, true, 16), Pick());
}

class PremergeTest : public testing::FetchFixture {
 protected:
  // Mapper m's records: `frames` frames (the last ones with keys in order, the others not), each
  // key among `keys`, each value "m/f/i" so a record's place in the order is known.
  static std::vector<std::string> Frames(uint32_t m, int frames, int keys, Rows* all) {
    std::vector<std::string> out;
    std::mt19937 rng(m * 7919 + 1);
    for (int f = 0; f < frames; ++f) {
      Rows rows;
      for (int i = 0; i < 30; ++i) {
        char key[16], value[32];
        std::snprintf(key, sizeof(key), "k%04d", static_cast<int>(rng() % keys));
        std::snprintf(value, sizeof(value), "%05u/%02d/%03d", m, f, i);
        rows.emplace_back(key, value);
      }
      if (f == frames - 1) {
        std::stable_sort(rows.begin(), rows.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      all->insert(all->end(), rows.begin(), rows.end());
      out.push_back(EncodeRows(rows));
    }
    return out;
  }

  // The KEY order of `rows`: by key, equal keys by mapper, then arrival (frame, position).
  static Rows KeyOrder(Rows rows) {
    std::stable_sort(rows.begin(), rows.end());  // (values "m/f/i" sort as arrival per mapper)
    return rows;
  }

  // A whole read, and whether it merged (false: sent as stored).
  Rows Read(const FetchSpec& spec, bool* merged = nullptr) {
    Rows got;
    auto session = FetchSession::Make(spec, deps_, nullptr);
    EXPECT_OK(session);
    if (!session.ok()) return got;
    if (merged != nullptr) *merged = (*session)->key_order();
    std::string frame;
    for (;;) {
      auto more = (*session)->Next(&frame);
      EXPECT_OK(more);
      if (!more.ok() || !*more) break;
      const Rows rows = DecodeRows(frame);
      got.insert(got.end(), rows.begin(), rows.end());
      (*session)->Sent();
    }
    return got;
  }

  FetchSpec Key(const std::string& id) {
    FetchSpec spec;
    spec.shuffle_id = id;
    spec.key_order = true;
    return spec;
  }

  Premerger MakePremerger(size_t min_runs) {
    PremergeOptions o;
    o.bytes_per_s = uint64_t{1} << 40;
    o.min_runs = min_runs;
    o.frame_bytes = 2048;  // (runs of many frames: reads that take some as stored, cut others)
    o.merge = deps_.merge;
    o.merge.memory_limit = 16 << 20;
    o.budget = &budget_;
    return Premerger(registry_.get(), o, nullptr);
  }

  std::shared_ptr<ShuffleStore> Store(const std::string& id) {
    auto store = registry_->Get(id);
    EXPECT_OK(store);
    return store.ok() ? *store : nullptr;
  }
};

TEST_F(PremergeTest, AReadOverPremergedRunsIsExactlyTheReadWithoutThem) {
  constexpr uint32_t kMappers = 41;  // 0-39, then 40 last
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, kMappers}));
  Rows all;
  std::vector<uint32_t> order(kMappers - 1);
  for (uint32_t m = 0; m + 1 < kMappers; ++m) order[m] = m;
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  for (uint32_t m : order) {
    if (m != 17) Push("s", m, Frames(m, 3, 50, &all));
  }
  const Rows expected = KeyOrder(all);

  // Mappers 0-16 and 18-39 are two stretches: each merged into one run.
  Premerger premerge = MakePremerger(4);
  EXPECT_GT(premerge.Run(), 0u);
  const ShuffleStore::MergedStats stats = Store("s")->Merged(0);
  EXPECT_EQ(stats.runs, 2u);
  EXPECT_EQ(stats.mappers, kMappers - 2);  // every one but 17 and 40
  bool merged = false;
  EXPECT_EQ(Read(Key("s"), &merged), expected);
  EXPECT_TRUE(merged);
  // A skip, a key range, some mappers: the same records as without the runs.
  FetchSpec skip = Key("s");
  skip.skip_records = 1234;
  EXPECT_EQ(Read(skip), Rows(expected.begin() + 1234, expected.end()));
  FetchSpec range = Key("s");
  range.from_key = "k0010";
  range.to_key = "k0020";
  Rows in_range;
  for (const auto& r : expected) {
    if (r.first >= "k0010" && r.first < "k0020") in_range.push_back(r);
  }
  EXPECT_EQ(Read(range), in_range);
  FetchSpec some = Key("s");
  some.only_mappers = {3, 4, 5, 30};  // (no run's whole range: their own blocks)
  Rows theirs;
  for (const auto& r : expected) {
    const int m = std::stoi(r.second.substr(0, 5));
    if (m == 3 || m == 4 || m == 5 || m == 30) theirs.push_back(r);
  }
  EXPECT_EQ(Read(some), theirs);
  // UNORDERED still hands out the mappers' own frames.
  FetchSpec unordered;
  unordered.shuffle_id = "s";
  EXPECT_EQ(Read(unordered).size(), all.size());

  // Mapper 17 between the two runs: read in its place, whole and over a key range.
  Push("s", 17, Frames(17, 3, 50, &all));
  const Rows between = KeyOrder(all);
  EXPECT_EQ(Read(Key("s")), between);
  range.from_key = "k0020";  // (a key at a run's frame boundary or not: each key once)
  range.to_key = "k0021";
  Rows one_key;
  for (const auto& r : between) {
    if (r.first == "k0020") one_key.push_back(r);
  }
  EXPECT_EQ(Read(range), one_key);
  // The last mapper: the whole partition in one run, sent as stored.
  Push("s", 40, Frames(40, 3, 50, &all));
  const Rows complete = KeyOrder(all);
  EXPECT_GT(premerge.Run(), 0u);
  EXPECT_EQ(Store("s")->Merged(0).runs, 1u);
  EXPECT_EQ(Store("s")->Merged(0).mappers, kMappers);
  EXPECT_EQ(Read(Key("s"), &merged), complete);
  EXPECT_FALSE(merged);  // its frames as stored: no merge slot, no decoding
  FetchSpec tail = Key("s");
  tail.skip_records = complete.size() - 45;
  EXPECT_EQ(Read(tail), Rows(complete.end() - 45, complete.end()));
  // Key ranges of the one run: its frames inside a range as stored, those at its ends cut to it
  // (skips counted within the range).
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"k0000", "k0050"}, {"k0007", "k0031"}, {"k0012", "k0013"}, {"k0049", "k0060"}}) {
    FetchSpec slice = Key("s");
    slice.from_key = from;
    slice.to_key = to;
    Rows want;
    for (const auto& r : complete) {
      if (r.first >= from && r.first < to) want.push_back(r);
    }
    ASSERT_GT(want.size(), 0u);
    EXPECT_EQ(Read(slice, &merged), want) << from << " " << to;
    EXPECT_FALSE(merged);
    slice.skip_records = want.size() / 3;
    EXPECT_EQ(Read(slice),
              Rows(want.begin() + static_cast<std::ptrdiff_t>(want.size() / 3), want.end()));
  }
  // Asked for other chunks or no compression: merged (of one run) as before.
  FetchSpec plain = Key("s");
  plain.uncompressed = true;
  EXPECT_EQ(Read(plain, &merged), complete);
  EXPECT_TRUE(merged);
  // The runs it took in were given back; the mappers' own blocks stay (a copy, not held).
  EXPECT_EQ(premerge.Run(), 0u);  // nothing more to do
}

TEST_F(PremergeTest, ARestartFindsTheRunsThatStandAndARevocationRetiresOne) {
  constexpr uint32_t kMappers = 12;
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 2, kMappers}));
  Rows all;
  for (uint32_t m = 0; m < kMappers; ++m) Push("s", m, Frames(m, 2, 20, &all));
  Premerger premerge = MakePremerger(4);
  EXPECT_GT(premerge.Run(), 0u);
  ASSERT_EQ(Store("s")->Merged(0).runs, 1u);
  const uint64_t held = Store("s")->Stats(0).bytes;

  // A start: the run stands (its MERGE record), and reads the same.
  OpenRegistry(StoreOptions{});
  EXPECT_EQ(Store("s")->Merged(0).runs, 1u);
  EXPECT_EQ(Store("s")->Merged(0).mappers, kMappers);
  EXPECT_EQ(Store("s")->Stats(0).bytes, held);  // (the run is not the partition's bytes)
  bool merged = true;
  EXPECT_EQ(Read(Key("s"), &merged), KeyOrder(all));
  EXPECT_FALSE(merged);

  // Mapper 5's decision is revoked: the run no longer stands for its range, here or after a
  // start; the read is the other mappers', merged from their own blocks.
  ASSERT_OK(Store("s")->Revoke(5, 1));
  EXPECT_EQ(Store("s")->Merged(0).runs, 0u);
  Rows rest;
  for (const auto& r : all) {
    if (std::stoi(r.second.substr(0, 5)) != 5) rest.push_back(r);
  }
  EXPECT_EQ(Read(Key("s"), &merged), KeyOrder(rest));
  EXPECT_TRUE(merged);
  OpenRegistry(StoreOptions{});
  EXPECT_EQ(Store("s")->Merged(0).runs, 0u);
  EXPECT_EQ(Read(Key("s")), KeyOrder(rest));
  // Mappers 0-4 and 6-11 are two stretches now: a run each (after the start: no read since).
  OpenRegistry(StoreOptions{});
  Premerger again = MakePremerger(4);  // (on the registry opened again)
  EXPECT_EQ(again.Run(), 2u);
  EXPECT_EQ(Store("s")->Merged(0).runs, 2u);
  EXPECT_EQ(Store("s")->Merged(0).mappers, kMappers - 1);
  EXPECT_EQ(Read(Key("s")), KeyOrder(rest));
}

TEST_F(PremergeTest, APartitionWhoseReduceBeganIsLeftAloneUntilItsNextCommit) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 21}));
  Rows all;
  for (uint32_t m = 0; m < 20; ++m) Push("s", m, Frames(m, 1, 20, &all));
  EXPECT_EQ(Read(Key("s")), KeyOrder(all));  // a reducer reads it: pre-merging it now helps none
  Premerger premerge = MakePremerger(4);
  EXPECT_EQ(premerge.Run(), 0u);
  EXPECT_EQ(Store("s")->Merged(0).runs, 0u);
  Push("s", 20, Frames(20, 1, 20, &all));  // more data: a later read may gain
  EXPECT_EQ(premerge.Run(), 1u);
  EXPECT_EQ(Store("s")->Merged(0).runs, 1u);
  EXPECT_EQ(Read(Key("s")), KeyOrder(all));
}

TEST_F(PremergeTest, MergesRacingCommitsNeverChangeARead) {
  constexpr uint32_t kMappers = 64;
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, kMappers}));
  std::vector<Rows> rows(kMappers);
  std::vector<std::vector<std::string>> frames(kMappers);
  for (uint32_t m = 0; m < kMappers; ++m) frames[m] = Frames(m, 2, 80, &rows[m]);
  std::atomic<bool> done{false};
  Premerger premerge = MakePremerger(3);
  std::thread merging([&] {
    while (!done.load()) premerge.Run();
  });
  std::vector<uint32_t> order(kMappers);
  for (uint32_t m = 0; m < kMappers; ++m) order[m] = m;
  std::shuffle(order.begin(), order.end(), std::mt19937(11));
  Rows committed;
  for (size_t i = 0; i < order.size(); ++i) {
    Push("s", order[i], frames[order[i]]);
    committed.insert(committed.end(), rows[order[i]].begin(), rows[order[i]].end());
    if (i % 8 == 7 && i + 1 < order.size()) {  // (not after the last: the final merge follows)
      EXPECT_EQ(Read(Key("s")), KeyOrder(committed)) << i;
    }
  }
  done.store(true);
  merging.join();
  premerge.Run();
  EXPECT_EQ(Store("s")->Merged(0).runs, 1u);
  EXPECT_EQ(Read(Key("s")), KeyOrder(committed));
}

TEST_F(PremergeTest, NoMapperMayUseTheRunsMapperId) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));  // (no mapper count: any id else)
  PushAttempt a(registry_.get(), PushLimits{});
  EXPECT_THAT(a.Open("s", kMergedMapper, 1),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, "reserved"));
}

TEST_F(PremergeTest, AMergeRecordBeyondTheShuffleIsItsDamageNotARun) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 4}));
  Rows all;
  for (uint32_t m = 0; m < 4; ++m) Push("s", m, Frames(m, 1, 10, &all));
  registry_.reset();
  CommitRecord r;
  r.merge = true;
  r.partition = 7;  // of a shuffle of one partition
  r.mapper = 0;
  r.last_mapper = 1;
  r.attempts = {1, 1};
  r.attempt = 5;
  {
    std::ofstream log(dir_.path() + "/shuffles/s/commits.log", std::ios::binary | std::ios::app);
    log << EncodeRecord(r);
  }
  OpenRegistry(StoreOptions{});
  EXPECT_THAT(registry_->Get("s"),
              testing::StatusIs(absl::StatusCode::kDataLoss, "pre-merged run of partition 7"));
}

}  // namespace
}  // namespace sluice
