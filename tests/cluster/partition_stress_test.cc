// Partitions healed after 90 s (label stress: `bash deploy/dev.sh stress`): as
// partition_test.cc, with the server away for longer than a lease and a repair take.
#include "tests/cluster/partition_fixture.h"

namespace sluice::partition_test {
namespace {

TEST_F(PartitionTest, CutFromItsWritersForNinetySecondsLosesNothing) {
  CutWriteHeal("long", {PartitionNet::kWriters}, std::chrono::seconds(90));
}

TEST_F(PartitionTest, CutFromTheOtherServersForNinetySecondsLosesNothing) {
  CutWriteHeal("longservers", {PartitionNet::kServers}, std::chrono::seconds(90));
}

TEST_F(PartitionTest, CutFromEtcdForNinetySecondsLosesNothing) {
  CutWriteHeal("longetcd", {PartitionNet::kEtcd}, std::chrono::seconds(90));
}

TEST_F(PartitionTest, CutOffBothWaysForNinetySecondsLosesNothing) {
  CutWriteHeal("longboth", {PartitionNet::kWriters, PartitionNet::kServers, PartitionNet::kEtcd},
               std::chrono::seconds(90));
}

}  // namespace
}  // namespace sluice::partition_test
