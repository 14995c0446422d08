// Disks as a cache (docs/object-store.md, "Disks as a cache"): two real sluice-server processes,
// each on its own small tmpfs, with --object_store (a real etcd and a real S3 server, npm's
// s3rver). The shuffles written are larger than the disks together: writes keep going because
// the shuffles already in the store are evicted, and every shuffle reads back exactly, both
// orders, its partitions read back from the store as they are read (evicting others again).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
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
#include "objstore/object_record.h"
#include "objstore/s3_store.h"
#include "tests/cluster/replication_fixture.h"
#include "tests/harness/s3_server.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using replication_test::Job;
using replication_test::WriteWithRetries;
using testing::MiniCluster;
using testing::S3Server;

constexpr int kDiskMiB = 24;

// The evicted shuffles in a data directory now (their EVICTED files).
std::set<std::string> EvictedSet(const std::string& data_dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data_dir + "/shuffles", ec)) {
    if (std::filesystem::exists(e.path() / "EVICTED")) out.insert(e.path().filename().string());
  }
  return out;
}
int EvictedIn(const std::string& data_dir) { return static_cast<int>(EvictedSet(data_dir).size()); }

// Every partition of `job` read in `order` as a reduce task would: a read refused with
// UNAVAILABLE (a disk full of shuffles still being uploaded, no room to read a partition back
// yet) is run again, 500 ms apart, for up to a minute; *retried counts them. Each (mapper,
// item) must come exactly once, from the mapper's winning attempt, in key order for KEY.
void ExpectExact(ShuffleClient& client, const Job& job, FetchOrder order,
                 const std::map<uint32_t, uint64_t>& winners, int* retried) {
  std::set<std::pair<uint32_t, int>> seen;
  for (uint32_t p = 0; p < job.partitions; ++p) {
    std::vector<std::pair<std::string, std::string>> got;
    absl::Status st;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    do {
      if (!st.ok()) {
        ++*retried;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      got.clear();
      ReaderOptions options;
      options.order = order;
      options.require_complete = true;
      auto reader = client.OpenReader(job.id, p, options);
      st = reader.status();
      Record r;
      while (st.ok()) {
        absl::StatusOr<bool> more = (*reader)->Next(&r);
        st = more.status();
        if (!st.ok() || !*more) break;
        got.emplace_back(std::string(r.key), std::string(r.value));
      }
    } while (absl::IsUnavailable(st) && std::chrono::steady_clock::now() < until);
    ASSERT_OK(st) << job.id << " partition " << p;
    for (size_t k = 0; k < got.size(); ++k) {
      if (order == FetchOrder::kKey && k > 0) {
        ASSERT_FALSE(KeyLess(got[k].first, got[k - 1].first)) << job.id << " partition " << p;
      }
      std::vector<std::string> parts = absl::StrSplit(got[k].second, '-');
      ASSERT_GE(parts.size(), 3u);
      uint32_t m = 0;
      int i = 0;
      uint64_t a = 0;
      ASSERT_TRUE(absl::SimpleAtoi(parts[0].substr(1), &m) &&
                  absl::SimpleAtoi(parts[1].substr(1), &i) &&
                  absl::SimpleAtoi(parts[2].substr(1), &a));
      ASSERT_EQ(got[k].first, replication_test::Key(m, i));
      ASSERT_EQ(a, winners.at(m)) << "mapper " << m << ": a losing attempt's record";
      ASSERT_TRUE(seen.emplace(m, i).second) << "mapper " << m << " item " << i << " twice";
    }
  }
  EXPECT_EQ(seen.size(), winners.size() * static_cast<size_t>(job.items)) << job.id;
}

// Eight shuffles `<prefix>0`..`<prefix>7` of ~5 MB each as stored (4 x 1,500 values of 1,500
// random letters), created at `replication` (0: the default) and written by mappers that re-run
// an attempt refused UNAVAILABLE, as an engine does (a full disk, until the shuffles before are
// in the store and evicted). Sets *jobs, each one's winners, and the attempts re-run.
void WriteShuffles(ShuffleClient& client, const std::string& prefix, uint32_t replication,
                   std::vector<Job>* jobs, std::vector<std::map<uint32_t, uint64_t>>* winners,
                   int* retried) {
  for (int s = 0; s < 8; ++s) {
    Job job;
    job.id = absl::StrCat(prefix, s);
    job.partitions = 4;
    job.mappers = 4;
    job.items = 1500;
    job.filler = 1500;
    ASSERT_OK(client.CreateShuffle(job.id, job.partitions, job.mappers, replication).status());
    std::map<uint32_t, uint64_t> won;
    for (uint32_t m = 0; m < job.mappers; ++m) {
      absl::StatusOr<uint64_t> w = WriteWithRetries(client, job, m, nullptr, 1, 60);
      ASSERT_OK(w) << job.id << " mapper " << m;
      *retried += static_cast<int>(*w - 1);
      won[m] = *w;
    }
    jobs->push_back(job);
    winners->push_back(won);
  }
}

class ObjectEvictTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      const std::string disk = absl::StrCat(root_.path(), "/disk", i);
      ::mkdir(disk.c_str(), 0755);
      if (::mount("tmpfs", disk.c_str(), "tmpfs", 0,
                  absl::StrCat("size=", kDiskMiB, "m").c_str()) != 0) {
        GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
      }
      disks_.push_back(disk);
    }
    ASSERT_OK_AND_ASSIGN(s3_, S3Server::Start("sluice-evict"));
    const objstore::S3Options o = s3_->Options("evict");
    setenv("AWS_ACCESS_KEY_ID", o.credentials.access_key_id.c_str(), 1);
    setenv("AWS_SECRET_ACCESS_KEY", o.credentials.secret_access_key.c_str(), 1);
    testing::MiniClusterOptions mo;
    mo.servers = 0;
    ASSERT_OK_AND_ASSIGN(cluster_, MiniCluster::Start(mo));
    flags_ = {"--object_store=s3://sluice-evict/evict",
              absl::StrCat("--object_endpoint=", s3_->endpoint()), "--object_part_mb=5",
              "--disk_high_water_pct=90", "--object_evict_pct=45"};
    for (const std::string& disk : disks_) ASSERT_OK(cluster_->Add(flags_, disk).status());
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  }
  void TearDown() override {
    cluster_.reset();
    for (const std::string& d : disks_) ::umount2(d.c_str(), MNT_DETACH);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
  }

  testing::TempDir root_;
  std::vector<std::string> disks_;
  std::vector<std::string> flags_;  // the servers' own
  std::unique_ptr<S3Server> s3_;
  std::unique_ptr<MiniCluster> cluster_;
  std::unique_ptr<ShuffleClient> client_;
};

TEST_F(ObjectEvictTest, ShufflesLargerThanTheDisksWriteAndReadBackExactly) {
  // Every partition on both servers: ~40 MB a server, on 24 MiB disks.
  std::vector<Job> jobs;
  std::vector<std::map<uint32_t, uint64_t>> winners;
  int retried = 0;
  ASSERT_NO_FATAL_FAILURE(WriteShuffles(*client_, "full", 2, &jobs, &winners, &retried));
  const int evicted = EvictedIn(cluster_->data_dir(0)) + EvictedIn(cluster_->data_dir(1));
  EXPECT_GT(evicted, 0) << "the shuffles did not fit: some were evicted";
  std::cout << "evicted shuffles: " << evicted << ", attempts retried: " << retried << "\n";
  // Every shuffle reads back exactly, both orders: the evicted ones' partitions come back from
  // the store as they are read (evicting others to make room for them).
  int reads_retried = 0;
  for (size_t s = 0; s < jobs.size(); ++s) {
    SCOPED_TRACE(jobs[s].id);
    ASSERT_NO_FATAL_FAILURE(
        ExpectExact(*client_, jobs[s], FetchOrder::kKey, winners[s], &reads_retried));
    ASSERT_NO_FATAL_FAILURE(
        ExpectExact(*client_, jobs[s], FetchOrder::kUnordered, winners[s], &reads_retried));
    // Its status reports every mapper committed, evicted or not, and no partition
    // under-replicated (asked again for a while: a server busy reading back partitions may
    // miss a status call, and its replica then counts as not whole).
    absl::StatusOr<ShuffleStatus> status;
    EXPECT_TRUE(testing::Eventually(
        [&] {
          status = client_->GetShuffle(jobs[s].id);
          return status.ok() && status->committed_mappers.size() == jobs[s].mappers &&
                 status->under_replicated_partitions.empty();
        },
        std::chrono::seconds(30)))
        << (status.ok() ? absl::StrCat(status->committed_mappers.size(), " mappers, ",
                                       status->under_replicated_partitions.size(),
                                       " partitions under-replicated")
                        : status.status().ToString());
  }
  // A server restarted finds its evicted shuffles evicted still, and serves them alone.
  // (It may evict more meanwhile, before its stop or after its start: never fewer.)
  const std::set<std::string> evicted_before = EvictedSet(cluster_->data_dir(0));
  ASSERT_OK(cluster_->Stop(0));
  ASSERT_OK(cluster_->Restart(0, flags_));
  const std::set<std::string> evicted_after = EvictedSet(cluster_->data_dir(0));
  for (const std::string& id : evicted_before) {
    EXPECT_EQ(evicted_after.count(id), 1u) << id << " is not evicted after the restart";
  }
  ASSERT_OK(cluster_->Stop(1));
  for (size_t s = 0; s < jobs.size(); ++s) {
    ASSERT_NO_FATAL_FAILURE(
        ExpectExact(*client_, jobs[s], FetchOrder::kKey, winners[s], &reads_retried));
  }
  std::cout << "reads retried: " << reads_retried << "\n";
}

// A server without etcd (docs/object-store.md, "A server on its own"): its commit log decides,
// its OBJECTS files record the uploads, and the rest is as in a cluster: on a 24 MiB disk it
// keeps taking shuffles larger than it by evicting those in the store, reads them back exactly,
// and with the server gone a client given the store reads them from it alone; a deleted
// shuffle leaves nothing in the store.
TEST(ObjectAloneTest, AServerOnItsOwnEvictsReadsBackAndIsReadFromTheStoreWhenGone) {
  testing::TempDir root;
  const std::string disk = root.path() + "/disk";
  ::mkdir(disk.c_str(), 0755);
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, absl::StrCat("size=", kDiskMiB, "m").c_str()) !=
      0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{disk};
  ASSERT_OK_AND_ASSIGN(auto s3, S3Server::Start("sluice-alone"));
  const objstore::S3Options o = s3->Options("alone");
  setenv("AWS_ACCESS_KEY_ID", o.credentials.access_key_id.c_str(), 1);
  setenv("AWS_SECRET_ACCESS_KEY", o.credentials.secret_access_key.c_str(), 1);
  ASSERT_OK_AND_ASSIGN(auto store, objstore::S3Store::Make(o));
  testing::MiniClusterOptions mo;
  mo.servers = 0;
  mo.etcd = false;
  ASSERT_OK_AND_ASSIGN(auto cluster, MiniCluster::Start(mo));
  ASSERT_OK(cluster
                ->Add({"--object_store=s3://sluice-alone/alone",
                       absl::StrCat("--object_endpoint=", s3->endpoint()), "--object_part_mb=5",
                       "--disk_high_water_pct=90", "--object_evict_pct=45"},
                      disk)
                .status());
  ASSERT_OK_AND_ASSIGN(auto client, cluster->Client());
  std::vector<Job> jobs;
  std::vector<std::map<uint32_t, uint64_t>> winners;
  int retried = 0;
  ASSERT_NO_FATAL_FAILURE(WriteShuffles(*client, "alone", 0, &jobs, &winners, &retried));
  EXPECT_GT(EvictedIn(disk), 0) << "the shuffles did not fit: some were evicted";
  for (size_t s = 0; s < jobs.size(); ++s) {
    ASSERT_NO_FATAL_FAILURE(ExpectExact(*client, jobs[s], FetchOrder::kKey, winners[s], &retried));
  }
  // Every shuffle's manifest in the store, then the server gone: a client given the store reads
  // it alone.
  for (const Job& job : jobs) {
    EXPECT_TRUE(testing::Eventually([&] { return store->Head(ManifestKey(job.id)).ok(); },
                                    std::chrono::seconds(30)))
        << job.id;
  }
  ASSERT_OK(client->DeleteShuffle(jobs[7].id));
  EXPECT_TRUE(testing::Eventually(
      [&] {
        auto listed = store->List(ShuffleObjectsPrefix(jobs[7].id));
        return listed.ok() && listed->empty();
      },
      std::chrono::seconds(30)))
      << "a deleted shuffle's objects";
  cluster->Kill(0);
  ClientOptions with_store = MiniCluster::ShortDeadlines();
  with_store.server = cluster->address(0);
  with_store.object_store = "s3://sluice-alone/alone";
  with_store.object_endpoint = s3->endpoint();
  ASSERT_OK_AND_ASSIGN(auto reader_client, ShuffleClient::Connect(with_store));
  ASSERT_NO_FATAL_FAILURE(
      ExpectExact(*reader_client, jobs[0], FetchOrder::kKey, winners[0], &retried));
  ASSERT_NO_FATAL_FAILURE(
      ExpectExact(*reader_client, jobs[1], FetchOrder::kUnordered, winners[1], &retried));
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
}

}  // namespace
}  // namespace sluice
