// Revive (docs/cluster.md, "Revive"): a writer that cannot reach a server of its attempt's
// epoch has it taken out at once, so a lost server costs the engine one retry, not the lease
// and --dead_after_s. Four real servers on 127.0.0.2-5 and a real etcd; the grace is made long
// (--dead_after_s=600) and the lease too (30 s), so that only a revive can move the shuffle
// while the test runs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/shuffle_client.h"
#include "rpc/error_reason.h"
#include "tests/cluster/replication_fixture.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using replication_test::Clock;
using replication_test::ExpectExactlyTheWinners;
using replication_test::Job;
using replication_test::LostServerTest;
using replication_test::WriteMapper;
using testing::StatusIs;

class ReviveTest : public LostServerTest {
 protected:
  void SetUp() override {
    testing::MiniClusterOptions options;
    options.servers = 4;
    options.lease_s = 30;
    options.flags.push_back("--dead_after_s=600");
    ASSERT_OK_AND_ASSIGN(cluster_, testing::MiniCluster::Start(options));
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  }
};

// A server killed -9 in the middle of the pushes, never back and still registered (its lease
// has 30 s to run): every mapper whose attempt it broke commits on its next attempt, routed by
// the one epoch the revive made (racing writers do not make one each); nothing is lost or read
// twice; the survivors keep their partitions and the lost server's replicas are copied back.
TEST_F(ReviveTest, AServerKilledDuringThePushesCostsOneRetry) {
  Job job;
  job.id = "revived";
  job.partitions = 8;
  job.mappers = 6;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo before, client_->GetPlacement(job.id));
  const size_t victim = 1;
  const std::string gone = cluster_->node_id(victim);
  std::map<uint32_t, uint64_t> winners;
  // Half the mappers commit, then the others push at once and the server is killed mid-push.
  for (uint32_t m = 0; m < job.mappers / 2; ++m) {
    ASSERT_OK_AND_ASSIGN(auto won, WriteMapper(*client_, job, m, 1, job.items));
    winners[m] = 1;
    EXPECT_FALSE(won.duplicate);
  }
  std::vector<absl::Status> first_failure(job.mappers);
  WriteAtOnce(
      job, job.mappers / 2, job.mappers, 3, &winners,
      [&](uint32_t m, int i) {
        if (m != job.mappers / 2 || i != job.items / 2) return;
        killed_at_ = Clock::now();
        cluster_->Kill(victim);
      },
      &first_failure);
  const double kill_to_done = std::chrono::duration<double>(Clock::now() - killed_at_).count();
  std::printf("RESULT revive_kill_to_complete_s=%.1f\n", kill_to_done);
  ASSERT_EQ(winners.size(), job.mappers);
  // The attempt the kill broke failed retryably, saying the shuffle moved without the server;
  // its next attempt won (one retry).
  EXPECT_EQ(ReasonOf(first_failure[job.mappers / 2]), ErrorReason::kPlacementChanged)
      << first_failure[job.mappers / 2];
  EXPECT_THAT(first_failure[job.mappers / 2], StatusIs(absl::StatusCode::kUnavailable, gone));
  for (const auto& [m, attempt] : winners) EXPECT_LE(attempt, 2u) << "mapper " << m;
  EXPECT_LT(kill_to_done, 15.0) << "the lease is 30 s and the grace 600 s: only a revive helps";

  ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement(job.id));
  EXPECT_EQ(after.epoch, 1u) << "one revive for one lost server, whatever the writers";
  ExpectWithout(after, gone);
  for (uint32_t p = 0; p < job.partitions; ++p) {
    const std::string old_primary = before.nodes[before.replicas[p][0]].node_id;
    if (old_primary != gone) {
      EXPECT_EQ(after.nodes[after.replicas[p][0]].node_id, old_primary) << "partition " << p;
    }
  }
  ExpectCounts(job);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(30)));
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
}

// The revive call itself: a report routed by an epoch that is no longer the newest, or about a
// server the newest does not hold, changes nothing and answers the newest; a server does not
// revive itself; a shuffle that does not exist is NOT_FOUND.
TEST_F(ReviveTest, AReviveIsDecidedOnceAndAnswersTheNewestEpoch) {
  ASSERT_OK(client_->CreateShuffle("r", 8, 2, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo p, client_->GetPlacement("r"));
  const std::string n2 = cluster_->node_id(2), n3 = cluster_->node_id(3);
  // A reader's client that holds epoch 0's placement, and n2 that has read it too.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShuffleClient> stale, cluster_->Client());
  ASSERT_OK(stale->GetPlacement("r").status());
  ASSERT_OK(cluster_->Link(2)->client().GetShuffle("r").status());
  // n2 is alive: a writer's report is all it takes (the writer cannot reach it; the server
  // asked does not second-guess that), and it stays a repair source.
  ASSERT_OK_AND_ASSIGN(ShuffleClient::Revive first, client_->ReviveShuffle("r", p.epoch, n2));
  EXPECT_TRUE(first.revived);
  EXPECT_EQ(first.placement_epoch, p.epoch + 1);
  ASSERT_OK_AND_ASSIGN(ShuffleClient::Revive again, client_->ReviveShuffle("r", p.epoch, n2));
  EXPECT_FALSE(again.revived);
  EXPECT_EQ(again.placement_epoch, first.placement_epoch);
  ASSERT_OK_AND_ASSIGN(ShuffleClient::Revive older, client_->ReviveShuffle("r", p.epoch, n3));
  EXPECT_FALSE(older.revived) << "a report about an epoch that is no longer the newest";
  EXPECT_EQ(older.placement_epoch, first.placement_epoch);
  ASSERT_OK_AND_ASSIGN(PlacementInfo now, client_->GetPlacement("r"));
  EXPECT_EQ(now.epoch, first.placement_epoch);
  EXPECT_THAT(
      cluster_->Link(0)->client().ReviveShuffle("r", now.epoch, cluster_->node_id(0)).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, "the one answering"));
  EXPECT_THAT(client_->ReviveShuffle("nope", 0, n2).status(),
              StatusIs(absl::StatusCode::kNotFound, ""));
  // The shuffle still commits and reads exactly on the servers left.
  Job job;
  job.id = "r";
  job.partitions = 8;
  job.mappers = 2;
  std::map<uint32_t, uint64_t> winners;
  for (uint32_t m = 0; m < 2; ++m) {
    ASSERT_OK_AND_ASSIGN(auto won, replication_test::WriteWithRetries(*client_, job, m));
    winners[m] = won;
  }
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
  // n2, taken out while alive, does not know of the winners decided since: asked for a
  // complete read it says so (NOT_COMMITTED), and a reader routed by the old placement goes on
  // to a replica that has them: exact, never short.
  uint32_t led_by_n2 = job.partitions;
  for (uint32_t q = 0; q < job.partitions; ++q) {
    if (p.nodes[p.replicas[q][0]].node_id == n2) led_by_n2 = q;
  }
  ASSERT_LT(led_by_n2, job.partitions);
  ReaderOptions complete;
  complete.require_complete = true;
  auto direct = cluster_->Link(2)->client().OpenReader("r", led_by_n2, complete);
  absl::Status st = direct.status();
  Record rec;
  if (direct.ok()) st = (*direct)->Next(&rec).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kFailedPrecondition, "have not committed"));
  EXPECT_EQ(ReasonOf(st), ErrorReason::kNotCommitted);
  ExpectExactlyTheWinners(*stale, job, FetchOrder::kKey, winners, job.items);
}

// A writer given only the server it loses (a client of one seed) still has it revived: the
// revive is asked of the placement's other servers when no seed answers, so the shuffle's other
// writers go on at once.
TEST_F(ReviveTest, AWriterWhoseOnlySeedIsLostStillRevivesIt) {
  Job job;
  job.id = "oneseed";
  job.partitions = 8;
  job.mappers = 2;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  const size_t victim = 3;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShuffleClient> lonely, cluster_->ClientOf(victim));
  ASSERT_OK(WriteMapper(*lonely, job, 0, 1, job.items).status());
  auto broken = WriteMapper(*lonely, job, 1, 1, job.items, [&](int i) {
    if (i == job.items / 2) cluster_->Kill(victim);
  });
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(ReasonOf(broken.status()), ErrorReason::kPlacementChanged) << broken.status();
  ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement(job.id));
  EXPECT_EQ(after.epoch, 1u);
  ASSERT_OK(WriteMapper(*client_, job, 1, 2, job.items).status());
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, {{0, 1}, {1, 2}}, job.items);
}

// A rolling restart is not a loss: a writer that finds a drained server down waits for it
// (UNAVAILABLE, DRAINING, retry_after_ms 2000) instead of reviving it, and its retry commits on
// the same placement once the server is back: no epoch, nothing to copy.
TEST_F(ReviveTest, ADrainedServerIsWaitedForNotRevived) {
  Job job;
  job.id = "rolling";
  job.partitions = 8;
  job.mappers = 2;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo before, client_->GetPlacement(job.id));
  ASSERT_OK(WriteMapper(*client_, job, 0, 1, job.items).status());
  ASSERT_OK(cluster_->Stop(1));  // drained, exited 0
  auto during = WriteMapper(*client_, job, 1, 1, job.items);
  ASSERT_FALSE(during.ok());
  EXPECT_EQ(ReasonOf(during.status()), ErrorReason::kDraining) << during.status();
  EXPECT_EQ(RetryAfterOf(during.status()), std::chrono::milliseconds(2000));
  ASSERT_OK(cluster_->Restart(1));
  ASSERT_OK_AND_ASSIGN(auto won, replication_test::WriteWithRetries(*client_, job, 1, nullptr, 2));
  ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement(job.id));
  EXPECT_EQ(after.epoch, before.epoch) << "a drained restart is not revived";
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, {{0, 1}, {1, won}}, job.items);
}

// Records of partition `p` read to the end, or the read's error.
absl::StatusOr<uint64_t> CountRecords(ShuffleClient& client, const std::string& id, uint32_t p,
                                      const ReaderOptions& options) {
  auto reader = client.OpenReader(id, p, options);
  if (!reader.ok()) return reader.status();
  Record r;
  uint64_t n = 0;
  for (;;) {
    auto more = (*reader)->Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) return n;
    ++n;
  }
}

// A server that stalls (SIGSTOP: alive, registered, silent) in the middle of the pushes is
// revived once the writers' keepalive gives up on it, their retries commit without it, and
// when it resumes it makes no second winner and serves no short read: its prepared attempts of
// the old epoch are never decided, a complete read from it by the old placement is refused or
// whole, and readers by any placement read every record once.
TEST_F(ReviveTest, AStalledServerResumedAfterItsReviveChangesNothing) {
  Job job;
  job.id = "stalled";
  job.partitions = 8;
  job.mappers = 6;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo before, client_->GetPlacement(job.id));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShuffleClient> stale, cluster_->Client());
  ASSERT_OK(stale->GetPlacement(job.id).status());  // (kept for its TTL: epoch 0)
  std::map<uint32_t, uint64_t> winners;
  for (uint32_t m = 0; m < 3; ++m) {
    ASSERT_OK(WriteMapper(*client_, job, m, 1, job.items).status());
    winners[m] = 1;
  }
  const size_t victim = 2;
  const std::string gone = cluster_->node_id(victim);
  WriteAtOnce(job, 3, job.mappers, 4, &winners, [&](uint32_t m, int i) {
    if (m == 3 && i == job.items / 2) cluster_->Pause(victim);
  });
  ASSERT_EQ(winners.size(), job.mappers);
  ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement(job.id));
  EXPECT_EQ(after.epoch, 1u);
  ExpectWithout(after, gone);
  cluster_->Resume(victim);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // (it serves again)
  ExpectCounts(job);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
  ExpectExactlyTheWinners(*stale, job, FetchOrder::kKey, winners, job.items);
  // Straight from the resumed server, as a reader holding epoch 0 would ask it.
  ReaderOptions complete;
  complete.require_complete = true;
  for (uint32_t p = 0; p < job.partitions; ++p) {
    bool held = false;
    for (uint32_t n : before.replicas[p]) held = held || before.nodes[n].node_id == gone;
    if (!held) continue;
    ASSERT_OK_AND_ASSIGN(uint64_t whole, CountRecords(*client_, job.id, p, complete));
    auto direct = CountRecords(cluster_->Link(victim)->client(), job.id, p, complete);
    if (direct.ok()) {
      EXPECT_EQ(*direct, whole) << "partition " << p << ": a short read from " << gone;
    }
  }
  // Its prepared attempts of epoch 0 never won: every winner is the one the writers were told.
  ASSERT_OK_AND_ASSIGN(ShuffleStatus status, client_->GetShuffle(job.id));
  EXPECT_EQ(status.committed_mappers.size(), job.mappers);
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(30)));
}

}  // namespace
}  // namespace sluice
