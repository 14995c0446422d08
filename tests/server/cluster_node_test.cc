// The node's cluster rules (ClusterNode) on their own: each "server" is a ClusterNode over a
// real registry in a temporary directory, and they share an in-memory cluster record
// (tests/harness/fake_cluster.h) in place of etcd. No process, no socket: the same rules run
// against a real etcd and real servers in tests/cluster/.
#include "server/rules/cluster_node.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rpc/error_reason.h"
#include "server/rules/replica_check.h"
#include "server/rules/segment_meter.h"
#include "tests/harness/fake_cluster.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {
namespace {

// One server of the test cluster: its data directory, registry and node.
struct Server {
  Server(const std::string& id, bool clustered) : Server(id, ClusterNode::Options{clustered}) {}
  Server(const std::string& id, ClusterNode::Options options) {
    auto r = ShuffleRegistry::Open(dir.path(), StoreOptions{});
    EXPECT_OK(r.status());
    registry = *std::move(r);
    node = std::make_unique<ClusterNode>(registry.get(), options);
    node->SetSelf({id, id + ":7070", 1});
  }
  TempDir dir;
  std::unique_ptr<ShuffleRegistry> registry;
  std::unique_ptr<ClusterNode> node;
};

// Prepares (or, `commit`, commits) `attempt` of `mapper` on the server's store of `id`: one
// record in each partition of `partitions`.
void Prepare(Server& s, const std::string& id, uint32_t mapper, uint64_t attempt,
             const std::vector<uint32_t>& partitions, bool commit = false) {
  ASSERT_OK_AND_ASSIGN(auto store, s.registry->Get(id));
  std::vector<BlockRef> blocks;
  for (uint32_t p : partitions) {
    const std::string frame = EncodeRows({{"k", "m" + std::to_string(mapper)}});
    ASSERT_OK_AND_ASSIGN(BlockRef b, store->Append(mapper, attempt, p, Bytes(frame), 1));
    blocks.push_back(b);
  }
  ASSERT_OK(
      (commit ? store->Commit(mapper, attempt, blocks) : store->Prepare(mapper, attempt, blocks))
          .status());
}

// What the etcd client answers when etcd cannot be reached.
absl::Status EtcdDown() {
  return WithReason(absl::UnavailableError("etcd get at 127.0.0.1:2379: Deadline Exceeded"),
                    ErrorReason::kEtcdUnavailable);
}

// The partitions of `p` that `node` keeps, and those it does not.
std::pair<std::vector<uint32_t>, std::vector<uint32_t>> Split(const ShufflePlacement& p,
                                                              const std::string& node) {
  std::vector<uint32_t> kept, other;
  for (uint32_t q = 0; q < p.num_partitions; ++q) {
    bool here = false;
    for (uint32_t i : p.replicas[q]) here = here || p.nodes[i] == node;
    (here ? kept : other).push_back(q);
  }
  return {kept, other};
}

// A lost mark stays while the mapper is still missing from its partition, and goes once it is
// not (copied after all) or the partition lacks nothing.
TEST(ReplicaCheckTest, StillLostKeepsOnlyMarksOfMappersStillMissing) {
  const std::map<uint32_t, std::set<uint32_t>> lost = {{0, {1, 2}}, {3, {4}}, {5, {6}}};
  const std::map<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>> missing = {
      {0, {{2, 7}, {9, 7}}}, {3, {{4, 1}}}};
  const std::map<uint32_t, std::set<uint32_t>> expected = {{0, {2}}, {3, {4}}};
  EXPECT_EQ(StillLost(lost, missing), expected);
  EXPECT_TRUE(StillLost({}, missing).empty());
}

// A huge partition's segment made in epoch 1 (docs/cluster.md, "Huge partitions") holds nothing
// of the winners of epoch 0: a server that keeps it lacks none of them.
TEST(ReplicaCheckTest, ASegmentLacksNoWinnerOfAnEpochBeforeItWasMade) {
  Server s("n1", /*clustered=*/false);
  ASSERT_OK(s.registry->Create(ShuffleParams{"job", 3, 2}).status());
  Prepare(s, "job", /*mapper=*/1, /*attempt=*/5, {2}, /*commit=*/true);
  ASSERT_OK_AND_ASSIGN(auto store, s.registry->Get("job"));
  // Epoch 0: n1 held nothing; epoch 1: it holds stored partition 2, made then.
  const std::vector<std::vector<bool>> held = {{false, false, false}, {false, false, true}};
  const std::map<uint32_t, MapperDecision> decided = {{0, {3, 0}}, {1, {5, 1}}};
  const ReplicaCheck with = CheckReplicas(held, decided, *store, {0, 0, 1});
  EXPECT_TRUE(with.lost.empty());
  EXPECT_TRUE(with.missing.empty());
  // (Without its epoch it would lack mapper 0: the check that tells them apart.)
  const ReplicaCheck without = CheckReplicas(held, decided, *store);
  ASSERT_EQ(without.missing.count(2), 1u);
  EXPECT_EQ(without.missing.at(2).front().first, 0u);
}

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
TEST(ClusterNodeTest, ASplitIsRecordedOnceAndTheNewSegmentsServerKeepsIt) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  ClusterNode::Options options{true};
  options.split_bytes = 8000;
  Server n0("n0", options), n1("n1", options);
  n0.node->Joined(&nodes, &record);
  n1.node->Joined(&nodes, &record);
  ASSERT_OK(n0.node->Create({"job", 2, 2}, 1).status());
  ASSERT_OK_AND_ASSIGN(auto placed, record.Get("job"));
  const uint32_t full = Split(*placed, "n0").first.front();
  ASSERT_OK(n1.node->PrepareToPush("job").status());
  ASSERT_OK(n0.node->PrepareToPush("job").status());
  std::shared_ptr<SegmentMeter> meter = n0.node->Meter("job");
  ASSERT_NE(meter, nullptr);
  ASSERT_TRUE(meter->Add(full, 7500));
  ASSERT_OK(n0.node->Split("job", full));
  ASSERT_OK(n0.node->Split("job", full));  // again (another replica, a retry): nothing new
  ASSERT_OK_AND_ASSIGN(placed, record.Get("job"));
  ASSERT_EQ(placed->total(), 3u);
  EXPECT_EQ(placed->ChainOf(full), (std::vector<uint32_t>{full, 2}));
  EXPECT_EQ(placed->nodes[placed->replicas[2][0]], "n1") << "the server without the chain";
  EXPECT_EQ(meter->count(), 1u);
  EXPECT_EQ(n0.node->SizesOf("job", placed->slots()).listed, 3u);
  // n1 read the record before the split: a frame for segment 2 has it read again (not within
  // 10 ms of its last read: then UNAVAILABLE, retry).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_OK_AND_ASSIGN(auto kept, n1.node->KeptNow("job", 2));
  ASSERT_NE(kept, nullptr);
  EXPECT_TRUE((*kept)[2]);
  EXPECT_OK(n1.node->PrepareToServe("job", 2));
  EXPECT_THAT(n0.node->PrepareToServe("job", 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, "keeps no replica of partition 2"));
  // Its store takes the segment ids.
  ASSERT_OK_AND_ASSIGN(auto store, n1.registry->Get("job"));
  EXPECT_EQ(store->params().num_partitions, placed->slots());
}

TEST(ClusterNodeTest, OnItsOwnItActsOnItsRegistryAlone) {
  Server s("solo", /*clustered=*/false);
  ClusterNode& node = *s.node;
  EXPECT_FALSE(node.requires_prepare());
  ASSERT_OK_AND_ASSIGN(bool created, node.Create({"job", 4, 2}, 0));
  EXPECT_TRUE(created);
  ASSERT_OK_AND_ASSIGN(created, node.Create({"job", 4, 2}, 0));
  EXPECT_FALSE(created);
  EXPECT_THAT(node.Create({"job", 5, 2}, 0).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "already exists with 4 partitions"));
  ASSERT_OK_AND_ASSIGN(auto kept, node.KeptPartitions("job"));
  EXPECT_EQ(kept, nullptr) << "a server on its own keeps every partition";
  ASSERT_OK(node.PrepareToServe("job", 3));
  ASSERT_OK_AND_ASSIGN(ClusterNode::Placement p, node.GetPlacement("job"));
  EXPECT_FALSE(p.clustered);
  ASSERT_EQ(p.nodes.size(), 1u);
  EXPECT_EQ(p.nodes[0].address, "solo:7070");
  EXPECT_EQ(p.replicas, std::vector<std::vector<uint32_t>>(4, std::vector<uint32_t>{0}));
  ASSERT_OK_AND_ASSIGN(auto nodes, node.Nodes());
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].node_id, "solo");
  EXPECT_THAT(node.GetPlacement("nope").status(), StatusIs(absl::StatusCode::kNotFound, ""));

  // The first attempt resolved here wins; a later one learns the winner.
  EXPECT_THAT(node.DecideMapper("job", 0, 1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "is not prepared on server solo"));
  Prepare(s, "job", 0, 1, {0, 1});
  Prepare(s, "job", 0, 2, {2});
  ASSERT_OK_AND_ASSIGN(uint64_t winner, node.DecideMapper("job", 0, 2));
  EXPECT_EQ(winner, 2u);
  ASSERT_OK_AND_ASSIGN(winner, node.DecideMapper("job", 0, 1));
  EXPECT_EQ(winner, 2u);

  ASSERT_OK_AND_ASSIGN(size_t count, node.CountForCreate("", "other"));
  EXPECT_EQ(count, 1u);
  ASSERT_OK_AND_ASSIGN(count, node.CountForCreate("", "job"));
  EXPECT_EQ(count, 0u) << "a shuffle it has already does not count again";
  ASSERT_OK(node.Delete("job"));
  EXPECT_THAT(node.Delete("job"), StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST(ClusterNodeTest, UntilItHasJoinedItsClusterCallsAreUnavailable) {
  Server s("n0", /*clustered=*/true);
  ClusterNode& node = *s.node;
  EXPECT_TRUE(node.requires_prepare());
  EXPECT_FALSE(node.registered());
  for (absl::Status st :
       {node.Create({"job", 4, 2}, 0).status(), node.Nodes().status(),
        node.PrepareToServe("job", 0), node.GetPlacement("job").status(), node.Delete("job")}) {
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "still joining"));
  }
}

// Two servers of a three-server cluster create the same shuffle: it is placed once, each
// makes its store only if it keeps a part, and each refuses the partitions it does not keep.
TEST(ClusterNodeTest, ACreatePlacesOnceAndEachServerKeepsOnlyItsPartitions) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1", "n2"});
  Server n0("n0", true), n1("n1", true);
  n0.node->Joined(&nodes, &record);
  n1.node->Joined(&nodes, &record);
  ASSERT_OK_AND_ASSIGN(bool created, n0.node->Create({"job", 12, 2}, 1));
  EXPECT_TRUE(created);
  ASSERT_OK_AND_ASSIGN(created, n1.node->Create({"job", 12, 2}, 1));
  EXPECT_FALSE(created);
  EXPECT_THAT(n1.node->Create({"job", 12, 2}, 2).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "replication 1"));
  ASSERT_OK_AND_ASSIGN(auto placed, record.Get("job"));
  ASSERT_TRUE(placed.has_value());
  const auto [kept, other] = Split(*placed, "n0");
  ASSERT_FALSE(kept.empty());
  ASSERT_FALSE(other.empty());
  EXPECT_OK(n0.registry->Get("job").status());
  for (uint32_t p : kept) EXPECT_OK(n0.node->PrepareToServe("job", p)) << p;
  for (uint32_t p : other) {
    EXPECT_THAT(n0.node->PrepareToServe("job", p),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         "server n0 keeps no replica of partition " + std::to_string(p)));
  }
  ASSERT_OK_AND_ASSIGN(auto push_kept, n0.node->PrepareToPush("job"));
  ASSERT_NE(push_kept, nullptr);
  for (uint32_t p : kept) EXPECT_TRUE((*push_kept)[p]);
  for (uint32_t p : other) EXPECT_FALSE((*push_kept)[p]);
  // n1 too: its store exists exactly when it keeps a part, and it serves only what it keeps.
  const auto [kept1, other1] = Split(*placed, "n1");
  EXPECT_EQ(n1.registry->Get("job").ok(), !kept1.empty());
  for (uint32_t p : kept1) EXPECT_OK(n1.node->PrepareToServe("job", p)) << p;
  for (uint32_t p : other1) {
    EXPECT_THAT(n1.node->PrepareToServe("job", p),
                StatusIs(absl::StatusCode::kFailedPrecondition, "server n1 keeps no replica"));
  }
  // The placement is remembered: no read of the record for what the server keeps.
  const int calls = record.calls();
  ASSERT_OK(n0.node->KeptPartitions("job").status());
  EXPECT_EQ(record.calls(), calls);
}

// A shuffle created through another server gets its store here on first use if this server
// keeps any of it; a server keeping none says so.
TEST(ClusterNodeTest, AShuffleRecordedElsewhereGetsItsStoreOnFirstUse) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true), n1("n1", true), n2("n2", true);
  for (Server* s : {&n0, &n1, &n2}) s->node->Joined(&nodes, &record);
  ASSERT_OK(n1.node->Create({"job", 4, 2}, 2).status());  // every partition on n0 and n1
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

// A prepared attempt becomes visible once its mapper is decided; a server applies the
// decisions others made before it serves the shuffle, and refuses to serve it as whole when it
// lost what it had prepared.
TEST(ClusterNodeTest, DecisionsMadeElsewhereAreAppliedAndALostPrepareIsDataLoss) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true), n1("n1", true);
  n0.node->Joined(&nodes, &record);
  n1.node->Joined(&nodes, &record);
  ASSERT_OK(n0.node->Create({"job", 2, 2}, 2).status());
  ASSERT_OK(n1.node->PrepareToServe("job", 0));
  for (Server* s : {&n0, &n1}) {
    Prepare(*s, "job", 0, 1, {0, 1});
    Prepare(*s, "job", 0, 2, {0, 1});
  }
  ASSERT_OK_AND_ASSIGN(uint64_t winner, n1.node->DecideMapper("job", 0, 2));
  EXPECT_EQ(winner, 2u);
  ASSERT_OK_AND_ASSIGN(auto store0, n0.registry->Get("job"));
  EXPECT_EQ(store0->CommittedAttempt(0), std::nullopt) << "n0 learns decisions when it serves";
  ASSERT_OK(n0.node->PrepareToServe("job", 0));
  EXPECT_EQ(store0->CommittedAttempt(0), std::optional<uint64_t>(2));
  EXPECT_FALSE(store0->IsPrepared(0, 1)) << "the loser's prepare is dropped";
  // Deciding again answers the winner, whoever asks.
  ASSERT_OK_AND_ASSIGN(winner, n0.node->DecideMapper("job", 0, 1));
  EXPECT_EQ(winner, 2u);

  // Another shuffle whose mapper was prepared on n1 only (n0's copy lost with its data
  // directory, say) and decided: n0 must not serve it as if it were whole.
  ASSERT_OK(n1.node->Create({"job2", 2, 2}, 2).status());
  Prepare(n1, "job2", 1, 1, {0, 1});
  ASSERT_OK(n1.node->DecideMapper("job2", 1, 1).status());
  EXPECT_THAT(n0.node->PrepareToServe("job2", 0),
              StatusIs(absl::StatusCode::kDataLoss, "server n0 lacks 1 mappers of shuffle 'job2'"));
  EXPECT_THAT(n0.node->PrepareToServe("job2", 0), StatusIs(absl::StatusCode::kDataLoss, ""));
  EXPECT_OK(n1.node->PrepareToServe("job2", 0));
}

// Revoking decisions (docs/cluster.md): decided once in the record as an epoch, applied at once
// by the server asked and by every other before it serves a caller routed by that epoch; the
// mapper is then undecided everywhere and a re-run of it wins. On its own: refused.
TEST(ClusterNodeTest, ARevokedDecisionIsAppliedEverywhereBeforeServingAndAReRunWins) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true), n1("n1", true);
  n0.node->Joined(&nodes, &record);
  n1.node->Joined(&nodes, &record);
  ASSERT_OK(n0.node->Create({"job", 2, 2}, 2).status());
  ASSERT_OK(n1.node->PrepareToServe("job", 0));
  for (uint32_t m : {0u, 1u}) {
    for (Server* s : {&n0, &n1}) Prepare(*s, "job", m, 1, {0, 1});
    ASSERT_OK(n0.node->DecideMapper("job", m, 1).status());
  }
  for (Server* s : {&n0, &n1}) ASSERT_OK(s->node->PrepareToServe("job", 0));
  ASSERT_OK_AND_ASSIGN(auto store0, n0.registry->Get("job"));
  ASSERT_OK_AND_ASSIGN(auto store1, n1.registry->Get("job"));
  ASSERT_EQ(store1->CommittedMappers(), (std::vector<uint32_t>{0, 1}));

  ASSERT_OK_AND_ASSIGN(ClusterNode::Revoked revoked, n0.node->RevokeMappers("job", {0}, 0));
  EXPECT_EQ(revoked.attempts, (std::vector<uint64_t>{1}));
  EXPECT_EQ(revoked.epoch, 1u);
  EXPECT_EQ(store0->CommittedMappers(), (std::vector<uint32_t>{1})) << "applied at once here";
  // n1 has not read the record since epoch 0: it learns before it serves a caller routed by
  // epoch 1 (a reader, or the client's CatchUp after a revocation).
  EXPECT_EQ(n1.node->KnownEpoch("job"), 0u);
  ASSERT_OK(n1.node->PrepareToServe("job", std::nullopt, 1));
  EXPECT_EQ(n1.node->KnownEpoch("job"), 1u);
  EXPECT_EQ(store1->CommittedMappers(), (std::vector<uint32_t>{1}));
  // A repeat from the epoch the caller saw: the same answer, nothing new.
  ASSERT_OK_AND_ASSIGN(ClusterNode::Revoked repeat, n1.node->RevokeMappers("job", {0}, 0));
  EXPECT_EQ(repeat.attempts, (std::vector<uint64_t>{1}));
  EXPECT_EQ(repeat.epoch, 1u);

  // The old attempt can never win again; a re-run in the new epoch does, on every replica.
  EXPECT_THAT(n0.node->DecideMapper("job", 0, 1, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not prepared"));
  EXPECT_THAT(n0.node->PrepareToPush("job", 0).status(),
              StatusIs(absl::StatusCode::kUnavailable, "epoch"));
  for (Server* s : {&n0, &n1}) {
    ASSERT_OK(s->node->PrepareToPush("job", 1).status());
    Prepare(*s, "job", 0, 2, {0, 1});
  }
  ASSERT_OK_AND_ASSIGN(uint64_t winner, n1.node->DecideMapper("job", 0, 2, 1));
  EXPECT_EQ(winner, 2u);
  for (Server* s : {&n0, &n1}) ASSERT_OK(s->node->PrepareToServe("job", 0, 1));
  EXPECT_EQ(store0->CommittedAttempt(0), std::optional<uint64_t>(2));
  EXPECT_EQ(store1->CommittedAttempt(0), std::optional<uint64_t>(2));
  // A server down while a decision was revoked applies it before it serves again, whoever asks.
  ASSERT_OK(n0.node->RevokeMappers("job", {1}, 1).status());
  EXPECT_EQ(store1->CommittedAttempt(1), std::optional<uint64_t>(1)) << "n1 not told";
  ClusterNode restarted(n1.registry.get(), true);
  restarted.SetSelf({"n1", "n1:7070", 2});
  restarted.Joined(&nodes, &record);
  ASSERT_OK(restarted.PrepareToServe("job", 0));
  EXPECT_EQ(store1->CommittedAttempt(1), std::nullopt);
  EXPECT_TRUE(store1->IsRevoked(1, 1));
  // The caller's view is stale once a revocation it did not ask for moved the record.
  EXPECT_THAT(n0.node->RevokeMappers("job", {0}, 1).status(),
              StatusIs(absl::StatusCode::kAborted, "read its status again"));

  Server alone("a", false);
  ASSERT_OK(alone.node->Create({"solo", 1, 1}, 0).status());
  EXPECT_THAT(alone.node->RevokeMappers("solo", {0}, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "on its own"));
}

// etcd unreachable: what a server has remembered still serves; what needs the record is
// UNAVAILABLE (retry), never the caller's mistake.
TEST(ClusterNodeTest, WithTheRecordUnreachableRememberedShufflesServeAndTheRestIsUnavailable) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0"});
  Server n0("n0", true);
  n0.node->Joined(&nodes, &record);
  ASSERT_OK(n0.node->Create({"job", 2, 1}, 1).status());
  ASSERT_OK(n0.node->PrepareToServe("job", 1));  // every decision checked once
  record.Fail(EtcdDown());
  EXPECT_OK(n0.node->PrepareToServe("job", 1));
  EXPECT_OK(n0.node->PrepareToPush("job").status());
  for (absl::Status st :
       {n0.node->Create({"other", 2, 1}, 1).status(), n0.node->GetPlacement("unseen").status(),
        n0.node->Delete("job"), n0.node->CountForCreate("t~", "t~x").status()}) {
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "etcd")) << st;
  }
  EXPECT_OK(n0.node->GetPlacement("job").status()) << "a placement read before is kept";
  ASSERT_OK(n0.registry->Get("job").status()) << "a failed delete leaves the shuffle";
}

// Once etcd is known down (WatchMembers found it), what needs it is refused at once, without
// waiting on etcd; GetPlacement answers from memory with its age; etcd back, all resumes.
TEST(ClusterNodeTest, WithEtcdKnownDownWhatNeedsItIsRefusedAtOnceAndPlacementsHaveAnAge) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true);
  n0.node->Joined(&nodes, &record);
  ASSERT_OK(n0.node->Create({"job", 4, 1}, 2).status());
  Prepare(n0, "job", 0, 1, {0, 1, 2, 3});
  ASSERT_OK_AND_ASSIGN(ClusterNode::Placement fresh, n0.node->GetPlacement("job"));
  EXPECT_EQ(fresh.age.count(), 0);
  record.Fail(EtcdDown());
  nodes.Fail(EtcdDown());
  n0.node->WatchMembers();
  EXPECT_TRUE(n0.node->etcd_down());
  const int calls = record.calls();
  for (absl::Status st :
       {n0.node->Create({"other", 2, 1}, 1).status(), n0.node->Delete("job"),
        n0.node->DecideMapper("job", 0, 1).status(), n0.node->GetPlacement("unseen").status(),
        // (an attempt prepared and not known decided: serving could leave out a mapper)
        n0.node->PrepareToServe("job", 0)}) {
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "etcd")) << st;
    EXPECT_EQ(ReasonOf(st), ErrorReason::kEtcdUnavailable) << st;
  }
  ASSERT_OK_AND_ASSIGN(ClusterNode::Placement old, n0.node->GetPlacement("job"));
  EXPECT_GT(old.age.count(), 0);
  EXPECT_EQ(old.nodes.size(), 2u);
  EXPECT_EQ(old.nodes[1].address, "n1:7070") << "the last list of servers read names them";
  EXPECT_EQ(record.calls(), calls) << "etcd was asked while known down";
  record.Fail(absl::OkStatus());
  nodes.Fail(absl::OkStatus());
  n0.node->WatchMembers();
  EXPECT_FALSE(n0.node->etcd_down());
  EXPECT_OK(n0.node->Create({"other", 2, 1}, 1).status());
}

// An etcd stall longer than the lease expires every lease when etcd resumes: until the servers
// registered before it are back (or the settle time has passed), a create is UNAVAILABLE and
// never placed on fewer servers, also across a second outage that read the list half-empty.
// A server that leaves while etcd is up holds nothing back.
TEST(ClusterNodeTest, AfterAnEtcdOutageACreateWaitsForTheServersRegisteredBeforeIt) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1", "n2"});
  Server n0("n0", true);
  n0.node->Joined(&nodes, &record);
  n0.node->WatchMembers();
  nodes.Fail(EtcdDown());
  n0.node->WatchMembers();
  nodes.Remove("n0");  // every lease expired at once
  nodes.Remove("n1");
  nodes.Remove("n2");
  nodes.Fail(absl::OkStatus());
  n0.node->WatchMembers();  // etcd back
  const absl::Status empty = n0.node->Create({"a", 6, 1}, 2).status();
  EXPECT_THAT(empty, StatusIs(absl::StatusCode::kUnavailable, "no server is registered"));
  EXPECT_EQ(ReasonOf(empty), ErrorReason::kSettling) << "every server would say the same";
  nodes.Add("n0");
  EXPECT_THAT(n0.node->Create({"a", 6, 1}, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "n1, n2 were registered before"));
  nodes.Fail(EtcdDown());  // a second blip, the list read between the two has n0 alone
  n0.node->WatchMembers();
  nodes.Fail(absl::OkStatus());
  n0.node->WatchMembers();
  EXPECT_THAT(n0.node->Create({"a", 6, 1}, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "n1, n2 were registered before"));
  nodes.Add("n1");
  nodes.Add("n2");
  ASSERT_OK(n0.node->Create({"a", 6, 1}, 2).status());
  ASSERT_OK_AND_ASSIGN(ClusterNode::Placement p, n0.node->GetPlacement("a"));
  EXPECT_EQ(p.nodes.size(), 3u);
}

// The settle time bounds the wait: a server that does not come back after an outage holds
// creates back no longer; one that leaves while etcd is up holds nothing back.
TEST(ClusterNodeTest, AServerGoneForGoodHoldsCreatesBackOnlyForTheSettleTime) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1", "n2"});
  Server n0("n0", true);
  n0.node = std::make_unique<ClusterNode>(
      n0.registry.get(), ClusterNode::Options{true, std::chrono::milliseconds(500)});
  n0.node->SetSelf({"n0", "n0:7070", 1});
  n0.node->Joined(&nodes, &record);
  nodes.Remove("n2");  // dies while etcd is up
  ASSERT_OK(n0.node->Create({"a", 6, 1}, 2).status());
  ASSERT_OK_AND_ASSIGN(ClusterNode::Placement p, n0.node->GetPlacement("a"));
  EXPECT_EQ(p.nodes.size(), 2u);
  nodes.Fail(EtcdDown());
  n0.node->WatchMembers();
  nodes.Remove("n1");  // lost with the outage, never back
  nodes.Fail(absl::OkStatus());
  n0.node->WatchMembers();
  EXPECT_THAT(n0.node->Create({"b", 6, 1}, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "n1 was registered before"));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the settle time has passed
  EXPECT_THAT(n0.node->Create({"b", 6, 1}, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "replication 2 needs 2 servers and 1 is"));
  EXPECT_THAT(n0.node->Create({"b", 6, 1}, 4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "replication 4"));
  ASSERT_OK(n0.node->Create({"b", 6, 1}, 1).status());
  ASSERT_OK_AND_ASSIGN(p, n0.node->GetPlacement("b"));
  EXPECT_EQ(p.nodes.size(), 1u);
}

TEST(ClusterNodeTest, ADeleteRemovesTheRecordFirstAndTheStoreWhereItIs) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true), n1("n1", true);
  n0.node->Joined(&nodes, &record);
  n1.node->Joined(&nodes, &record);
  ASSERT_OK(n0.node->Create({"job", 4, 2}, 2).status());  // every partition on both
  ASSERT_OK(n1.node->PrepareToServe("job", 0));           // n1 makes its store from the record
  ASSERT_OK(n1.registry->Get("job").status());
  ASSERT_OK(n1.node->Delete("job"));
  ASSERT_OK_AND_ASSIGN(auto placed, record.Get("job"));
  EXPECT_FALSE(placed.has_value());
  EXPECT_THAT(n1.registry->Get("job").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  // Nobody makes it again from the record: a read through n1 finds no shuffle.
  ASSERT_OK(n1.node->PrepareToServe("job", 0));
  EXPECT_THAT(n1.registry->Get("job").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  // n0 still has its store (only n0's own delete takes it): recorded nowhere, it is deleted here.
  EXPECT_OK(n0.registry->Get("job").status());
  EXPECT_OK(n0.node->Delete("job"));
  EXPECT_THAT(n0.registry->Get("job").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  // A shuffle recorded but kept only elsewhere: deleted through a server without it, all the same.
  ASSERT_OK(record.Create("far", 1, 1, 1, {"n0"}).status());
  EXPECT_OK(n1.node->Delete("far"));
  EXPECT_THAT(n1.node->Delete("far"), StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST(ClusterNodeTest, AQuotaCountsTheTenantsShufflesInTheRecordAndPlacementsNameAddresses) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true);
  n0.node->Joined(&nodes, &record);
  ASSERT_OK(record.Create("t~a", 2, 1, 1, {"n1"}).status());  // kept elsewhere only
  ASSERT_OK(record.Create("t~b", 2, 1, 1, {"n0"}).status());
  ASSERT_OK(record.Create("u~c", 2, 1, 1, {"n0"}).status());
  ASSERT_OK_AND_ASSIGN(size_t n, n0.node->CountForCreate("t~", "t~new"));
  EXPECT_EQ(n, 2u);
  ASSERT_OK_AND_ASSIGN(n, n0.node->CountForCreate("t~", "t~a"));
  EXPECT_EQ(n, 0u);

  nodes.Remove("n1");  // n1 went away: its address is no longer known
  ASSERT_OK_AND_ASSIGN(ClusterNode::Placement p, n0.node->GetPlacement("t~a"));
  EXPECT_TRUE(p.clustered);
  ASSERT_EQ(p.nodes.size(), 1u);
  EXPECT_EQ(p.nodes[0].node_id, "n1");
  EXPECT_EQ(p.nodes[0].address, "");
  ASSERT_OK_AND_ASSIGN(p, n0.node->GetPlacement("t~b"));
  EXPECT_EQ(p.nodes[0].address, "n0:7070");
  EXPECT_THAT(n0.node->GetPlacement("t~nope").status(),
              StatusIs(absl::StatusCode::kNotFound, "shuffle 'nope' not found in the cluster"));
}

// A server unregistered past dead_after is taken out of the placement with a new epoch: the
// survivors keep their partitions, the lost one's are filled from the others; a partition taken
// over is INCOMPLETE here until it holds every committed mapper; attempts of the old epoch are
// refused at their open and their decision (PLACEMENT_CHANGED), the new epoch's commit.
TEST(ClusterNodeTest, AServerGoneForGoodIsTakenOutAndATakenOverPartitionIsIncomplete) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1", "n2"});
  ClusterNode::Options options;
  options.clustered = true;
  options.dead_after = std::chrono::milliseconds(1);
  Server n0("n0", options), n1("n1", options), n2("n2", options);
  for (Server* s : {&n0, &n1, &n2}) s->node->Joined(&nodes, &record);
  ASSERT_OK(n0.node->Create({"job", 6, 3}, 2).status());
  ASSERT_OK_AND_ASSIGN(auto before, record.Get("job"));
  ASSERT_TRUE(before.has_value());
  // Mapper 0 prepared on every server of epoch 0 (each with the partitions it holds), decided.
  std::map<std::string, Server*> by_id{{"n0", &n0}, {"n1", &n1}, {"n2", &n2}};
  for (auto& [id, s] : by_id) {
    ASSERT_OK(s->node->PrepareToPush("job", 0).status());
    Prepare(*s, "job", 0, 1, Split(*before, id).first);
  }
  ASSERT_OK(n0.node->DecideMapper("job", 0, 1, 0).status());
  ASSERT_OK(n0.node->PrepareToServe("job", std::nullopt));

  nodes.Remove("n2");
  n0.node->WatchMembers();  // n2 absent from now
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  n0.node->WatchMembers();  // past dead_after: a new epoch
  ASSERT_OK_AND_ASSIGN(auto after, record.Get("job"));
  ASSERT_EQ(after->epoch(), 1u);
  EXPECT_EQ(after->epochs[0].removed, std::vector<std::string>{"n2"});
  EXPECT_FALSE(after->Holds("n2"));
  EXPECT_TRUE(after->Removed("n2"));
  for (uint32_t q = 0; q < 6; ++q) {
    ASSERT_EQ(after->replicas[q].size(), 2u) << q;
    // The survivors keep their place (primary first), the lost one's is filled.
    const auto old = before->replicas[q];
    if (before->nodes[old[0]] != "n2") {
      EXPECT_EQ(after->nodes[after->replicas[q][0]], before->nodes[old[0]]) << q;
    }
    EXPECT_EQ(after->ReplicasAt(q, 0), old) << q;
  }
  const auto absent = n0.node->AbsentNodes();
  ASSERT_EQ(absent.size(), 1u);
  EXPECT_EQ(absent[0].node_id, "n2");
  EXPECT_TRUE(absent[0].dead);

  // On n0: a partition held since epoch 0 is whole; one taken over lacks mapper 0.
  const auto [held0, other0] = Split(*before, "n0");
  const auto [held1, other1] = Split(*after, "n0");
  std::vector<uint32_t> taken;
  for (uint32_t q : held1) {
    if (std::find(held0.begin(), held0.end(), q) == held0.end()) taken.push_back(q);
  }
  ASSERT_FALSE(taken.empty()) << "n0 takes over some of n2's partitions";
  for (uint32_t q : held0) EXPECT_OK(n0.node->PrepareToServe("job", q)) << q;
  for (uint32_t q : taken) {
    const absl::Status st = n0.node->PrepareToServe("job", q);
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "lacks 1 committed mapper"));
    EXPECT_EQ(ReasonOf(st), ErrorReason::kIncomplete);
    EXPECT_EQ(n0.node->MissingMappers("job", q), 1u);
  }

  // Attempts of epoch 0 are refused at their open and their decision; epoch 1's commit.
  EXPECT_EQ(ReasonOf(n0.node->PrepareToPush("job", 0).status()), ErrorReason::kPlacementChanged);
  Prepare(n0, "job", 1, 1, held1);
  EXPECT_EQ(ReasonOf(n0.node->DecideMapper("job", 1, 1, 0).status()),
            ErrorReason::kPlacementChanged);
  ASSERT_OK(n1.node->PrepareToPush("job", 1).status());  // n1 reads epoch 1 (a newer one)
  ASSERT_OK(n0.node->PrepareToPush("job", 1).status());
  Prepare(n0, "job", 1, 2, held1);
  Prepare(n1, "job", 1, 2, Split(*after, "n1").first);
  ASSERT_OK_AND_ASSIGN(uint64_t winner, n0.node->DecideMapper("job", 1, 2, 1));
  EXPECT_EQ(winner, 2u);
  for (uint32_t q : taken) {
    EXPECT_THAT(n0.node->PrepareToServe("job", q),
                StatusIs(absl::StatusCode::kUnavailable, "lacks 1 committed mapper"));
  }
  for (uint32_t q : held0) EXPECT_OK(n0.node->PrepareToServe("job", q)) << q;
  // A decision of a newer epoch than the one remembered is read before it is judged.
  ASSERT_OK(n1.node->PrepareToServe("job", std::nullopt));
}

}  // namespace
}  // namespace sluice::testing
