// The server's scheduling pieces on their own: the worker pool and the gate that bounds
// concurrent merges (the memory budget: memory_budget_test.cc).
#include "server/runtime/worker_pool.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "tests/harness/wait.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;

using testing::Eventually;

// Returns once every task submitted to `pool` before it has run (a pool of one thread runs its
// tasks in order): what has not happened by then will not happen without a new submission.
void Flush(WorkerPool& pool) {
  std::promise<void> done;
  pool.Submit([&done] { done.set_value(); });
  done.get_future().wait();
}

TEST(WorkerPoolTest, RunsEveryTaskOnItsThreadsAndDrainsTheQueueWhenDestroyed) {
  std::atomic<int> done{0};
  std::mutex mu;
  std::set<std::thread::id> threads;
  {
    WorkerPool pool(3);
    for (int i = 0; i < 1000; ++i) {
      pool.Submit([&] {
        {
          std::lock_guard<std::mutex> lock(mu);
          threads.insert(std::this_thread::get_id());
        }
        ++done;
      });
    }
  }  // the destructor runs what is queued, then joins
  EXPECT_EQ(done.load(), 1000);
  EXPECT_LE(threads.size(), 3u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(WorkerPoolTest, ThreadsRunConcurrently) {
  WorkerPool pool(2);
  // Two tasks that each wait for the other: both must be running at once.
  std::promise<void> a, b;
  auto fa = a.get_future().share();
  auto fb = b.get_future().share();
  std::promise<bool> ok1, ok2;
  pool.Submit([&, fb] {
    a.set_value();
    ok1.set_value(fb.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  });
  pool.Submit([&, fa] {
    b.set_value();
    ok2.set_value(fa.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  });
  EXPECT_TRUE(ok1.get_future().get());
  EXPECT_TRUE(ok2.get_future().get());
}

TEST(GateTest, AdmitsAtMostItsLimitAndPassesSlotsInOrder) {
  WorkerPool pool(1);  // in order: Flush shows what will not happen
  Gate gate(2, &pool);
  std::mutex mu;
  std::vector<int> admitted;
  auto enter = [&](int id) {
    gate.Enter("", [&, id] {
      std::lock_guard<std::mutex> lock(mu);
      admitted.push_back(id);
    });
  };
  auto count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return admitted.size();
  };
  for (int i = 0; i < 5; ++i) enter(i);
  ASSERT_TRUE(Eventually([&] { return count() == 2; }));
  Flush(pool);
  EXPECT_EQ(count(), 2u) << "more holders than the limit";
  gate.Leave("");
  ASSERT_TRUE(Eventually([&] { return count() == 3; }));
  gate.Leave("");
  ASSERT_TRUE(Eventually([&] { return count() == 4; }));
  gate.Leave("");
  ASSERT_TRUE(Eventually([&] { return count() == 5; }));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(admitted[2], 2);  // waiters in arrival order
  EXPECT_EQ(admitted[3], 3);
  EXPECT_EQ(admitted[4], 4);
}

TEST(GateTest, ALimitOfZeroStillAdmitsOne) {
  WorkerPool pool(1);
  Gate gate(0, &pool);
  std::promise<void> in;
  gate.Enter("", [&] { in.set_value(); });
  EXPECT_EQ(in.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  gate.Leave("");
}

// Tenants: a freed slot goes to a waiter whose tenant is under its share before earlier ones
// of a tenant over it, and a tenant holding more than its share while another waits is told.
TEST(GateTest, AFreedSlotGoesToATenantUnderItsShareFirst) {
  WorkerPool pool(1);
  Gate gate(2, &pool);
  std::mutex mu;
  std::vector<std::string> admitted;
  auto enter = [&](const std::string& who) {
    gate.Enter(who.substr(0, 1), [&, who] {
      std::lock_guard<std::mutex> lock(mu);
      admitted.push_back(who);
    });
  };
  auto count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return admitted.size();
  };
  enter("a1");
  enter("a2");
  ASSERT_TRUE(Eventually([&] { return count() == 2; }));
  EXPECT_FALSE(gate.OverShareWhileOthersWait("a")) << "alone, a tenant may hold every slot";
  enter("a3");
  EXPECT_FALSE(gate.OverShareWhileOthersWait("a")) << "only its own fetches wait";
  enter("b1");
  EXPECT_TRUE(gate.OverShareWhileOthersWait("a")) << "2 of 2 slots, share 1, b waits";
  EXPECT_FALSE(gate.OverShareWhileOthersWait("b"));
  gate.Leave("a");
  ASSERT_TRUE(Eventually([&] { return count() == 3; }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(admitted[2], "b1") << "b is under its share: it goes before a3";
  }
  EXPECT_FALSE(gate.OverShareWhileOthersWait("a"));
  gate.Leave("a");
  ASSERT_TRUE(Eventually([&] { return count() == 4; }));
  gate.Leave("a");
  gate.Leave("b");
}

}  // namespace
}  // namespace sluice
