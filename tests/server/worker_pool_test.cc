// The server's scheduling pieces on their own: the worker pool, the memory budget that parks
// streams, and the gate that bounds concurrent merges.
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

// A push stream reserves a large frame's announced size before it reads a piece of it: the
// bytes are charged when granted, waiters go in order (a later small one does not pass a
// large one that waits), and a reservation over the whole limit goes once nothing else is
// charged.
TEST(MemoryBudgetTest, ReservationsAreChargedWhenGrantedAndServedInOrder) {
  WorkerPool pool(1);  // in order: Flush shows what will not happen
  MemoryBudget budget(100, &pool);
  std::atomic<int> order{0}, big_at{-1}, small_at{-1}, huge_at{-1};
  budget.Reserve(60, [&] { order++; });
  ASSERT_TRUE(Eventually([&] { return order.load() == 1; }));
  EXPECT_EQ(budget.used(), 60u);
  budget.Reserve(70, [&] { big_at = order++; });      // 130 > 100: waits
  budget.WhenAvailable([&] { small_at = order++; });  // 60 < 100, but behind the big one
  Flush(pool);
  EXPECT_EQ(order.load(), 1) << "a waiter passed a reservation that waits before it";
  EXPECT_EQ(budget.parked_total(), 2u);
  budget.Release(60);  // 0: the 70 is charged, and 70 < 100 lets the small one go too
  // (Both are granted, in order, by this call, and run on the pool.)
  ASSERT_TRUE(Eventually([&] { return order.load() == 3; }));
  EXPECT_GE(big_at.load(), 1);
  EXPECT_GE(small_at.load(), 1);
  EXPECT_EQ(budget.used(), 70u);
  budget.Reserve(250, [&] { huge_at = order++; });  // over the limit: alone, once used is 0
  Flush(pool);
  EXPECT_EQ(huge_at.load(), -1);
  budget.Release(70);
  ASSERT_TRUE(Eventually([&] { return huge_at.load() == 3; }));
  EXPECT_EQ(budget.used(), 250u);
  budget.Release(250);
  EXPECT_EQ(budget.used(), 0u);
}

TEST(MemoryBudgetTest, WaitersParkWhileFullAndResumeOnThePoolWhenMemoryIsReleased) {
  WorkerPool pool(1);  // in order: Flush shows what will not happen
  MemoryBudget budget(100, &pool);
  std::atomic<int> resumed{0};
  std::atomic<bool> on_caller{false};
  const auto caller = std::this_thread::get_id();
  // Room: runs at once, but on the pool, never on the caller's thread.
  budget.WhenAvailable([&] {
    on_caller = std::this_thread::get_id() == caller;
    ++resumed;
  });
  ASSERT_TRUE(Eventually([&] { return resumed.load() == 1; }));
  EXPECT_FALSE(on_caller.load());
  EXPECT_EQ(budget.parked_total(), 0u);

  budget.Charge(150);  // always granted (the data is in memory already), now over the limit
  EXPECT_EQ(budget.used(), 150u);
  for (int i = 0; i < 3; ++i) budget.WhenAvailable([&] { ++resumed; });
  EXPECT_EQ(budget.parked_total(), 3u);
  Flush(pool);
  EXPECT_EQ(resumed.load(), 1) << "a waiter ran while the budget was full";

  budget.Release(40);  // 110: still full
  Flush(pool);
  EXPECT_EQ(resumed.load(), 1);
  budget.Release(20);  // 90: room, every waiter goes
  ASSERT_TRUE(Eventually([&] { return resumed.load() == 4; }));
  budget.Release(1000);  // more than was charged: clamps at zero
  EXPECT_EQ(budget.used(), 0u);
}

TEST(GateTest, AdmitsAtMostItsLimitAndPassesSlotsInOrder) {
  WorkerPool pool(1);  // in order: Flush shows what will not happen
  Gate gate(2, &pool);
  std::mutex mu;
  std::vector<int> admitted;
  auto enter = [&](int id) {
    gate.Enter([&, id] {
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
  gate.Leave();
  ASSERT_TRUE(Eventually([&] { return count() == 3; }));
  gate.Leave();
  ASSERT_TRUE(Eventually([&] { return count() == 4; }));
  gate.Leave();
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
  gate.Enter([&] { in.set_value(); });
  EXPECT_EQ(in.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  gate.Leave();
}

}  // namespace
}  // namespace sluice
