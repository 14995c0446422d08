// Watchdog: deadlines fire once, disarmed ones never, and Disarm() of a firing entry returns
// only after its callback has.
#include "server/runtime/watchdog.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/harness/parked_threads.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;

TEST(WatchdogTest, FiresOnceAfterTheDeadlineUnlessDisarmed) {
  Watchdog dog(milliseconds(5));
  std::atomic<int> fired{0}, never{0};
  const auto start = Watchdog::Clock::now();
  std::atomic<int64_t> fired_after_ms{-1};
  dog.Arm(start + milliseconds(50), [&] {
    fired_after_ms =
        std::chrono::duration_cast<milliseconds>(Watchdog::Clock::now() - start).count();
    ++fired;
  });
  const uint64_t other = dog.Arm(start + milliseconds(50), [&] { ++never; });
  EXPECT_TRUE(dog.Disarm(other));
  EXPECT_FALSE(dog.Disarm(other));  // already taken back
  EXPECT_FALSE(dog.Disarm(0));      // never armed: returns at once
  for (int i = 0; i < 2000 && fired.load() == 0; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(fired.load(), 1);
  EXPECT_GE(fired_after_ms.load(), 50);
  // Nothing is left armed: neither it (it fires once) nor the disarmed one can fire later.
  EXPECT_EQ(dog.armed(), 0u);
  EXPECT_EQ(never.load(), 0);
}

TEST(WatchdogTest, DisarmWaitsForARunningCallback) {
  Watchdog dog(milliseconds(1));
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, release = false;
  std::atomic<bool> returned{false};
  const uint64_t id = dog.Arm(Watchdog::Clock::now(), [&] {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });  // runs until the test lets it return
    returned = true;
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return entered; }));
  }
  // Disarm while the callback runs: it must not return before the callback has.
  std::atomic<pid_t> tid{0};
  std::atomic<bool> disarmed{false}, over_at_disarm{false}, fired{false};
  std::thread disarm([&] {
    tid = ::gettid();
    fired = !dog.Disarm(id);
    over_at_disarm = returned.load();
    disarmed = true;
  });
  // Until Disarm has returned (wrongly) or is parked waiting for the callback.
  const bool waited = testing::Eventually(
      [&] { return disarmed.load() || (tid.load() != 0 && testing::ThreadsParked({tid.load()})); });
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  disarm.join();
  ASSERT_TRUE(waited);
  EXPECT_TRUE(fired.load());           // it fired...
  EXPECT_TRUE(over_at_disarm.load());  // ...and Disarm returned once its callback was over
}

TEST(WatchdogTest, EntriesStillArmedAtDestructionNeverRun) {
  std::atomic<int> ran{0};
  {
    Watchdog dog(milliseconds(1));
    dog.Arm(Watchdog::Clock::now() + std::chrono::hours(1), [&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 0);
}

}  // namespace
}  // namespace sluice
