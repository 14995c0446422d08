// The cluster's control plane under faults, on a MiniCluster (a real etcd, three servers on
// 127.0.0.2-4): etcd stopped or killed while readers come and go, an etcd stall longer than the
// servers' leases, a hung server first in the client's list, a server restarted under a
// client's feet, a node that comes back at its address under another id. Each time the job
// keeps working where it can, and every error it gets says whether a retry can help.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/shuffle_client.h"
#include "rpc/error_reason.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using testing::MiniCluster;
using testing::MiniClusterOptions;
using testing::StatusIs;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kPartitions = 6;
constexpr uint32_t kMappers = 3;
constexpr int kItems = 400;

// A MiniCluster client's options with calls of `deadline` and placements kept for
// `placement_ttl`.
ClientOptions With(std::chrono::milliseconds deadline,
                   std::chrono::milliseconds placement_ttl = ClientOptions().placement_ttl) {
  ClientOptions options = MiniCluster::ShortDeadlines();
  options.call_deadline = deadline;
  options.placement_ttl = placement_ttl;
  return options;
}

std::string Key(uint32_t m, int i) { return absl::StrCat("k", (m * 31 + i) % 97); }

absl::Status WriteMapper(ShuffleClient& c, const std::string& id, uint32_t m, uint64_t attempt) {
  WriterOptions o;
  o.sort_by_key = true;
  auto w = c.OpenWriter(id, m, attempt, o);
  if (!w.ok()) return w.status();
  for (int i = 0; i < kItems; ++i) {
    if (absl::Status st = (*w)->Add(Key(m, i), absl::StrCat("m", m, "-", i)); !st.ok()) return st;
  }
  return (*w)->Close().status();
}

// Every record of every partition, KEY order, each exactly once.
absl::Status ReadAll(ShuffleClient& c, const std::string& id) {
  std::set<std::string> seen;
  for (uint32_t p = 0; p < kPartitions; ++p) {
    ReaderOptions o;
    o.order = FetchOrder::kKey;
    o.require_complete = true;
    auto r = c.OpenReader(id, p, o);
    if (!r.ok()) return r.status();
    Record rec;
    for (;;) {
      auto more = (*r)->Next(&rec);
      if (!more.ok()) return more.status();
      if (!*more) break;
      if (!seen.insert(std::string(rec.value)).second) {
        return absl::InternalError(absl::StrCat("read twice: ", std::string(rec.value)));
      }
    }
  }
  if (seen.size() != kMappers * kItems) {
    return absl::InternalError(absl::StrCat(seen.size(), " records read of ", kMappers * kItems));
  }
  return absl::OkStatus();
}

class FaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cluster_, MiniCluster::Start());
    ASSERT_OK_AND_ASSIGN(client_, cluster_->Client());
  }
  // A committed shuffle of replication 2.
  void MakeShuffle(const std::string& id) {
    ASSERT_OK(client_->CreateShuffle(id, kPartitions, kMappers, 2).status());
    for (uint32_t m = 0; m < kMappers; ++m) ASSERT_OK(WriteMapper(*client_, id, m, 1));
  }

  std::unique_ptr<MiniCluster> cluster_;
  std::unique_ptr<ShuffleClient> client_;
};

// (1) etcd down: a reader that never saw the shuffle reads it all the same, from servers that
// keep serving what they have applied and checked; what needs etcd (a create, a decision) fails
// with UNAVAILABLE naming etcd, never a Sluice server; all of it comes back with etcd.
TEST_F(FaultsTest, WithEtcdStoppedANewReaderReadsACommittedShuffle) {
  MakeShuffle("job");
  ASSERT_OK(ReadAll(*client_, "job"));  // the servers have read its placement and decisions
  cluster_->etcd().Signal(SIGSTOP);
  // (A deadline over etcd's 5 s: the first call to find etcd stalled waits that long.)
  ASSERT_OK_AND_ASSIGN(auto fresh, cluster_->Client(With(std::chrono::seconds(10))));
  const auto start = Clock::now();
  EXPECT_OK(ReadAll(*fresh, "job"));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(8)) << "a new reader waited on etcd";
  ASSERT_OK_AND_ASSIGN(PlacementInfo p, fresh->GetPlacement("job"));
  EXPECT_EQ(p.nodes.size(), 3u);
  absl::Status create = fresh->CreateShuffle("other", 2, 1, 2).status();
  EXPECT_THAT(create, StatusIs(absl::StatusCode::kUnavailable, "etcd")) << create;
  EXPECT_EQ(create.message().find("server unreachable"), absl::string_view::npos) << create;
  cluster_->etcd().Signal(SIGCONT);
  EXPECT_TRUE(testing::Eventually([&] { return fresh->CreateShuffle("other", 2, 1, 2).ok(); },
                                  std::chrono::seconds(15)));
}

TEST_F(FaultsTest, WithEtcdKilledANewReaderReadsACommittedShuffle) {
  MakeShuffle("job");
  ASSERT_OK(ReadAll(*client_, "job"));
  cluster_->etcd().Signal(SIGKILL);
  ASSERT_OK_AND_ASSIGN(auto fresh, cluster_->Client());
  EXPECT_OK(ReadAll(*fresh, "job"));
  EXPECT_THAT(fresh->CreateShuffle("other", 2, 1, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "etcd"));
}

// (2) An etcd stall longer than the servers' leases: when etcd resumes it expires every lease
// at once, and for a moment no server (or only some) is registered. A create in that moment is
// UNAVAILABLE (retry), never INVALID_ARGUMENT, and a shuffle is never placed on fewer servers
// than were registered before the stall (as each server last read the list: every second, and
// at each ListNodes).
TEST_F(FaultsTest, AnEtcdStallLongerThanTheLeaseNeverMakesACreateInvalid) {
  for (size_t i = 0; i < 3; ++i) {  // each server has read the whole list
    ASSERT_OK_AND_ASSIGN(std::vector<NodeAddress> nodes, cluster_->Link(i)->client().ListNodes());
    ASSERT_EQ(nodes.size(), 3u);
  }
  cluster_->etcd().Signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(4));  // the lease is 2 s
  cluster_->etcd().Signal(SIGCONT);
  int created = 0;
  const auto until = Clock::now() + std::chrono::seconds(8);
  for (int i = 0; Clock::now() < until; ++i) {
    const std::string id = absl::StrCat("s", i);
    absl::StatusOr<bool> c = client_->CreateShuffle(id, 6, 1, 0);
    if (!c.ok()) {
      EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kUnavailable, "")) << id;
      continue;
    }
    ++created;
    ASSERT_OK_AND_ASSIGN(PlacementInfo p, client_->GetPlacement(id));
    EXPECT_EQ(p.nodes.size(), 3u) << id << " placed on fewer servers than the cluster has";
    EXPECT_EQ(p.replication, 2u) << id;
  }
  EXPECT_GT(created, 0) << "no create succeeded once the servers registered again";
}

// (3) A hung server first in the list costs one timeout, then none: the client remembers it.
TEST_F(FaultsTest, AHungServerFirstInTheListCostsOneTimeout) {
  ASSERT_OK_AND_ASSIGN(auto client, cluster_->Client(With(std::chrono::seconds(2))));
  ASSERT_OK(client->CreateShuffle("warm", 2, 1, 2).status());
  cluster_->Pause(0);
  const auto first = Clock::now();
  ASSERT_OK(client->CreateShuffle("a", 2, 1, 2).status());
  EXPECT_LT(Clock::now() - first, std::chrono::seconds(4));
  const auto then = Clock::now();
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(client->CreateShuffle(absl::StrCat("b", i), 2, 1, 2).status());
    ASSERT_OK(client->GetPlacement(absl::StrCat("b", i)).status());
    ASSERT_OK(client->GetShuffle(absl::StrCat("b", i)).status());
  }
  EXPECT_LT(Clock::now() - then, std::chrono::seconds(2)) << "the hung server was asked again";
  cluster_->Resume(0);
}

// (4) A server restarted between two attempts costs no attempt: the client's connection to
// its old process is dead, and a call that fails before anything of it was sent is sent again.
TEST_F(FaultsTest, AServerRestartCostsNoAttempt) {
  ASSERT_OK(client_->CreateShuffle("job", kPartitions, 10, 2).status());
  ASSERT_OK(WriteMapper(*client_, "job", 0, 1));
  for (uint32_t m = 1; m < 7; ++m) {
    const size_t victim = m % 3;
    if (m < 4) {
      ASSERT_OK(cluster_->Stop(victim));  // drained
    } else {
      cluster_->Kill(victim);  // kill -9
    }
    ASSERT_OK(cluster_->Restart(victim));
    EXPECT_OK(WriteMapper(*client_, "job", m, 1)) << "after restarting server " << victim;
  }
}

// (5) A node that comes back at its address under another id (a pod rescheduled with a new
// volume): a reader that still holds the old placement fails over to the other replica at
// once, instead of failing on "keeps no replica".
TEST_F(FaultsTest, ANodeRenamedAtItsAddressIsFailedOverAtOnce) {
  MakeShuffle("job");
  // (A placement kept for long: the reads below route by the old one, whatever the timing.)
  ASSERT_OK_AND_ASSIGN(auto client,
                       cluster_->Client(With(std::chrono::seconds(5), std::chrono::minutes(10))));
  ASSERT_OK(ReadAll(*client, "job"));  // the client holds the placement now
  ASSERT_OK_AND_ASSIGN(auto writer,
                       cluster_->Client(With(std::chrono::seconds(5), std::chrono::minutes(10))));
  ASSERT_OK(ReadAll(*writer, "job"));  // and so does this one
  cluster_->Kill(1);
  ASSERT_OK(cluster_->Wipe(1));
  ASSERT_OK(cluster_->Restart(1, {"--node_id=renamed"}));
  const auto start = Clock::now();
  EXPECT_OK(ReadAll(*client, "job"));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  // A writer routed by a stale placement is told to retry (not that it made a mistake), and
  // the placement is read again.
  absl::Status stale = WriteMapper(*writer, "job", 0, 7);
  EXPECT_THAT(stale, StatusIs(absl::StatusCode::kUnavailable, "placement was stale")) << stale;
  EXPECT_EQ(ReasonOf(stale), ErrorReason::kNotKept);
  // Routed afresh, always told to retry: while the old id's registration lives on (its lease,
  // 2 s here) the placement still names its address, then the old id is not registered.
  uint64_t attempt = 8;
  EXPECT_TRUE(testing::Eventually(
      [&] {
        absl::Status st = WriteMapper(*writer, "job", 0, attempt++);
        EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "")) << st;
        return absl::StrContains(st.message(), "not registered now");
      },
      std::chrono::seconds(10)));
}

}  // namespace
}  // namespace sluice
