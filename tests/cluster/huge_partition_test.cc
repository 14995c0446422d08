// Huge partitions spread over servers (docs/cluster.md, "Huge partitions"), on a real cluster: a
// real etcd and four sluice-server processes on 127.0.0.2-5 with --partition_split_mb=4. One
// partition takes ~90% of the records and grows to several times the split size: it must be
// spread over further servers as it is written, no server may keep much more than the split
// size of it, and every reader (both orders, key-range slices, a resume on another replica
// after kill -9) must see each committed record exactly once.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
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

namespace sluice {
namespace {

constexpr uint64_t kSplitBytes = 4 << 20;  // --partition_split_mb=4
// What a writer may still send to a segment once its next is made: the push message in flight
// and the one it had built when told (1 MiB each). The server asks that much per writer
// before the size (SegmentMeter::ask_bytes), so a segment ends within the size give or take
// the writers that opened after the ask.
constexpr uint64_t kOvershoot = 2 << 20;
constexpr uint32_t kPartitions = 4;
constexpr uint32_t kHot = 0;  // the huge partition

// Values of pseudo-random letters (zstd keeps ~60% of them): what is stored is close to what
// is written.
std::string Value(uint32_t m, int i, uint64_t attempt) {
  std::string out = absl::StrCat("m", m, "-i", i, "-a", attempt, "-");
  uint64_t x = 0x9e3779b97f4a7c15ULL * (m + 1) + static_cast<uint64_t>(i) * 7 + attempt;
  for (int k = 0; k < 600; ++k) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out.push_back(static_cast<char>('a' + x % 26));
  }
  return out;
}
std::string Key(uint32_t m, int i) { return absl::StrCat("k", (m * 7919 + i * 31) % 997); }

// Runs `sluice ARGS` (stderr with stdout); its exit code (-1: not run or killed) and output.
int RunCli(const std::string& args, std::string* out) {
  return testing::RunCommand(absl::StrCat(SLUICE_CLI_BIN, " ", args), out);
}

// 90% of the keys to kHot, the rest spread over the others.
uint32_t Skewed(std::string_view key, uint32_t n) {
  const uint32_t h = HashPartition(key, 10);
  return h < 9 ? kHot : 1 + HashPartition(key, n - 1);
}

using Items = std::set<std::pair<uint32_t, int>>;
Items AsSet(const std::vector<std::pair<uint32_t, int>>& v) { return Items(v.begin(), v.end()); }

class HugePartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MiniClusterOptions options;
    options.servers = 4;
    options.flags.push_back("--partition_split_mb=4");
    ASSERT_OK_AND_ASSIGN(cluster_, testing::MiniCluster::Start(options));
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  }

  // Mapper m's attempt: `items` records, sorted frames of at most 64 KiB.
  absl::StatusOr<WriteResult> Write(const std::string& id, uint32_t m, uint64_t attempt,
                                    int items) {
    WriterOptions options;
    options.sort_by_key = true;
    options.partitioner = Skewed;
    options.buffer_bytes = 256 << 10;
    options.sorted_frame_bytes = 64 << 10;
    auto writer = client_->OpenWriter(id, m, attempt, options);
    if (!writer.ok()) return writer.status();
    for (int i = 0; i < items; ++i) {
      if (absl::Status st = (*writer)->Add(Key(m, i), Value(m, i, attempt)); !st.ok()) return st;
    }
    return (*writer)->Close();
  }

  // Reads partition p with `options`; every record's (mapper, item), checked against its key
  // and the winners' attempts, in the order read.
  std::vector<std::pair<uint32_t, int>> Read(const std::string& id, uint32_t p,
                                             ReaderOptions options,
                                             const std::map<uint32_t, uint64_t>& winners) {
    std::vector<std::pair<uint32_t, int>> out;
    auto reader = client_->OpenReader(id, p, options);
    EXPECT_OK(reader);
    if (!reader.ok()) return out;
    std::string previous;
    Record r;
    for (;;) {
      absl::StatusOr<bool> more = (*reader)->Next(&r);
      EXPECT_OK(more);
      if (!more.ok() || !*more) break;
      if (options.order == FetchOrder::kKey) {
        EXPECT_LE(CompareKeys(previous, r.key), 0) << "out of key order at " << r.key;
        previous.assign(r.key);
      }
      std::vector<std::string> parts =
          absl::StrSplit(absl::string_view(r.value.data(), r.value.size()), '-');
      uint32_t m = 0;
      int i = 0;
      uint64_t a = 0;
      EXPECT_TRUE(parts.size() >= 4 && absl::SimpleAtoi(parts[0].substr(1), &m) &&
                  absl::SimpleAtoi(parts[1].substr(1), &i) &&
                  absl::SimpleAtoi(parts[2].substr(1), &a));
      EXPECT_EQ(std::string(r.key), Key(m, i));
      EXPECT_TRUE(winners.count(m) != 0 && winners.at(m) == a) << r.value.substr(0, 20);
      out.emplace_back(m, i);
    }
    return out;
  }

  // What a full write of `mappers` x `items` puts in partition p.
  static std::set<std::pair<uint32_t, int>> Expected(uint32_t p, uint32_t mappers, int items) {
    std::set<std::pair<uint32_t, int>> out;
    for (uint32_t m = 0; m < mappers; ++m) {
      for (int i = 0; i < items; ++i) {
        if (Skewed(Key(m, i), kPartitions) == p) out.emplace(m, i);
      }
    }
    return out;
  }

  // The hot partition read in both orders: exactly `hot`, each record once.
  void ExpectBothOrders(const std::string& id, const Items& hot,
                        const std::map<uint32_t, uint64_t>& winners) {
    for (FetchOrder order : {FetchOrder::kUnordered, FetchOrder::kKey}) {
      ReaderOptions options;
      options.order = order;
      const auto got = Read(id, kHot, options, winners);
      EXPECT_EQ(got.size(), hot.size());
      EXPECT_EQ(AsSet(got), hot);
    }
  }

  // Each stored partition's bytes (of partition p: the partition and its segments), the most
  // any of its replicas keeps.
  std::map<uint32_t, uint64_t> BytesPerSegment(const std::string& id, const PlacementInfo& placed,
                                               uint32_t p) {
    std::map<uint32_t, uint64_t> out;
    for (size_t i = 0; i < cluster_->size(); ++i) {
      if (!cluster_->running(i)) continue;
      auto status = cluster_->Link(i)->client().GetShuffle(id);
      if (!status.ok()) continue;
      for (uint32_t q : placed.ChainOf(p)) {
        if (q < status->partitions.size()) {
          out[q] = std::max(out[q], status->partitions[q].bytes);
        }
      }
    }
    return out;
  }

  // Each server's stored bytes of partition p (its own and its segments'), by node index.
  std::map<uint32_t, uint64_t> BytesPerServer(const std::string& id, const PlacementInfo& placed,
                                              uint32_t p) {
    std::map<uint32_t, uint64_t> out;
    for (size_t i = 0; i < cluster_->size(); ++i) {
      auto status = cluster_->Link(i)->client().GetShuffle(id);
      if (!status.ok()) continue;  // (keeps nothing of it)
      uint32_t node = 0;
      for (uint32_t n = 0; n < placed.nodes.size(); ++n) {
        if (placed.nodes[n].node_id == cluster_->node_id(i)) node = n;
      }
      for (uint32_t q : placed.ChainOf(p)) {
        const auto& on = placed.ReplicasOf(q);
        if (std::find(on.begin(), on.end(), node) == on.end()) continue;
        // (A server lists a segment once it has read of it: before its first frame, it has none.)
        if (q < status->partitions.size()) out[node] += status->partitions[q].bytes;
      }
    }
    return out;
  }

  std::unique_ptr<testing::MiniCluster> cluster_;
  std::unique_ptr<ShuffleClient> client_;
};

TEST_F(HugePartitionTest, AHugePartitionIsSpreadOverServersAndReadExactlyOnce) {
  const std::string id = "huge";
  constexpr uint32_t kMappers = 4;
  constexpr int kItems = 12000;  // ~0.4 KB a record stored: ~16 MB in the hot partition
  ASSERT_OK(client_->CreateShuffle(id, kPartitions, kMappers, /*replication=*/1).status());
  std::map<uint32_t, uint64_t> winners;
  for (uint32_t m = 0; m < kMappers; ++m) {
    ASSERT_OK_AND_ASSIGN(WriteResult r, Write(id, m, /*attempt=*/1, kItems));
    ASSERT_FALSE(r.duplicate);
    winners[m] = 1;
  }
  ASSERT_OK_AND_ASSIGN(PlacementInfo placed, client_->GetPlacement(id));
  EXPECT_EQ(placed.split_bytes, kSplitBytes);
  {
    // A reader's fresh check: the record's revision is enough while it is the one held; any
    // other revision gets the whole placement, segments and all.
    std::unique_ptr<ServerLink> link = cluster_->Link(1);
    ASSERT_GT(placed.revision, 0u);
    ASSERT_OK_AND_ASSIGN(PlacementInfo same,
                         link->client().GetPlacementIfChanged(id, placed.revision));
    EXPECT_TRUE(same.unchanged);
    EXPECT_EQ(same.revision, placed.revision);
    EXPECT_TRUE(same.replicas.empty());
    ASSERT_OK_AND_ASSIGN(PlacementInfo whole,
                         link->client().GetPlacementIfChanged(id, placed.revision - 1));
    EXPECT_FALSE(whole.unchanged);
    EXPECT_EQ(whole.revision, placed.revision);
    EXPECT_EQ(whole.segments.size(), placed.segments.size());
    EXPECT_EQ(whole.replicas.size(), kPartitions);
  }
  const std::vector<uint32_t> chain = placed.ChainOf(kHot);
  std::set<uint32_t> servers;
  for (uint32_t q : chain) {
    for (uint32_t n : placed.ReplicasOf(q)) servers.insert(n);
  }
  // ~4x the split size stored in the hot partition: at least 3 stored partitions, on 3 or more
  // servers.
  EXPECT_GE(chain.size(), 3u);
  EXPECT_GE(servers.size(), 3u);
  // No stored partition holds more than the split size, give or take what the one writer had
  // in flight; every server keeps some of it.
  for (const auto& [q, b] : BytesPerSegment(id, placed, kHot)) {
    EXPECT_LE(b, kSplitBytes + kOvershoot) << "stored partition " << q;
    std::printf("stored partition %u: %.2f MiB\n", q, b / 1048576.0);
  }
  const std::map<uint32_t, uint64_t> bytes = BytesPerServer(id, placed, kHot);
  uint64_t total = 0;
  for (const auto& [node, b] : bytes) total += b;
  EXPECT_EQ(bytes.size(), 4u);
  EXPECT_GE(total, 3 * kSplitBytes);
  // Its status: the union's counts under the partition.
  ASSERT_OK_AND_ASSIGN(ShuffleStatus status, client_->GetShuffle(id));
  ASSERT_EQ(status.partitions.size(), kPartitions);
  const std::set<std::pair<uint32_t, int>> hot = Expected(kHot, kMappers, kItems);
  EXPECT_EQ(status.partitions[kHot].records, hot.size());
  EXPECT_EQ(status.partitions[kHot].bytes, total);
  EXPECT_TRUE(status.under_replicated_partitions.empty());
  // `sluice status` names its stored partitions and their servers.
  std::string out;
  ASSERT_EQ(RunCli(absl::StrCat("status --server ", cluster_->address(0), " --shuffle ", id), &out),
            0)
      << out;
  EXPECT_NE(out.find("huge partitions: split at 4 MiB"), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrCat("partition 0 in ", chain.size(), " stored partitions: 0 on ")),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(absl::StrCat("partition 0: ", hot.size(), " records")), std::string::npos)
      << out;

  // Every partition, both orders: exactly the records written.
  for (FetchOrder order : {FetchOrder::kUnordered, FetchOrder::kKey}) {
    for (uint32_t p = 0; p < kPartitions; ++p) {
      ReaderOptions options;
      options.order = order;
      const auto got = Read(id, p, options, winners);
      const std::set<std::pair<uint32_t, int>> unique(got.begin(), got.end());
      EXPECT_EQ(unique.size(), got.size()) << "a record twice in partition " << p;
      EXPECT_EQ(unique, Expected(p, kMappers, kItems)) << "partition " << p;
    }
  }

  // Split reads over the segments: 4 key-range slices, each key in exactly one, the union the
  // partition.
  ASSERT_OK_AND_ASSIGN(SplitKeys keys, client_->GetSplits(id, kHot, 4));
  EXPECT_EQ(keys.partition_bytes, total);
  ASSERT_GE(keys.keys.size(), 2u);
  std::vector<std::pair<uint32_t, int>> sliced;
  std::map<std::string, size_t> slice_of_key;
  for (size_t s = 0; s <= keys.keys.size(); ++s) {
    ReaderOptions options = keys.Slice(s);
    for (const auto& [m, i] : Read(id, kHot, options, winners)) {
      auto [it, fresh] = slice_of_key.emplace(Key(m, i), s);
      EXPECT_EQ(it->second, s) << "key " << Key(m, i) << " in two slices";
      sliced.emplace_back(m, i);
    }
  }
  EXPECT_EQ(AsSet(sliced), hot);
  EXPECT_EQ(sliced.size(), hot.size());
}

TEST_F(HugePartitionTest, ConcurrentWritersFollowTheSplitsAndAReplicaServesAfterKill9) {
  const std::string id = "huge2";
  constexpr uint32_t kMappers = 2;
  constexpr int kItems = 18000;  // ~6 MB each in the hot partition, written at once
  ASSERT_OK(client_->CreateShuffle(id, kPartitions, kMappers, /*replication=*/2).status());
  std::map<uint32_t, uint64_t> winners;
  std::vector<std::thread> writers;
  std::vector<absl::Status> results(kMappers);
  for (uint32_t m = 0; m < kMappers; ++m) {
    winners[m] = 7;
    writers.emplace_back([&, m] { results[m] = Write(id, m, /*attempt=*/7, kItems).status(); });
  }
  for (auto& t : writers) t.join();
  for (uint32_t m = 0; m < kMappers; ++m) ASSERT_OK(results[m]) << "mapper " << m;
  ASSERT_OK_AND_ASSIGN(PlacementInfo placed, client_->GetPlacement(id));
  const std::vector<uint32_t> chain = placed.ChainOf(kHot);
  EXPECT_GE(chain.size(), 3u);
  // Two writers at once: each may send its messages in flight to a segment after its split.
  for (const auto& [q, b] : BytesPerSegment(id, placed, kHot)) {
    EXPECT_LE(b, kSplitBytes + kMappers * kOvershoot) << "stored partition " << q;
    std::printf("stored partition %u: %.2f MiB\n", q, b / 1048576.0);
  }
  const std::set<std::pair<uint32_t, int>> hot = Expected(kHot, kMappers, kItems);
  {
    ReaderOptions options;
    options.order = FetchOrder::kKey;
    const auto got = Read(id, kHot, options, winners);
    EXPECT_EQ(got.size(), hot.size());
    EXPECT_EQ(AsSet(got), hot);
  }
  // The last segment's primary killed -9: its other replica serves it; the read is exact.
  const uint32_t primary = placed.ReplicasOf(chain.back()).front();
  for (size_t i = 0; i < cluster_->size(); ++i) {
    if (cluster_->node_id(i) == placed.nodes[primary].node_id) cluster_->Kill(i);
  }
  ExpectBothOrders(id, hot, winners);
}

// A server that keeps segments restarts (kill -9, same data) and serves them; then etcd is
// killed, and a new client, which has no placement of its own, reads every segment all the same:
// the servers answer from the placements they remember, and the longest list of segments is
// taken (a server that took a segment's frames had read of it).
TEST_F(HugePartitionTest, ARestartAndAnEtcdOutageLoseNoSegment) {
  const std::string id = "huge3";
  constexpr uint32_t kMappers = 4;
  constexpr int kItems = 12000;
  ASSERT_OK(client_->CreateShuffle(id, kPartitions, kMappers, /*replication=*/1).status());
  std::map<uint32_t, uint64_t> winners;
  for (uint32_t m = 0; m < kMappers; ++m) {
    ASSERT_OK(Write(id, m, /*attempt=*/3, kItems).status());
    winners[m] = 3;
  }
  ASSERT_OK_AND_ASSIGN(PlacementInfo placed, client_->GetPlacement(id));
  const std::vector<uint32_t> chain = placed.ChainOf(kHot);
  ASSERT_GE(chain.size(), 3u);
  const Items hot = Expected(kHot, kMappers, kItems);
  ReaderOptions key_order;
  key_order.order = FetchOrder::kKey;
  // The server of the last segment, killed -9 and restarted on its data.
  const std::string last = placed.nodes[placed.ReplicasOf(chain.back()).front()].node_id;
  for (size_t i = 0; i < cluster_->size(); ++i) {
    if (cluster_->node_id(i) != last) continue;
    cluster_->Kill(i);
    ASSERT_OK(cluster_->Restart(i));
  }
  {
    const auto got = Read(id, kHot, key_order, winners);
    EXPECT_EQ(got.size(), hot.size());
    EXPECT_EQ(AsSet(got), hot);
  }
  ASSERT_OK_AND_ASSIGN(ShuffleStatus status, client_->GetShuffle(id));
  EXPECT_EQ(status.partitions[kHot].records, hot.size());
  // etcd gone: a new client reads every segment from what the servers remember.
  cluster_->etcd().Signal(SIGKILL);
  ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  ExpectBothOrders(id, hot, winners);
}

}  // namespace
}  // namespace sluice
