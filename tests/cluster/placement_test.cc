// Placement: deterministic, R distinct nodes per partition, even load, and arguments checked.
#include "cluster/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cluster/object_record.h"
#include "cluster/placement_store.h"
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

TEST(PlacementTest, ANewEpochKeepsTheSurvivorsAndSpreadsTheLostServersPartitions) {
  const auto nodes = Nodes(5);
  ASSERT_OK_AND_ASSIGN(auto placed, PlaceReplicas("job", 1000, nodes, 2));
  std::vector<std::vector<std::string>> current;
  for (const auto& r : placed) current.push_back({nodes[r[0]], nodes[r[1]]});
  std::vector<std::string> live(nodes.begin(), nodes.end() - 1);  // sluice-4 is gone
  const auto next = ReplaceReplicas("job", current, {"sluice-4"}, live, 2);
  EXPECT_EQ(next, ReplaceReplicas("job", current, {"sluice-4"}, live, 2)) << "deterministic";
  std::map<std::string, int> load;
  for (size_t p = 0; p < current.size(); ++p) {
    ASSERT_EQ(next[p].size(), 2u);
    EXPECT_NE(next[p][0], next[p][1]);
    for (const std::string& id : next[p]) {
      EXPECT_NE(id, "sluice-4");
      ++load[id];
    }
    // A survivor keeps its place, in order.
    size_t k = 0;
    for (const std::string& id : current[p]) {
      if (id != "sluice-4") {
        EXPECT_EQ(next[p][k++], id) << p;
      }
    }
  }
  // The lost server's 400 replicas go to the four others evenly: each ends near 500 (a
  // partition cannot take a server twice, so a few land one over).
  for (const auto& [id, n] : load) {
    EXPECT_GE(n, 495) << id;
    EXPECT_LE(n, 505) << id;
  }
  // Too few servers left: partitions keep what they can.
  const auto thin = ReplaceReplicas("job", current, {"sluice-4", "sluice-3", "sluice-2"},
                                    {"sluice-0", "sluice-1"}, 3);
  for (const auto& r : thin) EXPECT_EQ(r.size(), 2u);
}

// Revoking decisions (docs/cluster.md, "Revoking decisions") is an epoch that changes no replica
// and names the attempts it revoked; a repeat from the epoch before revokes nothing new, and
// anything else that moved the record under the caller is ABORTED.
TEST(PlacementTest, ARevocationIsAnEpochNamingItsAttemptsAndARepeatRevokesNothingNew) {
  ASSERT_OK_AND_ASSIGN(ShufflePlacement p, NewPlacement("job", 8, 4, 2, {"n0", "n1", "n2", "n3"}));
  const std::map<uint32_t, MapperDecision> decided{{0, {11, 0}}, {2, {12, 0}}, {3, {13, 0}}};
  ASSERT_OK_AND_ASSIGN(Revocation r, PlanRevocation(p, decided, {3, 0}, 0));
  EXPECT_EQ(r.attempts, (std::vector<uint64_t>{13, 11}));
  ASSERT_TRUE(r.next.has_value());
  ASSERT_EQ(r.next->epoch(), 1u);
  EXPECT_EQ(r.next->replicas, p.replicas) << "no replica moves";
  ASSERT_OK_AND_ASSIGN(ShufflePlacement back, DecodePlacement("job", EncodePlacement(*r.next)));
  using Pairs = std::vector<std::pair<uint32_t, uint64_t>>;
  EXPECT_EQ(back.RevokedAfter(0), (Pairs{{3, 13}, {0, 11}}));
  EXPECT_TRUE(back.RevokedAfter(1).empty());
  for (uint32_t part = 0; part < 8; ++part) EXPECT_EQ(back.ReplicasAt(part, 1), p.replicas[part]);
  // The same call again, from epoch 0: what it revoked, nothing written.
  ASSERT_OK_AND_ASSIGN(Revocation again, PlanRevocation(back, {{2, {12, 0}}}, {0, 3}, 0));
  EXPECT_EQ(again.attempts, (std::vector<uint64_t>{11, 13}));
  EXPECT_FALSE(again.next.has_value());
  // A mapper that epoch did not revoke: the caller's view is old.
  EXPECT_THAT(PlanRevocation(back, {{2, {12, 0}}}, {2}, 0).status(),
              StatusIs(absl::StatusCode::kAborted, "read its status again"));
  // The caller's mistakes, and a mapper with no decision.
  EXPECT_THAT(PlanRevocation(p, decided, {}, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no mapper"));
  EXPECT_THAT(PlanRevocation(p, decided, {0, 0}, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "twice"));
  EXPECT_THAT(PlanRevocation(p, decided, {4}, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "beyond the 4 mappers"));
  EXPECT_THAT(PlanRevocation(p, decided, {1}, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "mapper 1 is not committed"));
  EXPECT_THAT(PlanRevocation(p, decided, {0}, 5).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "newer than its newest"));
  // A record full of epochs takes no more.
  ShufflePlacement full = p;
  full.epochs.resize(kMaxPlacementEpochs);
  EXPECT_THAT(PlanRevocation(full, decided, {0}, kMaxPlacementEpochs).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "new id"));
  // A shuffle recorded before revocations (no "revocable") refuses them.
  std::string old = EncodePlacement(p);
  old.replace(old.find(",\"revocable\":true"), 17, "");
  ASSERT_OK_AND_ASSIGN(ShufflePlacement before, DecodePlacement("job", old));
  EXPECT_FALSE(before.revocable);
  EXPECT_THAT(PlanRevocation(before, decided, {0}, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "created before revocations"));
  // A malformed revocation is DATA_LOSS.
  std::string bad = EncodePlacement(*r.next);
  bad.replace(bad.find("\"revoked\":[["), 12, "\"revoked\":[[9");
  EXPECT_THAT(DecodePlacement("job", bad).status(),
              StatusIs(absl::StatusCode::kDataLoss, "revoked decision"));
}

TEST(PlacementTest, EpochsRoundTripThroughTheRecordAndDecisionsNameTheirEpoch) {
  ASSERT_OK_AND_ASSIGN(ShufflePlacement p, NewPlacement("job", 8, 4, 2, {"n0", "n1", "n2", "n3"}));
  EXPECT_EQ(p.epoch(), 0u);
  ASSERT_OK_AND_ASSIGN(ShufflePlacement q, NextEpoch(p, {"n2"}, {"n0", "n1", "n3", "n4"}));
  ASSERT_EQ(q.epoch(), 1u);
  EXPECT_FALSE(q.Holds("n2"));
  EXPECT_TRUE(q.Removed("n2"));
  ASSERT_OK_AND_ASSIGN(ShufflePlacement same, NextEpoch(q, {"n2"}, {"n0", "n1", "n3"}));
  EXPECT_EQ(same.epoch(), 1u) << "taking out a server already out changes nothing";
  ASSERT_OK_AND_ASSIGN(ShufflePlacement r, NextEpoch(q, {"n4"}, {"n0", "n1", "n3"}));
  ASSERT_OK_AND_ASSIGN(ShufflePlacement back, DecodePlacement("job", EncodePlacement(r)));
  EXPECT_EQ(back.epoch(), 2u);
  EXPECT_EQ(back.nodes, r.nodes);
  EXPECT_EQ(back.replicas, r.replicas);
  for (uint32_t part = 0; part < 8; ++part) {
    EXPECT_EQ(back.ReplicasAt(part, 0), p.replicas[part]);
    EXPECT_EQ(back.ReplicasAt(part, 1), q.replicas[part]);
    EXPECT_EQ(back.ReplicasAt(part, 2), r.replicas[part]);
  }
  // A record without epochs reads as epoch 0, and encodes as it always did.
  ASSERT_OK_AND_ASSIGN(ShufflePlacement plain, DecodePlacement("job", EncodePlacement(p)));
  EXPECT_EQ(plain.epoch(), 0u);
  EXPECT_EQ(EncodePlacement(p).find("epochs"), std::string::npos);
  // Malformed epochs are DATA_LOSS naming what is wrong.
  std::string bad = EncodePlacement(q);
  bad.replace(bad.find("\"changed\":[["), 12, "\"changed\":[[99");
  EXPECT_THAT(DecodePlacement("job", bad).status(),
              StatusIs(absl::StatusCode::kDataLoss, "epoch's change"));
  // Nobody left: UNAVAILABLE, not a placement with an empty partition.
  EXPECT_THAT(NextEpoch(p, {"n0", "n1", "n2", "n3"}, {}).status(),
              StatusIs(absl::StatusCode::kUnavailable, "no live server"));

  EXPECT_EQ(EncodeDecision({7, 0}), "7");
  EXPECT_EQ(EncodeDecision({7, 3}), "7@3");
  EXPECT_EQ(DecodeDecision("7"), (MapperDecision{7, 0}));
  EXPECT_EQ(DecodeDecision("7@3"), (MapperDecision{7, 3}));
  for (const char* wrong : {"", "x", "7@", "7@0", "7@x", "@3"}) {
    EXPECT_FALSE(DecodeDecision(wrong).has_value()) << wrong;
  }
}

// A writer's revive (docs/cluster.md, "Revive"): a new epoch without the server, marked, only
// while the writer's epoch is the newest and holds it; the revive mark round-trips the record;
// a shuffle takes at most kMaxRevives.
TEST(PlacementTest, ARevivesEpochIsMadeOnceFromTheNewestEpochAndIsBounded) {
  ASSERT_OK_AND_ASSIGN(ShufflePlacement p, NewPlacement("job", 8, 4, 2, {"n0", "n1", "n2", "n3"}));
  // n2 is still registered (a kill -9 within its lease): it is not given partitions again.
  const std::vector<std::string> live{"n0", "n1", "n2", "n3"};
  ASSERT_OK_AND_ASSIGN(auto next, PlanRevive(p, 0, "n2", live));
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->epoch(), 1u);
  EXPECT_FALSE(next->Holds("n2"));
  EXPECT_TRUE(next->epochs.back().revived);
  EXPECT_EQ(next->epochs.back().removed, std::vector<std::string>{"n2"});
  for (uint32_t q = 0; q < 8; ++q) EXPECT_EQ(next->replicas[q].size(), 2u) << q;
  // A racing writer's report of the same epoch, and a report about an older epoch, change
  // nothing; so does one about a server the newest epoch does not hold.
  ASSERT_OK_AND_ASSIGN(auto again, PlanRevive(*next, 0, "n2", live));
  EXPECT_FALSE(again.has_value());
  ASSERT_OK_AND_ASSIGN(auto older, PlanRevive(*next, 0, "n3", live));
  EXPECT_FALSE(older.has_value()) << "a report about epoch 0 after epoch 1 was made";
  ASSERT_OK_AND_ASSIGN(auto gone, PlanRevive(*next, 1, "n2", live));
  EXPECT_FALSE(gone.has_value());
  EXPECT_THAT(PlanRevive(*next, 5, "n3", live).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "past the shuffle's newest"));
  // The mark round-trips; an epoch made by the grace has none.
  ASSERT_OK_AND_ASSIGN(ShufflePlacement back, DecodePlacement("job", EncodePlacement(*next)));
  EXPECT_TRUE(back.epochs.back().revived);
  ASSERT_OK_AND_ASSIGN(ShufflePlacement grace, NextEpoch(p, {"n2"}, {"n0", "n1", "n3"}));
  EXPECT_EQ(EncodePlacement(grace).find("revive"), std::string::npos);
  std::string bad = EncodePlacement(*next);
  bad.replace(bad.find("\"revive\":true"), 13, "\"revive\":1234");
  EXPECT_THAT(DecodePlacement("job", bad).status(),
              StatusIs(absl::StatusCode::kDataLoss, "revive mark"));
  // kMaxRevives, then UNAVAILABLE: the grace takes the server out.
  ShufflePlacement q = p;
  const std::vector<std::string> many{"n0", "n1", "n2", "n3", "n4", "n5"};
  for (uint32_t i = 0; i < kMaxRevives; ++i) {
    const std::string out = q.nodes[q.replicas[i % 8][0]];
    ASSERT_OK_AND_ASSIGN(auto r, PlanRevive(q, q.epoch(), out, many));
    ASSERT_TRUE(r.has_value()) << i;
    q = *r;
  }
  EXPECT_EQ(q.epoch(), kMaxRevives);
  EXPECT_THAT(PlanRevive(q, q.epoch(), q.nodes[q.replicas[0][0]], many).status(),
              StatusIs(absl::StatusCode::kUnavailable, "revives, the most it takes"));
}

// The record stays within what etcd takes (kMaxRecordBytes; its requests are 1.5 MiB by
// default) however a shuffle loses servers: the largest shuffle a record is made for (8,192
// partitions, R = 3), on 4 servers (each loss moves three quarters of its partitions) and on 32,
// revived kMaxRevives times and then losing servers to the grace until no epoch more is made.
// Large epochs are written compactly and read back exactly; old records' form still reads.
TEST(PlacementTest, ARecordStaysWithinWhatEtcdTakesHoweverItsShuffleLosesServers) {
  std::vector<std::string> nodes;
  for (int i = 0; i < 100; ++i) nodes.push_back("server-" + std::to_string(i));
  for (const size_t servers : {size_t{4}, size_t{32}}) {
    SCOPED_TRACE(servers);
    std::vector<std::string> live(nodes.begin(), nodes.begin() + servers);
    ASSERT_OK_AND_ASSIGN(ShufflePlacement p,
                         NewPlacement("a-long-shuffle-name-0123456789", 8192, 4096, 3, live));
    size_t next_node = servers;
    const auto lose_one = [&] {
      const std::string out = live.front();
      live.erase(live.begin());
      live.push_back(nodes[next_node++ % nodes.size()]);
      return out;
    };
    size_t largest = 0;
    absl::Status last;
    for (;;) {
      const std::string out = lose_one();
      absl::StatusOr<ShufflePlacement> next = p;
      if (p.epoch() < kMaxRevives) {
        auto r = PlanRevive(p, p.epoch(), out, live);
        ASSERT_OK(r.status()) << "a revive refused at epoch " << p.epoch();
        ASSERT_TRUE(r->has_value());
        next = **r;
      } else {
        next = NextEpoch(p, {out}, live);
      }
      if (!next.ok()) {
        last = next.status();
        break;
      }
      p = *next;
      const std::string record = EncodePlacement(p);
      largest = std::max(largest, record.size());
      ASSERT_LE(record.size(), kMaxRecordBytes);
      ASSERT_OK_AND_ASSIGN(ShufflePlacement back, DecodePlacement(p.shuffle_id, record));
      ASSERT_EQ(back.replicas, p.replicas) << "epoch " << p.epoch();
      ASSERT_EQ(back.epochs.back().changed, p.epochs.back().changed);
      ASSERT_EQ(back.epochs.back().revived, p.epochs.back().revived);
    }
    std::printf("RESULT record_%zu_servers_epochs=%u largest_bytes=%zu\n", servers, p.epoch(),
                largest);
    EXPECT_GE(p.epoch(), kMaxRevives) << "every revive made";
    EXPECT_TRUE(absl::IsUnavailable(last)) << last;
    if (servers == 32) {
      EXPECT_EQ(p.epoch(), kMaxPlacementEpochs) << last;
    }
  }
}

// A record near the size etcd takes: revives stop first (the grace keeps room), then the
// grace's epochs, each with UNAVAILABLE naming the size, before etcd would refuse the write.
TEST(PlacementTest, RevivesAndThenEpochsStopBeforeTheRecordPassesWhatEtcdTakes) {
  std::vector<std::string> live;
  for (int i = 0; i < 4; ++i) live.push_back("n" + std::to_string(i));
  ASSERT_OK_AND_ASSIGN(ShufflePlacement p, NewPlacement("wide", 60000, 8, 3, live));
  int next_node = 4;
  absl::Status refused;
  while (refused.ok()) {
    const std::string out = live.front();
    live.erase(live.begin());
    live.push_back("n" + std::to_string(next_node++));
    auto r = PlanRevive(p, p.epoch(), out, live);
    if (!r.ok()) {
      refused = r.status();
    } else {
      p = **r;
    }
  }
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnavailable, "where revives stop"));
  EXPECT_LT(p.epoch(), kMaxRevives);
  absl::Status full;
  while (full.ok()) {
    const std::string out = live.front();
    live.erase(live.begin());
    live.push_back("n" + std::to_string(next_node++));
    auto next = NextEpoch(p, {out}, live);
    if (!next.ok()) {
      full = next.status();
    } else {
      p = *next;
    }
  }
  EXPECT_THAT(full, StatusIs(absl::StatusCode::kUnavailable, "a record takes in etcd"));
  EXPECT_LE(EncodePlacement(p).size(), kMaxRecordBytes);
  std::printf(
      "RESULT wide_record_revives_stop_after=%u epochs_stop_after=%u\n",
      static_cast<unsigned>(std::count_if(p.epochs.begin(), p.epochs.end(),
                                          [](const PlacementEpoch& e) { return e.revived; })),
      p.epoch());
}

// Every change of a record is held to what etcd takes, a revocation's too: one revoking 150,000
// mappers at once (~2 MB of revoked decisions) is refused, naming the size, and a smaller one
// is made.
TEST(PlacementTest, ARevocationPastWhatEtcdTakesIsRefused) {
  ASSERT_OK_AND_ASSIGN(ShufflePlacement p, NewPlacement("many", 8, 200000, 2, {"n0", "n1"}));
  p.revocable = true;
  std::map<uint32_t, MapperDecision> decided;
  std::vector<uint32_t> all, few;
  for (uint32_t m = 0; m < 150000; ++m) {
    decided[m] = MapperDecision{1000000 + m, 0};
    all.push_back(m);
    if (m < 1000) few.push_back(m);
  }
  EXPECT_THAT(PlanRevocation(p, decided, all, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "revoke fewer mappers at once"));
  ASSERT_OK_AND_ASSIGN(Revocation r, PlanRevocation(p, decided, few, 0));
  ASSERT_TRUE(r.next.has_value());
  EXPECT_LE(EncodePlacement(*r.next).size(), kMaxRecordBytes);
}

TEST(PlacementTest, ACompactEpochIsCheckedLikeAnyRecord) {
  std::vector<std::string> nodes;
  for (int i = 0; i < 6; ++i) nodes.push_back("n" + std::to_string(i));
  ASSERT_OK_AND_ASSIGN(ShufflePlacement p, NewPlacement("job", 1024, 8, 2, nodes));
  ASSERT_OK_AND_ASSIGN(ShufflePlacement next, NextEpoch(p, {"n0"}, {"n1", "n2", "n3", "n4", "n5"}));
  const std::string record = EncodePlacement(next);
  ASSERT_NE(record.find("\"moves\""), std::string::npos) << "a large epoch, written compactly";
  EXPECT_EQ(record.find("\"changed\""), std::string::npos)
      << "so that a server before compact epochs refuses the record rather than misread it";
  const size_t at = record.find("\"moves\":\"") + 9;
  std::string bad = record;
  bad[at] = '*';
  EXPECT_THAT(DecodePlacement("job", bad).status(),
              StatusIs(absl::StatusCode::kDataLoss, "not base64"));
  bad = record;
  bad.replace(at, record.find('"', at) - at, "/////w==");  // a partition far past the last
  EXPECT_THAT(DecodePlacement("job", bad).status(), StatusIs(absl::StatusCode::kDataLoss, "move"));
  // A small epoch keeps the form every version reads.
  ASSERT_OK_AND_ASSIGN(ShufflePlacement small, NewPlacement("job", 8, 8, 2, nodes));
  ASSERT_OK_AND_ASSIGN(small, NextEpoch(small, {"n0"}, {"n1", "n2", "n3", "n4", "n5"}));
  EXPECT_NE(EncodePlacement(small).find("\"changed\""), std::string::npos);
}

// Huge partitions (docs/cluster.md, "Huge partitions"): a segment is decided once per full
// segment, goes to servers that hold fewer of its partition's chain, is stored as partition
// num_partitions + k, takes part in epochs like a partition, and round-trips the record.
TEST(PlacementTest, ASegmentIsDecidedOnceOnOtherServersAndTakesPartInEpochs) {
  const std::vector<std::string> nodes = {"n0", "n1", "n2", "n3"};
  ASSERT_OK_AND_ASSIGN(ShufflePlacement p, NewPlacement("job", 8, 4, 1, nodes, 1 << 20));
  EXPECT_EQ(p.split_bytes, 1u << 20);
  EXPECT_EQ(p.segment_slots, kMaxSegments);
  EXPECT_EQ(p.slots(), 8 + kMaxSegments);
  EXPECT_EQ(p.total(), 8u);
  // Not splittable: never.
  ASSERT_OK_AND_ASSIGN(ShufflePlacement plain, NewPlacement("job", 8, 4, 1, nodes));
  EXPECT_THAT(NextSegment(plain, 3, nodes).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not split"));
  EXPECT_EQ(EncodePlacement(plain).find("segments"), std::string::npos);

  // Partition 3, then its segment 8, then 9: each on a server holding none of the chain yet.
  ASSERT_OK_AND_ASSIGN(ShufflePlacement a, NextSegment(p, 3, nodes));
  ASSERT_EQ(a.total(), 9u);
  EXPECT_EQ(a.ParentOf(8), 3u);
  EXPECT_EQ(a.ChainOf(3), (std::vector<uint32_t>{3, 8}));
  EXPECT_NE(a.replicas[8], a.replicas[3]);
  // Asked again for the same full segment (another replica, a retry): nothing new.
  ASSERT_OK_AND_ASSIGN(ShufflePlacement again, NextSegment(a, 3, nodes));
  EXPECT_EQ(again.total(), 9u);
  ASSERT_OK_AND_ASSIGN(ShufflePlacement b, NextSegment(a, 8, nodes));
  ASSERT_OK_AND_ASSIGN(ShufflePlacement c, NextSegment(b, 9, nodes));
  std::set<uint32_t> on;
  for (uint32_t q : c.ChainOf(3)) on.insert(c.replicas[q][0]);
  EXPECT_EQ(on.size(), 4u) << "a chain of 4 over 4 servers takes each once";
  // Only live servers, and only those holding a partition (every writer prepares on them).
  ASSERT_OK_AND_ASSIGN(ShufflePlacement d, NextSegment(c, 10, {"n1"}));
  EXPECT_EQ(d.replicas[11], (std::vector<uint32_t>{1}));
  EXPECT_THAT(NextSegment(c, 10, {"n9"}).status(),
              StatusIs(absl::StatusCode::kUnavailable, "no live server"));
  EXPECT_THAT(NextSegment(c, 99, nodes).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));

  // An epoch takes a segment's server out like a partition's; the record keeps it all.
  const std::string gone = c.nodes[c.replicas[9][0]];
  std::vector<std::string> live;
  for (const auto& n : nodes) {
    if (n != gone) live.push_back(n);
  }
  ASSERT_OK_AND_ASSIGN(ShufflePlacement e, NextEpoch(c, {gone}, live));
  ASSERT_EQ(e.epoch(), 1u);
  EXPECT_NE(e.nodes[e.replicas[9][0]], gone);
  ASSERT_OK_AND_ASSIGN(ShufflePlacement f, NextSegment(e, 10, live));  // made in epoch 1
  EXPECT_EQ(f.BornAt(11), 1u);
  ASSERT_OK_AND_ASSIGN(ShufflePlacement back, DecodePlacement("job", EncodePlacement(f)));
  EXPECT_EQ(back.total(), f.total());
  EXPECT_EQ(back.replicas, f.replicas);
  EXPECT_EQ(back.first_replicas, f.first_replicas);
  EXPECT_EQ(back.split_bytes, f.split_bytes);
  EXPECT_EQ(back.segment_slots, f.segment_slots);
  EXPECT_EQ(back.ChainOf(3), f.ChainOf(3));
  EXPECT_EQ(back.ReplicasAt(9, 0), c.replicas[9]);
  EXPECT_EQ(back.ReplicasAt(9, 1), e.replicas[9]);
  // HeldBy: a segment is held by nobody before the epoch it was made in.
  const std::string holder = f.nodes[f.replicas[11][0]];
  const auto held = back.HeldBy(holder);
  ASSERT_EQ(held.size(), 2u);
  ASSERT_EQ(held[1].size(), f.total());
  EXPECT_FALSE(held[0][11]);
  EXPECT_TRUE(held[1][11]);

  // Malformed segments are DATA_LOSS naming them.
  std::string bad = EncodePlacement(f);
  bad.replace(bad.find("\"segments\":[["), 13, "\"segments\":[[77");
  EXPECT_THAT(DecodePlacement("job", bad).status(),
              StatusIs(absl::StatusCode::kDataLoss, "segment"));
  // Out of slots: RESOURCE_EXHAUSTED, and the record is not changed.
  ShufflePlacement full = p;
  full.segment_slots = 1;
  ASSERT_OK_AND_ASSIGN(full, NextSegment(full, 0, nodes));
  EXPECT_THAT(NextSegment(full, 8, nodes).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "segment slots"));
  // A shuffle of the most partitions has no slot to split into.
  EXPECT_EQ(SegmentSlots(1u << 16), 0u);
  EXPECT_EQ(SegmentSlots((1u << 16) - 10), 10u);
}

// An object record round-trips; a malformed one is DATA_LOSS naming what is wrong; it stands
// for its partition only while its winners are every mapper's decision.
TEST(ObjectRecordTest, ARecordRoundTripsIsCheckedAndStandsForItsDecisions) {
  const ObjectRecord r{"job/p7-n1-1a2b", 123456789012u, "abc-3", "n1", 40, {{0, 5}, {2, 9}}};
  ASSERT_OK_AND_ASSIGN(ObjectRecord back, DecodeObjectRecord(EncodeObjectRecord(r)));
  EXPECT_EQ(back, r);
  EXPECT_THAT(DecodeObjectRecord("[]").status(),
              StatusIs(absl::StatusCode::kDataLoss, "not a JSON object"));
  // (The winners as a count and a hash: the record is the same size however many mappers.)
  EXPECT_EQ(back.winners.count, 2u);
  EXPECT_NE(r.winners, WinnerSet({{0, 5}, {2, 10}}));
  EXPECT_NE(r.winners, WinnerSet({{0, 5}}));
  std::string bad = EncodeObjectRecord(r);
  const size_t hash = bad.find("\"winners_xxh3\":\"") + 16;
  bad[hash] = bad[hash] == 'g' ? 'h' : 'g';
  EXPECT_THAT(DecodeObjectRecord(bad).status(),
              StatusIs(absl::StatusCode::kDataLoss, "'winners_xxh3'"));
  bad = EncodeObjectRecord(r);
  bad.replace(bad.find("\"size\""), 6, "\"sise\"");
  EXPECT_THAT(DecodeObjectRecord(bad).status(), StatusIs(absl::StatusCode::kDataLoss, "'size'"));
  std::map<uint32_t, MapperDecision> decided{{0, {5, 0}}, {2, {9, 1}}};
  EXPECT_TRUE(StandsFor(r, decided, 0));
  EXPECT_FALSE(StandsFor(r, decided, 3)) << "mapper 1 of 3 is not decided";
  decided[2].attempt = 10;
  EXPECT_FALSE(StandsFor(r, decided, 0)) << "another winner";
  decided.erase(2);
  EXPECT_FALSE(StandsFor(r, decided, 0));
}

}  // namespace
}  // namespace sluice
