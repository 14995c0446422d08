// Partitions healed after 90 s (label stress: `bash deploy/dev.sh stress`): as
// partition_test.cc, with the server away for longer than a lease and a repair take.
#include "tests/cluster/partition_fixture.h"

namespace sluice::partition_test {
namespace {

TEST_F(PartitionTest, CutFromItsClientsForNinetySecondsLosesNothing) {
  CutWriteHeal("long", {ServerNetns::kClients}, std::chrono::seconds(90));
}

TEST_F(PartitionTest, CutOffBothWaysForNinetySecondsLosesNothing) {
  CutWriteHeal("longboth", {ServerNetns::kClients, ServerNetns::kEtcd}, std::chrono::seconds(90));
}

}  // namespace
}  // namespace sluice::partition_test
