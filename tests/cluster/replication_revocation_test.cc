// Revoked decisions and epoch changes on a real cluster (docs/cluster.md, "Revoking
// decisions"): a lost partition's mappers revoked and run again into the same shuffle, read
// exactly in both orders with no revoked record anywhere; attempts of one mapper racing across
// an epoch change have exactly one winner on every replica.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "rpc/error_reason.h"
#include "tests/cluster/replication_fixture.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using replication_test::ExpectExactlyTheWinners;
using replication_test::Job;
using replication_test::LostServerTest;
using replication_test::RunCli;
using replication_test::WriteMapper;
using replication_test::WriteWithRetries;

// Revoking decisions (docs/cluster.md): both replicas of partition 0 killed for good, its
// mappers reported lost, then revoked (`sluice revoke --lost`) and run again into the same
// shuffle: every partition then reads exactly the new winners in both orders, the revoked
// attempts' records nowhere. A reader that began before the revocation and fails over after it
// is refused (ABORTED, REVOKED) rather than served a mix of attempts; a repeat of the revocation
// revokes nothing new.
TEST_F(LostServerTest, ALostPartitionsMappersAreRevokedAndRunAgainIntoTheSameShuffle) {
  Job job;
  job.id = "revoke";
  job.partitions = 8;
  job.mappers = 4;
  job.filler = 1000;  // ~1.5 MB a partition: more than a fetch stream buffers ahead of its reader
  const auto first = CreateAndWriteAll(job, 2);
  ASSERT_OK_AND_ASSIGN(const PlacementInfo before, client_->GetPlacement(job.id));
  std::set<std::string> victims;
  for (uint32_t n : before.replicas[0]) victims.insert(before.nodes[n].node_id);
  // A reader begun before, on a partition whose primary is a victim and whose other replica
  // survives: it will fail over after the revocation.
  std::unique_ptr<ShuffleReader> early;
  uint32_t early_partition = 0;
  for (uint32_t p = 0; p < job.partitions && early == nullptr; ++p) {
    const auto& r = before.replicas[p];
    if (victims.count(before.nodes[r[0]].node_id) && !victims.count(before.nodes[r[1]].node_id)) {
      ReaderOptions options;
      options.order = FetchOrder::kKey;
      options.chunk_bytes = 4 << 10;
      ASSERT_OK_AND_ASSIGN(early, client_->OpenReader(job.id, p, options));
      early_partition = p;
    }
  }
  ASSERT_NE(early, nullptr) << "no partition has a victim primary and a surviving replica";
  Record r;
  for (int i = 0; i < 10; ++i) ASSERT_OK(early->Next(&r).status());

  for (size_t i = 0; i < 4; ++i) {
    if (victims.count(cluster_->node_id(i))) cluster_->Kill(i);
  }
  for (const std::string& gone : victims) PlacedWithout(job.id, gone);
  ShuffleStatus status;
  std::set<uint32_t> lost_mappers;  // (marked over the repairer's rounds)
  EXPECT_TRUE(testing::Eventually(
      [&] {
        auto st = client_->GetShuffle(job.id);
        if (!st.ok()) return false;
        status = *st;
        lost_mappers.clear();
        for (const LostPartition& l : status.lost_partitions) {
          lost_mappers.insert(l.mappers.begin(), l.mappers.end());
        }
        return lost_mappers == std::set<uint32_t>{0, 1, 2, 3};
      },
      std::chrono::seconds(30)))
      << "lost mappers " << absl::StrJoin(lost_mappers, ",");

  std::string text;
  ASSERT_EQ(RunCli(absl::StrCat("revoke --server ", cluster_->addresses(), " --shuffle ", job.id,
                                " --lost"),
                   &text),
            0)
      << text;
  EXPECT_NE(text.find("revoked in revoke at placement epoch"), std::string::npos) << text;
  ASSERT_OK_AND_ASSIGN(ShuffleStatus revoked, client_->GetShuffle(job.id));
  EXPECT_TRUE(revoked.committed_mappers.empty());
  EXPECT_TRUE(revoked.lost_partitions.empty());
  EXPECT_GT(revoked.placement_epoch, status.placement_epoch);

  // A replica asked to resume a read of the revoked attempts refuses: never a mix.
  const auto& kept = before.replicas[early_partition];
  ReaderOptions resume;
  resume.order = FetchOrder::kKey;
  resume.skip_records = 10;
  for (const auto& [m, attempt] : first) {
    resume.only_mappers.push_back(m);
    resume.only_attempts.push_back(attempt);
  }
  auto link = Alone(before.nodes[kept[1]]);
  auto refused = link->OpenFetch(job.id, early_partition, resume, /*report_mappers=*/false);
  const std::string* frame = nullptr;
  absl::StatusOr<bool> got = refused->Next(&frame);
  EXPECT_THAT(got.status(), testing::StatusIs(absl::StatusCode::kAborted, "revoked"));
  EXPECT_EQ(ReasonOf(got.status()), ErrorReason::kRevoked);
  // The early reader, whose server was killed, fails over onto such a replica and is refused
  // (ABORTED, REVOKED); unless its stream had already brought it the whole partition, which is
  // then exactly the revoked attempts' records.
  absl::StatusOr<bool> more = true;
  uint64_t records = 10;
  while (more.ok() && *more) {
    more = early->Next(&r);
    if (more.ok() && *more) {
      ++records;
      const std::vector<std::string> parts =
          absl::StrSplit(absl::string_view(r.value.data(), r.value.size()), '-');
      uint32_t m = 0;
      uint64_t a = 0;
      ASSERT_TRUE(parts.size() >= 3 && absl::SimpleAtoi(parts[0].substr(1), &m) &&
                  absl::SimpleAtoi(parts[2].substr(1), &a) && first.count(m))
          << r.value;
      ASSERT_EQ(a, first.at(m)) << "a read mixing attempts";
    }
  }
  std::fprintf(stderr, "the early reader of partition %u %s after %llu records\n", early_partition,
               more.ok() ? "read it whole" : "was refused",
               static_cast<unsigned long long>(records));
  if (more.ok()) {
    EXPECT_EQ(records, status.partitions[early_partition].records);
  } else {
    EXPECT_THAT(more.status(), testing::StatusIs(absl::StatusCode::kAborted, "revoked"))
        << "partition " << early_partition;
    EXPECT_EQ(ReasonOf(more.status()), ErrorReason::kRevoked);
  }

  // The engine runs the mappers again (new attempt ids), into the same shuffle.
  std::map<uint32_t, uint64_t> again;
  for (uint32_t m = 0; m < job.mappers; ++m) {
    ASSERT_OK_AND_ASSIGN(again[m], WriteWithRetries(*client_, job, m, nullptr, 100));
    EXPECT_NE(again[m], first.at(m));
  }
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, again, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, again, job.items);
  // A repeat from the epoch the revocation was asked at: the same attempts, nothing new.
  ASSERT_OK_AND_ASSIGN(ShuffleClient::Revocation repeat,
                       client_->RevokeMappers(job.id, {0, 1, 2, 3}, status.placement_epoch));
  for (uint32_t m = 0; m < 4; ++m) EXPECT_EQ(repeat.attempts[m], first.at(m));
  ASSERT_OK_AND_ASSIGN(ShuffleStatus after, client_->GetShuffle(job.id));
  EXPECT_EQ(after.committed_mappers, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(after.lost_partitions.empty());
  // An epoch the shuffle never had is the caller's mistake.
  EXPECT_THAT(client_->RevokeMappers(job.id, {0}, after.placement_epoch + 1).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, "newer than its newest"));
}

// Attempts of one mapper across an epoch change: one prepared in the old epoch cannot be
// decided in the new one (PLACEMENT_CHANGED, retryable); the retry in the new epoch wins; a
// late one is a duplicate; every replica serves exactly the winner.
TEST_F(LostServerTest, AttemptsRacingAcrossAnEpochChangeHaveExactlyOneWinner) {
  Job job;
  job.id = "race";
  job.partitions = 8;
  job.mappers = 2;
  job.items = 1000;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo before, client_->GetPlacement(job.id));
  // Attempt 1 of mapper 0 prepared (with no records) on every server of epoch 0.
  std::vector<std::unique_ptr<ServerLink>> links;
  std::set<uint32_t> servers;
  for (const auto& r : before.replicas) servers.insert(r.begin(), r.end());
  for (uint32_t n : servers) {
    links.push_back(Alone(before.nodes[n]));
    ASSERT_OK_AND_ASSIGN(auto stream,
                         links.back()->OpenPush(job.id, 0, 1, /*prepare=*/true, /*epoch=*/0));
    ASSERT_OK(stream->SendCommit(0, 0));
    ASSERT_OK(stream->FinishCommit().status());
  }
  ASSERT_OK_AND_ASSIGN(uint64_t m1, WriteWithRetries(*client_, job, 1));
  const size_t victim = 3;
  cluster_->Kill(victim);
  const PlacementInfo after = PlacedWithout(job.id, cluster_->node_id(victim));
  EXPECT_GE(after.epoch, 1u);
  // Its decision now: refused, retryable, on any server.
  ServerLink* survivor = nullptr;
  for (auto& link : links) {
    if (link->address() != cluster_->address(victim)) survivor = link.get();
  }
  ASSERT_NE(survivor, nullptr);
  absl::StatusOr<uint64_t> late = survivor->CommitMapper(job.id, 0, 1, /*epoch=*/0);
  EXPECT_THAT(late.status(), testing::StatusIs(absl::StatusCode::kUnavailable, "epoch"));
  EXPECT_EQ(ReasonOf(late.status()), ErrorReason::kPlacementChanged);
  // An old-epoch push is refused at its open once the server has read the new epoch (within
  // a second), or else at its decision: either way retryably.
  auto old_push = survivor->OpenPush(job.id, 0, 5, /*prepare=*/true, /*epoch=*/0);
  absl::Status st = old_push.status();
  if (st.ok()) st = (*old_push)->SendCommit(0, 0);
  if (st.ok()) st = (*old_push)->FinishCommit().status();
  if (st.ok()) st = survivor->CommitMapper(job.id, 0, 5, /*epoch=*/0).status();
  EXPECT_EQ(ReasonOf(st), ErrorReason::kPlacementChanged) << Describe(st);
  // The engine's retries, routed afresh, win (the first may still follow the client's cached
  // placement and fail); a later attempt is a duplicate.
  ASSERT_OK_AND_ASSIGN(uint64_t m0, WriteWithRetries(*client_, job, 0, nullptr, 2));
  EXPECT_GE(m0, 2u);
  ASSERT_OK_AND_ASSIGN(WriteResult again, WriteMapper(*client_, job, 0, 9, 10));
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.winning_attempt, m0);
  ExpectCounts(job);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, {{0, m0}, {1, m1}}, job.items);
  // Every replica agrees: each partition read from each of its servers alone.
  for (uint32_t p = 0; p < job.partitions; ++p) {
    std::optional<uint64_t> records;
    for (uint32_t n : after.replicas[p]) {
      std::unique_ptr<ServerLink> one = Alone(after.nodes[n]);
      auto here = one->client().GetShuffle(job.id);
      ASSERT_OK(here);
      if (here->partitions[p].missing_mappers != 0) continue;  // a replica not repaired yet
      if (records.has_value()) {
        EXPECT_EQ(*records, here->partitions[p].records) << "partition " << p;
      }
      records = here->partitions[p].records;
    }
    EXPECT_TRUE(records.has_value()) << "partition " << p << " has no whole replica";
  }
}

}  // namespace
}  // namespace sluice
