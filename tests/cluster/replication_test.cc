// Replicated shuffles on a real cluster: a real etcd and three sluice-server processes, each on
// its own loopback address (127.0.0.2-4) with its own data directory, driven by the client
// given the server list. Round trips at R = 1 and 2 in both orders; kill -9 of each server in
// turn (during pushes, between the last commit and the fetches, in the middle of a KEY fetch);
// a SIGSTOPped server (reads and pushes); speculative attempts racing across replicas with a
// server killed in between; a fourth server joining mid-shuffle; a server refusing what it
// does not keep. Every time: each acknowledged commit is read back exactly once, one winning
// attempt per mapper everywhere, nothing twice.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include <array>
#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/server_process.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "codec/frame_format.h"
#include "rpc/error_reason.h"
#include "rpc/tls_options.h"
#include "tests/harness/data_file.h"
#include "tests/harness/etcd_process.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/run_command.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using testing::EtcdProcess;
using testing::TempDir;
using Clock = std::chrono::steady_clock;

constexpr int kServers = 3;

// A shuffle of the test: `mappers` x `items` records, value "m<m>-i<i>-a<attempt>".
struct Job {
  std::string id;
  uint32_t partitions = 6;
  uint32_t mappers = 4;
  int items = 3000;
  size_t filler = 40;  // bytes added to each value; incompressible past 40
};

// The value's filler: x's, or for large fillers pseudo-random letters (zstd cannot shrink
// them, so the fetch stream really carries that much).
std::string Filler(uint32_t m, int i, size_t n) {
  if (n <= 40) return std::string(n, 'x');
  std::string out(n, 'a');
  uint64_t x = 0x9e3779b97f4a7c15ULL * (m + 1) + static_cast<uint64_t>(i);
  for (char& c : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>('a' + x % 26);
  }
  return out;
}

std::string Key(uint32_t m, int i) { return absl::StrCat("key", (m * 7919 + i * 31) % 500); }

// Runs `sluice ARGS` (stderr with stdout); its exit code (-1: not run or killed) and output.
int RunCli(const std::string& args, std::string* out) {
  return testing::RunCommand(absl::StrCat(SLUICE_CLI_BIN, " ", args), out);
}

absl::StatusOr<WriteResult> WriteMapper(ShuffleClient& client, const Job& job, uint32_t m,
                                        uint64_t attempt, int items,
                                        const std::function<void(int)>& each = nullptr) {
  WriterOptions options;
  options.sort_by_key = true;
  options.buffer_bytes = 64 << 10;  // many frames, so a kill lands in the middle
  auto writer = client.OpenWriter(job.id, m, attempt, options);
  if (!writer.ok()) return writer.status();
  for (int i = 0; i < items; ++i) {
    if (each) each(i);
    const std::string value =
        absl::StrCat("m", m, "-i", i, "-a", attempt, "-", Filler(m, i, job.filler));
    if (absl::Status st = (*writer)->Add(Key(m, i), value); !st.ok()) return st;
  }
  return (*writer)->Close();
}

// An engine's mapper: a failed attempt is retried with a new attempt id, 600 ms apart. Returns
// the attempt that won.
absl::StatusOr<uint64_t> WriteWithRetries(ShuffleClient& client, const Job& job, uint32_t m,
                                          const std::function<void(int)>& each = nullptr,
                                          uint64_t first_attempt = 1, uint64_t attempts = 12) {
  absl::Status last;
  for (uint64_t attempt = first_attempt; attempt < first_attempt + attempts; ++attempt) {
    auto r =
        WriteMapper(client, job, m, attempt, job.items, attempt == first_attempt ? each : nullptr);
    if (r.ok()) {
      // A duplicate: an earlier attempt won after all (its answer was lost with its server).
      if (r->duplicate) return r->winning_attempt;
      return attempt;
    }
    last = r.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }
  return last;
}

// Reads every partition; checks each (mapper, item) comes exactly once, from the mapper's
// winning attempt, and KEY order holds.
void ExpectExactlyTheWinners(ShuffleClient& client, const Job& job, FetchOrder order,
                             const std::map<uint32_t, uint64_t>& winners, int items) {
  std::set<std::pair<uint32_t, int>> seen;
  for (uint32_t p = 0; p < job.partitions; ++p) {
    ReaderOptions options;
    options.order = order;
    options.require_complete = true;
    options.chunk_bytes = 16 << 10;
    ASSERT_OK_AND_ASSIGN(auto reader, client.OpenReader(job.id, p, options));
    std::string previous;
    Record r;
    for (;;) {
      absl::StatusOr<bool> more = reader->Next(&r);
      ASSERT_OK(more) << "partition " << p;
      if (!*more) break;
      if (order == FetchOrder::kKey) {
        ASSERT_FALSE(KeyLess(r.key, previous)) << "partition " << p << " out of key order";
        previous.assign(r.key);
      }
      std::vector<std::string> parts =
          absl::StrSplit(absl::string_view(r.value.data(), r.value.size()), '-');
      ASSERT_GE(parts.size(), 3u) << r.value;
      uint32_t m = 0;
      int i = 0;
      uint64_t a = 0;
      ASSERT_TRUE(absl::SimpleAtoi(parts[0].substr(1), &m) &&
                  absl::SimpleAtoi(parts[1].substr(1), &i) &&
                  absl::SimpleAtoi(parts[2].substr(1), &a))
          << r.value;
      ASSERT_EQ(std::string(r.key), Key(m, i));
      ASSERT_TRUE(winners.count(m)) << "mapper " << m << " never committed";
      ASSERT_EQ(a, winners.at(m)) << "mapper " << m << ": a record of a losing attempt";
      ASSERT_TRUE(seen.emplace(m, i).second) << "mapper " << m << " item " << i << " twice";
    }
  }
  EXPECT_EQ(seen.size(), winners.size() * static_cast<size_t>(items));
}

// The client a MiniCluster made, or null after a failure (reported).
std::unique_ptr<ShuffleClient> OrNull(absl::StatusOr<std::unique_ptr<ShuffleClient>> c) {
  EXPECT_OK(c);
  return c.ok() ? *std::move(c) : nullptr;
}

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cluster_, testing::MiniCluster::Start());
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  }

  // The server of a placement's node alone.
  std::unique_ptr<ServerLink> Alone(const NodeAddress& node) {
    return cluster_->Link(cluster_->index_of(node.node_id));
  }

  // The server (index) that is primary of `partition`.
  int PrimaryOf(const std::string& id, uint32_t partition) {
    auto p = client_->GetPlacement(id);
    EXPECT_OK(p);
    if (!p.ok()) return 0;
    const std::string& node = p->nodes[p->replicas[partition][0]].node_id;
    return node.back() - '0';
  }

  // Creates `job` with `replication` and writes all its mappers; their winning attempts.
  std::map<uint32_t, uint64_t> CreateAndWriteAll(const Job& job, uint32_t replication) {
    EXPECT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, replication).status());
    auto winners = WriteAll(job);
    EXPECT_EQ(winners.size(), job.mappers);
    return winners;
  }

  // Writes every mapper of `job` once, concurrently; their winning attempts.
  std::map<uint32_t, uint64_t> WriteAll(const Job& job) {
    std::map<uint32_t, uint64_t> winners;
    std::mutex mu;
    std::vector<std::thread> threads;
    for (uint32_t m = 0; m < job.mappers; ++m) {
      threads.emplace_back([&, m] {
        auto won = WriteWithRetries(*client_, job, m);
        EXPECT_OK(won) << "mapper " << m;
        std::lock_guard<std::mutex> lock(mu);
        if (won.ok()) winners[m] = *won;
      });
    }
    for (auto& t : threads) t.join();
    return winners;
  }

  std::unique_ptr<testing::MiniCluster> cluster_;
  std::unique_ptr<ShuffleClient> client_;
};

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
  // other replicas.
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

// Four secured servers: writes `job` at R = 2 (its winners in *winners), kills server `victim`
// for good, and waits until it is taken out and every partition is whole again on 2 registered
// servers, copied by the servers themselves (`admin(i)`: a client of server i allowed GetNode).
void WriteThenLoseOneForGood(ShuffleClient& client, testing::MiniCluster& cluster, const Job& job,
                             size_t victim,
                             const std::function<std::unique_ptr<ShuffleClient>(size_t)>& admin,
                             std::map<uint32_t, uint64_t>* winners) {
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto nodes = client.ListNodes();
        return nodes.ok() && nodes->size() == 4;
      },
      std::chrono::seconds(20)));
  ASSERT_OK(client.CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  for (uint32_t m = 0; m < job.mappers; ++m) {
    ASSERT_OK_AND_ASSIGN((*winners)[m], WriteWithRetries(client, job, m));
  }
  cluster.Kill(victim);
  ShuffleStatus status;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto placed = client.GetPlacement(job.id);
        if (!placed.ok() || placed->epoch == 0) return false;
        auto st = client.GetShuffle(job.id);
        if (!st.ok()) return false;
        status = *st;
        return status.under_replicated_partitions.empty();
      },
      std::chrono::seconds(60)))
      << "under-replicated: " << absl::StrJoin(status.under_replicated_partitions, ",");
  uint64_t repaired = 0;
  for (size_t i = 0; i < 4; ++i) {
    if (i == victim) continue;
    ASSERT_OK_AND_ASSIGN(NodeStatus node, admin(i)->GetNode());
    repaired += node.repaired_bytes;
  }
  EXPECT_GT(repaired, 0u) << "the copies were made over TLS by the servers";
}

// Re-replication where the servers serve TLS and ask for credentials: each dials the others
// over TLS (--peer_tls_ca; their certificates name localhost, hence --peer_tls_server_name) with
// an admin's token (--peer_token_file); a tenant's shuffle loses a server for good and is whole
// again on R = 2 registered servers, read exactly through TLS. A server without the peer flags
// does not repair and refuses a decommission, naming the flag.
TEST(SecureRepairTest, ServersWithTlsAndTokensRepairEachOther) {
  TempDir dir;
  ASSERT_EQ(std::system(absl::StrCat("bash ", SLUICE_SOURCE_DIR, "/tests/harness/make_certs.sh ",
                                     dir.path(), "/certs >/dev/null 2>&1")
                            .c_str()),
            0)
      << "make_certs.sh failed: is openssl installed?";
  const std::string certs = dir.path() + "/certs/";
  std::ofstream(dir.path() + "/credentials") << rpc::TokenHash("slc_peers") << " peers admin\n"
                                             << rpc::TokenHash("slc_a") << " team-a tenant\n";
  std::ofstream(dir.path() + "/peer-token") << "slc_peers\n";
  testing::MiniClusterOptions options;
  options.servers = 4;
  const std::vector<std::string> secure = {"--tls_cert=" + certs + "server.pem",
                                           "--tls_key=" + certs + "server.key",
                                           "--auth_file=" + dir.path() + "/credentials"};
  options.flags.insert(options.flags.end(), secure.begin(), secure.end());
  options.flags.push_back("--dead_after_s=2");
  options.flags.push_back("--peer_tls_ca=" + certs + "ca.pem");
  options.flags.push_back("--peer_tls_server_name=localhost");
  options.flags.push_back("--peer_token_file=" + dir.path() + "/peer-token");
  ASSERT_OK_AND_ASSIGN(auto cluster, testing::MiniCluster::Start(options));
  auto as = [&](const std::string& token) {
    ClientOptions o = testing::MiniCluster::ShortDeadlines();
    o.token = token;
    o.tls.ca_file = certs + "ca.pem";
    o.tls.server_name = "localhost";
    return o;
  };
  auto client = OrNull(cluster->Client(as("slc_a")));
  ASSERT_NE(client, nullptr);
  Job job;
  job.id = "secure";
  job.partitions = 8;
  std::map<uint32_t, uint64_t> winners;
  WriteThenLoseOneForGood(
      *client, *cluster, job, /*victim=*/1,
      [&](size_t i) { return OrNull(cluster->ClientOf(i, as("slc_peers"))); }, &winners);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectExactlyTheWinners(*client, job, FetchOrder::kKey, winners, job.items);
  // Without --peer_token_file: no repair, and a decommission says what is missing.
  ASSERT_OK_AND_ASSIGN(size_t plain, cluster->Add({"--peer_token_file="}));
  auto admin = OrNull(cluster->ClientOf(plain, as("slc_peers")));
  absl::StatusOr<ShuffleClient::DecommissionProgress> refused = admin->Decommission();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("--peer_token_file"), absl::string_view::npos)
      << refused.status();
}

// Under mutual TLS the servers show each other a client certificate (--peer_tls_cert) whose
// name the credentials file makes an admin: no token needed. Four servers that require client
// certificates, one killed for good: every partition whole again, copied over mutual TLS.
TEST(SecureRepairTest, ServersWithMutualTlsRepairEachOtherWithTheirCertificate) {
  TempDir dir;
  ASSERT_EQ(std::system(absl::StrCat("bash ", SLUICE_SOURCE_DIR, "/tests/harness/make_certs.sh ",
                                     dir.path(), "/certs >/dev/null 2>&1")
                            .c_str()),
            0)
      << "make_certs.sh failed: is openssl installed?";
  const std::string certs = dir.path() + "/certs/";
  std::ofstream(dir.path() + "/credentials") << "cn:sluice-peer peers admin\n"
                                             << "cn:tenant-a team-a tenant\n";
  testing::MiniClusterOptions options;
  options.servers = 4;
  for (const std::string& flag :
       {"--tls_cert=" + certs + "server.pem", "--tls_key=" + certs + "server.key",
        "--tls_client_ca=" + certs + "ca.pem", "--auth_file=" + dir.path() + "/credentials",
        std::string("--dead_after_s=2"), "--peer_tls_ca=" + certs + "ca.pem",
        std::string("--peer_tls_server_name=localhost"), "--peer_tls_cert=" + certs + "peer.pem",
        "--peer_tls_key=" + certs + "peer.key"}) {
    options.flags.push_back(flag);
  }
  ASSERT_OK_AND_ASSIGN(auto cluster, testing::MiniCluster::Start(options));
  auto as = [&](const std::string& who) {
    ClientOptions o = testing::MiniCluster::ShortDeadlines();
    o.tls.ca_file = certs + "ca.pem";
    o.tls.server_name = "localhost";
    o.tls.cert_file = certs + who + ".pem";
    o.tls.key_file = certs + who + ".key";
    return o;
  };
  auto client = OrNull(cluster->Client(as("client-a")));
  ASSERT_NE(client, nullptr);
  Job job;
  job.id = "mutual";
  job.partitions = 8;
  std::map<uint32_t, uint64_t> winners;
  WriteThenLoseOneForGood(
      *client, *cluster, job, /*victim=*/2,
      [&](size_t i) { return OrNull(cluster->ClientOf(i, as("peer"))); }, &winners);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectExactlyTheWinners(*client, job, FetchOrder::kUnordered, winners, job.items);
}

// A server lost for good (docs/cluster.md, "Placement epochs"): four servers on 127.0.0.2-5,
// R = 2, and a server unregistered for 2 s is taken out of its shuffles' placements.
class LostServerTest : public ReplicationTest {
 protected:
  void SetUp() override {
    testing::MiniClusterOptions options;
    options.servers = 4;
    options.flags.push_back("--dead_after_s=2");
    ASSERT_OK_AND_ASSIGN(cluster_, testing::MiniCluster::Start(options));
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  }

  // The shuffle's placement once its newest epoch has none of `gone` (up to 30 s).
  PlacementInfo PlacedWithout(const std::string& id, const std::string& gone) {
    PlacementInfo placed;
    EXPECT_TRUE(testing::Eventually(
        [&] {
          auto p = client_->GetPlacement(id);
          if (!p.ok()) return false;
          placed = *p;
          for (const auto& r : placed.replicas) {
            for (uint32_t n : r) {
              if (placed.nodes[n].node_id == gone) return false;
            }
          }
          return true;
        },
        std::chrono::seconds(30)))
        << "server " << gone << " is still in the placement of " << id;
    return placed;
  }

  // Every partition has `replication` replicas, all registered now.
  static void ExpectWholeReplicaLists(const PlacementInfo& placed) {
    for (size_t p = 0; p < placed.replicas.size(); ++p) {
      EXPECT_EQ(placed.replicas[p].size(), placed.replication) << "partition " << p;
      for (uint32_t n : placed.replicas[p]) {
        EXPECT_FALSE(placed.nodes[n].address.empty())
            << "partition " << p << " on " << placed.nodes[n].node_id << ", not registered";
      }
    }
  }

  // Writes the first half of the mappers of `job`, then the rest at once with an engine's
  // retries, killing server `victim` (and, with `then`, doing that) half-way through the first
  // of those's records; returns the winners.
  std::map<uint32_t, uint64_t> WriteAllKilling(const Job& job, size_t victim,
                                               const std::function<void()>& then = nullptr) {
    std::map<uint32_t, uint64_t> winners;
    std::mutex mu;
    const uint32_t before = job.mappers / 2;
    for (uint32_t m = 0; m < before; ++m) {
      auto won = WriteWithRetries(*client_, job, m);
      EXPECT_OK(won) << "mapper " << m;
      if (won.ok()) winners[m] = *won;
    }
    std::vector<std::thread> threads;
    for (uint32_t m = before; m < job.mappers; ++m) {
      threads.emplace_back([&, m] {
        std::function<void(int)> each;
        if (m == before) {
          each = [&](int i) {
            if (i != job.items / 2) return;
            killed_at_ = Clock::now();
            cluster_->Kill(victim);
            if (then) then();
          };
        }
        // Up to ~25 s of retries: the server is taken out after its lease and --dead_after_s.
        auto won = WriteWithRetries(*client_, job, m, each, 1, 50);
        EXPECT_OK(won) << "mapper " << m;
        std::lock_guard<std::mutex> lock(mu);
        if (won.ok()) winners[m] = *won;
      });
    }
    for (auto& t : threads) t.join();
    return winners;
  }

  // The shuffle's status agrees with what was written: every mapper committed, every record
  // counted once, no partition unavailable.
  void ExpectCounts(const Job& job) {
    ASSERT_OK_AND_ASSIGN(ShuffleStatus status, client_->GetShuffle(job.id));
    EXPECT_EQ(status.committed_mappers.size(), job.mappers);
    EXPECT_TRUE(status.unavailable_partitions.empty());
    uint64_t records = 0;
    for (const PartitionStatsInfo& p : status.partitions) {
      records += p.records;
      EXPECT_EQ(p.missing_mappers, 0u);
    }
    EXPECT_EQ(records, uint64_t{job.mappers} * static_cast<uint64_t>(job.items));
    under_replicated_ = status.under_replicated_partitions.size();
  }
  size_t under_replicated_ = 0;

  // Waits (up to `within`) until every partition's replicas in the newest epoch are all
  // registered and whole (none lacks a committed mapper) and agree on its records.
  bool EveryReplicaWhole(const std::string& id, std::chrono::seconds within) {
    return testing::Eventually(
        [&] {
          auto placed = client_->GetPlacement(id);
          if (!placed.ok()) return false;
          std::map<std::string, ShuffleStatus> by_node;
          for (uint32_t p = 0; p < placed->replicas.size(); ++p) {
            if (placed->replicas[p].size() != placed->replication) return false;
            std::optional<uint64_t> records;
            for (uint32_t n : placed->replicas[p]) {
              const NodeAddress& node = placed->nodes[n];
              if (node.address.empty()) return false;
              if (by_node.count(node.node_id) == 0) {
                auto here = Alone(node)->client().GetShuffle(id);
                if (!here.ok()) return false;
                by_node[node.node_id] = *here;
              }
              const ShuffleStatus& here = by_node[node.node_id];
              if (p >= here.partitions.size() || here.partitions[p].missing_mappers != 0) {
                return false;
              }
              if (records.has_value() && *records != here.partitions[p].records) return false;
              records = here.partitions[p].records;
            }
          }
          return true;
        },
        within);
  }

  Clock::time_point killed_at_;
};

TEST_F(LostServerTest, AServerKilledForGoodDuringThePushesStopsNothing) {
  Job job;
  job.id = "lost";
  job.partitions = 8;
  job.mappers = 6;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo before, client_->GetPlacement(job.id));
  EXPECT_EQ(before.epoch, 0u);
  const size_t victim = 1;
  const std::string gone = cluster_->node_id(victim);
  const auto winners = WriteAllKilling(job, victim);
  ASSERT_EQ(winners.size(), job.mappers);
  std::printf("RESULT lost_server_kill_to_complete_s=%.1f\n",
              std::chrono::duration<double>(Clock::now() - killed_at_).count());
  const PlacementInfo after = PlacedWithout(job.id, gone);
  EXPECT_GE(after.epoch, 1u);
  ExpectWholeReplicaLists(after);
  // The survivors keep their partitions (and lead them), the lost server's go elsewhere.
  for (uint32_t p = 0; p < job.partitions; ++p) {
    const std::string old_primary = before.nodes[before.replicas[p][0]].node_id;
    if (old_primary != gone) {
      EXPECT_EQ(after.nodes[after.replicas[p][0]].node_id, old_primary) << "partition " << p;
    }
  }
  ExpectCounts(job);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
  // The servers say why it is gone.
  ASSERT_OK_AND_ASSIGN(std::vector<AbsentNode> absent, client_->AbsentNodes());
  ASSERT_EQ(absent.size(), 1u);
  EXPECT_EQ(absent[0].node_id, gone);
  EXPECT_TRUE(absent[0].dead) << "taken out of the placement";
  EXPECT_GE(absent[0].absent, std::chrono::milliseconds(500));
  // Re-replication: within a bounded time every partition has 2 whole, registered replicas.
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(30)));
  ExpectCounts(job);
  EXPECT_EQ(under_replicated_, 0u);
  std::printf("RESULT lost_server_kill_to_whole_s=%.1f\n",
              std::chrono::duration<double>(Clock::now() - killed_at_).count());
  uint64_t repaired = 0;
  for (size_t i = 0; i < cluster_->size(); ++i) {
    if (!cluster_->running(i)) continue;
    ASSERT_OK_AND_ASSIGN(NodeStatus node, cluster_->Link(i)->client().GetNode());
    EXPECT_EQ(node.repair_backlog, 0u) << node.node_id;
    // (In bytes as of the repairer's last round, once a second: commits made meanwhile may
    // leave an estimate behind until the next.)
    EXPECT_TRUE(testing::Eventually(
        [&] {
          auto again = cluster_->Link(i)->client().GetNode();
          return again.ok() && again->repair_backlog_bytes == 0;
        },
        std::chrono::seconds(5)))
        << node.node_id;
    repaired += node.repaired_bytes;
  }
  EXPECT_GT(repaired, 0u) << "the lost server's replicas were copied";
  // Copied frames got their key bounds like pushed ones: every replica, repaired ones too, plans
  // splits from bounds alone (docs/api.md, "Split reads").
  for (uint32_t p = 0; p < job.partitions; ++p) {
    for (uint32_t n : after.replicas[p]) {
      if (after.nodes[n].address.empty()) continue;
      ASSERT_OK_AND_ASSIGN(SplitKeys splits,
                           Alone(after.nodes[n])->client().GetSplits(job.id, p, 2));
      EXPECT_GT(splits.frames, 0u) << "partition " << p << " on " << after.nodes[n].node_id;
      EXPECT_EQ(splits.frames_without_bounds, 0u)
          << "partition " << p << " on " << after.nodes[n].node_id;
    }
  }
  // Then a second server is lost for good: nothing is lost, the counts stay exact.
  size_t second = 0;
  while (second == victim || !cluster_->running(second)) ++second;
  cluster_->Kill(second);
  ExpectCounts(job);
  EXPECT_GT(under_replicated_, 0u) << "the second server's partitions lack a replica";
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
  // And once it is taken out and repaired in turn, R = 2 on the two servers left.
  PlacedWithout(job.id, cluster_->node_id(second));
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(30)));
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
}

TEST_F(LostServerTest, AServerBackWithAnEmptyDiskUnderANewIdTakesNothingBack) {
  Job job;
  job.id = "renamed";
  job.partitions = 8;
  job.mappers = 4;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  const size_t victim = 2;
  const std::string gone = cluster_->node_id(victim);
  const auto winners = WriteAllKilling(job, victim, [&] {
    ASSERT_OK(cluster_->Wipe(victim));
    ASSERT_OK(cluster_->Restart(victim, {"--node_id=n9"}));
  });
  ASSERT_EQ(winners.size(), job.mappers);
  const PlacementInfo after = PlacedWithout(job.id, gone);
  ExpectWholeReplicaLists(after);
  ExpectCounts(job);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
}

// Both replicas of some partitions killed for good (R = 2): once they are taken out, GetShuffle
// names exactly those partitions as lost, each with every committed mapper (each wrote to
// every partition); the others are whole again; a reader of a lost partition never gets a
// short partition as if whole; `sluice status` says LOST.
TEST_F(LostServerTest, PartitionsWhoseEveryReplicaIsGoneAreReportedLostWithTheirMappers) {
  Job job;
  job.id = "lost";
  job.partitions = 8;
  job.mappers = 4;
  CreateAndWriteAll(job, 2);
  ASSERT_OK_AND_ASSIGN(const PlacementInfo before, client_->GetPlacement(job.id));
  std::set<std::string> victims;
  for (uint32_t n : before.replicas[0]) victims.insert(before.nodes[n].node_id);
  std::set<uint32_t> expected;  // the partitions kept by the victims alone
  for (uint32_t p = 0; p < job.partitions; ++p) {
    bool elsewhere = false;
    for (uint32_t n : before.replicas[p]) elsewhere |= !victims.count(before.nodes[n].node_id);
    if (!elsewhere) expected.insert(p);
  }
  for (size_t i = 0; i < 4; ++i) {
    if (victims.count(cluster_->node_id(i))) cluster_->Kill(i);
  }
  for (const std::string& gone : victims) PlacedWithout(job.id, gone);
  std::set<uint32_t> lost;
  ShuffleStatus status;
  EXPECT_TRUE(testing::Eventually(
      [&] {
        auto st = client_->GetShuffle(job.id);
        if (!st.ok()) return false;
        status = *st;
        lost.clear();
        for (const LostPartition& l : status.lost_partitions) lost.insert(l.partition);
        return lost == expected && status.under_replicated_partitions.size() == expected.size();
      },
      std::chrono::seconds(30)))
      << "lost " << absl::StrJoin(lost, ",") << " expected " << absl::StrJoin(expected, ",")
      << "; under-replicated " << absl::StrJoin(status.under_replicated_partitions, ",");
  for (const LostPartition& l : status.lost_partitions) {
    EXPECT_EQ(l.mappers, (std::vector<uint32_t>{0, 1, 2, 3})) << "partition " << l.partition;
  }
  // A lost partition's reader fails, retryably (a server may yet come back), never short.
  ReaderOptions options;
  options.require_complete = true;
  ASSERT_OK_AND_ASSIGN(auto reader, client_->OpenReader(job.id, *expected.begin(), options));
  Record r;
  absl::StatusOr<bool> more = true;
  while (more.ok() && *more) more = reader->Next(&r);
  EXPECT_TRUE(absl::IsUnavailable(more.status())) << more.status();
  // Every other partition reads whole.
  for (uint32_t p = 0; p < job.partitions; ++p) {
    if (expected.count(p)) continue;
    ASSERT_OK_AND_ASSIGN(auto whole, client_->OpenReader(job.id, p, options));
    uint64_t n = 0;
    for (;;) {
      ASSERT_OK_AND_ASSIGN(bool any, whole->Next(&r));
      if (!any) break;
      ++n;
    }
    EXPECT_EQ(n, status.partitions[p].records) << "partition " << p;
  }
  std::string text;
  RunCli(absl::StrCat("status --server ", cluster_->addresses(), " --shuffle ", job.id), &text);
  EXPECT_NE(text.find(absl::StrCat("LOST partition ", *expected.begin(),
                                   ": no server holds the records of mappers 0, 1, 2, 3")),
            std::string::npos)
      << text;
}

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

// Decommission under load: readers read the whole time and never fail, writers' attempts in
// flight are retried onto the new placement, and once the server says it may be stopped a kill
// -9 of it loses nothing.
TEST_F(LostServerTest, ADecommissionedServerCanBeStoppedWithoutLosingAReplica) {
  Job job;
  job.id = "leave";
  job.partitions = 8;
  job.mappers = 6;
  ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
  std::map<uint32_t, uint64_t> winners;
  for (uint32_t m = 0; m < job.mappers / 2; ++m) {
    ASSERT_OK_AND_ASSIGN(winners[m], WriteWithRetries(*client_, job, m));
  }
  // Readers of what is committed, all along.
  std::atomic<bool> reading{true};
  std::atomic<int> reads{0}, failed_reads{0};
  const std::map<uint32_t, uint64_t> first = winners;
  std::thread reader([&] {
    ASSERT_OK_AND_ASSIGN(auto own, cluster_->Client());
    while (reading.load()) {
      for (uint32_t p = 0; p < job.partitions && reading.load(); ++p) {
        ReaderOptions options;
        options.order = FetchOrder::kKey;
        auto r = own->OpenReader(job.id, p, options);
        if (!r.ok()) {
          ++failed_reads;
          continue;
        }
        Record rec;
        absl::StatusOr<bool> more;
        while ((more = (*r)->Next(&rec)).ok() && *more) {
        }
        more.ok() ? ++reads : ++failed_reads;
      }
    }
  });
  const size_t leaving = 2;
  std::unique_ptr<ServerLink> link = cluster_->Link(leaving);
  const auto started = Clock::now();
  ASSERT_OK_AND_ASSIGN(auto progress, link->client().Decommission());
  ASSERT_OK_AND_ASSIGN(NodeStatus node, link->client().GetNode());
  EXPECT_TRUE(node.decommissioning);
  // The rest of the mappers, while it leaves: attempts routed by the old placement retry.
  for (uint32_t m = job.mappers / 2; m < job.mappers; ++m) {
    ASSERT_OK_AND_ASSIGN(winners[m], WriteWithRetries(*client_, job, m, nullptr, 1, 50));
  }
  // A shuffle created now is not placed on it.
  ASSERT_OK(client_->CreateShuffle("after", 8, 1, 2).status());
  ASSERT_OK_AND_ASSIGN(PlacementInfo after, client_->GetPlacement("after"));
  for (const auto& r : after.replicas) {
    for (uint32_t n : r) EXPECT_NE(after.nodes[n].node_id, cluster_->node_id(leaving));
  }
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto p = link->client().Decommission();
        return p.ok() && p->done;
      },
      std::chrono::seconds(30)));
  std::printf("RESULT decommission_s=%.1f\n",
              std::chrono::duration<double>(Clock::now() - started).count());
  reading.store(false);
  reader.join();
  EXPECT_EQ(failed_reads.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(5)));
  cluster_->Kill(leaving);
  ExpectCounts(job);
  EXPECT_EQ(under_replicated_, 0u) << "nothing was kept only on the server that left";
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
}

// Re-replication slowed to 1 MB/s, so that a kill lands in the middle of a copy; a server
// unregistered for 10 s is taken out (the repairing server's restart takes less).
class SlowRepairTest : public LostServerTest {
 protected:
  void SetUp() override {
    testing::MiniClusterOptions options;
    options.servers = 4;
    options.flags.push_back("--dead_after_s=10");
    options.flags.push_back("--repair_mb_per_s=1");
    ASSERT_OK_AND_ASSIGN(cluster_, testing::MiniCluster::Start(options));
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  }
};

TEST_F(SlowRepairTest, ARepairCutByAKillResumesAndIsNeverServedHalfCopied) {
  Job job;
  job.id = "slow";
  job.partitions = 4;
  job.mappers = 4;
  job.items = 1500;
  job.filler = 2000;  // ~0.75 MB a mapper a partition: seconds to copy at 1 MB/s
  const auto winners = CreateAndWriteAll(job, 2);
  ASSERT_EQ(winners.size(), job.mappers);
  const size_t victim = 1;
  cluster_->Kill(victim);
  const PlacementInfo after = PlacedWithout(job.id, cluster_->node_id(victim));
  // A server that took a partition over and lacks its mappers: it refuses to serve it.
  size_t repairing = 0;
  uint32_t partition = 0;
  bool found = false;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        for (uint32_t p = 0; p < job.partitions && !found; ++p) {
          for (uint32_t n : after.replicas[p]) {
            auto here = Alone(after.nodes[n])->client().GetShuffle(job.id);
            if (here.ok() && here->partitions[p].missing_mappers > 0) {
              partition = p;
              repairing = static_cast<size_t>(after.nodes[n].node_id.back() - '0');
              found = true;
              break;
            }
          }
        }
        return found;
      },
      std::chrono::seconds(15)));
  std::unique_ptr<ServerLink> link = cluster_->Link(repairing);
  ReaderOptions read;
  ASSERT_OK_AND_ASSIGN(auto direct, link->client().OpenReader(job.id, partition, read));
  Record r;
  const absl::Status refused = direct->Next(&r).status();
  EXPECT_EQ(ReasonOf(refused), ErrorReason::kIncomplete) << Describe(refused);
  // Killed in the middle of its copies (some made, some not), and back at once.
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto node = link->client().GetNode();
        return node.ok() && node->repaired_bytes > 0;
      },
      std::chrono::seconds(20)));
  ASSERT_OK_AND_ASSIGN(NodeStatus before_kill, link->client().GetNode());
  EXPECT_GT(before_kill.repair_backlog, 0u) << "the kill should land before the copies end";
  // What is left, in bytes: at most the partitions' frame bytes it lacks (~0.75 MB a mapper).
  EXPECT_GT(before_kill.repair_backlog_bytes, 0u);
  EXPECT_LE(before_kill.repair_backlog_bytes,
            uint64_t{job.partitions} * job.mappers * job.items * (job.filler + 64));
  cluster_->Kill(repairing);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ASSERT_OK(cluster_->Restart(repairing));
  // It resumes: every replica whole, and the same records everywhere.
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(60)));
  // (A new client: the first still asks the server it saw die after the others, for a while.)
  ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  ExpectCounts(job);
  EXPECT_EQ(under_replicated_, 0u);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
}

// etcd (the leader: the only member) killed -9 at random moments while servers copy, and
// restarted on its data: the repair resumes, no live server is taken out, a read in the middle
// of an outage is exact, and every replica ends whole and equal.
TEST_F(SlowRepairTest, EtcdKilledAtRandomMomentsDuringARepairLosesAndHalfServesNothing) {
  Job job;
  job.id = "etcdkill";
  job.partitions = 4;
  job.mappers = 4;
  job.items = 1500;
  job.filler = 2000;
  const auto winners = CreateAndWriteAll(job, 2);
  ASSERT_EQ(winners.size(), job.mappers);
  const size_t victim = 2;
  cluster_->Kill(victim);
  PlacedWithout(job.id, cluster_->node_id(victim));
  ASSERT_TRUE(testing::Eventually(
      [&] {
        uint64_t repaired = 0;
        for (size_t i = 0; i < 4; ++i) {
          if (i == victim) continue;
          auto node = cluster_->Link(i)->client().GetNode();
          if (node.ok()) repaired += node->repaired_bytes;
        }
        return repaired > 0;
      },
      std::chrono::seconds(20)));
  const unsigned seed = static_cast<unsigned>(
      std::chrono::steady_clock::now().time_since_epoch().count() & 0xffffffff);
  std::mt19937 random(seed);
  std::uniform_int_distribution<int> up_ms(100, 1500), down_ms(200, 2000);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(up_ms(random)));
    cluster_->etcd().Signal(SIGKILL);
    if (round == 0) {  // readers go on while etcd is down
      ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(down_ms(random)));
    ASSERT_OK(cluster_->etcd().Restart()) << "seed " << seed;
  }
  ASSERT_TRUE(EveryReplicaWhole(job.id, std::chrono::seconds(90))) << "seed " << seed;
  ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  ASSERT_OK_AND_ASSIGN(const PlacementInfo placed, client_->GetPlacement(job.id));
  ExpectWholeReplicaLists(placed);  // (no live server taken out by the outages)
  ExpectCounts(job);
  EXPECT_EQ(under_replicated_, 0u) << "seed " << seed;
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kKey, winners, job.items);
  ExpectExactlyTheWinners(*client_, job, FetchOrder::kUnordered, winners, job.items);
}

}  // namespace
}  // namespace sluice
