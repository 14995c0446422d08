// EtcdClient against a real etcd (Debian's etcd-server) on loopback: keys, prefixes, the
// first-writer-wins create under a race, leases that take their keys with them, and a
// stopped etcd costing a bounded wait.
#include "cluster/etcd_client.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/object_record.h"
#include "cluster/placement_store.h"
#include "cluster/shuffle_placement.h"
#include "rpc/error_reason.h"
#include "tests/harness/etcd_process.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using testing::EtcdProcess;
using testing::StatusIs;

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdProcess::Start());
    EtcdOptions options;
    options.endpoints = etcd_->endpoint();
    options.deadline = std::chrono::seconds(2);
    ASSERT_OK_AND_ASSIGN(client_, EtcdClient::Connect(options));
  }
  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, KeysAndPrefixes) {
  ASSERT_OK_AND_ASSIGN(auto missing, client_->Get("/t/a"));
  EXPECT_FALSE(missing.has_value());
  ASSERT_OK(client_->Put("/t/a", "1"));
  ASSERT_OK(client_->Put("/t/b", std::string("two\0bytes", 9)));
  ASSERT_OK(client_->Put("/u/c", "3"));
  ASSERT_OK_AND_ASSIGN(auto a, client_->Get("/t/a"));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->value, "1");
  EXPECT_GT(a->mod_revision, 0);
  // Its revision alone (the value not read), and 0 for a key that does not exist.
  ASSERT_OK_AND_ASSIGN(int64_t rev, client_->ModRevision("/t/a"));
  EXPECT_EQ(rev, a->mod_revision);
  ASSERT_OK_AND_ASSIGN(int64_t none, client_->ModRevision("/t/none"));
  EXPECT_EQ(none, 0);
  ASSERT_OK_AND_ASSIGN(auto t, client_->GetPrefix("/t/"));
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].key, "/t/a");
  EXPECT_EQ(t[1].value, std::string("two\0bytes", 9));
  ASSERT_OK_AND_ASSIGN(int64_t deleted, client_->DeletePrefix("/t/"));
  EXPECT_EQ(deleted, 2);
  ASSERT_OK_AND_ASSIGN(auto after, client_->GetPrefix("/t/"));
  EXPECT_TRUE(after.empty());
  ASSERT_OK_AND_ASSIGN(auto u, client_->Get("/u/c"));
  EXPECT_TRUE(u.has_value());
}

// What a mapper's decision needs: a create that holds only while its shuffle's record exists,
// and a delete of a record with everything under it at once.
TEST_F(EtcdClientTest, GuardedCreatesAndDeletesWithChildren) {
  EXPECT_THAT(client_->CreateIfAbsent("/s/job/mappers/0", "1", 0, "/s/job"),
              StatusIs(absl::StatusCode::kNotFound, "'/s/job' does not exist"));
  ASSERT_OK(client_->Put("/s/job", "record"));
  ASSERT_OK(client_->Put("/s/job2", "another"));
  ASSERT_OK_AND_ASSIGN(EtcdCreate c, client_->CreateIfAbsent("/s/job/mappers/0", "1", 0, "/s/job"));
  EXPECT_TRUE(c.created);
  ASSERT_OK_AND_ASSIGN(c, client_->CreateIfAbsent("/s/job/mappers/0", "2", 0, "/s/job"));
  EXPECT_FALSE(c.created);
  EXPECT_EQ(c.kv.value, "1");
  ASSERT_OK_AND_ASSIGN(bool existed, client_->DeleteWithChildren("/s/job"));
  EXPECT_TRUE(existed);
  ASSERT_OK_AND_ASSIGN(auto left, client_->GetPrefix("/s/"));
  ASSERT_EQ(left.size(), 1u);  // not "/s/job2": only "/s/job" and what is under "/s/job/"
  EXPECT_EQ(left[0].key, "/s/job2");
  ASSERT_OK_AND_ASSIGN(existed, client_->DeleteWithChildren("/s/job"));
  EXPECT_FALSE(existed);
}

// A partition's object is recorded once (docs/object-store.md, "The commit point"): of
// uploaders racing to record theirs, one wins and every one learns which; a record stands for
// the partition only while its winners are the decisions; a deleted shuffle takes its records
// and takes none after.
TEST_F(EtcdClientTest, OfRacingUploadersOneObjectIsRecordedAndTheShuffleTakesItsRecords) {
  EtcdOptions options;
  options.endpoints = etcd_->endpoint();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Connect(options));
  EtcdPlacementStore store(std::shared_ptr<EtcdClient>(std::move(etcd)), "/sluice/test/");
  ASSERT_OK(store.Create("job", 4, 2, 2, {"n0", "n1", "n2"}).status());
  ASSERT_OK(store.DecideMapper("job", 0, 10, 0).status());
  ASSERT_OK(store.DecideMapper("job", 1, 11, 0).status());
  std::vector<std::thread> racers;
  std::vector<std::pair<ObjectRecord, bool>> got(8);
  for (int i = 0; i < 8; ++i) {
    racers.emplace_back([&, i] {
      ObjectRecord mine{"job/p2-n" + std::to_string(i), 1000u + i, "etag",
                        "n" + std::to_string(i),        3,         {{0, 10}, {1, 11}}};
      auto r = store.RecordObject("job", 2, mine);
      ASSERT_TRUE(r.ok()) << r.status();
      got[i] = *r;
    });
  }
  for (std::thread& t : racers) t.join();
  int created = 0;
  for (const auto& [record, mine] : got) {
    created += mine ? 1 : 0;
    EXPECT_EQ(record.key, got[0].first.key) << "every racer learns the one recorded";
  }
  EXPECT_EQ(created, 1);
  ASSERT_OK_AND_ASSIGN(auto objects, store.Objects("job"));
  ASSERT_EQ(objects.size(), 1u);
  EXPECT_EQ(objects.at(2).key, got[0].first.key);
  EXPECT_GT(objects.at(2).revision, 0);
  ASSERT_OK_AND_ASSIGN(auto decided, store.Decisions("job"));
  EXPECT_TRUE(StandsFor(objects.at(2), decided, 2));
  ASSERT_OK(store.Revoke("job", {1}, 0).status());
  ASSERT_OK_AND_ASSIGN(decided, store.Decisions("job"));
  EXPECT_FALSE(StandsFor(objects.at(2), decided, 2)) << "a revocation makes it stale";
  // A stale record is replaced once: by the first uploader naming its revision.
  ASSERT_OK(store.DecideMapper("job", 1, 21, 1).status());
  ASSERT_OK_AND_ASSIGN(decided, store.Decisions("job"));
  const ObjectRecord fresh{"job/p2-new", 9, "e2", "n1", 3, {{0, 10}, {1, 21}}};
  const int64_t stale = objects.at(2).revision;
  ASSERT_OK_AND_ASSIGN(auto replaced, store.RecordObject("job", 2, fresh, stale));
  EXPECT_TRUE(replaced.second);
  ObjectRecord late = fresh;
  late.key = "job/p2-late";
  ASSERT_OK_AND_ASSIGN(auto lost, store.RecordObject("job", 2, late, stale));
  EXPECT_FALSE(lost.second) << "the stale record was replaced already";
  EXPECT_EQ(lost.first.key, "job/p2-new");
  ASSERT_OK_AND_ASSIGN(objects, store.Objects("job"));
  EXPECT_TRUE(StandsFor(objects.at(2), decided, 2));
  ASSERT_OK(store.Delete("job").status());
  ASSERT_OK_AND_ASSIGN(objects, store.Objects("job"));
  EXPECT_TRUE(objects.empty());
  EXPECT_THAT(store.RecordObject("job", 2, got[0].first),
              StatusIs(absl::StatusCode::kNotFound, "not recorded"));
  EXPECT_THAT(store.RecordObject("job", 2, fresh, stale),
              StatusIs(absl::StatusCode::kNotFound, "not recorded"));
}

// The largest placement record (kMaxRecordBytes) is one etcd, at its default request size
// limit, takes: created, and replaced in the guarded transaction a new epoch is written by.
TEST_F(EtcdClientTest, TheLargestPlacementRecordIsWrittenAndReplaced) {
  const std::string record(kMaxRecordBytes, 'r');
  ASSERT_OK_AND_ASSIGN(EtcdCreate c, client_->CreateIfAbsent("/s/wide", record));
  ASSERT_TRUE(c.created);
  ASSERT_OK_AND_ASSIGN(bool replaced,
                       client_->PutIfUnchanged("/s/wide", std::string(kMaxRecordBytes, 'q'),
                                               c.kv.mod_revision, "/s/wide/epoch", "1"));
  EXPECT_TRUE(replaced);
  ASSERT_OK_AND_ASSIGN(auto back, client_->Get("/s/wide"));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->value.size(), kMaxRecordBytes);
}

TEST_F(EtcdClientTest, OfManyRacingCreatesExactlyOneWinsAndAllSeeIt) {
  constexpr int kRacers = 16;
  std::vector<std::thread> racers;
  std::vector<EtcdCreate> results(kRacers);
  std::vector<absl::Status> errors(kRacers);
  std::atomic<bool> go{false};
  for (int i = 0; i < kRacers; ++i) {
    racers.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      auto r = client_->CreateIfAbsent("/shuffle/job/mapper/3", "attempt-" + std::to_string(i));
      errors[i] = r.status();
      if (r.ok()) results[i] = *r;
    });
  }
  go = true;
  for (auto& t : racers) t.join();
  int created = 0;
  std::set<std::string> seen;
  for (int i = 0; i < kRacers; ++i) {
    ASSERT_OK(errors[i]);
    created += results[i].created ? 1 : 0;
    seen.insert(results[i].kv.value);
  }
  EXPECT_EQ(created, 1);
  ASSERT_EQ(seen.size(), 1u) << "racers saw different winners";
  ASSERT_OK_AND_ASSIGN(auto stored, client_->Get("/shuffle/job/mapper/3"));
  EXPECT_EQ(stored->value, *seen.begin());
}

// Revoking decisions in etcd (docs/cluster.md, "Revoking decisions"): hundreds of decisions in
// one transaction, as ranges of adjacent keys (etcd takes 128 operations a transaction), the
// others left as they are; too scattered a set is refused naming why, and writes nothing.
TEST_F(EtcdClientTest, HundredsOfDecisionsAreRevokedInOneTransactionAndNoOtherIsTouched) {
  EtcdOptions options;
  options.endpoints = etcd_->endpoint();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Connect(options));
  EtcdPlacementStore store(std::shared_ptr<EtcdClient>(std::move(etcd)), "/sluice/test/");
  ASSERT_OK(store.Create("big", 4, 400, 2, {"n0", "n1"}).status());
  for (uint32_t m = 0; m < 400; ++m) {
    ASSERT_OK(store.DecideMapper("big", m, 1000 + m, 0).status());
  }
  std::vector<uint32_t> evens, first300;
  for (uint32_t m = 0; m < 400; ++m) {
    if (m % 2 == 0) evens.push_back(m);
    if (m < 300) first300.push_back(m);
  }
  EXPECT_THAT(store.Revoke("big", evens, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "revoke them in parts"));
  ASSERT_OK_AND_ASSIGN(auto decided, store.Decisions("big"));
  EXPECT_EQ(decided.size(), 400u) << "a refused revocation writes nothing";
  ASSERT_OK_AND_ASSIGN(auto revoked, store.Revoke("big", first300, 0));
  ASSERT_EQ(revoked.first.size(), 300u);
  EXPECT_EQ(revoked.first[299], 1299u);
  EXPECT_EQ(revoked.second.epoch(), 1u);
  ASSERT_OK_AND_ASSIGN(decided, store.Decisions("big"));
  ASSERT_EQ(decided.size(), 100u);
  for (const auto& [m, d] : decided) {
    EXPECT_GE(m, 300u);
    EXPECT_EQ(d.attempt, 1000 + m);
  }
  // A revoked mapper decides afresh in the new epoch; a repeat revokes nothing new.
  ASSERT_OK_AND_ASSIGN(MapperDecision again, store.DecideMapper("big", 7, 5007, 1));
  EXPECT_EQ(again.attempt, 5007u);
  ASSERT_OK_AND_ASSIGN(auto repeat, store.Revoke("big", first300, 0));
  EXPECT_EQ(repeat.first[7], 1007u);
  ASSERT_OK_AND_ASSIGN(decided, store.Decisions("big"));
  EXPECT_EQ(decided.size(), 101u);
}

TEST_F(EtcdClientTest, ALeaseTakesItsKeysWhenItEndsOrExpires) {
  ASSERT_OK_AND_ASSIGN(int64_t lease, client_->GrantLease(std::chrono::seconds(2)));
  ASSERT_OK(client_->Put("/nodes/a", "127.0.0.2:7070", lease));
  ASSERT_OK_AND_ASSIGN(auto c, client_->CreateIfAbsent("/nodes/b", "x", lease));
  EXPECT_TRUE(c.created);
  // Kept alive past its TTL, it stays.
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    ASSERT_OK(client_->KeepAlive(lease));
  }
  ASSERT_OK_AND_ASSIGN(auto a, client_->Get("/nodes/a"));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->lease, lease);
  // Not kept alive, it expires and its keys go.
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto k = client_->Get("/nodes/a");
        return k.ok() && !k->has_value();
      },
      std::chrono::seconds(10)));
  EXPECT_THAT(client_->KeepAlive(lease), StatusIs(absl::StatusCode::kNotFound, "has expired"));
  // Revoked, at once.
  ASSERT_OK_AND_ASSIGN(int64_t lease2, client_->GrantLease(std::chrono::seconds(60)));
  ASSERT_OK(client_->Put("/nodes/c", "y", lease2));
  ASSERT_OK(client_->RevokeLease(lease2));
  ASSERT_OK_AND_ASSIGN(auto gone, client_->Get("/nodes/c"));
  EXPECT_FALSE(gone.has_value());
}

// Whether every thread of process `pid` is stopped now (state T in /proc).
bool EveryThreadStopped(pid_t pid) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  int threads = 0;
  for (const auto& t : std::filesystem::directory_iterator(tasks)) {
    std::ifstream f(t.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'T') {
      return false;
    }
    ++threads;
  }
  return threads > 0;
}

// A stopped etcd once answered a put in CI: kill() returns before every thread of a process
// has stopped, so the harness waits for the stop.
TEST_F(EtcdClientTest, ASignalledStopIsCompleteWhenSignalReturns) {
  for (int i = 0; i < 50; ++i) {
    etcd_->Signal(SIGSTOP);
    EXPECT_TRUE(EveryThreadStopped(etcd_->pid())) << "round " << i;
    etcd_->Signal(SIGCONT);
  }
  ASSERT_OK(client_->Put("/k", "v"));
}

TEST_F(EtcdClientTest, AStoppedOrDeadEtcdCostsABoundedWait) {
  etcd_->Signal(SIGSTOP);
  auto start = std::chrono::steady_clock::now();
  // etcd's fault, retryable, and said to be etcd's (not the server's that asked it).
  const absl::Status stalled = client_->Put("/k", "v");
  EXPECT_THAT(stalled, StatusIs(absl::StatusCode::kUnavailable, "etcd put at"));
  EXPECT_EQ(ReasonOf(stalled), ErrorReason::kEtcdUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  etcd_->Signal(SIGCONT);
  ASSERT_OK(client_->Put("/k", "v"));
  etcd_->Signal(SIGKILL);
  start = std::chrono::steady_clock::now();
  const absl::Status st = client_->Get("/k").status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, etcd_->endpoint()));
  EXPECT_EQ(ReasonOf(st), ErrorReason::kEtcdUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

TEST(EtcdClientArgsTest, EndpointsAreChecked) {
  EXPECT_THAT(EtcdClient::Connect({""}), StatusIs(absl::StatusCode::kInvalidArgument, "no etcd"));
  EXPECT_THAT(EtcdClient::Connect({"127.0.0.1:2379,etcd-1:2379"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "'etcd-1:2379'"));
  EXPECT_OK(EtcdClient::Connect({"127.0.0.1:2379,127.0.0.2:2379"}).status());
  EXPECT_EQ(PrefixRangeEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixRangeEnd("\xff"), std::string(1, '\0'));
}

}  // namespace
}  // namespace sluice
