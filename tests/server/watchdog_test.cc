// Watchdog: deadlines fire once, disarmed ones never, and Disarm() of a firing entry returns
// only after its callback has.
#include "server/runtime/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

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
  std::atomic<bool> entered{false}, returned{false};
  const uint64_t id = dog.Arm(Watchdog::Clock::now(), [&] {
    entered = true;
    std::this_thread::sleep_for(milliseconds(100));
    returned = true;
  });
  while (!entered.load()) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_FALSE(dog.Disarm(id));  // it fired...
  EXPECT_TRUE(returned.load());  // ...and its callback is over
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
