// Membership and placement against a real etcd: sluice-server processes, each on its own
// loopback address (127.0.0.2, 127.0.0.3, ...), register with --etcd and list each other; a
// stopped server leaves at once, a killed one when its lease expires, a restarted one takes
// its id back at once, and a second server with a taken id is refused, naming the first. A
// shuffle is placed once and every server gives the same placement.
#include "cluster/membership.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/server_process.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "server/sluice_server.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using testing::MiniCluster;
using testing::MiniClusterOptions;
using testing::MiniServer;
using testing::MiniServerOptions;
using testing::StatusIs;
using testing::TempDir;

// Server i alone (the client of a server list would route by placement and gather a shuffle's
// status from all its servers), with calls of up to 10 s.
std::shared_ptr<ShuffleClient> Alone(const MiniCluster& cluster, size_t i) {
  ClientOptions options = MiniCluster::ShortDeadlines();
  options.call_deadline = std::chrono::seconds(10);
  std::shared_ptr<ServerLink> link = cluster.Link(i, options);
  return std::shared_ptr<ShuffleClient>(link, &link->client());
}

std::vector<std::string> Ids(const std::vector<NodeAddress>& nodes) {
  std::vector<std::string> out;
  for (const auto& n : nodes) out.push_back(n.node_id);
  return out;
}

// n servers registering with a lease of `lease_s`.
absl::StatusOr<std::unique_ptr<MiniCluster>> StartCluster(size_t n, int lease_s) {
  MiniClusterOptions options;
  options.servers = n;
  options.lease_s = lease_s;
  options.flags = {"--log_level=warn"};
  return MiniCluster::Start(options);
}

TEST(MembershipTest, ServersListEachOtherAndLeaveWhenStoppedOrDead) {
  ASSERT_OK_AND_ASSIGN(auto cluster, StartCluster(3, 2));
  for (size_t i = 0; i < 3; ++i) {
    auto client = Alone(*cluster, i);
    ASSERT_OK_AND_ASSIGN(std::vector<NodeAddress> nodes, client->ListNodes());
    ASSERT_EQ(Ids(nodes), (std::vector<std::string>{"n0", "n1", "n2"})) << "asked " << i;
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(nodes[j].address, cluster->address(j));
      EXPECT_GT(nodes[j].started_unix_ms, 0u);
    }
    ASSERT_OK_AND_ASSIGN(NodeStatus self, client->GetNode());
    EXPECT_EQ(self.node_id, cluster->node_id(i));
    EXPECT_EQ(self.address, cluster->address(i));
    EXPECT_TRUE(self.serving);
    EXPECT_TRUE(self.clustered);
    EXPECT_TRUE(self.registered);
    EXPECT_GT(self.disk_free_bytes, 0u);
    EXPECT_GE(self.disk_total_bytes, self.disk_free_bytes);
    EXPECT_EQ(self.memory_budget_bytes, uint64_t{256} << 20);
  }
  auto c0 = Alone(*cluster, 0);
  // Stopped (SIGTERM): it revokes its lease and is gone at once.
  ASSERT_OK(cluster->Stop(1));
  ASSERT_OK_AND_ASSIGN(auto after_stop, c0->ListNodes());
  EXPECT_EQ(Ids(after_stop), (std::vector<std::string>{"n0", "n2"}));
  // Killed: listed until its 2 s lease expires, then gone.
  cluster->Kill(2);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto nodes = c0->ListNodes();
        return nodes.ok() && Ids(*nodes) == std::vector<std::string>{"n0"};
      },
      std::chrono::seconds(8)));
  EXPECT_GE(std::chrono::steady_clock::now() - killed, std::chrono::milliseconds(500))
      << "a dead server should stay listed until its lease expires";
}

TEST(MembershipTest, ARestartAtTheSameAddressTakesItsIdBackAtOnce) {
  // A 30 s lease: waiting for the dead one's registration to expire would take that long.
  ASSERT_OK_AND_ASSIGN(auto cluster, StartCluster(1, 30));
  cluster->Kill(0);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK(cluster->Restart(0));  // the same address
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  auto client = Alone(*cluster, 0);
  ASSERT_OK_AND_ASSIGN(auto nodes, client->ListNodes());
  ASSERT_EQ(Ids(nodes), std::vector<std::string>{"n0"});
  ASSERT_OK_AND_ASSIGN(NodeStatus self, client->GetNode());
  EXPECT_EQ(nodes[0].started_unix_ms, self.started_unix_ms) << "the old registration is listed";
  ASSERT_OK(cluster->Stop(0));
}

TEST(MembershipTest, ATakenIdIsRefusedNamingItsServerAndAnUnreachableEtcdIsNamed) {
  ASSERT_OK_AND_ASSIGN(auto cluster, StartCluster(1, 2));
  TempDir d1, d2;
  ServerOptions o;
  o.data_dir = d1.path();
  o.listen_address = "127.0.0.3:0";
  o.worker_threads = 2;
  o.etcd_endpoints = cluster->etcd_endpoint();
  o.node_id = "n0";
  o.node_lease_ttl = std::chrono::seconds(2);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(SluiceServer::Start(o),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "node id 'n0' is registered by a live server at " + cluster->address(0)));
  // It waited for the registration to expire (one TTL and a second), not longer.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
  // The first one was not disturbed.
  auto client = Alone(*cluster, 0);
  ASSERT_OK_AND_ASSIGN(NodeStatus self, client->GetNode());
  EXPECT_TRUE(self.registered);

  o.data_dir = d2.path();
  o.node_id = "n9";
  o.etcd_endpoints =
      "127.0.0.1:" + std::to_string(*testing::FreePort("127.0.0.1"));  // nobody there
  EXPECT_THAT(SluiceServer::Start(o),
              StatusIs(absl::StatusCode::kUnavailable,
                       "could not join the cluster: etcd lease grant at " + o.etcd_endpoints));
  o.node_id = "bad id!";
  EXPECT_THAT(SluiceServer::Start(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "node id 'bad id!' must be"));
}

// A shuffle is placed once, by the first CreateShuffle on any server, and recorded in etcd:
// every server then gives the same placement, a server that joins later changes nothing, and
// a server holding some of its partitions makes its store on first use.
TEST(MembershipTest, AShuffleIsPlacedOnceAndEveryServerGivesThePlacement) {
  ASSERT_OK_AND_ASSIGN(auto cluster, StartCluster(3, 5));
  std::vector<std::shared_ptr<ShuffleClient>> clients;
  for (size_t i = 0; i < 3; ++i) clients.push_back(Alone(*cluster, i));
  // Two servers create it at once: both succeed, one of them created it.
  absl::StatusOr<bool> a, b;
  std::thread ta([&] { a = clients[0]->CreateShuffle("job", 12, 4, 2); });
  std::thread tb([&] { b = clients[1]->CreateShuffle("job", 12, 4, 2); });
  ta.join();
  tb.join();
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_NE(*a, *b) << "exactly one of two racing creates creates";
  ASSERT_OK_AND_ASSIGN(PlacementInfo p, clients[2]->GetPlacement("job"));
  EXPECT_EQ(p.num_partitions, 12u);
  EXPECT_EQ(p.num_mappers, 4u);
  EXPECT_EQ(p.replication, 2u);
  ASSERT_EQ(p.nodes.size(), 3u);
  ASSERT_EQ(p.replicas.size(), 12u);
  std::vector<int> load(3, 0);
  for (const auto& r : p.replicas) {
    ASSERT_EQ(r.size(), 2u);
    EXPECT_NE(r[0], r[1]);
    for (uint32_t i : r) ++load[i];
  }
  EXPECT_EQ(load, (std::vector<int>{8, 8, 8}));
  for (auto& c : clients) {
    ASSERT_OK_AND_ASSIGN(PlacementInfo q, c->GetPlacement("job"));
    EXPECT_EQ(q.replicas, p.replicas);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(q.nodes[i].address, p.nodes[i].address);
  }
  // The same again is not created again; other arguments are refused, naming the recorded ones.
  ASSERT_OK_AND_ASSIGN(bool again, clients[2]->CreateShuffle("job", 12, 4));
  EXPECT_FALSE(again);
  EXPECT_THAT(clients[2]->CreateShuffle("job", 13, 4),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       "already exists with 12 partitions, 4 mappers and replication 2"));
  EXPECT_THAT(clients[0]->CreateShuffle("job", 12, 4, 3),
              StatusIs(absl::StatusCode::kAlreadyExists, "replication 2"));
  // Every server holds some of it: each makes its store on first use.
  for (auto& c : clients) {
    ASSERT_OK_AND_ASSIGN(ShuffleStatus st, c->GetShuffle("job"));
    EXPECT_EQ(st.num_partitions, 12u);
  }
  // A fourth server joins: the recorded placement does not change.
  ASSERT_OK(cluster->Add().status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo after, clients[1]->GetPlacement("job"));
  EXPECT_EQ(after.replicas, p.replicas);
  EXPECT_EQ(after.nodes.size(), 3u);
  // A shuffle of one partition on one server: the others hold none of it, and say so.
  ASSERT_OK(clients[0]->CreateShuffle("one", 1, 0, 1).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo one, clients[0]->GetPlacement("one"));
  ASSERT_EQ(one.nodes.size(), 4u);
  const uint32_t owner = one.replicas[0][0];
  auto other = Alone(*cluster, cluster->index_of(one.nodes[(owner + 1) % 4].node_id));
  EXPECT_THAT(other->GetShuffle("one"), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                 "holds no partition of shuffle 'one'"));
  auto holder = Alone(*cluster, cluster->index_of(one.nodes[owner].node_id));
  EXPECT_OK(holder->GetShuffle("one").status());
  EXPECT_THAT(clients[0]->GetPlacement("none"),
              StatusIs(absl::StatusCode::kNotFound, "'none' not found in the cluster"));
  EXPECT_THAT(clients[0]->CreateShuffle("four", 2, 0, 5),
              StatusIs(absl::StatusCode::kInvalidArgument, "replication 5"));
  // Deleted: its record goes first, so no server makes its store again from etcd.
  ASSERT_OK(clients[1]->DeleteShuffle("job"));
  EXPECT_THAT(clients[2]->GetPlacement("job"), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(clients[1]->GetShuffle("job"), StatusIs(absl::StatusCode::kNotFound, ""));
  ASSERT_OK(other->DeleteShuffle("one"));  // recorded, held elsewhere: deleted all the same
  EXPECT_THAT(other->DeleteShuffle("one"), StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST(MembershipAloneTest, AServerWithoutEtcdListsItself) {
  MiniServerOptions o;
  o.server.node_id = "solo";
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(o));
  const std::string address = server->address();
  EXPECT_EQ(server->server()->address(), address);
  ASSERT_OK_AND_ASSIGN(auto client, server->Client());
  ASSERT_OK_AND_ASSIGN(auto nodes, client->ListNodes());
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].node_id, "solo");
  EXPECT_EQ(nodes[0].address, address);
  ASSERT_OK_AND_ASSIGN(NodeStatus self, client->GetNode());
  EXPECT_FALSE(self.clustered);
  EXPECT_FALSE(self.registered);
  EXPECT_EQ(self.shuffles, 0u);
  // On its own, every partition is here.
  ASSERT_OK(client->CreateShuffle("s", 3, 0).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo p, client->GetPlacement("s"));
  EXPECT_EQ(p.replication, 1u);
  ASSERT_EQ(p.nodes.size(), 1u);
  EXPECT_EQ(p.nodes[0].address, address);
  EXPECT_EQ(p.replicas, (std::vector<std::vector<uint32_t>>{{0}, {0}, {0}}));
}

}  // namespace
}  // namespace sluice
