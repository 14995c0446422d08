// PlacementCache (server/rules/placement_cache.h) through its node: what a server holds of a
// shuffle, read once and remembered, the stores made from the record, placements with etcd
// unreachable, and huge partitions' segments (and the meter that asks for them). Servers over
// real registries share an in-memory record (tests/harness/cluster_fixture.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rpc/error_reason.h"
#include "server/rules/cluster_node.h"
#include "server/rules/replica_check.h"
#include "server/rules/segment_meter.h"
#include "tests/harness/cluster_fixture.h"

namespace sluice::testing {
namespace {

// The meter asks once, an eighth before the split size (more with more writers), for the last
// segment of a partition only, and again after a split that did not happen; what the record
// made is told in order.
TEST(SegmentMeterTest, AsksOnceNearTheSplitSizeAndTellsTheSegmentsInOrder) {
  ASSERT_OK_AND_ASSIGN(ShufflePlacement p, NewPlacement("job", 2, 1, 1, {"n0", "n1"}, 8000));
  SegmentMeter meter(p.split_bytes, p.slots());
  meter.Known(p);
  EXPECT_EQ(meter.ask_bytes(), 7000u);
  // Writers pushing here: each may send ~2 MiB after the split; never more than half the size.
  meter.Enter();
  EXPECT_EQ(meter.ask_bytes(), 4000u);
  meter.Leave();
  ASSERT_OK_AND_ASSIGN(ShufflePlacement big, NewPlacement("big", 2, 1, 1, {"n0"}, 64 << 20));
  SegmentMeter large(big.split_bytes, big.slots());
  EXPECT_EQ(large.ask_bytes(), 56u << 20);
  for (int i = 0; i < 6; ++i) large.Enter();
  EXPECT_EQ(large.ask_bytes(), 46u << 20);
  EXPECT_FALSE(meter.Add(0, 6999));
  EXPECT_TRUE(meter.Add(0, 1));
  EXPECT_FALSE(meter.Add(0, 5000)) << "asked already";
  meter.Unask(0);  // (the record could not be written)
  EXPECT_TRUE(meter.Add(0, 1));
  EXPECT_EQ(meter.Bytes(0), 12001u);
  EXPECT_FALSE(meter.Add(p.slots(), 1 << 20)) << "beyond the slots";
  EXPECT_EQ(meter.count(), 0u);
  ASSERT_OK_AND_ASSIGN(ShufflePlacement a, NextSegment(p, 0, {"n0", "n1"}));
  ASSERT_OK_AND_ASSIGN(ShufflePlacement b, NextSegment(a, 1, {"n0", "n1"}));
  meter.Known(b);
  ASSERT_EQ(meter.count(), 2u);
  const auto told = meter.After(0);
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[0].id, 2u);
  EXPECT_EQ(told[0].parent, 0u);
  EXPECT_EQ(told[1].id, 3u);
  EXPECT_EQ(told[1].parent, 1u);
  EXPECT_EQ(meter.After(1).size(), 1u);
  EXPECT_TRUE(meter.After(2).empty());
  // Partition 1 is followed by segment 3 now: it never asks again; segment 3 does.
  meter.Unask(1);
  meter.Known(b);
  EXPECT_FALSE(meter.Add(1, 1 << 20));
  EXPECT_TRUE(meter.Add(3, 7000));
}

// A split asked by the server that keeps the full partition is recorded once; the server that
// keeps the new segment takes its frames after reading the record again.
TEST(PlacementCacheTest, ASplitIsRecordedOnceAndTheNewSegmentsServerKeepsIt) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  ClusterNode::Options options{true};
  options.split_bytes = 8000;
  FakeClock clock;
  Server n0("n0", options, &clock), n1("n1", options, &clock);
  n0.node->membership().Joined(&nodes, &record);
  n1.node->membership().Joined(&nodes, &record);
  ASSERT_OK(n0.node->decisions().Create({"job", 2, 2}, 1).status());
  ASSERT_OK_AND_ASSIGN(auto placed, record.Get("job"));
  const uint32_t full = KeptAndOther(*placed, "n0").first.front();
  ASSERT_OK(n1.node->PrepareToPush("job").status());
  ASSERT_OK(n0.node->PrepareToPush("job").status());
  std::shared_ptr<SegmentMeter> meter = n0.node->placements().Meter("job");
  ASSERT_NE(meter, nullptr);
  ASSERT_TRUE(meter->Add(full, 7500));
  ASSERT_OK(n0.node->placements().Split("job", full));
  ASSERT_OK(
      n0.node->placements().Split("job", full));  // again (another replica, a retry): nothing new
  ASSERT_OK_AND_ASSIGN(placed, record.Get("job"));
  ASSERT_EQ(placed->total(), 3u);
  EXPECT_EQ(placed->ChainOf(full), (std::vector<uint32_t>{full, 2}));
  EXPECT_EQ(placed->nodes[placed->replicas[2][0]], "n1") << "the server without the chain";
  EXPECT_EQ(meter->count(), 1u);
  EXPECT_EQ(n0.node->placements().SizesOf("job", placed->slots()).listed, 3u);
  // n1 read the record before the split: a frame for segment 2 has it read again (not within
  // 10 ms of its last read: then UNAVAILABLE, retry).
  EXPECT_THAT(n1.node->placements().KeptNow("job", 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "has not read of yet"));
  clock.Advance(std::chrono::milliseconds(10));
  ASSERT_OK_AND_ASSIGN(auto kept, n1.node->placements().KeptNow("job", 2));
  ASSERT_NE(kept, nullptr);
  EXPECT_TRUE((*kept)[2]);
  EXPECT_OK(n1.node->PrepareToServe("job", 2));
  EXPECT_THAT(n0.node->PrepareToServe("job", 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, "keeps no replica of partition 2"));
  // Its store takes the segment ids.
  ASSERT_OK_AND_ASSIGN(auto store, n1.registry->Get("job"));
  EXPECT_EQ(store->params().num_partitions, placed->slots());
}

// A shuffle created through another server gets its store here on first use if this server
// keeps any of it; a server keeping none says so.
TEST(PlacementCacheTest, AShuffleRecordedElsewhereGetsItsStoreOnFirstUse) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true), n1("n1", true), n2("n2", true);
  for (Server* s : {&n0, &n1, &n2}) s->node->membership().Joined(&nodes, &record);
  ASSERT_OK(
      n1.node->decisions().Create({"job", 4, 2}, 2).status());  // every partition on n0 and n1
  EXPECT_THAT(n0.registry->Get("job").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  ASSERT_OK(n0.node->PrepareToServe("job", 2));
  ASSERT_OK_AND_ASSIGN(auto store, n0.registry->Get("job"));
  EXPECT_EQ(store->params().num_partitions, 4u);
  EXPECT_EQ(store->params().num_mappers, 2u);
  // n2 joined after the placement: it keeps nothing of the shuffle.
  EXPECT_THAT(n2.node->PrepareToPush("job").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "server n2 holds no partition"));
  // An unknown shuffle is the store's own NOT_FOUND.
  EXPECT_OK(n0.node->PrepareToServe("nope", 0));
  EXPECT_THAT(n0.registry->Get("nope").status(), StatusIs(absl::StatusCode::kNotFound, ""));
}

// etcd unreachable: what a server has remembered still serves; what needs the record is
// UNAVAILABLE (retry), never the caller's mistake.
TEST(PlacementCacheTest, WithTheRecordUnreachableRememberedShufflesServeAndTheRestIsUnavailable) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0"});
  Server n0("n0", true);
  n0.node->membership().Joined(&nodes, &record);
  ASSERT_OK(n0.node->decisions().Create({"job", 2, 1}, 1).status());
  ASSERT_OK(n0.node->PrepareToServe("job", 1));  // every decision checked once
  record.Fail(EtcdDown());
  EXPECT_OK(n0.node->PrepareToServe("job", 1));
  EXPECT_OK(n0.node->PrepareToPush("job").status());
  for (absl::Status st :
       {n0.node->decisions().Create({"other", 2, 1}, 1).status(),
        n0.node->placements().GetPlacement("unseen").status(), n0.node->decisions().Delete("job"),
        n0.node->decisions().CountForCreate("t~", "t~x").status()}) {
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "etcd")) << st;
  }
  EXPECT_OK(n0.node->placements().GetPlacement("job").status())
      << "a placement read before is kept";
  ASSERT_OK(n0.registry->Get("job").status()) << "a failed delete leaves the shuffle";
}

// PlacementCache on its own: a holding is read from the record once and remembered; a read of
// an older epoch never replaces a newer one; a shuffle the record no longer has is forgotten,
// and whoever keeps more of it is told.
TEST(PlacementCacheTest, AHoldingIsReadOnceOnlyANewerEpochReplacesItAndADeleteIsForgotten) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
  FakeNodeDirectory nodes({"n0", "n1"});
  FakePlacementStore record;
  ClusterMembership m({true});
  m.SetSelf({"n0", "n0:7070", 1});
  m.Joined(&nodes, &record);
  PlacementCache cache(registry.get(), &m);
  std::vector<std::string> forgotten;
  cache.OnForget([&](const std::string& id) { forgotten.push_back(id); });
  ASSERT_OK(record.Create("job", 4, 2, 1, {"n0", "n1"}).status());
  const int calls = record.calls();
  ASSERT_OK_AND_ASSIGN(auto held, cache.HoldingOf("job"));
  ASSERT_NE(held, nullptr);
  ASSERT_OK_AND_ASSIGN(auto again, cache.HoldingOf("job"));
  EXPECT_EQ(again, held) << "remembered";
  EXPECT_EQ(record.calls(), calls + 1) << "read once";
  const auto [kept, other] = KeptAndOther(held->placement, "n0");
  for (uint32_t q : kept) EXPECT_OK(cache.CheckKept(held.get(), "job", q));
  for (uint32_t q : other) {
    EXPECT_THAT(cache.CheckKept(held.get(), "job", q),
                StatusIs(absl::StatusCode::kFailedPrecondition, "keeps no replica"));
  }
  // A newer epoch (n1 taken out): n0 keeps everything.
  ASSERT_OK_AND_ASSIGN(auto next, record.AddEpoch("job", {"n1"}, {"n0"}));
  ASSERT_TRUE(next.has_value());
  ASSERT_OK(cache.ReadUpTo("job", next->epoch()));
  EXPECT_EQ(cache.KnownEpoch("job"), 1u);
  // The older placement read late (a racing read) does not take it back.
  cache.Remember("job", held->placement, "n0");
  EXPECT_EQ(cache.KnownEpoch("job"), 1u);
  ASSERT_OK(record.Delete("job").status());
  ASSERT_OK_AND_ASSIGN(auto gone, cache.Reread("job"));
  EXPECT_EQ(gone, nullptr);
  EXPECT_EQ(cache.Remembered("job"), nullptr);
  EXPECT_EQ(forgotten, std::vector<std::string>{"job"});
}

}  // namespace
}  // namespace sluice::testing
