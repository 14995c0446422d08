// The rules of ClusterNode (server/rules/cluster_node.h) that need all its parts: a server on
// its own, and a server gone for good taken out of its shuffles' placements (WatchMembers) with
// a taken-over partition incomplete until repaired. Servers over real registries share an
// in-memory record (tests/harness/cluster_fixture.h); a fake clock stands in for dead_after.
#include "server/rules/cluster_node.h"

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
#include "server/rules/replica_check.h"
#include "server/rules/segment_meter.h"
#include "tests/harness/cluster_fixture.h"

namespace sluice::testing {
namespace {

TEST(ClusterNodeTest, OnItsOwnItActsOnItsRegistryAlone) {
  Server s("solo", /*clustered=*/false);
  ClusterNode& node = *s.node;
  EXPECT_FALSE(node.requires_prepare());
  ASSERT_OK_AND_ASSIGN(bool created, node.decisions().Create({"job", 4, 2}, 0));
  EXPECT_TRUE(created);
  ASSERT_OK_AND_ASSIGN(created, node.decisions().Create({"job", 4, 2}, 0));
  EXPECT_FALSE(created);
  EXPECT_THAT(node.decisions().Create({"job", 5, 2}, 0).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "already exists with 4 partitions"));
  ASSERT_OK_AND_ASSIGN(auto kept, node.placements().HoldingOf("job"));
  EXPECT_EQ(kept, nullptr) << "a server on its own keeps every partition";
  ASSERT_OK(node.PrepareToServe("job", 3));
  ASSERT_OK_AND_ASSIGN(PlacementCache::Placement p, node.placements().GetPlacement("job"));
  EXPECT_FALSE(p.clustered);
  ASSERT_EQ(p.nodes.size(), 1u);
  EXPECT_EQ(p.nodes[0].address, "solo:7070");
  EXPECT_EQ(p.replicas, std::vector<std::vector<uint32_t>>(4, std::vector<uint32_t>{0}));
  ASSERT_OK_AND_ASSIGN(auto nodes, node.membership().Nodes());
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].node_id, "solo");
  EXPECT_THAT(node.placements().GetPlacement("nope").status(),
              StatusIs(absl::StatusCode::kNotFound, ""));

  // The first attempt resolved here wins; a later one learns the winner.
  EXPECT_THAT(node.decisions().DecideMapper("job", 0, 1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "is not prepared on server solo"));
  Prepare(s, "job", 0, 1, {0, 1});
  Prepare(s, "job", 0, 2, {2});
  ASSERT_OK_AND_ASSIGN(uint64_t winner, node.decisions().DecideMapper("job", 0, 2));
  EXPECT_EQ(winner, 2u);
  ASSERT_OK_AND_ASSIGN(winner, node.decisions().DecideMapper("job", 0, 1));
  EXPECT_EQ(winner, 2u);

  ASSERT_OK_AND_ASSIGN(size_t count, node.decisions().CountForCreate("", "other"));
  EXPECT_EQ(count, 1u);
  ASSERT_OK_AND_ASSIGN(count, node.decisions().CountForCreate("", "job"));
  EXPECT_EQ(count, 0u) << "a shuffle it has already does not count again";
  ASSERT_OK(node.decisions().Delete("job"));
  EXPECT_THAT(node.decisions().Delete("job"), StatusIs(absl::StatusCode::kNotFound, ""));
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
  options.dead_after = std::chrono::seconds(60);
  FakeClock clock;
  Server n0("n0", options, &clock), n1("n1", options, &clock), n2("n2", options, &clock);
  for (Server* s : {&n0, &n1, &n2}) s->node->membership().Joined(&nodes, &record);
  ASSERT_OK(n0.node->decisions().Create({"job", 6, 3}, 2).status());
  ASSERT_OK_AND_ASSIGN(auto before, record.Get("job"));
  ASSERT_TRUE(before.has_value());
  // Mapper 0 prepared on every server of epoch 0 (each with the partitions it holds), decided.
  std::map<std::string, Server*> by_id{{"n0", &n0}, {"n1", &n1}, {"n2", &n2}};
  for (auto& [id, s] : by_id) {
    ASSERT_OK(s->node->PrepareToPush("job", 0).status());
    Prepare(*s, "job", 0, 1, KeptAndOther(*before, id).first);
  }
  ASSERT_OK(n0.node->decisions().DecideMapper("job", 0, 1, 0).status());
  ASSERT_OK(n0.node->PrepareToServe("job", std::nullopt));

  nodes.Remove("n2");
  n0.node->WatchMembers();  // n2 absent from now
  EXPECT_FALSE(n0.node->AbsentNodes().front().dead) << "absent, not for dead_after yet";
  clock.Advance(options.dead_after);
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
  const auto [held0, other0] = KeptAndOther(*before, "n0");
  const auto [held1, other1] = KeptAndOther(*after, "n0");
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
    EXPECT_EQ(n0.node->decisions().MissingMappers("job", q), 1u);
  }

  // Attempts of epoch 0 are refused at their open and their decision; epoch 1's commit.
  EXPECT_EQ(ReasonOf(n0.node->PrepareToPush("job", 0).status()), ErrorReason::kPlacementChanged);
  Prepare(n0, "job", 1, 1, held1);
  EXPECT_EQ(ReasonOf(n0.node->decisions().DecideMapper("job", 1, 1, 0).status()),
            ErrorReason::kPlacementChanged);
  ASSERT_OK(n1.node->PrepareToPush("job", 1).status());  // n1 reads epoch 1 (a newer one)
  ASSERT_OK(n0.node->PrepareToPush("job", 1).status());
  Prepare(n0, "job", 1, 2, held1);
  Prepare(n1, "job", 1, 2, KeptAndOther(*after, "n1").first);
  ASSERT_OK_AND_ASSIGN(uint64_t winner, n0.node->decisions().DecideMapper("job", 1, 2, 1));
  EXPECT_EQ(winner, 2u);
  for (uint32_t q : taken) {
    EXPECT_THAT(n0.node->PrepareToServe("job", q),
                StatusIs(absl::StatusCode::kUnavailable, "lacks 1 committed mapper"));
  }
  for (uint32_t q : held0) EXPECT_OK(n0.node->PrepareToServe("job", q)) << q;
  // A decision of a newer epoch than the one remembered is read before it is judged.
  ASSERT_OK(n1.node->PrepareToServe("job", std::nullopt));
}

// A writer that cannot reach n2 has it taken out at once (no dead_after, n2 still registered):
// a new epoch without it, decided once (a racing writer's report of the same epoch gets the
// same epoch, no second one); attempts of the old epoch can no longer be decided; a server
// does not revive itself; past --revives_per_s a revive is UNAVAILABLE with a retry time; on
// its own a server has nothing to revive.
TEST(ClusterNodeTest, AReviveTakesAServerOutAtOnceDecidedOnceAndBounded) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1", "n2", "n3"});
  ClusterNode::Options options;
  options.clustered = true;
  options.dead_after = std::chrono::seconds(60);
  options.revives_per_s = 2;
  FakeClock clock;
  Server n0("n0", options, &clock), n1("n1", options, &clock);
  for (Server* s : {&n0, &n1}) s->node->membership().Joined(&nodes, &record);
  ASSERT_OK(n0.node->decisions().Create({"job", 8, 3}, 2).status());
  ASSERT_OK(n0.node->decisions().Create({"other", 8, 3}, 2).status());

  ASSERT_OK_AND_ASSIGN(ClusterNode::Revived r, n0.node->Revive("job", 0, "n2"));
  EXPECT_TRUE(r.revived);
  EXPECT_EQ(r.epoch, 1u);
  ASSERT_OK_AND_ASSIGN(auto after, record.Get("job"));
  EXPECT_FALSE(after->Holds("n2"));
  EXPECT_TRUE(after->epochs.back().revived);
  // Another writer's report, to another server: the same epoch, nothing new.
  ASSERT_OK_AND_ASSIGN(ClusterNode::Revived again, n1.node->Revive("job", 0, "n2"));
  EXPECT_FALSE(again.revived);
  EXPECT_EQ(again.epoch, 1u);
  ASSERT_OK_AND_ASSIGN(after, record.Get("job"));
  EXPECT_EQ(after->epoch(), 1u);
  // An attempt of epoch 0 can no longer be decided, nor opened.
  EXPECT_EQ(ReasonOf(record.DecideMapper("job", 0, 1, 0).status()), ErrorReason::kPlacementChanged);
  EXPECT_EQ(ReasonOf(n0.node->PrepareToPush("job", 0).status()), ErrorReason::kPlacementChanged);
  ASSERT_OK(n0.node->PrepareToPush("job", 1).status());

  EXPECT_THAT(n0.node->Revive("job", 1, "n0").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "the one answering"));
  // The bucket holds 2 a second: the first revive took one, this takes the other, the next
  // waits (an answer from the placement remembered, epoch moved already, takes none).
  ASSERT_OK_AND_ASSIGN(ClusterNode::Revived other, n0.node->Revive("other", 0, "n3"));
  EXPECT_TRUE(other.revived);
  EXPECT_OK(n0.node->Revive("other", 0, "n3").status()) << "remembered: no token";
  const absl::Status limited = n0.node->Revive("other", 1, "n1").status();
  EXPECT_THAT(limited, StatusIs(absl::StatusCode::kUnavailable, "--revives_per_s=2"));
  EXPECT_GT(RetryAfterOf(limited).count(), 0);
  clock.Advance(std::chrono::seconds(1));
  ASSERT_OK_AND_ASSIGN(other, n0.node->Revive("other", 1, "n1"));
  EXPECT_TRUE(other.revived);
  EXPECT_EQ(other.epoch, 2u);

  clock.Advance(std::chrono::seconds(1));
  // A server that drained to restart is waited for, not revived.
  nodes.SetRestarting("n3", true);
  const absl::Status waiting = n0.node->Revive("job", 1, "n3").status();
  EXPECT_THAT(waiting, StatusIs(absl::StatusCode::kUnavailable, "drained to restart"));
  EXPECT_EQ(ReasonOf(waiting), ErrorReason::kDraining);
  EXPECT_EQ(RetryAfterOf(waiting), std::chrono::milliseconds(2000));
  ASSERT_OK_AND_ASSIGN(after, record.Get("job"));
  EXPECT_EQ(after->epoch(), 1u);
  nodes.SetRestarting("n3", false);

  Server alone("a", false);
  EXPECT_THAT(alone.node->Revive("job", 0, "n2").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "on its own"));
}

}  // namespace
}  // namespace sluice::testing
