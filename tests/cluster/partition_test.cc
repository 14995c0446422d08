// Partitions, not only deaths (docs/cluster.md, "Revive"): the fixture is
// partition_fixture.h; the heals after 90 s are in partition_stress_test.cc (label stress).
#include "tests/cluster/partition_fixture.h"

namespace sluice::partition_test {
namespace {

// Cut off from its writers and readers alone: the other servers and etcd still reach it.
TEST_F(PartitionTest, CutFromItsWritersThenHealedLosesNothing) {
  CutWriteHeal("writers", {PartitionNet::kWriters}, std::chrono::seconds(10));
}

// Cut off from the other servers alone: its writers and etcd still reach it.
TEST_F(PartitionTest, CutFromTheOtherServersThenHealedLosesNothing) {
  CutWriteHeal("servers", {PartitionNet::kServers}, std::chrono::seconds(10));
}

// Cut off from its writers and the other servers (not from etcd: it stays registered).
TEST_F(PartitionTest, CutFromItsWritersAndServersThenHealedLosesNothing) {
  CutWriteHeal("cut", {PartitionNet::kWriters, PartitionNet::kServers}, std::chrono::seconds(10));
}

// Cut off from everything, etcd too (its lease runs out), then back.
TEST_F(PartitionTest, CutOffBothWaysThenHealedLosesNothing) {
  CutWriteHeal("both", {PartitionNet::kWriters, PartitionNet::kServers, PartitionNet::kEtcd},
               std::chrono::seconds(10));
}

// Cut off from etcd alone, under writers from the start and readers at once: nobody waits on
// it (a reader there waits one brief etcd read at most, not etcd's deadline).
TEST_F(PartitionTest, CutFromEtcdAloneUnderWritersAndReadersThenHealedLosesNothing) {
  CutWriteHeal("etcd", {PartitionNet::kEtcd}, std::chrono::seconds(10));
}

// Cut off from etcd alone, for 10 s: once its lease has run out, mappers write (a writer whose
// placement is fresh sees it unregistered and may revive it; one with the placement it had
// pushes to it, and servers that reach etcd decide); every mapper commits, and once healed it
// registers again and every record is read once.
TEST_F(PartitionTest, CutFromEtcdAloneStopsNoWriterAndLosesNothing) {
  Job job;
  job.id = "noetcd";
  job.partitions = 8;
  job.mappers = 6;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  std::map<uint32_t, uint64_t> winners;
  WriteAtOnce(job, 0, 2, 4, &winners);  // (every server has read the placement)
  const auto cut_at = Clock::now();
  ASSERT_TRUE(net_->Cut(PartitionNet::kEtcd));
  ASSERT_FALSE(net_->Reaches(PartitionNet::kEtcd, PortOf(PartitionNet::kEtcd)));
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto nodes = client_->ListNodes();
        return nodes.ok() && nodes->size() == 3;
      },
      std::chrono::seconds(20)))
      << "its lease ran out";
  const double stall = WriteAtOnce(job, 2, job.mappers, 4, &winners);
  std::printf("RESULT partition_etcd_longest_mapper_s=%.1f\n", stall);
  ASSERT_EQ(winners.size(), job.mappers);
  std::this_thread::sleep_until(cut_at + std::chrono::seconds(10));
  ASSERT_TRUE(net_->Heal(PartitionNet::kEtcd));
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto nodes = client_->ListNodes();
        return nodes.ok() && nodes->size() == 4;
      },
      std::chrono::seconds(20)))
      << "registered again";
  ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement(job.id));
  EXPECT_LE(after.epoch, 1u) << "one revive at most";
  ExpectCounts(job);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
}

}  // namespace
}  // namespace sluice::partition_test
