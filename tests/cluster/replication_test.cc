// Replicated shuffles on a real cluster: a real etcd and three sluice-server processes, each on
// its own loopback address (127.0.0.2-4) with its own data directory, driven by the client
// given the server list. Round trips at R = 1 and 2 in both orders; kill -9 of each server in
// turn (during pushes, between the last commit and the fetches, in the middle of a KEY fetch);
// a SIGSTOPped server (reads and pushes); speculative attempts racing across replicas with a
// server killed in between; a fourth server joining mid-shuffle; a server refusing what it
// does not keep. Every time: each acknowledged commit is read back exactly once, one winning
// attempt per mapper everywhere, nothing twice.
// (Servers lost for good: replication_repair_test.cc; revoked decisions:
// replication_revocation_test.cc.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "codec/frame_format.h"
#include "rpc/error_reason.h"
#include "tests/cluster/replication_fixture.h"
#include "tests/harness/data_file.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using replication_test::Clock;
using replication_test::ExpectExactlyTheWinners;
using replication_test::Job;
using replication_test::Key;
using replication_test::kServers;
using replication_test::OrNull;
using replication_test::ReplicationTest;
using replication_test::RunCli;
using replication_test::WriteMapper;
using replication_test::WriteWithRetries;
using testing::TempDir;

TEST_F(ReplicationTest, RoundTripsAtOneAndTwoReplicasInBothOrders) {
  for (uint32_t r : {1u, 2u}) {
    Job job;
    job.id = absl::StrCat("rt", r);
    ASSERT_OK_AND_ASSIGN(bool created,
                         client_->CreateShuffle(job.id, job.partitions, job.mappers, r));
    ASSERT_TRUE(created);
    ASSERT_OK_AND_ASSIGN(PlacementInfo placed, client_->GetPlacement(job.id));
    EXPECT_TRUE(placed.clustered);
    EXPECT_EQ(placed.replication, r);
    std::map<uint32_t, uint64_t> winners;
    for (uint32_t m = 0; m < job.mappers; ++m) {
      if (r == 2 && m == job.mappers / 2) {
        // A fourth server joins mid-shuffle: the shuffle's placement stays as it was.
        ASSERT_OK(cluster_->Add().status());
        ASSERT_OK_AND_ASSIGN(std::vector<NodeAddress> nodes, client_->ListNodes());
        EXPECT_EQ(nodes.size(), 4u);
      }
      ASSERT_OK_AND_ASSIGN(winners[m], WriteWithRetries(*client_, job, m));
    }
    ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement(job.id));
    EXPECT_EQ(after.replicas, placed.replicas);
    EXPECT_EQ(after.nodes.size(), 3u);
    ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
    ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
    // Every replica of a partition holds the same: each server's own count of it agrees.
    std::vector<ShuffleStatus> per_server;
    for (size_t i = 0; i < 3; ++i) {
      const std::string& a = cluster_->address(i);
      std::unique_ptr<ServerLink> one = cluster_->Link(i);  // that server alone
      ASSERT_OK_AND_ASSIGN(ShuffleStatus st, one->client().GetShuffle(job.id));
      EXPECT_EQ(st.committed_mappers.size(), job.mappers) << a;
      per_server.push_back(st);
    }
    uint64_t stored = 0;
    for (uint32_t p = 0; p < job.partitions; ++p) {
      std::set<uint64_t> counts;
      for (uint32_t n : placed.replicas[p]) {
        const int server = placed.nodes[n].node_id.back() - '0';
        counts.insert(per_server[server].partitions[p].records);
      }
      EXPECT_EQ(counts.size(), 1u) << "replicas of partition " << p << " differ";
      stored += *counts.begin();
    }
    EXPECT_EQ(stored, uint64_t{job.mappers} * job.items);
  }
}

// The CLI reads a clustered shuffle, before and after a server is killed -9: every record once.
// (`sluice fetch` once let its client go while the reader still used the client's links: a
// crash, or a fetch that waited without end.)
TEST_F(ReplicationTest, TheCliFetchesEveryRecordOfAClusteredShuffle) {
  Job job;
  job.id = "cli";
  CreateAndWriteAll(job, 2);
  const auto fetched = [&] {
    int lines = 0;  // records
    for (uint32_t p = 0; p < job.partitions; ++p) {
      std::string text;
      EXPECT_EQ(RunCli(absl::StrCat("fetch --server ", cluster_->addresses(), " --shuffle ", job.id,
                                    " --partition ", p,
                                    " --order UNORDERED --format msgpack --output /dev/null"),
                       &text),
                0)
          << "partition " << p << ": " << text.substr(0, 400);
      int records = 0;
      EXPECT_EQ(std::sscanf(text.c_str(), "fetched %d records", &records), 1) << text;
      lines += records;
    }
    return lines;
  };
  EXPECT_EQ(fetched(), static_cast<int>(job.mappers) * job.items);
  cluster_->Kill(1);
  EXPECT_EQ(fetched(), static_cast<int>(job.mappers) * job.items);
}

TEST_F(ReplicationTest, KillingEachServerInTurnLosesAndRepeatsNothing) {
  // (1) n0 killed during the pushes, back 1.5 s later at its address: the attempts that failed
  // are retried and the shuffle completes.
  Job job;
  job.id = "kill";
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  std::atomic<bool> killed{false};
  std::map<uint32_t, uint64_t> winners;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (uint32_t m = 0; m < job.mappers; ++m) {
    threads.emplace_back([&, m] {
      auto won = WriteWithRetries(*client_, job, m, [&](int i) {
        if (m == 0 && i == job.items / 2 && !killed.exchange(true)) {
          cluster_->Kill(0);
        }
      });
      EXPECT_OK(won) << "mapper " << m;
      std::lock_guard<std::mutex> lock(mu);
      if (won.ok()) winners[m] = *won;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  while (!killed.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_OK(cluster_->Restart(0));
  for (auto& t : threads) t.join();
  ASSERT_EQ(winners.size(), job.mappers);
  EXPECT_GT(winners.at(0), 1u) << "mapper 0's first attempt should have failed with its server";
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);

  // (2) n1 killed after the last commit, before the fetches: its partitions come from their
  // other replicas, once they are whole (a writer that lost n0 in (1) may have revived it: the
  // partitions n0 held then went to servers that copy what they lack from the others).
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(30)));
  cluster_->Kill(1);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
  ASSERT_OK(cluster_->Restart(1));

  // (3) n2 killed in the middle of a KEY fetch of a partition it is primary of: the reader goes
  // on from the other replica where it left off. 8 MB of incompressible values a partition, so
  // that half of it is far more than the stream's windows hold: the rest must come from the
  // replica.
  job.id = "kill-key";
  job.partitions = 2;
  job.mappers = 2;
  job.items = 2000;
  job.filler = 4000;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  winners = WriteAll(job);
  ASSERT_EQ(winners.size(), job.mappers);
  uint32_t p = 0;
  while (p < job.partitions && PrimaryOf(job.id, p) != 2) ++p;
  if (p == job.partitions) {  // placement gave n2 no primary here: use the one that has p 0
    p = 0;
  }
  const int primary = PrimaryOf(job.id, p);
  ReaderOptions options;
  options.order = FetchOrder::kKey;
  options.require_complete = true;
  options.chunk_bytes = 4 << 10;
  std::vector<std::string> whole;  // the partition read in one go first
  {
    ASSERT_OK_AND_ASSIGN(auto reader, client_->OpenReader(job.id, p, options));
    Record r;
    while (*reader->Next(&r)) whole.push_back(std::string(r.key) + "=" + std::string(r.value));
  }
  ASSERT_GT(whole.size(), 1000u);
  std::vector<std::string> got;
  ASSERT_OK_AND_ASSIGN(auto reader, client_->OpenReader(job.id, p, options));
  Record r;
  for (;;) {
    if (got.size() == whole.size() / 4) cluster_->Kill(primary);
    ASSERT_OK_AND_ASSIGN(bool more, reader->Next(&r));
    if (!more) break;
    got.push_back(std::string(r.key) + "=" + std::string(r.value));
  }
  ASSERT_EQ(got.size(), whole.size()) << "records lost or repeated across the failover";
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i] == whole[i]) << "record " << i << " differs after the failover";
  }
}

TEST_F(ReplicationTest, AStoppedServerCostsABoundedWaitThenAReplicaServes) {
  Job job;
  job.id = "stop";
  const auto winners = CreateAndWriteAll(job, 2);
  ASSERT_EQ(winners.size(), job.mappers);
  const int stopped = PrimaryOf(job.id, 0);
  cluster_->Pause(stopped);
  const auto start = Clock::now();
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  const auto waited = Clock::now() - start;
  cluster_->Resume(stopped);
  // Keepalive (1 s + 1 s here) ends the calls to it; each partition it is primary of costs
  // about that once.
  EXPECT_LT(waited, std::chrono::seconds(30));

  // A push to a stopped server: the attempt fails within the same bound, naming it; once the
  // server runs again, a retry with a new attempt id commits.
  // (Its registration lapsed while it was stopped: placement takes the servers registered
  // when a shuffle is created, so wait for it to be back.)
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto nodes = client_->ListNodes();
        return nodes.ok() && nodes->size() == kServers;
      },
      std::chrono::seconds(10)));
  Job pushed;
  pushed.id = "stop-push";
  pushed.mappers = 1;
  ASSERT_OK(client_->CreateShuffle(pushed.id, pushed.partitions, pushed.mappers, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo placed, client_->GetPlacement(pushed.id));
  ASSERT_EQ(placed.nodes.size(), static_cast<size_t>(kServers));
  cluster_->Pause(stopped);
  const auto push_start = Clock::now();
  auto failed = WriteMapper(*client_, pushed, 0, 1, pushed.items);
  const auto push_waited = Clock::now() - push_start;
  cluster_->Resume(stopped);
  EXPECT_FALSE(failed.ok());
  EXPECT_TRUE(absl::IsUnavailable(failed.status()) || absl::IsDeadlineExceeded(failed.status()))
      << failed.status();
  EXPECT_LT(push_waited, std::chrono::seconds(15));
  std::map<uint32_t, uint64_t> pushed_winners;
  ASSERT_OK_AND_ASSIGN(pushed_winners[0], WriteWithRetries(*client_, pushed, 0));
  ExpectExactlyTheWinners(*client_, pushed, FetchOrder::kUnordered, pushed_winners, pushed.items);
}

TEST_F(ReplicationTest, SpeculativeAttemptsRaceAndOneWinsEverywhere) {
  Job job;
  job.id = "race";
  job.mappers = 2;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  // Mapper 0's attempts 1 and 2 race, with different data (attempt 2 writes more items); a
  // second client stands for a second worker.
  ASSERT_OK_AND_ASSIGN(auto other, cluster_->Client());
  absl::StatusOr<WriteResult> r1, r2;
  std::thread t1([&] { r1 = WriteMapper(*client_, job, 0, 1, job.items); });
  std::thread t2([&] { r2 = WriteMapper(*other, job, 0, 2, job.items + 500); });
  t1.join();
  t2.join();
  ASSERT_OK(r1);
  ASSERT_OK(r2);
  ASSERT_NE(r1->duplicate, r2->duplicate)
      << "exactly one attempt wins; winners said: " << r1->winning_attempt << ", "
      << r2->winning_attempt;
  const uint64_t winner = r1->duplicate ? 2 : 1;
  const int winner_items = winner == 1 ? job.items : job.items + 500;
  // A late third attempt is a duplicate.
  ASSERT_OK_AND_ASSIGN(WriteResult late, WriteMapper(*client_, job, 0, 3, 10));
  EXPECT_TRUE(late.duplicate);
  ASSERT_OK_AND_ASSIGN(WriteResult m1, WriteMapper(*client_, job, 1, 1, winner_items));
  EXPECT_FALSE(m1.duplicate);
  // A server killed in between: the survivors agree on the winner in every partition.
  cluster_->Kill(PrimaryOf(job.id, 1));
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, {{0, winner}, {1, 1}}, winner_items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, {{0, winner}, {1, 1}},
                          winner_items);
}

// What a client that ignores the placement (or an old one) meets: a server refuses frames and
// fetches of partitions it does not keep, and a commit that skips the protocol.
TEST_F(ReplicationTest, AServerRefusesPartitionsItDoesNotKeepAndPlainCommits) {
  Job job;
  job.id = "direct";
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 1).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo placed, client_->GetPlacement(job.id));
  // n0 and a partition it does not keep, and one it does.
  int other = -1, own = -1;
  for (uint32_t p = 0; p < job.partitions; ++p) {
    const bool on_n0 = placed.nodes[placed.replicas[p][0]].node_id == "n0";
    if (on_n0 && own < 0) own = static_cast<int>(p);
    if (!on_n0 && other < 0) other = static_cast<int>(p);
  }
  ASSERT_GE(own, 0);
  ASSERT_GE(other, 0);
  std::unique_ptr<ServerLink> n0 = cluster_->Link(0);
  ReaderOptions read;
  ASSERT_OK_AND_ASSIGN(auto reader, n0->client().OpenReader(job.id, other, read));
  Record r;
  EXPECT_THAT(reader->Next(&r).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                absl::StrCat("keeps no replica of partition ", other)));
  // A frame of a partition kept elsewhere is refused; so is a plain commit of an attempt.
  {
    ASSERT_OK_AND_ASSIGN(auto stream, n0->OpenPush(job.id, 0, 1, /*prepare=*/true, /*epoch=*/0));
    *stream->NewFrame(static_cast<uint32_t>(other)) = "not even a frame";  // (placement first)
    absl::Status st = stream->SendFrame();
    if (st.ok()) st = stream->SendCommit(1, 1);
    if (st.ok()) st = stream->FinishCommit().status();
    EXPECT_THAT(st, testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                      absl::StrCat("partition ", other,
                                                   " of shuffle 'direct' is "
                                                   "kept on other servers")));
  }
  ASSERT_OK_AND_ASSIGN(auto plain, n0->OpenPush(job.id, 1, 1, /*prepare=*/false, /*epoch=*/0));
  ASSERT_OK(plain->SendCommit(0, 0));
  EXPECT_THAT(plain->FinishCommit().status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, "part of a cluster"));
  // A decision for an attempt the server never prepared.
  EXPECT_THAT(
      n0->CommitMapper(job.id, 1, 7, /*epoch=*/0).status(),
      testing::StatusIs(absl::StatusCode::kFailedPrecondition, "is not prepared on server n0"));

  // The cluster's view of the shuffle: each partition counted from its server; with n1 gone
  // (and R = 1), its partitions are named unavailable and cannot be read.
  const auto winners = WriteAll(job);
  ASSERT_EQ(winners.size(), job.mappers);
  ASSERT_OK_AND_ASSIGN(ShuffleStatus all, client_->GetShuffle(job.id));
  EXPECT_EQ(all.committed_mappers.size(), job.mappers);
  uint64_t records = 0;
  for (const auto& part : all.partitions) records += part.records;
  EXPECT_EQ(records, uint64_t{job.mappers} * job.items);
  EXPECT_TRUE(all.unavailable_partitions.empty());
  cluster_->Kill(1);
  std::vector<uint32_t> on_n1;
  for (uint32_t p = 0; p < job.partitions; ++p) {
    if (placed.nodes[placed.replicas[p][0]].node_id == "n1") on_n1.push_back(p);
  }
  ASSERT_FALSE(on_n1.empty());
  ASSERT_OK_AND_ASSIGN(ShuffleStatus degraded, client_->GetShuffle(job.id));
  EXPECT_EQ(degraded.unavailable_partitions, on_n1);
  ASSERT_OK_AND_ASSIGN(auto lost, client_->OpenReader(job.id, on_n1[0], read));
  EXPECT_THAT(lost->Next(&r).status(),
              testing::StatusIs(absl::StatusCode::kUnavailable, "no replica of partition"));
  // Deleted from the cluster; n1's copy stays until it is deleted there, and the error says so.
  EXPECT_THAT(client_->DeleteShuffle(job.id),
              testing::StatusIs(absl::StatusCode::kUnavailable, "remain until deleted there"));
  EXPECT_THAT(client_->GetShuffle(job.id).status(),
              testing::StatusIs(absl::StatusCode::kNotFound, ""));
  ASSERT_OK(cluster_->Restart(1));
  std::unique_ptr<ServerLink> n1 = cluster_->Link(1);
  ASSERT_OK_AND_ASSIGN(auto listed, n1->client().ListShuffles());
  ASSERT_EQ(listed.size(), 1u);
  ASSERT_OK(n1->client().DeleteShuffle(job.id));
  ASSERT_OK_AND_ASSIGN(listed, n1->client().ListShuffles());
  EXPECT_TRUE(listed.empty());
}

// A server that lost its data directory comes back empty: it must not serve the shuffle as if
// it were whole (the reader goes to the other replica), nor count it in the shuffle's status.
TEST_F(ReplicationTest, AServerThatLostItsDataIsNotReadFrom) {
  Job job;
  job.id = "lost";
  const auto winners = CreateAndWriteAll(job, 2);
  ASSERT_EQ(winners.size(), job.mappers);
  const int victim = PrimaryOf(job.id, 0);
  cluster_->Kill(victim);
  ASSERT_OK(cluster_->Wipe(victim));  // a new, empty disk
  ASSERT_OK(cluster_->Restart(victim));
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ASSERT_OK_AND_ASSIGN(ShuffleStatus all, client_->GetShuffle(job.id));
  uint64_t records = 0;
  for (const auto& part : all.partitions) records += part.records;
  EXPECT_EQ(records, uint64_t{job.mappers} * job.items);
  std::unique_ptr<ServerLink> alone = cluster_->Link(victim);
  EXPECT_THAT(alone->client().GetShuffle(job.id).status(),
              testing::StatusIs(absl::StatusCode::kDataLoss, "what it had prepared is gone"));
}

// Every committed payload of one server's replicas rots on disk (one byte at each frame's end),
// found at start by nothing (a start reads logs only): readers get DATA_LOSS from that server,
// read the other replica, and get every record once; the server marks what it read damaged,
// and its scrub finds the rest.
TEST_F(ReplicationTest, ARottenReplicaIsReadAroundAndMarkedDamaged) {
  Job job;
  job.id = "rot";
  const auto winners = CreateAndWriteAll(job, 2);
  ASSERT_EQ(winners.size(), job.mappers);
  const int victim = PrimaryOf(job.id, 0);
  cluster_->Kill(victim);
  {
    const std::string path = cluster_->data_dir(victim) + "/shuffles/rot/data";
    const auto blocks = testing::DataFileBlocks(path);
    ASSERT_FALSE(blocks.empty()) << path;
    for (const auto& [at, frame] : blocks) testing::PutByte(path, at + 32 + frame - 1, '\x5a');
  }
  ASSERT_OK(cluster_->Restart(victim, {"--scrub_mb_per_s=0"}));
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
  {
    std::unique_ptr<ServerLink> alone = cluster_->Link(victim);
    ASSERT_OK_AND_ASSIGN(ShuffleStatus here, alone->client().GetShuffle(job.id));
    ASSERT_GT(here.partitions.size(), 0u);
    EXPECT_TRUE(here.partitions[0].damaged) << "its primary partition was read and failed";
  }
  // The cluster's status takes each partition from a whole replica.
  ASSERT_OK_AND_ASSIGN(ShuffleStatus all, client_->GetShuffle(job.id));
  uint64_t records = 0;
  for (const auto& part : all.partitions) {
    records += part.records;
    EXPECT_FALSE(part.damaged) << part.damage;
  }
  EXPECT_EQ(records, uint64_t{job.mappers} * job.items);
  // With the scrub on, every partition it keeps is found damaged with nobody reading.
  cluster_->Kill(victim);
  ASSERT_OK(cluster_->Restart(victim, {"--scrub_mb_per_s=64"}));
  ASSERT_OK_AND_ASSIGN(PlacementInfo placed, client_->GetPlacement(job.id));
  std::vector<uint32_t> kept;
  for (uint32_t p = 0; p < job.partitions; ++p) {
    for (uint32_t n : placed.replicas[p]) {
      if (placed.nodes[n].node_id == cluster_->node_id(victim)) kept.push_back(p);
    }
  }
  ASSERT_FALSE(kept.empty());
  EXPECT_TRUE(testing::Eventually(
      [&] {
        std::unique_ptr<ServerLink> alone = cluster_->Link(victim);
        auto here = alone->client().GetShuffle(job.id);
        if (!here.ok()) return false;
        for (uint32_t p : kept) {
          if (p >= here->partitions.size() || !here->partitions[p].damaged) return false;
        }
        return true;
      },
      std::chrono::seconds(20)));
}

// A mapper committed while a reader is half-way through a partition: a replica that takes
// over serves exactly the mappers the first one did, so nothing is skipped or repeated.
TEST_F(ReplicationTest, AReaderResumesOverTheSameMappersWhenMoreCommitMeanwhile) {
  Job job;
  job.id = "late";
  job.partitions = 2;
  job.mappers = 3;
  job.items = 1500;
  job.filler = 8000;  // ~12 MB a partition: far more than the stream's windows hold
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  std::map<uint32_t, uint64_t> first;
  for (uint32_t m : {0u, 2u}) {
    ASSERT_OK_AND_ASSIGN(first[m], WriteWithRetries(*client_, job, m));
  }
  const int primary = PrimaryOf(job.id, 0);
  ReaderOptions options;  // not require_complete: mappers 0 and 2 as they are
  options.order = FetchOrder::kUnordered;
  options.chunk_bytes = 4 << 10;
  ASSERT_OK_AND_ASSIGN(auto reader, client_->OpenReader(job.id, 0, options));
  std::set<std::pair<uint32_t, int>> seen;
  Record r;
  bool killed = false;
  for (;;) {
    if (!killed && seen.size() == 300) {
      ASSERT_OK(WriteWithRetries(*client_, job, 1).status());  // committed on both replicas
      cluster_->Kill(primary);
      killed = true;
    }
    ASSERT_OK_AND_ASSIGN(bool more, reader->Next(&r));
    if (!more) break;
    std::vector<std::string> parts =
        absl::StrSplit(absl::string_view(r.value.data(), r.value.size()), '-');
    uint32_t m = 0;
    int i = 0;
    ASSERT_TRUE(absl::SimpleAtoi(parts[0].substr(1), &m) &&
                absl::SimpleAtoi(parts[1].substr(1), &i));
    ASSERT_NE(m, 1u) << "a mapper committed after the read began";
    ASSERT_TRUE(seen.emplace(m, i).second) << "mapper " << m << " item " << i << " twice";
  }
  ASSERT_TRUE(killed);
  // Exactly partition 0's records of mappers 0 and 2.
  size_t expected = 0;
  for (uint32_t m : {0u, 2u}) {
    for (int i = 0; i < job.items; ++i) expected += HashPartition(Key(m, i), job.partitions) == 0;
  }
  EXPECT_EQ(seen.size(), expected);
}

// Tenants in a cluster: each server takes the same credentials; tenant B finds none of tenant
// A's shuffles through any server; A's shuffle quota counts what etcd records, wherever the
// shuffles are kept, so creating through a server that keeps none of them does not pass it.
TEST(ClusterTenantsTest, IsolationAndTheShuffleQuotaHoldAcrossServers) {
  TempDir creds_dir;
  const std::string creds = creds_dir.path() + "/credentials";
  std::ofstream(creds) << rpc::TokenHash("slc_a") << " team-a tenant\n"
                       << rpc::TokenHash("slc_b") << " team-b tenant\n"
                       << "quota team-a shuffles=3\n";
  testing::MiniClusterOptions options;
  options.servers = 2;
  options.flags.push_back("--auth_file=" + creds);
  ASSERT_OK_AND_ASSIGN(auto cluster, testing::MiniCluster::Start(options));
  auto as = [](const std::string& token) {
    ClientOptions o = testing::MiniCluster::ShortDeadlines();
    o.token = token;
    return o;
  };
  auto a = OrNull(cluster->Client(as("slc_a")));
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto nodes = a->ListNodes();
        return nodes.ok() && nodes->size() == 2;
      },
      std::chrono::seconds(20)));
  // One partition each, replication 1: some are kept on one server, some on the other.
  const Job job{"job0", 1, 2, 200, 40};
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(a->CreateShuffle(absl::StrCat("job", i), 1, 2, 1).status());
  }
  ASSERT_OK(WriteMapper(*a, job, 0, 1, job.items, nullptr).status());
  ASSERT_OK(WriteMapper(*a, job, 1, 1, job.items, nullptr).status());
  ExpectExactlyTheWinners(*a, job, FetchOrder::kKey, {{0, 1}, {1, 1}}, job.items);
  // The fourth, through either server alone, passes the quota: refused.
  for (size_t i = 0; i < 2; ++i) {
    auto only = OrNull(cluster->ClientOf(i, as("slc_a")));
    absl::Status st = only->CreateShuffle("job3", 1, 2, 1).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    EXPECT_NE(st.message().find("in the cluster"), absl::string_view::npos) << st;
    // Asking again for one it has is no new shuffle.
    EXPECT_OK(only->CreateShuffle("job1", 1, 2, 1).status());
  }
  // Team B: nothing of team A's, through either server.
  auto b = OrNull(cluster->Client(as("slc_b")));
  EXPECT_EQ(b->GetShuffle("job0").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->GetPlacement("job0").status().code(), absl::StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(auto listed, b->ListShuffles());
  EXPECT_TRUE(listed.empty());
  // A delete makes room again.
  ASSERT_OK(a->DeleteShuffle("job2"));
  EXPECT_OK(a->CreateShuffle("job3", 1, 2, 1).status());
}

}  // namespace
}  // namespace sluice
