// ClusterMembership (server/rules/cluster_membership.h) through its node: joining, etcd's
// health as the calls see it, the settle time after an outage, absent servers. Servers over
// real registries share an in-memory record (tests/harness/cluster_fixture.h); a fake clock
// stands in for the settle time and absences.
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

TEST(ClusterMembershipTest, UntilItHasJoinedItsClusterCallsAreUnavailable) {
  Server s("n0", /*clustered=*/true);
  ClusterNode& node = *s.node;
  EXPECT_TRUE(node.requires_prepare());
  EXPECT_FALSE(node.membership().registered());
  for (absl::Status st :
       {node.decisions().Create({"job", 4, 2}, 0).status(), node.membership().Nodes().status(),
        node.PrepareToServe("job", 0), node.placements().GetPlacement("job").status(),
        node.decisions().Delete("job")}) {
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "still joining"));
  }
}

// Once etcd is known down (WatchMembers found it), what needs it is refused at once, without
// waiting on etcd; GetPlacement answers from memory with its age; etcd back, all resumes.
TEST(ClusterMembershipTest, WithEtcdKnownDownWhatNeedsItIsRefusedAtOnceAndPlacementsHaveAnAge) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1"});
  Server n0("n0", true);
  n0.node->membership().Joined(&nodes, &record);
  ASSERT_OK(n0.node->decisions().Create({"job", 4, 1}, 2).status());
  Prepare(n0, "job", 0, 1, {0, 1, 2, 3});
  ASSERT_OK_AND_ASSIGN(PlacementCache::Placement fresh, n0.node->placements().GetPlacement("job"));
  EXPECT_EQ(fresh.age.count(), 0);
  record.Fail(EtcdDown());
  nodes.Fail(EtcdDown());
  n0.node->WatchMembers();
  EXPECT_TRUE(n0.node->membership().etcd_down());
  const int calls = record.calls();
  for (absl::Status st :
       {n0.node->decisions().Create({"other", 2, 1}, 1).status(),
        n0.node->decisions().Delete("job"), n0.node->decisions().DecideMapper("job", 0, 1).status(),
        n0.node->placements().GetPlacement("unseen").status(),
        // (an attempt prepared and not known decided: serving could leave out a mapper)
        n0.node->PrepareToServe("job", 0)}) {
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "etcd")) << st;
    EXPECT_EQ(ReasonOf(st), ErrorReason::kEtcdUnavailable) << st;
  }
  ASSERT_OK_AND_ASSIGN(PlacementCache::Placement old, n0.node->placements().GetPlacement("job"));
  EXPECT_GT(old.age.count(), 0);
  EXPECT_EQ(old.nodes.size(), 2u);
  EXPECT_EQ(old.nodes[1].address, "n1:7070") << "the last list of servers read names them";
  EXPECT_EQ(record.calls(), calls) << "etcd was asked while known down";
  record.Fail(absl::OkStatus());
  nodes.Fail(absl::OkStatus());
  n0.node->WatchMembers();
  EXPECT_FALSE(n0.node->membership().etcd_down());
  EXPECT_OK(n0.node->decisions().Create({"other", 2, 1}, 1).status());
}

// An etcd stall longer than the lease expires every lease when etcd resumes: until the servers
// registered before it are back (or the settle time has passed), a create is UNAVAILABLE and
// never placed on fewer servers, also across a second outage that read the list half-empty.
// A server that leaves while etcd is up holds nothing back.
TEST(ClusterMembershipTest, AfterAnEtcdOutageACreateWaitsForTheServersRegisteredBeforeIt) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1", "n2"});
  Server n0("n0", true);
  n0.node->membership().Joined(&nodes, &record);
  n0.node->WatchMembers();
  nodes.Fail(EtcdDown());
  n0.node->WatchMembers();
  nodes.Remove("n0");  // every lease expired at once
  nodes.Remove("n1");
  nodes.Remove("n2");
  nodes.Fail(absl::OkStatus());
  n0.node->WatchMembers();  // etcd back
  const absl::Status empty = n0.node->decisions().Create({"a", 6, 1}, 2).status();
  EXPECT_THAT(empty, StatusIs(absl::StatusCode::kUnavailable, "no server is registered"));
  EXPECT_EQ(ReasonOf(empty), ErrorReason::kSettling) << "every server would say the same";
  nodes.Add("n0");
  EXPECT_THAT(n0.node->decisions().Create({"a", 6, 1}, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "n1, n2 were registered before"));
  nodes.Fail(EtcdDown());  // a second blip, the list read between the two has n0 alone
  n0.node->WatchMembers();
  nodes.Fail(absl::OkStatus());
  n0.node->WatchMembers();
  EXPECT_THAT(n0.node->decisions().Create({"a", 6, 1}, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "n1, n2 were registered before"));
  nodes.Add("n1");
  nodes.Add("n2");
  ASSERT_OK(n0.node->decisions().Create({"a", 6, 1}, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementCache::Placement p, n0.node->placements().GetPlacement("a"));
  EXPECT_EQ(p.nodes.size(), 3u);
}

// The settle time bounds the wait: a server that does not come back after an outage holds
// creates back no longer; one that leaves while etcd is up holds nothing back.
TEST(ClusterMembershipTest, AServerGoneForGoodHoldsCreatesBackOnlyForTheSettleTime) {
  FakePlacementStore record;
  FakeNodeDirectory nodes({"n0", "n1", "n2"});
  FakeClock clock;
  ClusterNode::Options options{true, std::chrono::milliseconds(500)};
  Server n0("n0", options, &clock);
  n0.node->membership().Joined(&nodes, &record);
  nodes.Remove("n2");  // dies while etcd is up
  ASSERT_OK(n0.node->decisions().Create({"a", 6, 1}, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementCache::Placement p, n0.node->placements().GetPlacement("a"));
  EXPECT_EQ(p.nodes.size(), 2u);
  nodes.Fail(EtcdDown());
  n0.node->WatchMembers();
  nodes.Remove("n1");  // lost with the outage, never back
  nodes.Fail(absl::OkStatus());
  n0.node->WatchMembers();
  EXPECT_THAT(n0.node->decisions().Create({"b", 6, 1}, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "n1 was registered before"));
  clock.Advance(std::chrono::milliseconds(499));
  EXPECT_THAT(n0.node->decisions().Create({"b", 6, 1}, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "n1 was registered before"));
  clock.Advance(std::chrono::milliseconds(1));  // the settle time has passed
  EXPECT_THAT(n0.node->decisions().Create({"b", 6, 1}, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "replication 2 needs 2 servers and 1 is"));
  EXPECT_THAT(n0.node->decisions().Create({"b", 6, 1}, 4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "replication 4"));
  ASSERT_OK(n0.node->decisions().Create({"b", 6, 1}, 1).status());
  ASSERT_OK_AND_ASSIGN(p, n0.node->placements().GetPlacement("b"));
  EXPECT_EQ(p.nodes.size(), 1u);
}

// ClusterMembership on its own: an absent server is absent since it was first seen so, and
// measured afresh once etcd answers again (during an outage nobody could register).
TEST(ClusterMembershipTest, AbsentServersCountFromWhenFirstSeenAndAfreshAfterAnOutage) {
  FakeClock clock;
  FakeNodeDirectory nodes({"n0", "n1"});
  FakePlacementStore record;
  ClusterMembership m({true, std::chrono::seconds(20), std::chrono::seconds(1), &clock});
  m.Joined(&nodes, &record);
  ASSERT_OK_AND_ASSIGN(const std::vector<NodeEntry> live, m.Nodes());
  const Clock::time_point first = clock.Now();
  m.TrackAbsent(live, {"n0", "n1", "n2"});
  clock.Advance(std::chrono::seconds(5));
  m.TrackAbsent(live, {"n0", "n1", "n2"});
  ASSERT_EQ(m.Absent().size(), 1u);
  EXPECT_EQ(m.Absent().at("n2"), first) << "absent since it was first seen so";
  EXPECT_EQ(m.Since(m.Absent().at("n2")), std::chrono::seconds(5));
  m.Note(EtcdDown());
  m.Note(absl::OkStatus());
  EXPECT_TRUE(m.Absent().empty()) << "measured afresh from a time etcd answers";
}

// With etcd down, the last list read answers without asking etcd (and what needs etcd is
// refused naming it, with how long it has not answered); once the watch finds etcd back, the
// list is read again.
TEST(ClusterMembershipTest, WithEtcdDownTheLastListAnswersAndWhatNeedsEtcdIsRefused) {
  FakeClock clock;
  FakeNodeDirectory nodes({"n0", "n1", "n2"});
  FakePlacementStore record;
  ClusterMembership m({true, std::chrono::seconds(20), std::chrono::seconds(1), &clock});
  m.Joined(&nodes, &record);
  ASSERT_OK(m.Nodes().status());
  nodes.Remove("n2");
  nodes.Fail(EtcdDown());
  ASSERT_OK_AND_ASSIGN(std::vector<NodeEntry> last, m.Nodes());
  EXPECT_EQ(last.size(), 3u) << "the last list read";
  EXPECT_TRUE(m.etcd_down());
  clock.Advance(std::chrono::seconds(7));
  const absl::Status up = m.EtcdUp();
  EXPECT_THAT(up, StatusIs(absl::StatusCode::kUnavailable, "etcd has not answered for 7 s"));
  EXPECT_EQ(ReasonOf(up), ErrorReason::kEtcdUnavailable);
  nodes.Fail(absl::OkStatus());
  ASSERT_OK_AND_ASSIGN(last, m.Nodes());
  EXPECT_EQ(last.size(), 3u) << "etcd known down is not asked until the watch finds it back";
  ClusterMembership::Members members;
  ASSERT_TRUE(m.ReadMembers(&members));
  EXPECT_EQ(members.live.size(), 2u);
  ASSERT_OK_AND_ASSIGN(last, m.Nodes());
  EXPECT_EQ(last.size(), 2u);
  EXPECT_FALSE(m.etcd_down());
  EXPECT_OK(m.EtcdUp());
}

}  // namespace
}  // namespace sluice::testing
