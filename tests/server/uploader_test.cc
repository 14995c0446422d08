// The server's uploads (server/rules/uploader.h) over real registries, an in-memory cluster
// record (tests/harness/cluster_fixture.h) and a real S3 server (s3rver): two servers that both
// think the upload theirs record one object per partition and the loser deletes its own; a
// revocation makes the records stale, and the partitions are uploaded again, the stale objects
// deleted and the manifest written anew.
#include "server/rules/uploader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "client/store_reader.h"
#include "tests/harness/cluster_fixture.h"
#include "tests/harness/s3_server.h"

namespace sluice::testing {
namespace {

// Holds RecordObject's callers of each partition until `n` of them are there (or 10 s pass):
// racing uploaders have all uploaded before any records.
class RecordBarrier {
 public:
  explicit RecordBarrier(int n) : n_(n) {}
  void Arrive(uint32_t partition) {
    std::unique_lock<std::mutex> lock(mu_);
    if (++arrived_[partition] >= n_) cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return arrived_[partition] >= n_; });
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, int> arrived_;
};

class UploaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(s3_, S3Server::Start("sluice-up"));
    ASSERT_OK_AND_ASSIGN(store_, objstore::S3Store::Make(s3_->Options("t")));
    for (Server* s : {&n0_, &n1_}) s->node->membership().Joined(&nodes_, &record_);
    ASSERT_OK(n0_.node->decisions().Create({"job", 2, 2}, 2).status());
    ASSERT_OK(n1_.node->PrepareToServe("job", 0));
    for (uint32_t m : {0u, 1u}) {
      for (Server* s : {&n0_, &n1_}) Prepare(*s, "job", m, 1, {0, 1});
      ASSERT_OK(n0_.node->decisions().DecideMapper("job", m, 1).status());
    }
    for (Server* s : {&n0_, &n1_}) ASSERT_OK(s->node->PrepareToServe("job", std::nullopt));
    // Each server saw the other unregistered a moment (its last list of servers): both take
    // every partition's upload for theirs.
    nodes_.Remove("n1");
    n0_.node->WatchMembers();
    nodes_.Add("n1");
    nodes_.Remove("n0");
    n1_.node->WatchMembers();
    nodes_.Add("n0");
    Uploader::Options o;
    o.upload.part_bytes = objstore::kMinPartBytes;
    up0_ = std::make_unique<Uploader>(n0_.registry.get(), n0_.node.get(), store_.get(), o, &m0_);
    up1_ = std::make_unique<Uploader>(n1_.registry.get(), n1_.node.get(), store_.get(), o, &m1_);
  }
  // Both servers' rounds at once.
  void RunBoth() {
    std::thread t([&] { up1_->Run(); });
    up0_->Run();
    t.join();
  }
  std::vector<std::string> Keys() {
    std::vector<std::string> keys;
    auto listed = store_->List("job/");
    EXPECT_OK(listed);
    if (listed.ok()) {
      for (const auto& o : *listed) keys.push_back(o.key);
    }
    return keys;
  }

  std::unique_ptr<S3Server> s3_;
  std::unique_ptr<objstore::S3Store> store_;
  FakePlacementStore record_;
  FakeNodeDirectory nodes_{{"n0", "n1"}};
  Server n0_{"n0", true}, n1_{"n1", true};
  ServerMetrics m0_, m1_;
  std::unique_ptr<Uploader> up0_, up1_;
};

TEST_F(UploaderTest, OfTwoServersRacingEachPartitionOneObjectIsRecordedAndTheOtherDeleted) {
  RecordBarrier barrier(2);
  record_.before_record = [&](const std::string&, uint32_t q) { barrier.Arrive(q); };
  RunBoth();
  EXPECT_EQ(m0_.objects_uploaded + m1_.objects_uploaded, 2u) << "one record a partition";
  EXPECT_EQ(m0_.objects_deleted + m1_.objects_deleted, 2u) << "each loser deleted its own";
  ASSERT_OK_AND_ASSIGN(auto records, record_.Objects("job"));
  ASSERT_EQ(records.size(), 2u);
  std::vector<std::string> want{records[0].key, records[1].key, ManifestKey("job")};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Keys(), want) << "the recorded objects and the manifest, nothing else";
  ASSERT_OK_AND_ASSIGN(auto shuffle, StoreShuffle::Open(store_.get(), "job"));
  EXPECT_EQ(shuffle->manifest().objects, records);
  for (uint32_t p : {0u, 1u}) {
    ASSERT_OK_AND_ASSIGN(auto reader, shuffle->OpenReader(p));
    Record r;
    std::vector<std::string> values;
    while (*reader->Next(&r)) values.emplace_back(r.value);
    EXPECT_EQ(values, (std::vector<std::string>{"m0", "m1"})) << "partition " << p;
  }
  // Settled: a round more asks nothing of the store.
  const auto before = store_->counters();
  RunBoth();
  EXPECT_EQ(store_->counters().put, before.put);
  EXPECT_EQ(m0_.objects_uploaded + m1_.objects_uploaded, 2u);
}

TEST_F(UploaderTest, ARevokedMapperMakesTheRecordsStaleAndTheyAreReplacedWithANewManifest) {
  up0_->Run();
  up1_->Run();
  ASSERT_OK_AND_ASSIGN(auto first, record_.Objects("job"));
  ASSERT_EQ(first.size(), 2u);
  ASSERT_OK(StoreShuffle::Open(store_.get(), "job").status());
  // Mapper 0 revoked: the stale manifest goes at once, before the mapper runs again (a reader
  // with no server finds none, not the revoked attempt).
  ASSERT_OK(n0_.node->decisions().RevokeMappers("job", {0}, 0).status());
  up0_->Run();
  EXPECT_THAT(StoreShuffle::Open(store_.get(), "job").status(),
              StatusIs(absl::StatusCode::kNotFound, "no manifest"));
  // Run again (attempt 2) on both replicas.
  for (Server* s : {&n0_, &n1_}) {
    ASSERT_OK(s->node->PrepareToPush("job", 1).status());
    Prepare(*s, "job", 0, 2, {0, 1});
  }
  ASSERT_OK(n1_.node->decisions().DecideMapper("job", 0, 2, 1).status());
  RunBoth();
  ASSERT_OK_AND_ASSIGN(auto second, record_.Objects("job"));
  ASSERT_EQ(second.size(), 2u);
  std::vector<std::string> want{ManifestKey("job")};
  for (uint32_t p : {0u, 1u}) {
    EXPECT_EQ(second[p].winners, (std::vector<std::pair<uint32_t, uint64_t>>{{0, 2}, {1, 1}}));
    EXPECT_NE(second[p].key, first[p].key);
    want.push_back(second[p].key);
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Keys(), want) << "the stale objects deleted";
  ASSERT_OK_AND_ASSIGN(auto shuffle, StoreShuffle::Open(store_.get(), "job"));
  EXPECT_EQ(shuffle->manifest().objects, second) << "the manifest written anew";
}

}  // namespace
}  // namespace sluice::testing
