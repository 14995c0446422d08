// What the replication tests share (tests/cluster/replication*_test.cc): a shuffle of the
// test (Job), the engine's mapper writing it with retries, the exact check of what a reader
// gets (each (mapper, item) once, from the mapper's winning attempt), and the fixtures: three
// servers and etcd (ReplicationTest), four servers that take a lost one out (LostServerTest).
#ifndef SLUICE_TESTS_CLUSTER_REPLICATION_FIXTURE_H_
#define SLUICE_TESTS_CLUSTER_REPLICATION_FIXTURE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
#include "tests/harness/mini_cluster.h"
#include "tests/harness/run_command.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/wait.h"

namespace sluice::replication_test {

using Clock = std::chrono::steady_clock;

inline constexpr int kServers = 3;

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
inline std::string Filler(uint32_t m, int i, size_t n) {
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

inline std::string Key(uint32_t m, int i) { return absl::StrCat("key", (m * 7919 + i * 31) % 500); }

// Runs `sluice ARGS` (stderr with stdout); its exit code (-1: not run or killed) and output.
inline int RunCli(const std::string& args, std::string* out) {
  return testing::RunCommand(absl::StrCat(SLUICE_CLI_BIN, " ", args), out);
}

inline absl::StatusOr<WriteResult> WriteMapper(ShuffleClient& client, const Job& job, uint32_t m,
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
inline absl::StatusOr<uint64_t> WriteWithRetries(ShuffleClient& client, const Job& job, uint32_t m,
                                                 const std::function<void(int)>& each = nullptr,
                                                 uint64_t first_attempt = 1,
                                                 uint64_t attempts = 12) {
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
inline void ExpectExactlyTheWinners(ShuffleClient& client, const Job& job, FetchOrder order,
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
inline std::unique_ptr<ShuffleClient> OrNull(absl::StatusOr<std::unique_ptr<ShuffleClient>> c) {
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

  std::unique_ptr<testing::MiniCluster> cluster_;
  std::unique_ptr<ShuffleClient> client_;
};

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

  // No partition of `placed` has a replica on `gone`.
  static void ExpectWithout(const PlacementInfo& placed, const std::string& gone) {
    for (size_t p = 0; p < placed.replicas.size(); ++p) {
      for (uint32_t n : placed.replicas[p]) {
        EXPECT_NE(placed.nodes[n].node_id, gone) << "partition " << p;
      }
    }
  }

  // Mappers [first, last) of `job` written at once, each in up to `attempts` attempts 200 ms
  // apart (`each(m, i)` sees item i of mapper m's first attempt); their winners into *winners,
  // each one's first failure into *failures (when given, sized for the job's mappers). The
  // longest a mapper took, in seconds.
  double WriteAtOnce(const Job& job, uint32_t first, uint32_t last, uint64_t attempts,
                     std::map<uint32_t, uint64_t>* winners,
                     const std::function<void(uint32_t, int)>& each = nullptr,
                     std::vector<absl::Status>* failures = nullptr) {
    std::mutex mu;
    double longest = 0;
    std::vector<std::thread> threads;
    for (uint32_t m = first; m < last; ++m) {
      threads.emplace_back([&, m] {
        const auto start = Clock::now();
        std::function<void(int)> first_each;
        if (each) first_each = [&each, m](int i) { each(m, i); };
        for (uint64_t attempt = 1; attempt <= attempts; ++attempt) {
          auto r = WriteMapper(*client_, job, m, attempt, job.items,
                               attempt == 1 ? first_each : nullptr);
          if (r.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            (*winners)[m] = r->duplicate ? r->winning_attempt : attempt;
            longest =
                std::max(longest, std::chrono::duration<double>(Clock::now() - start).count());
            return;
          }
          if (attempt == 1 && failures != nullptr) (*failures)[m] = r.status();
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        ADD_FAILURE() << "mapper " << m << " did not commit in " << attempts << " attempts";
      });
    }
    for (auto& t : threads) t.join();
    return longest;
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

  Clock::time_point killed_at_;
};

}  // namespace sluice::replication_test

#endif  // SLUICE_TESTS_CLUSTER_REPLICATION_FIXTURE_H_
