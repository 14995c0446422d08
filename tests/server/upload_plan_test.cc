// PartitionsToUpload (server/rules/upload_plan.h): who uploads which partition, and when.
#include "server/rules/upload_plan.h"

#include <gtest/gtest.h>

#include "cluster/placement_epochs.h"
#include "tests/harness/status_matchers.h"

namespace sluice {
namespace {

class UploadPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(placement_, NewPlacement("job", 8, 3, 2, {"n0", "n1", "n2"}));
    for (uint32_t m = 0; m < 3; ++m) decided_[m] = MapperDecision{100 + m, 0};
  }
  // The partitions whose first replica is `node`.
  std::vector<uint32_t> FirstOn(const std::string& node) const {
    std::vector<uint32_t> out;
    for (uint32_t q = 0; q < 8; ++q) {
      if (placement_.nodes[placement_.replicas[q][0]] == node) out.push_back(q);
    }
    return out;
  }
  // Partitions `node` holds in the newest epoch (whole, in these tests).
  std::vector<bool> Held(const std::string& node) const {
    std::vector<bool> out(8, false);
    for (uint32_t q = 0; q < 8; ++q) {
      for (uint32_t i : placement_.replicas[q]) out[q] = out[q] || placement_.nodes[i] == node;
    }
    return out;
  }
  ShufflePlacement placement_;
  std::map<uint32_t, MapperDecision> decided_;
  const std::set<std::string> all_{"n0", "n1", "n2"};
};

TEST_F(UploadPlanTest, EachPartitionIsUploadedByItsFirstRegisteredReplicaOnceComplete) {
  std::set<uint32_t> seen;
  for (const std::string& n : all_) {
    const std::vector<uint32_t> mine =
        PartitionsToUpload(placement_, decided_, {}, n, all_, Held(n));
    EXPECT_EQ(mine, FirstOn(n)) << n;
    for (uint32_t q : mine) EXPECT_TRUE(seen.insert(q).second) << "one uploader for " << q;
  }
  EXPECT_EQ(seen.size(), 8u) << "every partition has one";
  // Not before every mapper is decided, nor when the mapper count is not known.
  auto some = decided_;
  some.erase(2);
  EXPECT_TRUE(PartitionsToUpload(placement_, some, {}, "n0", all_, Held("n0")).empty());
  ShufflePlacement open = placement_;
  open.num_mappers = 0;
  EXPECT_TRUE(PartitionsToUpload(open, decided_, {}, "n0", all_, Held("n0")).empty());
}

TEST_F(UploadPlanTest, TheNextReplicaTakesOverFromOneGoneAndOnlyAWholeReplicaUploads) {
  const std::vector<uint32_t> n0s = FirstOn("n0");
  ASSERT_FALSE(n0s.empty());
  const std::set<std::string> without_n0{"n1", "n2"};
  std::set<uint32_t> taken;
  for (const std::string& n : without_n0) {
    for (uint32_t q : PartitionsToUpload(placement_, decided_, {}, n, without_n0, Held(n))) {
      taken.insert(q);
    }
  }
  for (uint32_t q : n0s) EXPECT_EQ(taken.count(q), 1u) << "partition " << q << " taken over";
  std::vector<bool> lacking = Held("n1");
  for (uint32_t q : FirstOn("n1")) lacking[q] = false;
  EXPECT_TRUE(PartitionsToUpload(placement_, decided_, {}, "n1", all_, lacking).empty())
      << "a replica that lacks a mapper's data waits for its repair";
}

TEST_F(UploadPlanTest, ARecordThatStandsIsNotUploadedAgainAStaleOneIs) {
  const uint32_t q = FirstOn("n0").front();
  std::map<uint32_t, ObjectRecord> recorded;
  recorded[q] = ObjectRecord{"job/p", 10, "e", "n0", 1, {{0, 100}, {1, 101}, {2, 102}}};
  std::vector<uint32_t> mine =
      PartitionsToUpload(placement_, decided_, recorded, "n0", all_, Held("n0"));
  EXPECT_EQ(std::count(mine.begin(), mine.end(), q), 0);
  auto revoked = decided_;
  revoked[1] = MapperDecision{201, 1};  // (revoked and committed again)
  mine = PartitionsToUpload(placement_, revoked, recorded, "n0", all_, Held("n0"));
  EXPECT_EQ(std::count(mine.begin(), mine.end(), q), 1);
}

}  // namespace
}  // namespace sluice
