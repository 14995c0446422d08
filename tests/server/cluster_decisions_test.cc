// ClusterDecisions (server/rules/cluster_decisions.h) through its node: creates placed once,
// winners decided once and applied everywhere, revocations, deletes, tenants' quotas in the
// record, and the replica check that says what a server lacks. Servers over real registries
// share an in-memory record (tests/harness/cluster_fixture.h).
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

// Two servers of a three-server cluster create the same shuffle: it is placed once, each
// makes its store only if it keeps a part, and each refuses the partitions it does not keep.
TEST(ClusterDecisionsTest, ACreatePlacesOnceAndEachServerKeepsOnlyItsPartitions) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1", "n2"});
  Server n0("n0", true), n1("n1", true);
  n0.node->membership().Joined(&nodes, &record);
  n1.node->membership().Joined(&nodes, &record);
  ASSERT_OK_AND_ASSIGN(bool created, n0.node->decisions().Create({"job", 12, 2}, 1));
  EXPECT_TRUE(created);
  ASSERT_OK_AND_ASSIGN(created, n1.node->decisions().Create({"job", 12, 2}, 1));
  EXPECT_FALSE(created);
  EXPECT_THAT(n1.node->decisions().Create({"job", 12, 2}, 2).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "replication 1"));
  ASSERT_OK_AND_ASSIGN(auto placed, record.Get("job"));
  ASSERT_TRUE(placed.has_value());
  const auto [kept, other] = KeptAndOther(*placed, "n0");
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
  const auto [kept1, other1] = KeptAndOther(*placed, "n1");
  EXPECT_EQ(n1.registry->Get("job").ok(), !kept1.empty());
  for (uint32_t p : kept1) EXPECT_OK(n1.node->PrepareToServe("job", p)) << p;
  for (uint32_t p : other1) {
    EXPECT_THAT(n1.node->PrepareToServe("job", p),
                StatusIs(absl::StatusCode::kFailedPrecondition, "server n1 keeps no replica"));
  }
  // The placement is remembered: no read of the record for what the server keeps.
  const int calls = record.calls();
  ASSERT_OK(n0.node->placements().HoldingOf("job").status());
  EXPECT_EQ(record.calls(), calls);
}

// A prepared attempt becomes visible once its mapper is decided; a server applies the
// decisions others made before it serves the shuffle, and refuses to serve it as whole when it
// lost what it had prepared.
TEST(ClusterDecisionsTest, DecisionsMadeElsewhereAreAppliedAndALostPrepareIsDataLoss) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true), n1("n1", true);
  n0.node->membership().Joined(&nodes, &record);
  n1.node->membership().Joined(&nodes, &record);
  ASSERT_OK(n0.node->decisions().Create({"job", 2, 2}, 2).status());
  ASSERT_OK(n1.node->PrepareToServe("job", 0));
  for (Server* s : {&n0, &n1}) {
    Prepare(*s, "job", 0, 1, {0, 1});
    Prepare(*s, "job", 0, 2, {0, 1});
  }
  ASSERT_OK_AND_ASSIGN(uint64_t winner, n1.node->decisions().DecideMapper("job", 0, 2));
  EXPECT_EQ(winner, 2u);
  ASSERT_OK_AND_ASSIGN(auto store0, n0.registry->Get("job"));
  EXPECT_EQ(store0->CommittedAttempt(0), std::nullopt) << "n0 learns decisions when it serves";
  ASSERT_OK(n0.node->PrepareToServe("job", 0));
  EXPECT_EQ(store0->CommittedAttempt(0), std::optional<uint64_t>(2));
  EXPECT_FALSE(store0->IsPrepared(0, 1)) << "the loser's prepare is dropped";
  // Deciding again answers the winner, whoever asks.
  ASSERT_OK_AND_ASSIGN(winner, n0.node->decisions().DecideMapper("job", 0, 1));
  EXPECT_EQ(winner, 2u);

  // Another shuffle whose mapper was prepared on n1 only (n0's copy lost with its data
  // directory, say) and decided: n0 must not serve it as if it were whole.
  ASSERT_OK(n1.node->decisions().Create({"job2", 2, 2}, 2).status());
  Prepare(n1, "job2", 1, 1, {0, 1});
  ASSERT_OK(n1.node->decisions().DecideMapper("job2", 1, 1).status());
  EXPECT_THAT(n0.node->PrepareToServe("job2", 0),
              StatusIs(absl::StatusCode::kDataLoss, "server n0 lacks 1 mappers of shuffle 'job2'"));
  EXPECT_THAT(n0.node->PrepareToServe("job2", 0), StatusIs(absl::StatusCode::kDataLoss, ""));
  EXPECT_OK(n1.node->PrepareToServe("job2", 0));
}

// Revoking decisions (docs/cluster.md): decided once in the record as an epoch, applied at once
// by the server asked and by every other before it serves a caller routed by that epoch; the
// mapper is then undecided everywhere and a re-run of it wins. On its own: refused.
TEST(ClusterDecisionsTest, ARevokedDecisionIsAppliedEverywhereBeforeServingAndAReRunWins) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true), n1("n1", true);
  n0.node->membership().Joined(&nodes, &record);
  n1.node->membership().Joined(&nodes, &record);
  ASSERT_OK(n0.node->decisions().Create({"job", 2, 2}, 2).status());
  ASSERT_OK(n1.node->PrepareToServe("job", 0));
  for (uint32_t m : {0u, 1u}) {
    for (Server* s : {&n0, &n1}) Prepare(*s, "job", m, 1, {0, 1});
    ASSERT_OK(n0.node->decisions().DecideMapper("job", m, 1).status());
  }
  for (Server* s : {&n0, &n1}) ASSERT_OK(s->node->PrepareToServe("job", 0));
  ASSERT_OK_AND_ASSIGN(auto store0, n0.registry->Get("job"));
  ASSERT_OK_AND_ASSIGN(auto store1, n1.registry->Get("job"));
  ASSERT_EQ(store1->CommittedMappers(), (std::vector<uint32_t>{0, 1}));

  ASSERT_OK_AND_ASSIGN(ClusterDecisions::Revoked revoked,
                       n0.node->decisions().RevokeMappers("job", {0}, 0));
  EXPECT_EQ(revoked.attempts, (std::vector<uint64_t>{1}));
  EXPECT_EQ(revoked.epoch, 1u);
  EXPECT_EQ(store0->CommittedMappers(), (std::vector<uint32_t>{1})) << "applied at once here";
  // n1 has not read the record since epoch 0: it learns before it serves a caller routed by
  // epoch 1 (a reader, or the client's CatchUp after a revocation).
  EXPECT_EQ(n1.node->placements().KnownEpoch("job"), 0u);
  ASSERT_OK(n1.node->PrepareToServe("job", std::nullopt, 1));
  EXPECT_EQ(n1.node->placements().KnownEpoch("job"), 1u);
  EXPECT_EQ(store1->CommittedMappers(), (std::vector<uint32_t>{1}));
  // A repeat from the epoch the caller saw: the same answer, nothing new.
  ASSERT_OK_AND_ASSIGN(ClusterDecisions::Revoked repeat,
                       n1.node->decisions().RevokeMappers("job", {0}, 0));
  EXPECT_EQ(repeat.attempts, (std::vector<uint64_t>{1}));
  EXPECT_EQ(repeat.epoch, 1u);

  // The old attempt can never win again; a re-run in the new epoch does, on every replica.
  EXPECT_THAT(n0.node->decisions().DecideMapper("job", 0, 1, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not prepared"));
  EXPECT_THAT(n0.node->PrepareToPush("job", 0).status(),
              StatusIs(absl::StatusCode::kUnavailable, "epoch"));
  for (Server* s : {&n0, &n1}) {
    ASSERT_OK(s->node->PrepareToPush("job", 1).status());
    Prepare(*s, "job", 0, 2, {0, 1});
  }
  ASSERT_OK_AND_ASSIGN(uint64_t winner, n1.node->decisions().DecideMapper("job", 0, 2, 1));
  EXPECT_EQ(winner, 2u);
  for (Server* s : {&n0, &n1}) ASSERT_OK(s->node->PrepareToServe("job", 0, 1));
  EXPECT_EQ(store0->CommittedAttempt(0), std::optional<uint64_t>(2));
  EXPECT_EQ(store1->CommittedAttempt(0), std::optional<uint64_t>(2));
  // A server down while a decision was revoked applies it before it serves again, whoever asks.
  ASSERT_OK(n0.node->decisions().RevokeMappers("job", {1}, 1).status());
  EXPECT_EQ(store1->CommittedAttempt(1), std::optional<uint64_t>(1)) << "n1 not told";
  ClusterNode restarted(n1.registry.get(), true);
  restarted.membership().SetSelf({"n1", "n1:7070", 2});
  restarted.membership().Joined(&nodes, &record);
  ASSERT_OK(restarted.PrepareToServe("job", 0));
  EXPECT_EQ(store1->CommittedAttempt(1), std::nullopt);
  EXPECT_TRUE(store1->IsRevoked(1, 1));
  // The caller's view is stale once a revocation it did not ask for moved the record.
  EXPECT_THAT(n0.node->decisions().RevokeMappers("job", {0}, 1).status(),
              StatusIs(absl::StatusCode::kAborted, "read its status again"));

  Server alone("a", false);
  ASSERT_OK(alone.node->decisions().Create({"solo", 1, 1}, 0).status());
  EXPECT_THAT(alone.node->decisions().RevokeMappers("solo", {0}, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "on its own"));
}

TEST(ClusterDecisionsTest, ADeleteRemovesTheRecordFirstAndTheStoreWhereItIs) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true), n1("n1", true);
  n0.node->membership().Joined(&nodes, &record);
  n1.node->membership().Joined(&nodes, &record);
  ASSERT_OK(n0.node->decisions().Create({"job", 4, 2}, 2).status());  // every partition on both
  ASSERT_OK(n1.node->PrepareToServe("job", 0));  // n1 makes its store from the record
  ASSERT_OK(n1.registry->Get("job").status());
  ASSERT_OK(n1.node->decisions().Delete("job"));
  ASSERT_OK_AND_ASSIGN(auto placed, record.Get("job"));
  EXPECT_FALSE(placed.has_value());
  EXPECT_THAT(n1.registry->Get("job").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  // Nobody makes it again from the record: a read through n1 finds no shuffle.
  ASSERT_OK(n1.node->PrepareToServe("job", 0));
  EXPECT_THAT(n1.registry->Get("job").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  // n0 still has its store (only n0's own delete takes it): recorded nowhere, it is deleted here.
  EXPECT_OK(n0.registry->Get("job").status());
  EXPECT_OK(n0.node->decisions().Delete("job"));
  EXPECT_THAT(n0.registry->Get("job").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  // A shuffle recorded but kept only elsewhere: deleted through a server without it, all the same.
  ASSERT_OK(record.Create("far", 1, 1, 1, {"n0"}).status());
  EXPECT_OK(n1.node->decisions().Delete("far"));
  EXPECT_THAT(n1.node->decisions().Delete("far"), StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST(ClusterDecisionsTest, AQuotaCountsTheTenantsShufflesInTheRecordAndPlacementsNameAddresses) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true);
  n0.node->membership().Joined(&nodes, &record);
  ASSERT_OK(record.Create("t~a", 2, 1, 1, {"n1"}).status());  // kept elsewhere only
  ASSERT_OK(record.Create("t~b", 2, 1, 1, {"n0"}).status());
  ASSERT_OK(record.Create("u~c", 2, 1, 1, {"n0"}).status());
  ASSERT_OK_AND_ASSIGN(size_t n, n0.node->decisions().CountForCreate("t~", "t~new"));
  EXPECT_EQ(n, 2u);
  ASSERT_OK_AND_ASSIGN(n, n0.node->decisions().CountForCreate("t~", "t~a"));
  EXPECT_EQ(n, 0u);

  nodes.Remove("n1");  // n1 went away: its address is no longer known
  ASSERT_OK_AND_ASSIGN(PlacementCache::Placement p, n0.node->placements().GetPlacement("t~a"));
  EXPECT_TRUE(p.clustered);
  ASSERT_EQ(p.nodes.size(), 1u);
  EXPECT_EQ(p.nodes[0].node_id, "n1");
  EXPECT_EQ(p.nodes[0].address, "");
  ASSERT_OK_AND_ASSIGN(p, n0.node->placements().GetPlacement("t~b"));
  EXPECT_EQ(p.nodes[0].address, "n0:7070");
  EXPECT_THAT(n0.node->placements().GetPlacement("t~nope").status(),
              StatusIs(absl::StatusCode::kNotFound, "shuffle 'nope' not found in the cluster"));
}

}  // namespace
}  // namespace sluice::testing
