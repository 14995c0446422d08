// Placement: deterministic, R distinct nodes per partition, even load, and arguments checked.
#include "cluster/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "tests/harness/status_matchers.h"

namespace sluice {
namespace {

using testing::StatusIs;

std::vector<std::string> Nodes(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("sluice-" + std::to_string(i));
  return out;
}

TEST(PlacementTest, EveryPartitionGetsDistinctReplicasAndTheSameAnswerTwice) {
  const auto nodes = Nodes(5);
  ASSERT_OK_AND_ASSIGN(auto a, PlaceReplicas("job", 1000, nodes, 3));
  ASSERT_OK_AND_ASSIGN(auto b, PlaceReplicas("job", 1000, nodes, 3));
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 1000u);
  for (const auto& replicas : a) {
    ASSERT_EQ(replicas.size(), 3u);
    EXPECT_EQ(std::set<uint32_t>(replicas.begin(), replicas.end()).size(), 3u);
    for (uint32_t r : replicas) EXPECT_LT(r, 5u);
  }
  ASSERT_OK_AND_ASSIGN(auto other, PlaceReplicas("job2", 1000, nodes, 3));
  EXPECT_NE(a, other) << "two shuffles should not share one placement";
}

TEST(PlacementTest, LoadIsEvenAtSmallAndLargePartitionCounts) {
  // No node takes more than ceil(partitions x replicas / nodes); none falls more than one
  // below the floor, and none is left out while there are as many replicas as nodes.
  for (uint32_t n = 1; n <= 7; ++n) {
    for (uint32_t partitions : {1u, 2u, 3u, 7u, 8u, 64u, 1000u, 8192u}) {
      for (uint32_t replicas = 1; replicas <= std::min(n, 3u); ++replicas) {
        const std::string where = std::to_string(partitions) + " partitions x " +
                                  std::to_string(replicas) + " on " + std::to_string(n);
        ASSERT_OK_AND_ASSIGN(auto placed, PlaceReplicas("s" + std::to_string(partitions * 7 + n),
                                                        partitions, Nodes(n), replicas));
        std::vector<uint32_t> load(n, 0), primaries(n, 0);
        for (const auto& r : placed) {
          ASSERT_EQ(std::set<uint32_t>(r.begin(), r.end()).size(), replicas) << where;
          for (uint32_t i : r) ++load[i];
          ++primaries[r[0]];
        }
        // Primaries (where reads go) spread nearly as evenly: within 10% (or 2) of the share.
        const uint32_t share = (partitions + n - 1) / n;
        for (uint32_t pr : primaries) {
          EXPECT_LE(pr, share + std::max(2u, share / 10)) << where << ": primaries";
        }
        const uint32_t lo = partitions * replicas / n, hi = (partitions * replicas + n - 1) / n;
        for (uint32_t l : load) {
          EXPECT_LE(l, hi) << where;
          EXPECT_GE(l + 1, lo) << where;
          if (partitions * replicas >= n) {
            EXPECT_GT(l, 0u) << where;
          }
        }
      }
    }
  }
}

TEST(PlacementTest, ScoresDoNotDependOnOtherNodesAndAreLengthPrefixed) {
  EXPECT_EQ(RendezvousScore("s", 3, "a"), RendezvousScore("s", 3, "a"));
  EXPECT_NE(RendezvousScore("ab", 3, "c"), RendezvousScore("a", 3, "bc"));
  EXPECT_NE(RendezvousScore("s", 3, "a"), RendezvousScore("s", 4, "a"));
  // Without the load cap (one replica, many partitions per node), a fifth node takes partitions
  // only from others, never moves one between the first four.
  ASSERT_OK_AND_ASSIGN(auto four, PlaceReplicas("s", 1, Nodes(4), 1));
  ASSERT_OK_AND_ASSIGN(auto five, PlaceReplicas("s", 1, Nodes(5), 1));
  EXPECT_TRUE(five[0][0] == four[0][0] || five[0][0] == 4u);
}

TEST(PlacementTest, BadArgumentsAreNamed) {
  EXPECT_THAT(PlaceReplicas("s", 4, {}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "no servers"));
  EXPECT_THAT(PlaceReplicas("s", 4, Nodes(2), 3),
              StatusIs(absl::StatusCode::kInvalidArgument, "replication 3 needs 1 to 2 servers"));
  EXPECT_THAT(PlaceReplicas("s", 4, Nodes(2), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "replication 0"));
  const std::vector<std::string> dup = {"a", "b", "a"};
  EXPECT_THAT(PlaceReplicas("s", 4, dup, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "same node id"));
}

}  // namespace
}  // namespace sluice
