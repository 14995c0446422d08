// The partition tests' fixture (partition_test.cc; the long heals in
// partition_stress_test.cc): a server in a network namespace the test makes
// (tests/harness/netns.h), three on the host's loopback, a real etcd on the host; the server's
// links to its clients and servers, or to etcd, are taken down and brought up again. The grace
// is long (--dead_after_s=600), so that only a revive moves a shuffle. Skipped where namespaces
// cannot be made (not root, no iproute2).
#ifndef SLUICE_TESTS_CLUSTER_PARTITION_FIXTURE_H_
#define SLUICE_TESTS_CLUSTER_PARTITION_FIXTURE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
using testing::ServerNetns;

class PartitionTest : public LostServerTest {
 protected:
  void SetUp() override {
    auto ns = ServerNetns::Make();
    if (!ns.ok()) GTEST_SKIP() << ns.status();
    ns_ = std::move(ns).value();
    testing::MiniClusterOptions options;
    options.servers = 3;
    options.lease_s = 3;
    options.flags.push_back("--dead_after_s=600");
    options.etcd_also_on = ns_->b_host();
    ASSERT_OK_AND_ASSIGN(cluster_, testing::MiniCluster::Start(options));
    const std::string& endpoint = cluster_->etcd_endpoint();
    const std::string etcd = ns_->b_host() + endpoint.substr(endpoint.rfind(':'));
    // (A private address on a veth the test made: served in clear, as on loopback.)
    ASSERT_OK_AND_ASSIGN(inside_,
                         cluster_->AddIn({ns_->name(), ns_->a_inside(), etcd}, {"--plaintext"}));
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
    cluster_.reset();  // (its servers first: the namespace's goes with them)
    ns_.reset();
  }

  // Cuts the server's `links` for `cut_for` in the middle of a job's pushes: the writers revive
  // it and commit without it; healed, it makes no second winner and serves no short read, and
  // its partitions are whole again on the others.
  void CutWriteHeal(const std::string& id, const std::vector<ServerNetns::Link>& links,
                    std::chrono::seconds cut_for) {
    Job job;
    job.id = id;
    job.partitions = 8;
    job.mappers = 6;
    ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShuffleClient> stale, cluster_->Client());
    ASSERT_OK(stale->GetPlacement(job.id).status());
    std::map<uint32_t, uint64_t> winners;
    WriteAtOnce(job, 0, 3, 4, &winners);
    const std::string gone = cluster_->node_id(inside_);
    const auto cut_at = Clock::now();
    for (ServerNetns::Link link : links) ASSERT_TRUE(ns_->Cut(link));
    const double stall = WriteAtOnce(job, 3, job.mappers, 4, &winners);
    std::printf("RESULT partition_%s_longest_mapper_s=%.1f\n", id.c_str(), stall);
    ASSERT_EQ(winners.size(), job.mappers);
    ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement(job.id));
    EXPECT_EQ(after.epoch, 1u);
    ExpectWithout(after, gone);
    std::this_thread::sleep_until(cut_at + cut_for);
    for (ServerNetns::Link link : links) ASSERT_TRUE(ns_->Heal(link));
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
    EXPECT_EQ(last.epoch, 1u) << "healing moves nothing back, and makes no further epoch";
  }

  std::unique_ptr<ServerNetns> ns_;
  size_t inside_ = 0;
};

}  // namespace sluice::partition_test

#endif  // SLUICE_TESTS_CLUSTER_PARTITION_FIXTURE_H_
