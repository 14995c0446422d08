// Servers lost for good on a real cluster (docs/cluster.md, "Placement epochs"): a server killed
// for good is taken out of its shuffles' placements and its partitions are copied again by the
// servers themselves (over TLS with tokens, over mutual TLS); partitions whose every replica is
// gone are reported lost; a decommissioned server can be stopped; a repair cut by a kill of its
// server or of etcd resumes and is never served half-copied.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "rpc/error_reason.h"
#include "rpc/tls_options.h"
#include "tests/cluster/replication_fixture.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using replication_test::Clock;
using replication_test::ExpectExactlyTheWinners;
using replication_test::Job;
using replication_test::LostServerTest;
using replication_test::OrNull;
using replication_test::RunCli;
using replication_test::WriteWithRetries;
using testing::TempDir;

// Four secured servers: writes `job` at R = 2 (its winners in *winners), kills server `victim`
// for good, and waits until it is taken out and every partition is whole again on 2 registered
// servers, copied by the servers themselves (`admin(i)`: a client of server i allowed GetNode).
void WriteThenLoseOneForGood(ShuffleClient& client, testing::MiniCluster& cluster, const Job& job,
                             size_t victim,
                             const std::function<std::unique_ptr<ShuffleClient>(size_t)>& admin,
                             std::map<uint32_t, uint64_t>* winners) {
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto nodes = client.ListNodes();
        return nodes.ok() && nodes->size() == 4;
      },
      std::chrono::seconds(20)));
  ASSERT_OK(client.CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  for (uint32_t m = 0; m < job.mappers; ++m) {
    ASSERT_OK_AND_ASSIGN((*winners)[m], WriteWithRetries(client, job, m));
  }
  cluster.Kill(victim);
  ShuffleStatus status;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto placed = client.GetPlacement(job.id);
        if (!placed.ok() || placed->epoch == 0) return false;
        auto st = client.GetShuffle(job.id);
        if (!st.ok()) return false;
        status = *st;
        return status.under_replicated_partitions.empty();
      },
      std::chrono::seconds(60)))
      << "under-replicated: " << absl::StrJoin(status.under_replicated_partitions, ",");
  uint64_t repaired = 0;
  for (size_t i = 0; i < 4; ++i) {
    if (i == victim) continue;
    ASSERT_OK_AND_ASSIGN(NodeStatus node, admin(i)->GetNode());
    repaired += node.repaired_bytes;
  }
  EXPECT_GT(repaired, 0u) << "the copies were made over TLS by the servers";
}

// Re-replication where the servers serve TLS and ask for credentials: each dials the others
// over TLS (--peer_tls_ca; their certificates name localhost, hence --peer_tls_server_name) with
// an admin's token (--peer_token_file); a tenant's shuffle loses a server for good and is whole
// again on R = 2 registered servers, read exactly through TLS. A server without the peer flags
// does not repair and refuses a decommission, naming the flag.
TEST(SecureRepairTest, ServersWithTlsAndTokensRepairEachOther) {
  TempDir dir;
  ASSERT_EQ(std::system(absl::StrCat("bash ", SLUICE_SOURCE_DIR, "/tests/harness/make_certs.sh ",
                                     dir.path(), "/certs >/dev/null 2>&1")
                            .c_str()),
            0)
      << "make_certs.sh failed: is openssl installed?";
  const std::string certs = dir.path() + "/certs/";
  std::ofstream(dir.path() + "/credentials") << rpc::TokenHash("slc_peers") << " peers admin\n"
                                             << rpc::TokenHash("slc_a") << " team-a tenant\n";
  std::ofstream(dir.path() + "/peer-token") << "slc_peers\n";
  testing::MiniClusterOptions options;
  options.servers = 4;
  const std::vector<std::string> secure = {"--tls_cert=" + certs + "server.pem",
                                           "--tls_key=" + certs + "server.key",
                                           "--auth_file=" + dir.path() + "/credentials"};
  options.flags.insert(options.flags.end(), secure.begin(), secure.end());
  options.flags.push_back("--dead_after_s=2");
  options.flags.push_back("--peer_tls_ca=" + certs + "ca.pem");
  options.flags.push_back("--peer_tls_server_name=localhost");
  options.flags.push_back("--peer_token_file=" + dir.path() + "/peer-token");
  ASSERT_OK_AND_ASSIGN(auto cluster, testing::MiniCluster::Start(options));
  auto as = [&](const std::string& token) {
    ClientOptions o = testing::MiniCluster::ShortDeadlines();
    o.token = token;
    o.tls.ca_file = certs + "ca.pem";
    o.tls.server_name = "localhost";
    return o;
  };
  auto client = OrNull(cluster->Client(as("slc_a")));
  ASSERT_NE(client, nullptr);
  Job job;
  job.id = "secure";
  job.partitions = 8;
  std::map<uint32_t, uint64_t> winners;
  WriteThenLoseOneForGood(
      *client, *cluster, job, /*victim=*/1,
      [&](size_t i) { return OrNull(cluster->ClientOf(i, as("slc_peers"))); }, &winners);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectExactlyTheWinners(*client, job, FetchOrder::kKey, winners, job.items);
  // Without --peer_token_file: no repair, and a decommission says what is missing.
  ASSERT_OK_AND_ASSIGN(size_t plain, cluster->Add({"--peer_token_file="}));
  auto admin = OrNull(cluster->ClientOf(plain, as("slc_peers")));
  absl::StatusOr<ShuffleClient::DecommissionProgress> refused = admin->Decommission();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("--peer_token_file"), absl::string_view::npos)
      << refused.status();
}

// Under mutual TLS the servers show each other a client certificate (--peer_tls_cert) whose
// name the credentials file makes an admin: no token needed. Four servers that require client
// certificates, one killed for good: every partition whole again, copied over mutual TLS.
TEST(SecureRepairTest, ServersWithMutualTlsRepairEachOtherWithTheirCertificate) {
  TempDir dir;
  ASSERT_EQ(std::system(absl::StrCat("bash ", SLUICE_SOURCE_DIR, "/tests/harness/make_certs.sh ",
                                     dir.path(), "/certs >/dev/null 2>&1")
                            .c_str()),
            0)
      << "make_certs.sh failed: is openssl installed?";
  const std::string certs = dir.path() + "/certs/";
  std::ofstream(dir.path() + "/credentials") << "cn:sluice-peer peers admin\n"
                                             << "cn:tenant-a team-a tenant\n";
  testing::MiniClusterOptions options;
  options.servers = 4;
  for (const std::string& flag :
       {"--tls_cert=" + certs + "server.pem", "--tls_key=" + certs + "server.key",
        "--tls_client_ca=" + certs + "ca.pem", "--auth_file=" + dir.path() + "/credentials",
        std::string("--dead_after_s=2"), "--peer_tls_ca=" + certs + "ca.pem",
        std::string("--peer_tls_server_name=localhost"), "--peer_tls_cert=" + certs + "peer.pem",
        "--peer_tls_key=" + certs + "peer.key"}) {
    options.flags.push_back(flag);
  }
  ASSERT_OK_AND_ASSIGN(auto cluster, testing::MiniCluster::Start(options));
  auto as = [&](const std::string& who) {
    ClientOptions o = testing::MiniCluster::ShortDeadlines();
    o.tls.ca_file = certs + "ca.pem";
    o.tls.server_name = "localhost";
    o.tls.cert_file = certs + who + ".pem";
    o.tls.key_file = certs + who + ".key";
    return o;
  };
  auto client = OrNull(cluster->Client(as("client-a")));
  ASSERT_NE(client, nullptr);
  Job job;
  job.id = "mutual";
  job.partitions = 8;
  std::map<uint32_t, uint64_t> winners;
  WriteThenLoseOneForGood(
      *client, *cluster, job, /*victim=*/2,
      [&](size_t i) { return OrNull(cluster->ClientOf(i, as("peer"))); }, &winners);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectExactlyTheWinners(*client, job, FetchOrder::kUnordered, winners, job.items);
}

TEST_F(LostServerTest, AServerKilledForGoodDuringThePushesStopsNothing) {
  Job job;
  job.id = "lost";
  job.partitions = 8;
  job.mappers = 6;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo before, client_->GetPlacement(job.id));
  EXPECT_EQ(before.epoch, 0u);
  const size_t victim = 1;
  const std::string gone = cluster_->node_id(victim);
  const auto winners = WriteAllKilling(job, victim);
  ASSERT_EQ(winners.size(), job.mappers);
  std::printf("RESULT lost_server_kill_to_complete_s=%.1f\n",
              std::chrono::duration<double>(Clock::now() - killed_at_).count());
  const PlacementInfo after = PlacedWithout(job.id, gone);
  EXPECT_GE(after.epoch, 1u);
  ExpectWholeReplicaLists(after);
  // The survivors keep their partitions (and lead them), the lost server's go elsewhere.
  for (uint32_t p = 0; p < job.partitions; ++p) {
    const std::string old_primary = before.nodes[before.replicas[p][0]].node_id;
    if (old_primary != gone) {
      EXPECT_EQ(after.nodes[after.replicas[p][0]].node_id, old_primary) << "partition " << p;
    }
  }
  ExpectCounts(job);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
  // The servers say why it is gone (once its 2 s lease has run out: the writers revived it
  // before that).
  std::vector<AbsentNode> absent;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto listed = client_->AbsentNodes();
        if (listed.ok()) absent = *listed;
        return absent.size() == 1;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(absent[0].node_id, gone);
  EXPECT_TRUE(absent[0].dead) << "taken out of the placement";
  // Re-replication: within a bounded time every partition has 2 whole, registered replicas.
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(30)));
  ExpectCounts(job);
  EXPECT_EQ(under_replicated_, 0u);
  std::printf("RESULT lost_server_kill_to_whole_s=%.1f\n",
              std::chrono::duration<double>(Clock::now() - killed_at_).count());
  uint64_t repaired = 0;
  for (size_t i = 0; i < cluster_->size(); ++i) {
    if (!cluster_->running(i)) continue;
    ASSERT_OK_AND_ASSIGN(NodeStatus node, cluster_->Link(i)->client().GetNode());
    EXPECT_EQ(node.repair_backlog, 0u) << node.node_id;
    // (In bytes as of the repairer's last round, once a second: commits made meanwhile may
    // leave an estimate behind until the next.)
    EXPECT_TRUE(testing::Eventually(
        [&] {
          auto again = cluster_->Link(i)->client().GetNode();
          return again.ok() && again->repair_backlog_bytes == 0;
        },
        std::chrono::seconds(5)))
        << node.node_id;
    repaired += node.repaired_bytes;
  }
  EXPECT_GT(repaired, 0u) << "the lost server's replicas were copied";
  // Copied frames got their key bounds like pushed ones: every replica, repaired ones too, plans
  // splits from bounds alone (docs/api.md, "Split reads").
  for (uint32_t p = 0; p < job.partitions; ++p) {
    for (uint32_t n : after.replicas[p]) {
      if (after.nodes[n].address.empty()) continue;
      ASSERT_OK_AND_ASSIGN(SplitKeys splits,
                           Alone(after.nodes[n])->client().GetSplits(job.id, p, 2));
      EXPECT_GT(splits.frames, 0u) << "partition " << p << " on " << after.nodes[n].node_id;
      EXPECT_EQ(splits.frames_without_bounds, 0u)
          << "partition " << p << " on " << after.nodes[n].node_id;
    }
  }
  // Then a second server is lost for good: nothing is lost, the counts stay exact.
  size_t second = 0;
  while (second == victim || !cluster_->running(second)) ++second;
  cluster_->Kill(second);
  ExpectCounts(job);
  EXPECT_GT(under_replicated_, 0u) << "the second server's partitions lack a replica";
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
  // And once it is taken out and repaired in turn, R = 2 on the two servers left.
  PlacedWithout(job.id, cluster_->node_id(second));
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(30)));
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
}

TEST_F(LostServerTest, AServerBackWithAnEmptyDiskUnderANewIdTakesNothingBack) {
  Job job;
  job.id = "renamed";
  job.partitions = 8;
  job.mappers = 4;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  const size_t victim = 2;
  const std::string gone = cluster_->node_id(victim);
  const auto winners = WriteAllKilling(job, victim, [&] {
    ASSERT_OK(cluster_->Wipe(victim));
    ASSERT_OK(cluster_->Restart(victim, {"--node_id=n9"}));
  });
  ASSERT_EQ(winners.size(), job.mappers);
  const PlacementInfo after = PlacedWithout(job.id, gone);
  ExpectWholeReplicaLists(after);
  ExpectCounts(job);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
}

// Both replicas of some partitions killed for good (R = 2): once they are taken out, GetShuffle
// names exactly those partitions as lost, each with every committed mapper (each wrote to
// every partition); the others are whole again; a reader of a lost partition never gets a
// short partition as if whole; `sluice status` says LOST.
TEST_F(LostServerTest, PartitionsWhoseEveryReplicaIsGoneAreReportedLostWithTheirMappers) {
  Job job;
  job.id = "lost";
  job.partitions = 8;
  job.mappers = 4;
  CreateAndWriteAll(job, 2);
  ASSERT_OK_AND_ASSIGN(const PlacementInfo before, client_->GetPlacement(job.id));
  std::set<std::string> victims;
  for (uint32_t n : before.replicas[0]) victims.insert(before.nodes[n].node_id);
  std::set<uint32_t> expected;  // the partitions kept by the victims alone
  for (uint32_t p = 0; p < job.partitions; ++p) {
    bool elsewhere = false;
    for (uint32_t n : before.replicas[p]) elsewhere |= !victims.count(before.nodes[n].node_id);
    if (!elsewhere) expected.insert(p);
  }
  for (size_t i = 0; i < 4; ++i) {
    if (victims.count(cluster_->node_id(i))) cluster_->Kill(i);
  }
  for (const std::string& gone : victims) PlacedWithout(job.id, gone);
  std::set<uint32_t> lost;
  ShuffleStatus status;
  EXPECT_TRUE(testing::Eventually(
      [&] {
        auto st = client_->GetShuffle(job.id);
        if (!st.ok()) return false;
        status = *st;
        lost.clear();
        for (const LostPartition& l : status.lost_partitions) lost.insert(l.partition);
        return lost == expected && status.under_replicated_partitions.size() == expected.size();
      },
      std::chrono::seconds(30)))
      << "lost " << absl::StrJoin(lost, ",") << " expected " << absl::StrJoin(expected, ",")
      << "; under-replicated " << absl::StrJoin(status.under_replicated_partitions, ",");
  for (const LostPartition& l : status.lost_partitions) {
    EXPECT_EQ(l.mappers, (std::vector<uint32_t>{0, 1, 2, 3})) << "partition " << l.partition;
  }
  // A lost partition's reader fails, retryably (a server may yet come back), never short.
  ReaderOptions options;
  options.require_complete = true;
  ASSERT_OK_AND_ASSIGN(auto reader, client_->OpenReader(job.id, *expected.begin(), options));
  Record r;
  absl::StatusOr<bool> more = true;
  while (more.ok() && *more) more = reader->Next(&r);
  EXPECT_TRUE(absl::IsUnavailable(more.status())) << more.status();
  // Every other partition reads whole.
  for (uint32_t p = 0; p < job.partitions; ++p) {
    if (expected.count(p)) continue;
    ASSERT_OK_AND_ASSIGN(auto whole, client_->OpenReader(job.id, p, options));
    uint64_t n = 0;
    for (;;) {
      ASSERT_OK_AND_ASSIGN(bool any, whole->Next(&r));
      if (!any) break;
      ++n;
    }
    EXPECT_EQ(n, status.partitions[p].records) << "partition " << p;
  }
  std::string text;
  RunCli(absl::StrCat("status --server ", cluster_->addresses(), " --shuffle ", job.id), &text);
  EXPECT_NE(text.find(absl::StrCat("LOST partition ", *expected.begin(),
                                   ": no server holds the records of mappers 0, 1, 2, 3")),
            std::string::npos)
      << text;
}

// Decommission under load: readers read the whole time and never fail, writers' attempts in
// flight are retried onto the new placement, and once the server says it may be stopped a kill
// -9 of it loses nothing.
TEST_F(LostServerTest, ADecommissionedServerCanBeStoppedWithoutLosingAReplica) {
  Job job;
  job.id = "leave";
  job.partitions = 8;
  job.mappers = 6;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  std::map<uint32_t, uint64_t> winners;
  for (uint32_t m = 0; m < job.mappers / 2; ++m) {
    ASSERT_OK_AND_ASSIGN(winners[m], WriteWithRetries(*client_, job, m));
  }
  // Readers of what is committed, all along.
  std::atomic<bool> reading{true};
  std::atomic<int> reads{0}, failed_reads{0};
  const std::map<uint32_t, uint64_t> first = winners;
  std::thread reader([&] {
    ASSERT_OK_AND_ASSIGN(auto own, cluster_->Client());
    while (reading.load()) {
      for (uint32_t p = 0; p < job.partitions && reading.load(); ++p) {
        ReaderOptions options;
        options.order = FetchOrder::kKey;
        auto r = own->OpenReader(job.id, p, options);
        if (!r.ok()) {
          ++failed_reads;
          continue;
        }
        Record rec;
        absl::StatusOr<bool> more;
        while ((more = (*r)->Next(&rec)).ok() && *more) {
        }
        more.ok() ? ++reads : ++failed_reads;
      }
    }
  });
  const size_t leaving = 2;
  std::unique_ptr<ServerLink> link = cluster_->Link(leaving);
  const auto started = Clock::now();
  ASSERT_OK_AND_ASSIGN(auto progress, link->client().Decommission());
  ASSERT_OK_AND_ASSIGN(NodeStatus node, link->client().GetNode());
  EXPECT_TRUE(node.decommissioning);
  // The rest of the mappers, while it leaves: attempts routed by the old placement retry.
  for (uint32_t m = job.mappers / 2; m < job.mappers; ++m) {
    ASSERT_OK_AND_ASSIGN(winners[m], WriteWithRetries(*client_, job, m, nullptr, 1, 50));
  }
  // A shuffle created now is not placed on it.
  ASSERT_OK(client_->CreateShuffle("after", 8, 1, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement("after"));
  for (const auto& r : after.replicas) {
    for (uint32_t n : r) EXPECT_NE(after.nodes[n].node_id, cluster_->node_id(leaving));
  }
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto p = link->client().Decommission();
        return p.ok() && p->done;
      },
      std::chrono::seconds(30)));
  std::printf("RESULT decommission_s=%.1f\n",
              std::chrono::duration<double>(Clock::now() - started).count());
  reading.store(false);
  reader.join();
  EXPECT_EQ(failed_reads.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(5)));
  cluster_->Kill(leaving);
  ExpectCounts(job);
  EXPECT_EQ(under_replicated_, 0u) << "nothing was kept only on the server that left";
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
}

// Re-replication slowed to 1 MB/s, so that a kill lands in the middle of a copy; a server
// unregistered for 10 s is taken out (the repairing server's restart takes less).
class SlowRepairTest : public LostServerTest {
 protected:
  void SetUp() override {
    testing::MiniClusterOptions options;
    options.servers = 4;
    options.flags.push_back("--dead_after_s=10");
    options.flags.push_back("--repair_mb_per_s=1");
    ASSERT_OK_AND_ASSIGN(cluster_, testing::MiniCluster::Start(options));
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  }
};

TEST_F(SlowRepairTest, ARepairCutByAKillResumesAndIsNeverServedHalfCopied) {
  Job job;
  job.id = "slow";
  job.partitions = 4;
  job.mappers = 4;
  job.items = 1500;
  job.filler = 2000;  // ~0.75 MB a mapper a partition: seconds to copy at 1 MB/s
  const auto winners = CreateAndWriteAll(job, 2);
  ASSERT_EQ(winners.size(), job.mappers);
  const size_t victim = 1;
  cluster_->Kill(victim);
  const PlacementInfo after = PlacedWithout(job.id, cluster_->node_id(victim));
  // A server that took a partition over and lacks its mappers: it refuses to serve it.
  size_t repairing = 0;
  uint32_t partition = 0;
  bool found = false;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        for (uint32_t p = 0; p < job.partitions && !found; ++p) {
          for (uint32_t n : after.replicas[p]) {
            auto here = Alone(after.nodes[n])->client().GetShuffle(job.id);
            if (here.ok() && here->partitions[p].missing_mappers > 0) {
              partition = p;
              repairing = static_cast<size_t>(after.nodes[n].node_id.back() - '0');
              found = true;
              break;
            }
          }
        }
        return found;
      },
      std::chrono::seconds(15)));
  std::unique_ptr<ServerLink> link = cluster_->Link(repairing);
  ReaderOptions read;
  ASSERT_OK_AND_ASSIGN(auto direct, link->client().OpenReader(job.id, partition, read));
  Record r;
  const absl::Status refused = direct->Next(&r).status();
  EXPECT_EQ(ReasonOf(refused), ErrorReason::kIncomplete) << Describe(refused);
  // Killed in the middle of its copies (some made, some not), and back at once.
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto node = link->client().GetNode();
        return node.ok() && node->repaired_bytes > 0;
      },
      std::chrono::seconds(20)));
  ASSERT_OK_AND_ASSIGN(NodeStatus before_kill, link->client().GetNode());
  EXPECT_GT(before_kill.repair_backlog, 0u) << "the kill should land before the copies end";
  // What is left, in bytes: at most the partitions' frame bytes it lacks (~0.75 MB a mapper).
  EXPECT_GT(before_kill.repair_backlog_bytes, 0u);
  EXPECT_LE(before_kill.repair_backlog_bytes,
            uint64_t{job.partitions} * job.mappers * job.items * (job.filler + 64));
  cluster_->Kill(repairing);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ASSERT_OK(cluster_->Restart(repairing));
  // It resumes: every replica whole, and the same records everywhere.
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(60)));
  // (A new client: the first still asks the server it saw die after the others, for a while.)
  ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  ExpectCounts(job);
  EXPECT_EQ(under_replicated_, 0u);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
}

// etcd (the leader: the only member) killed -9 at random moments while servers copy, and
// restarted on its data: the repair resumes, no live server is taken out, a read in the middle
// of an outage is exact, and every replica ends whole and equal.
TEST_F(SlowRepairTest, EtcdKilledAtRandomMomentsDuringARepairLosesAndHalfServesNothing) {
  Job job;
  job.id = "etcdkill";
  job.partitions = 4;
  job.mappers = 4;
  job.items = 1500;
  job.filler = 2000;
  const auto winners = CreateAndWriteAll(job, 2);
  ASSERT_EQ(winners.size(), job.mappers);
  const size_t victim = 2;
  cluster_->Kill(victim);
  PlacedWithout(job.id, cluster_->node_id(victim));
  ASSERT_TRUE(testing::Eventually(
      [&] {
        uint64_t repaired = 0;
        for (size_t i = 0; i < 4; ++i) {
          if (i == victim) continue;
          auto node = cluster_->Link(i)->client().GetNode();
          if (node.ok()) repaired += node->repaired_bytes;
        }
        return repaired > 0;
      },
      std::chrono::seconds(20)));
  const unsigned seed = static_cast<unsigned>(
      std::chrono::steady_clock::now().time_since_epoch().count() & 0xffffffff);
  std::mt19937 random(seed);
  std::uniform_int_distribution<int> up_ms(100, 1500), down_ms(200, 2000);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(up_ms(random)));
    cluster_->etcd().Signal(SIGKILL);
    if (round == 0) {  // readers go on while etcd is down
      ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(down_ms(random)));
    ASSERT_OK(cluster_->etcd().Restart()) << "seed " << seed;
  }
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(90))) << "seed " << seed;
  ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  ASSERT_OK_AND_ASSIGN(const PlacementInfo placed, client_->GetPlacement(job.id));
  ExpectWholeReplicaLists(placed);  // (no live server taken out by the outages)
  ExpectCounts(job);
  EXPECT_EQ(under_replicated_, 0u) << "seed " << seed;
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
}

}  // namespace
}  // namespace sluice
