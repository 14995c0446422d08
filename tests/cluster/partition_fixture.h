// The partition tests' fixture (partition_test.cc; the long heals in
// partition_stress_test.cc): four servers in network namespaces the test makes
// (tests/harness/netns.h): three together, one alone, and a real etcd and the clients on the
// host; the lone server is cut off from its writers and readers, from the other servers, from
// etcd, or from several of them, and healed. The grace is long (--dead_after_s=600), so that
// only a revive moves a shuffle. Skipped where namespaces cannot be made (not root, no
// iproute2).
#ifndef SLUICE_TESTS_CLUSTER_PARTITION_FIXTURE_H_
#define SLUICE_TESTS_CLUSTER_PARTITION_FIXTURE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/shuffle_client.h"
#include "tests/cluster/replication_fixture.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/netns.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/wait.h"

namespace sluice::partition_test {

using replication_test::Clock;
using replication_test::ExpectExactlyTheWinners;
using replication_test::Job;
using replication_test::LostServerTest;
using testing::PartitionNet;

class PartitionTest : public LostServerTest {
 protected:
  void SetUp() override {
    auto net = PartitionNet::Make();
    if (!net.ok()) GTEST_SKIP() << net.status();
    net_ = std::move(net).value();
    testing::MiniClusterOptions options;
    options.servers = 0;
    options.lease_s = 3;
    options.flags.push_back("--dead_after_s=600");
    options.flags.push_back("--plaintext");  // (private addresses on veths the test made)
    options.etcd_also_on = net_->etcd_host();
    ASSERT_OK_AND_ASSIGN(cluster_, testing::MiniCluster::Start(options));
    const std::string etcd = absl::StrCat(net_->etcd_host(), ":", EtcdPort());
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK(cluster_->AddIn({net_->peers_netns(), net_->peer_host(i), etcd}).status());
    }
    ASSERT_OK_AND_ASSIGN(cut_, cluster_->AddIn({net_->cut_netns(), net_->cut_host(), etcd}));
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
    ASSERT_TRUE(testing::Eventually(
        [&] {
          auto nodes = client_->ListNodes();
          return nodes.ok() && nodes->size() == 4;
        },
        std::chrono::seconds(20)));
  }
  void TearDown() override {
    client_.reset();
    cluster_.reset();  // (its servers first: the namespaces go with them)
    net_.reset();
  }

  // Cuts the lone server off from `kinds` in the middle of a job's pushes. Cut from its
  // writers, they revive it and commit without it, and readers read the others at once; cut
  // from the other servers alone, nobody waits for it. Healed, it makes no second winner and
  // serves no short read, and every replica is whole again.
  void CutWriteHeal(const std::string& id, const std::vector<PartitionNet::Kind>& kinds,
                    std::chrono::seconds cut_for) {
    auto has = [&](PartitionNet::Kind k) {
      return std::find(kinds.begin(), kinds.end(), k) != kinds.end();
    };
    // (Cut from etcd alone, a writer that sees it unregistered may revive it.)
    const bool from_writers = has(PartitionNet::kWriters), from_etcd = has(PartitionNet::kEtcd);
    Job job;
    job.id = id;
    job.partitions = 8;
    job.mappers = 6;
    ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShuffleClient> stale, cluster_->Client());
    ASSERT_OK(stale->GetPlacement(job.id).status());
    std::map<uint32_t, uint64_t> winners;
    WriteAtOnce(job, 0, 3, 4, &winners);
    const std::string gone = cluster_->node_id(cut_);
    const auto cut_at = Clock::now();
    for (PartitionNet::Kind kind : kinds) {
      ASSERT_TRUE(net_->Cut(kind));
      ASSERT_FALSE(net_->Reaches(kind, PortOf(kind))) << "cut " << kind;
    }
    const double stall = WriteAtOnce(job, 3, job.mappers, 4, &winners);
    std::printf("RESULT partition_%s_longest_mapper_s=%.1f\n", id.c_str(), stall);
    ASSERT_EQ(winners.size(), job.mappers);
    ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement(job.id));
    if (from_writers) {
      EXPECT_EQ(after.epoch, 1u) << "one revive";
    } else {
      EXPECT_LE(after.epoch, from_etcd ? 1u : 0u) << "no revive unless it left etcd";
    }
    if (after.epoch == 1) ExpectWithout(after, gone);
    // Read while it is still cut off: a reader holding the first epoch's placement too.
    const auto read_at = Clock::now();
    ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
    ExpectExactlyTheWinners(*stale, job, FetchOrder::kUnordered, winners, job.items);
    const double read_s = std::chrono::duration<double>(Clock::now() - read_at).count();
    std::printf("RESULT partition_%s_read_while_cut_s=%.1f\n", id.c_str(), read_s);
    // (A server cut off is passed over at once, or after one brief etcd read: 1 s.)
    EXPECT_LT(read_s, 3.5) << "readers wait no etcd deadline on a server cut off";
    std::this_thread::sleep_until(cut_at + cut_for);
    for (PartitionNet::Kind kind : kinds) {
      ASSERT_TRUE(net_->Heal(kind));
      ASSERT_TRUE(net_->Reaches(kind, PortOf(kind))) << "healed " << kind;
    }
    ASSERT_TRUE(testing::Eventually(
        [&] {
          auto nodes = client_->ListNodes();
          return nodes.ok() && nodes->size() == 4;
        },
        std::chrono::seconds(20)))
        << "registered again";
    ExpectCounts(job);
    ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
    ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
    ExpectExactlyTheWinners(*stale, job, FetchOrder::kKey, winners, job.items);
    ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(30)));
    ASSERT_OK_AND_ASSIGN(PlacementInfo last, client_->GetPlacement(job.id));
    EXPECT_EQ(last.epoch, after.epoch) << "healing moves nothing back, and makes no further epoch";
  }

  // The port a cut of `kind` is checked on (etcd's, or the cut server's).
  int PortOf(PartitionNet::Kind kind) const {
    return kind == PartitionNet::kEtcd ? EtcdPort() : cluster_->port(cut_);
  }
  int EtcdPort() const {
    const std::string& endpoint = cluster_->etcd_endpoint();
    return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  }

  std::unique_ptr<PartitionNet> net_;
  size_t cut_ = 0;  // (the lone server's index)
};

}  // namespace sluice::partition_test

#endif  // SLUICE_TESTS_CLUSTER_PARTITION_FIXTURE_H_
