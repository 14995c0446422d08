// Split reads (docs/api.md, "Split reads"): frames' key bounds taken at push, kept through the
// commit log and a restart, KEY fetches of a key range that read only the frames that may hold
// it, and split keys planned from the bounds. A registry on a real temporary directory,
// attempts pushed through PushAttempt, fetches through FetchSession, as the server runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "codec/key_bounds.h"
#include "server/rules/fetch_session.h"
#include "server/rules/push_attempt.h"
#include "server/rules/split_plan.h"
#include "tests/harness/fetch_fixture.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice {
namespace {

using absl::StatusCode;
using testing::Bytes;
using testing::DecodeRows;
using testing::EncodeRows;
using testing::Rows;
using testing::StatusIs;

std::string Bounds(std::vector<std::string_view> keys) {
  std::string out;
  AppendKeyBounds(keys, HeavyKey{keys[0], false, 1, 1}, &out);
  return out;
}

TEST(KeyBoundsTest, LongKeysAreCutAndBadEncodingsRefused) {
  const std::string long_hi(40, 'z');
  const std::string b = Bounds({"a", "m", long_hi});
  ASSERT_EQ(KeyBoundsSize(b), b.size());
  const KeyBounds k = ReadKeyBounds(b);
  EXPECT_TRUE(k.known);
  EXPECT_EQ(k.lo, "a");
  EXPECT_EQ(k.hi, std::string(kMaxBoundKey, 'z'));
  EXPECT_TRUE(k.hi_cut);
  // A cut greatest key stands for every key starting with it.
  EXPECT_TRUE(MayHoldKeyIn(b, long_hi, std::nullopt));
  EXPECT_TRUE(MayHoldKeyIn(b, std::string(50, 'z'), std::nullopt));
  EXPECT_FALSE(MayHoldKeyIn(b, std::string(31, 'z') + "{", std::nullopt));
  // Bytes that are not an encoding: too few keys, a length past the bytes, keys going back, a
  // cut mark on a short or inner key.
  EXPECT_EQ(KeyBoundsSize(std::string("\x01\x01"
                                      "a",
                                      3)),
            0u);
  EXPECT_EQ(KeyBoundsSize(std::string("\x02\x01"
                                      "a\x05"
                                      "b",
                                      5)),
            0u);
  EXPECT_EQ(KeyBoundsSize(std::string("\x02\x01"
                                      "b\x01"
                                      "a",
                                      5)),
            0u);
  EXPECT_EQ(KeyBoundsSize(std::string("\x02\x01"
                                      "a\x81"
                                      "b",
                                      5)),
            0u);
  EXPECT_EQ(KeyBoundsSize(""), 0u);
  EXPECT_TRUE(MayHoldKeyIn("", "anything", std::string("b")));  // not known: any key
}

TEST(KeyBoundsTest, ARangeMeetsAFrameExactlyAtItsEdges) {
  const std::string b = Bounds({"c", "f"});
  const auto to = [](const char* k) { return std::optional<std::string>(k); };
  EXPECT_TRUE(MayHoldKeyIn(b, "a", std::string("c\0", 2)));  // [a, c\0) holds c
  EXPECT_FALSE(MayHoldKeyIn(b, "a", to("c")));               // [a, c) ends before c
  EXPECT_TRUE(MayHoldKeyIn(b, "f", std::nullopt));
  EXPECT_FALSE(MayHoldKeyIn(b, std::string("f\0", 2), std::nullopt));
  EXPECT_TRUE(MayHoldKeyIn(b, "d", to("e")));
  EXPECT_TRUE(MayHoldKeyIn(b, "", std::nullopt));
}

TEST(KeyBoundsTest, CommitRecordsKeepEachBlocksBoundsFromVersion7) {
  BlockRef a{0, 100, 4096, 3, 300, Bounds({"a", "b", "c"})};
  BlockRef none{1, 50, 8192, 1, 60, ""};
  const std::string rec = EncodeCommitRecord(7, 9, {a, none});
  CommitRecord out;
  const auto* p = reinterpret_cast<const uint8_t*>(rec.data());
  ASSERT_EQ(ParseCommitRecord(p, p + rec.size(), &out), rec.size());
  ASSERT_EQ(out.blocks.size(), 2u);
  EXPECT_EQ(out.blocks[0].bounds, a.bounds);
  EXPECT_EQ(out.blocks[1].bounds, "");
  EXPECT_EQ(out.blocks[1].offset, 8192u);
  // A version 6 record has no bounds (and a version 7 parser takes only its own).
  const std::string old = EncodeCommitRecord(7, 9, {a, none}, false, 6);
  const auto* q = reinterpret_cast<const uint8_t*>(old.data());
  ASSERT_EQ(ParseCommitRecord(q, q + old.size(), &out, 6), old.size());
  EXPECT_EQ(out.blocks[0].bounds, "");
  EXPECT_EQ(old.size() + a.bounds.size() + 1, rec.size());
}

class SplitReadTest : public testing::FetchFixture {
 protected:
  // A sorted frame of `rows` (sorted here).
  static std::string Sorted(Rows rows) {
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto& a, const auto& b) { return KeyLess(a.first, b.first); });
    EncodeOptions o;
    o.sort_by_key = true;
    return EncodeRows(rows, o);
  }

  // Mapper m's sorted run of `rows` (sorted here, stably by key), pushed as frames of
  // `per_frame` records each: frames whose key bounds follow each other.
  void PushRun(const std::string& id, uint32_t m, Rows rows, size_t per_frame) {
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto& a, const auto& b) { return KeyLess(a.first, b.first); });
    std::vector<std::string> frames;
    for (size_t f = 0; f < rows.size(); f += per_frame) {
      frames.push_back(Sorted(
          Rows(rows.begin() + static_cast<std::ptrdiff_t>(f),
               rows.begin() + static_cast<std::ptrdiff_t>(std::min(rows.size(), f + per_frame)))));
    }
    Push(id, m, frames);
  }

  // Partition 0's plan, as GetSplits makes it.
  SplitPlan Plan(const std::string& id, uint32_t slices) {
    auto store = registry_->Get(id);
    EXPECT_OK(store);
    if (!store.ok()) return {};
    auto plan = PlanSplits((*store)->SampleBlocks(0, kMaxPlanFrames), slices);
    EXPECT_OK(plan);
    return plan.ok() ? *std::move(plan) : SplitPlan{};
  }

  // Slice i of `plan`, read (and the frames it read).
  Rows ReadSlice(const std::string& id, const SplitPlan& plan, size_t i, size_t* frames = nullptr) {
    return Read(id, i == 0 ? "" : plan.keys[i - 1],
                i == plan.keys.size() ? std::nullopt : std::optional<std::string>(plan.keys[i]),
                frames);
  }

  // The KEY read of [from, to) of partition 0: its records, and the frames it read.
  Rows Read(const std::string& id, const std::string& from, std::optional<std::string> to,
            size_t* frames = nullptr) {
    FetchSpec spec;
    spec.shuffle_id = id;
    spec.key_order = true;
    spec.from_key = from;
    spec.to_key = std::move(to);
    auto session = FetchSession::Make(spec, deps_, nullptr);
    EXPECT_OK(session);
    if (!session.ok()) return {};
    if (frames != nullptr) *frames = (*session)->frames_to_read();
    Rows rows;
    std::string frame;
    for (;;) {
      auto more = (*session)->Next(&frame);
      EXPECT_OK(more);
      if (!more.ok() || !*more) break;
      for (auto& r : DecodeRows(frame)) rows.push_back(std::move(r));
    }
    return rows;
  }

  // What the range should give: `all` (in key order) within [from, to).
  static Rows Within(const Rows& all, const std::string& from,
                     const std::optional<std::string>& to) {
    Rows out;
    for (const auto& r : all) {
      if (CompareKeys(r.first, from) >= 0 && (!to || CompareKeys(r.first, *to) < 0)) {
        out.push_back(r);
      }
    }
    return out;
  }
};

// Keys k000..k299: mapper m's frame f holds keys [100 f, 100 f + 100) of its own stride, so each
// frame covers a narrow range and a range read can leave most frames unread.
TEST_F(SplitReadTest, ARangeReadsOnlyTheFramesThatMayHoldItAndExactlyItsRecords) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));
  Rows all;
  for (uint32_t m = 0; m < 3; ++m) {
    std::vector<std::string> frames;
    for (int f = 0; f < 3; ++f) {
      Rows rows;
      for (int i = 0; i < 100; ++i) {
        rows.emplace_back(absl::StrFormat("k%03d", 100 * f + i), absl::StrCat(m, "/", i));
      }
      frames.push_back(Sorted(rows));
    }
    Push("s", m, frames);
  }
  all = Read("s", "", std::nullopt);
  ASSERT_EQ(all.size(), 900u);
  size_t frames = 0;
  // Inside one frame of each mapper: 3 of the 9 frames read.
  EXPECT_EQ(Read("s", "k120", "k130", &frames), Within(all, "k120", "k130"));
  EXPECT_EQ(frames, 3u);
  EXPECT_EQ(Within(all, "k120", "k130").size(), 30u);
  // A key equal to from is in, equal to to is out; both edges across frames.
  EXPECT_EQ(Read("s", "k099", "k101", &frames), Within(all, "k099", "k101"));
  EXPECT_EQ(frames, 6u);
  EXPECT_EQ(Within(all, "k099", "k101").size(), 6u);
  // Empty ranges read nothing; a range past every key too.
  EXPECT_TRUE(Read("s", "k150", "k150", &frames).empty());
  EXPECT_EQ(frames, 0u);
  EXPECT_TRUE(Read("s", "k299\x01", std::nullopt, &frames).empty());
  EXPECT_EQ(frames, 0u);
  // Open ends.
  EXPECT_EQ(Read("s", "", "k050"), Within(all, "", "k050"));
  EXPECT_EQ(Read("s", "k250", std::nullopt), Within(all, "k250", std::nullopt));
  // Unsorted frames (sorted when loaded) are read exactly too.
  ASSERT_OK(registry_->Create(ShuffleParams{"u", 1, 0}));
  Rows rows;
  for (int i = 0; i < 200; ++i) rows.emplace_back(absl::StrFormat("k%03d", (i * 37) % 200), "v");
  Push("u", 0, {EncodeRows(rows)});
  const Rows u = Read("u", "", std::nullopt);
  EXPECT_EQ(Read("u", "k010", "k020"), Within(u, "k010", "k020"));
  EXPECT_EQ(Within(u, "k010", "k020").size(), 10u);
}

// A sorted flush cut into frames is one run, loaded a frame at a time: four frames of ~1 MiB
// decoded merge within a 1.5 MiB limit when their keys follow each other, and are refused when
// they overlap (each would be a run of its own, all held at once).
TEST_F(SplitReadTest, FramesWhoseKeysFollowEachOtherAreOneRunReadAFrameAtATime) {
  deps_.merge.memory_limit = 3u << 19;
  const std::string value(1 << 20, 'v');
  ASSERT_OK(registry_->Create(ShuffleParams{"chained", 1, 0}));
  Push("chained", 0,
       {Sorted({{"a", value}}), Sorted({{"b", value}}), Sorted({{"c", value}}),
        Sorted({{"d", value}})});
  const Rows read = Read("chained", "", std::nullopt);
  ASSERT_EQ(read.size(), 4u);
  EXPECT_EQ(read[3].first, "d");
  ASSERT_OK(registry_->Create(ShuffleParams{"overlapping", 1, 0}));
  Push("overlapping", 0,
       {Sorted({{"d", value}}), Sorted({{"c", value}}), Sorted({{"b", value}}),
        Sorted({{"a", value}})});
  FetchSpec spec;
  spec.shuffle_id = "overlapping";
  spec.key_order = true;
  ASSERT_OK_AND_ASSIGN(auto session, FetchSession::Make(spec, deps_, nullptr));
  std::string frame;
  EXPECT_THAT(session->Next(&frame), StatusIs(StatusCode::kResourceExhausted, "memory"));
}

TEST_F(SplitReadTest, RangeRequestsAreChecked) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));
  FetchSpec spec;
  spec.shuffle_id = "s";
  spec.to_key = "b";
  EXPECT_THAT(FetchSession::Make(spec, deps_, nullptr),
              StatusIs(StatusCode::kInvalidArgument, "KEY order only"));
  spec.key_order = true;
  spec.from_key = "c";
  EXPECT_THAT(FetchSession::Make(spec, deps_, nullptr),
              StatusIs(StatusCode::kInvalidArgument, "from_key is after to_key"));
  spec.from_key = std::string(kMaxRangeKeyBytes + 1, 'a');
  spec.to_key.reset();
  EXPECT_THAT(FetchSession::Make(spec, deps_, nullptr),
              StatusIs(StatusCode::kInvalidArgument, "longer than"));
  EXPECT_THAT(PlanSplits({}, 0), StatusIs(StatusCode::kInvalidArgument, "slices 0"));
  EXPECT_THAT(PlanSplits({}, kMaxSplitSlices + 1),
              StatusIs(StatusCode::kInvalidArgument, "out of range"));
  ASSERT_OK_AND_ASSIGN(SplitPlan empty, PlanSplits({}, 4));
  EXPECT_TRUE(empty.keys.empty());
  EXPECT_EQ(empty.slice_bytes, std::vector<uint64_t>{0});
}

TEST_F(SplitReadTest, BoundsSurviveARestartAndAnOlderLogHasNone) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));
  for (uint32_t m = 0; m < 2; ++m) {
    Push("s", m, {Sorted({{"a", "1"}, {"b", "2"}}), Sorted({{"x", "3"}, {"y", "4"}})});
  }
  size_t frames = 0;
  const Rows before = Read("s", "w", std::nullopt, &frames);
  EXPECT_EQ(frames, 2u);
  OpenRegistry(StoreOptions{});  // a restart: the index from the log alone
  EXPECT_EQ(Read("s", "w", std::nullopt, &frames), before);
  EXPECT_EQ(frames, 2u);
  ASSERT_OK_AND_ASSIGN(auto store, registry_->Get("s"));
  for (const BlockRef& b : store->CommittedBlocks(0)) EXPECT_TRUE(ReadKeyBounds(b.bounds).known);
  // A log of version 6 keeps no bounds: the range reads every frame, exactly all the same.
  StoreOptions v6;
  v6.log_version = 6;
  OpenRegistry(v6);
  ASSERT_OK(registry_->Create(ShuffleParams{"old", 1, 0}));
  Push("old", 0, {Sorted({{"a", "1"}, {"b", "2"}}), Sorted({{"x", "3"}, {"y", "4"}})});
  EXPECT_EQ(Read("old", "w", std::nullopt, &frames), (Rows{{"x", "3"}, {"y", "4"}}));
  EXPECT_EQ(frames, 2u);
  const SplitPlan plan = Plan("old", 2);
  EXPECT_EQ(plan.frames_without_bounds, 2u);
  EXPECT_TRUE(plan.keys.empty());
}

// 16 mappers, each a sorted run of 8 frames over uniform random keys: 16 slices planned from
// the bounds alone are nearly equal, and read one by one they are exactly the partition.
TEST_F(SplitReadTest, SlicesArePlannedNearlyEqualAndTogetherAreExactlyThePartition) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));
  std::mt19937_64 rng(7);
  const std::string value(100, 'v');
  for (uint32_t m = 0; m < 16; ++m) {
    Rows run;
    for (int i = 0; i < 4000; ++i) {
      run.emplace_back(absl::StrFormat("key%08d", rng() % 100000000), value);
    }
    PushRun("s", m, run, 500);
  }
  const SplitPlan plan = Plan("s", 16);
  ASSERT_EQ(plan.keys.size(), 15u);
  EXPECT_EQ(plan.frames, 128u);
  EXPECT_EQ(plan.frames_without_bounds, 0u);
  const Rows all = Read("s", "", std::nullopt);
  ASSERT_EQ(all.size(), 64000u);
  Rows joined;
  size_t least = SIZE_MAX, most = 0, frames_read = 0;
  std::string shown;  // each slice's records (and bytes planned)
  for (size_t i = 0; i <= plan.keys.size(); ++i) {
    size_t frames = 0;
    const Rows slice = ReadSlice("s", plan, i, &frames);
    frames_read += frames;
    absl::StrAppend(&shown, " ", slice.size(), " (~", plan.slice_bytes[i], " B)");
    least = std::min(least, slice.size());
    most = std::max(most, slice.size());
    joined.insert(joined.end(), slice.begin(), slice.end());
  }
  EXPECT_EQ(joined, all);  // every record once, in key order
  EXPECT_LE(static_cast<double>(most), 1.5 * static_cast<double>(least)) << "slices:" << shown;
  // Each cut splits about one frame per mapper: far from every slice reading every frame.
  EXPECT_LE(frames_read, 128u + 15u * 16u);
}

TEST_F(SplitReadTest, AHotKeyStaysInOneSlice) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));
  std::mt19937_64 rng(3);
  for (uint32_t m = 0; m < 8; ++m) {
    Rows run;
    for (int i = 0; i < 3000; ++i) {
      // 30% of the records on one key.
      run.emplace_back(
          rng() % 10 < 3 ? std::string("hot") : absl::StrFormat("k%06d", rng() % 1000000), "v");
    }
    PushRun("s", m, run, 500);
  }
  const SplitPlan plan = Plan("s", 8);
  EXPECT_GE(plan.keys.size(), 3u);
  const Rows all = Read("s", "", std::nullopt);
  Rows joined;
  int slices_with_hot = 0;
  for (size_t i = 0; i <= plan.keys.size(); ++i) {
    const Rows slice = ReadSlice("s", plan, i);
    const auto hot =
        std::count_if(slice.begin(), slice.end(), [](const auto& r) { return r.first == "hot"; });
    if (hot > 0) {
      ++slices_with_hot;
      EXPECT_EQ(hot, std::count_if(all.begin(), all.end(),
                                   [](const auto& r) { return r.first == "hot"; }));
    }
    joined.insert(joined.end(), slice.begin(), slice.end());
  }
  EXPECT_EQ(slices_with_hot, 1);
  EXPECT_EQ(joined, all);
}

// A known distribution: 8 mappers' sorted runs with 30% of their records on "hot", 10% on
// "warm" and the rest over a million keys. The sketch names both with their exact counts (each
// is the heaviest key of every frame it is in), and forgets a revoked mapper's share exactly.
TEST_F(SplitReadTest, TheHotKeySketchNamesTheHeaviestKeysWithTheirCounts) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));
  std::mt19937_64 rng(11);
  std::map<std::string, uint64_t> count;
  uint64_t mapper0_hot = 0;
  for (uint32_t m = 0; m < 8; ++m) {
    Rows run;
    for (int i = 0; i < 4000; ++i) {
      const uint64_t r = rng() % 10;
      run.emplace_back(
          r < 3 ? std::string("hot")
                : (r < 4 ? std::string("warm") : absl::StrFormat("k%06d", rng() % 1000000)),
          "v");
      ++count[run.back().first];
      if (m == 0 && run.back().first == "hot") ++mapper0_hot;
    }
    PushRun("s", m, run, 500);
  }
  ASSERT_OK_AND_ASSIGN(auto store, registry_->Get("s"));
  // Its memory is counted with the index's: 64 entries, their bounds and the 8-key sketch.
  EXPECT_GE(registry_->index_bytes(), 64 * 32 + 64 * 20 + kHotKeysKept * sizeof(HotKey));
  std::vector<HotKey> hot = store->HotKeys(0, 3);
  ASSERT_EQ(hot.size(), 3u);
  EXPECT_EQ(hot[0].key, "hot");
  EXPECT_EQ(hot[0].records, count["hot"]);
  EXPECT_EQ(hot[0].bytes, count["hot"] * 4);  // "hot" and "v"
  EXPECT_EQ(hot[0].error, 0u);
  EXPECT_EQ(hot[1].key, "warm");
  EXPECT_EQ(hot[1].records, count["warm"]);
  EXPECT_LT(hot[2].records, count["warm"] / 10);  // the rest are far lighter
  // The same after a restart (from the log), and less the revoked mapper's share after a
  // revocation.
  OpenRegistry(StoreOptions{});
  ASSERT_OK_AND_ASSIGN(store, registry_->Get("s"));
  EXPECT_EQ(store->HotKeys(0, 1)[0].records, count["hot"]);
  ASSERT_OK(store->Revoke(0, 1));
  EXPECT_EQ(store->HotKeys(0, 1)[0].records, count["hot"] - mapper0_hot);
  // An unsorted frame's heaviest key too.
  ASSERT_OK(registry_->Create(ShuffleParams{"u", 1, 0}));
  Rows rows;
  for (int i = 0; i < 300; ++i) rows.emplace_back(i % 3 == 0 ? "x" : absl::StrCat("y", i), "v");
  Push("u", 0, {EncodeRows(rows)});
  ASSERT_OK_AND_ASSIGN(auto u, registry_->Get("u"));
  ASSERT_EQ(u->HotKeys(0, 1).size(), 1u);
  EXPECT_EQ(u->HotKeys(0, 1)[0].key, "x");
  EXPECT_EQ(u->HotKeys(0, 1)[0].records, 100u);
}

}  // namespace
}  // namespace sluice
