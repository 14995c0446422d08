// The object tier in a cluster (docs/object-store.md): real sluice-server processes with
// --object_store, a real etcd and a real S3 server (npm's s3rver). Servers upload each sealed
// partition once, record it in etcd, and write the shuffle's manifest; the shuffle then reads
// back from the store alone, with every server killed and its disk wiped; a deleted shuffle
// leaves nothing in the store.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/store_reader.h"
#include "objstore/s3_store.h"
#include "tests/cluster/replication_fixture.h"
#include "tests/harness/s3_server.h"

namespace sluice {
namespace {

using replication_test::Job;
using replication_test::WriteMapper;
using testing::Eventually;
using testing::MiniCluster;
using testing::S3Server;
using KeyValues = std::vector<std::pair<std::string, std::string>>;

absl::StatusOr<KeyValues> ReadAll(absl::StatusOr<std::unique_ptr<ShuffleReader>> reader) {
  if (!reader.ok()) return reader.status();
  KeyValues out;
  Record r;
  for (;;) {
    absl::StatusOr<bool> more = (*reader)->Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) return out;
    out.emplace_back(std::string(r.key), std::string(r.value));
  }
}

// The faults a proxy's state (its JSON) has left to inject: those whose "count" is above 0.
int FaultsLeft(const std::string& state) {
  int left = 0;
  const std::string count = "\"count\": ";
  for (size_t at = state.find(count); at != std::string::npos; at = state.find(count, at + 1)) {
    const char c = at + count.size() < state.size() ? state[at + count.size()] : '0';
    if (c >= '1' && c <= '9') ++left;
  }
  return left;
}

KeyValues Sorted(KeyValues kv) {
  std::sort(kv.begin(), kv.end());
  return kv;
}

class ObjectTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(s3_, S3Server::Start("sluice-tier"));
    const objstore::S3Options o = s3_->Options("tier");
    // The servers take their credentials from the environment, as AWS's tools do.
    setenv("AWS_ACCESS_KEY_ID", o.credentials.access_key_id.c_str(), 1);
    setenv("AWS_SECRET_ACCESS_KEY", o.credentials.secret_access_key.c_str(), 1);
    ASSERT_OK_AND_ASSIGN(store_, objstore::S3Store::Make(o));
  }
  // Three servers at `endpoint` (empty: the S3 server's), with `extra` flags.
  void StartCluster(const std::string& endpoint = "", const std::vector<std::string>& extra = {}) {
    testing::MiniClusterOptions mo;
    mo.servers = 3;
    mo.flags.push_back("--object_store=s3://sluice-tier/tier");
    mo.flags.push_back(
        absl::StrCat("--object_endpoint=", endpoint.empty() ? s3_->endpoint() : endpoint));
    mo.flags.push_back("--object_part_mb=5");
    // (A server gone 2 s is taken out: fresh servers take its partitions over sooner.)
    mo.flags.push_back("--dead_after_s=2");
    mo.flags.insert(mo.flags.end(), extra.begin(), extra.end());
    ASSERT_OK_AND_ASSIGN(cluster_, MiniCluster::Start(mo));
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  }
  void TearDown() override {
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
  }

  // Creates `job` at R = 2 and writes every mapper (attempt 1).
  void Write(const Job& job) {
    ASSERT_OK(client_->CreateShuffle(job.id, job.partitions, job.mappers, 2).status());
    for (uint32_t m = 0; m < job.mappers; ++m) {
      ASSERT_OK(WriteMapper(*client_, job, m, 1, job.items).status()) << "mapper " << m;
    }
  }
  // Every partition read through the servers, KEY order.
  std::vector<KeyValues> ReadThroughServers(const Job& job) {
    std::vector<KeyValues> out;
    for (uint32_t p = 0; p < job.partitions; ++p) {
      ReaderOptions o;
      o.order = FetchOrder::kKey;
      o.require_complete = true;
      auto kv = ReadAll(client_->OpenReader(job.id, p, o));
      EXPECT_OK(kv) << "partition " << p;
      out.push_back(kv.ok() ? *std::move(kv) : KeyValues{});
    }
    return out;
  }
  // Waits for the shuffle's manifest in the store.
  std::unique_ptr<StoreShuffle> WaitForManifest(const std::string& id) {
    std::unique_ptr<StoreShuffle> shuffle;
    absl::Status last;
    EXPECT_TRUE(Eventually(
        [&] {
          auto s = StoreShuffle::Open(store_.get(), id);
          if (s.ok()) shuffle = *std::move(s);
          last = s.status();
          return s.ok();
        },
        std::chrono::seconds(60)))
        << last;
    return shuffle;
  }

  std::unique_ptr<S3Server> s3_;
  std::unique_ptr<MiniCluster> cluster_;
  std::unique_ptr<ShuffleClient> client_;
  std::unique_ptr<objstore::S3Store> store_;
};

TEST_F(ObjectTierTest, EveryServerLostTheShuffleReadsBackFromTheStoreAlone) {
  Job job;
  job.id = "lost";
  job.partitions = 6;
  job.mappers = 4;
  job.items = 4000;
  job.filler = 300;  // ~0.9 MB a partition: one PUT each
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ASSERT_NO_FATAL_FAILURE(Write(job));
  const std::vector<KeyValues> expected = ReadThroughServers(job);
  std::unique_ptr<StoreShuffle> first = WaitForManifest(job.id);
  ASSERT_NE(first, nullptr);
  const ShuffleManifest& m = first->manifest();
  EXPECT_EQ(m.partitions, job.partitions);
  EXPECT_EQ(m.mappers, job.mappers);
  ASSERT_EQ(m.objects.size(), job.partitions);
  // One object per partition (plus the manifest), whatever the mappers: the racers' and the
  // lost ones deleted.
  ASSERT_OK_AND_ASSIGN(auto listed, store_->List(ShuffleObjectsPrefix(job.id)));
  EXPECT_EQ(listed.size(), job.partitions + 1);

  // A client told of the store (ClientOptions::object_store), its placement read while the
  // servers live.
  ClientOptions with_store = MiniCluster::ShortDeadlines();
  with_store.object_store = "s3://sluice-tier/tier";
  with_store.object_endpoint = s3_->endpoint();
  ASSERT_OK_AND_ASSIGN(auto before, cluster_->Client(with_store));
  ASSERT_OK(before->GetPlacement(job.id).status());

  for (size_t i = 0; i < cluster_->size(); ++i) {
    cluster_->Kill(i);
    ASSERT_OK(cluster_->Wipe(i));
  }
  // The clients read from the store when no replica serves (its placement known), and when no
  // server answers at all (a client made now): the same records, in KEY order.
  ASSERT_OK_AND_ASSIGN(auto after, cluster_->Client(with_store));
  for (ShuffleClient* c : {before.get(), after.get()}) {
    for (uint32_t p = 0; p < job.partitions; ++p) {
      ReaderOptions key;
      key.order = FetchOrder::kKey;
      key.require_complete = true;
      ASSERT_OK_AND_ASSIGN(KeyValues got, ReadAll(c->OpenReader(job.id, p, key)));
      EXPECT_EQ(got, expected[p]) << "partition " << p;
    }
  }
  ASSERT_OK_AND_ASSIGN(auto shuffle, StoreShuffle::Open(store_.get(), job.id));
  size_t records = 0;
  for (uint32_t p = 0; p < job.partitions; ++p) {
    ReaderOptions key;
    key.order = FetchOrder::kKey;
    ASSERT_OK_AND_ASSIGN(KeyValues in_order, ReadAll(shuffle->OpenReader(p, key)));
    EXPECT_EQ(in_order, expected[p]) << "partition " << p << ", KEY order";
    ASSERT_OK_AND_ASSIGN(KeyValues any, ReadAll(shuffle->OpenReader(p)));
    EXPECT_EQ(Sorted(any), Sorted(expected[p])) << "partition " << p << ", UNORDERED";
    records += any.size();
    // A key range (what a split read asks) and a resumed read.
    const size_t n = expected[p].size();
    ASSERT_GT(n, 3u);
    ReaderOptions range = key;
    range.from_key = expected[p][n / 3].first;
    range.to_key = expected[p][2 * n / 3].first;
    ASSERT_OK_AND_ASSIGN(KeyValues slice, ReadAll(shuffle->OpenReader(p, range)));
    KeyValues want;
    for (const auto& kv : expected[p]) {
      if (kv.first >= range.from_key && kv.first < *range.to_key) want.push_back(kv);
    }
    EXPECT_EQ(slice, want) << "partition " << p << ", keys [" << range.from_key << ", "
                           << *range.to_key << ")";
    ReaderOptions resumed = key;
    resumed.skip_records = n / 2;
    ASSERT_OK_AND_ASSIGN(KeyValues rest, ReadAll(shuffle->OpenReader(p, resumed)));
    EXPECT_EQ(rest, KeyValues(expected[p].begin() + n / 2, expected[p].end()));
  }
  EXPECT_EQ(records, size_t{job.mappers} * job.items);
  // The CLI reads it so too (`sluice fetch --object-store`): the values of partition 0.
  testing::TempDir dir;
  std::string said;
  ASSERT_EQ(replication_test::RunCli(
                absl::StrCat("fetch --shuffle lost --partition 0 --order KEY --format msgpack "
                             "--object-store s3://sluice-tier/tier --object-endpoint ",
                             s3_->endpoint(), " --output ", dir.path(), "/values"),
                &said),
            0)
      << said;
  std::ifstream file(dir.path() + "/values", std::ios::binary);
  const std::string out((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::string values;
  for (const auto& kv : expected[0]) values += kv.second;
  EXPECT_EQ(out, values);
  EXPECT_NE(said.find(absl::StrCat("fetched ", expected[0].size(), " records")), std::string::npos)
      << said;
}

TEST_F(ObjectTierTest, FreshServersServeTheShuffleFromTheStoreAfterEveryServerIsLost) {
  Job job;
  job.id = "reborn";
  job.partitions = 6;
  job.mappers = 4;
  job.items = 3000;
  job.filler = 100;
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ASSERT_NO_FATAL_FAILURE(Write(job));
  const std::vector<KeyValues> expected = ReadThroughServers(job);
  ASSERT_NE(WaitForManifest(job.id), nullptr);
  for (size_t i = 0; i < 3; ++i) {
    cluster_->Kill(i);
    ASSERT_OK(cluster_->Wipe(i));
  }
  // Three new servers (new ids, empty disks); the old ones never come back.
  for (size_t i = 0; i < 3; ++i) ASSERT_OK(cluster_->Add().status());
  ASSERT_OK_AND_ASSIGN(auto client, cluster_->ClientOf(3));
  const auto start = std::chrono::steady_clock::now();
  for (uint32_t p = 0; p < job.partitions; ++p) {
    ReaderOptions key;
    key.order = FetchOrder::kKey;
    key.require_complete = true;
    absl::StatusOr<KeyValues> got;
    // (Taken out after --dead_after_s, the partitions' new replicas restore them from the store;
    // meanwhile reads are refused as retryable.)
    EXPECT_TRUE(Eventually(
        [&] {
          got = ReadAll(client->OpenReader(job.id, p, key));
          EXPECT_TRUE(got.ok() || absl::IsUnavailable(got.status())) << got.status();
          return got.ok();
        },
        std::chrono::seconds(60)))
        << "partition " << p << ": " << got.status();
    ASSERT_OK(got);
    EXPECT_EQ(*got, expected[p]) << "partition " << p << ", KEY order";
    ReaderOptions any;
    any.require_complete = true;
    ASSERT_OK_AND_ASSIGN(KeyValues unordered, ReadAll(client->OpenReader(job.id, p, any)));
    EXPECT_EQ(Sorted(unordered), Sorted(expected[p])) << "partition " << p << ", UNORDERED";
    // Split reads: the slices, read one after another, are the partition.
    ASSERT_OK_AND_ASSIGN(SplitKeys splits, client->GetSplits(job.id, p, 3));
    KeyValues sliced;
    for (size_t i = 0; i <= splits.keys.size(); ++i) {
      ASSERT_OK_AND_ASSIGN(KeyValues slice,
                           ReadAll(client->OpenReader(job.id, p, splits.Slice(i))));
      sliced.insert(sliced.end(), slice.begin(), slice.end());
    }
    EXPECT_EQ(sliced, expected[p])
        << "partition " << p << ", " << splits.keys.size() + 1 << " slices";
  }
  std::printf("every server lost: fresh servers served the shuffle from the store after %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

TEST_F(ObjectTierTest, StoreFaultsAndAnUploaderKilledMidUploadLeaveOneObjectPerPartition) {
  ASSERT_OK_AND_ASSIGN(auto proxy, testing::S3FaultProxy::Start(*s3_));
  // The store fails calls of every kind once or more; each is retried by the uploads.
  for (const char* fault : {
           R"({"method": "PUT", "query": "partNumber", "count": 3, "status": 503,
               "code": "SlowDown"})",
           R"({"method": "POST", "query": "uploads", "count": 1, "status": 500,
               "code": "InternalError"})",
           R"({"method": "POST", "query": "uploadId", "count": 1, "status": 200,
               "code": "InternalError"})",
           R"({"method": "PUT", "query": "partNumber", "count": 1, "reset": true})",
           R"({"method": "GET", "query": "list-type", "count": 1, "status": 503,
               "code": "SlowDown"})",
       }) {
    ASSERT_TRUE(proxy->Inject(fault)) << fault;
  }
  // (2 MiB/s: an upload of a partition takes seconds, and is killed in the middle.)
  ASSERT_NO_FATAL_FAILURE(StartCluster(proxy->Options().endpoint, {"--object_mb_per_s=2"}));
  Job job;
  job.id = "faulty";
  job.partitions = 2;
  job.mappers = 4;
  job.items = 6000;
  job.filler = 1000;  // ~7 MB a partition stored: two parts of a multipart upload
  ASSERT_NO_FATAL_FAILURE(Write(job));
  const std::vector<KeyValues> expected = ReadThroughServers(job);
  // The uploader of partition 0 (its first replica) killed once a part is on its way.
  ASSERT_OK_AND_ASSIGN(PlacementInfo placement, client_->GetPlacement(job.id));
  const size_t uploader = cluster_->index_of(placement.nodes[placement.replicas[0][0]].node_id);
  ASSERT_LT(uploader, cluster_->size());
  EXPECT_TRUE(Eventually([&] { return proxy->State().find("partNumber") != std::string::npos; },
                         std::chrono::seconds(30)));
  cluster_->Kill(uploader);
  // Its partner takes the upload over once it is unregistered; every fault was met.
  std::unique_ptr<StoreShuffle> shuffle = WaitForManifest(job.id);
  ASSERT_NE(shuffle, nullptr);
  EXPECT_EQ(FaultsLeft(proxy->State()), 0) << proxy->State();
  ASSERT_OK_AND_ASSIGN(auto listed, store_->List(ShuffleObjectsPrefix(job.id)));
  EXPECT_EQ(listed.size(), job.partitions + 1);  // one object a partition, and the manifest
  for (uint32_t p = 0; p < job.partitions; ++p) {
    EXPECT_GT(shuffle->manifest().objects.at(p).size, objstore::kMinPartBytes);
    ReaderOptions key;
    key.order = FetchOrder::kKey;
    ASSERT_OK_AND_ASSIGN(KeyValues got, ReadAll(shuffle->OpenReader(p, key)));
    EXPECT_EQ(got, expected[p]) << "partition " << p;
  }
  // (The killed server's copy stays until it is back: the delete says so, retryably.)
  const absl::Status deleted = client_->DeleteShuffle(job.id);
  EXPECT_TRUE(deleted.ok() || absl::IsUnavailable(deleted)) << deleted;
  EXPECT_TRUE(Eventually(
      [&] {
        auto left = store_->List(ShuffleObjectsPrefix(job.id));
        return left.ok() && left->empty();
      },
      std::chrono::seconds(30)));
}

TEST_F(ObjectTierTest, ADeletedShuffleLeavesNothingInTheStore) {
  Job job;
  job.id = "gone";
  job.partitions = 4;
  job.mappers = 3;
  job.items = 500;
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ASSERT_NO_FATAL_FAILURE(Write(job));
  ASSERT_NE(WaitForManifest(job.id), nullptr);
  ASSERT_OK(client_->DeleteShuffle(job.id));
  EXPECT_TRUE(Eventually(
      [&] {
        auto listed = store_->List(ShuffleObjectsPrefix(job.id));
        return listed.ok() && listed->empty();
      },
      std::chrono::seconds(30)));
  EXPECT_THAT(StoreShuffle::Open(store_.get(), job.id).status(),
              testing::StatusIs(absl::StatusCode::kNotFound, "no manifest"));
}

}  // namespace
}  // namespace sluice
