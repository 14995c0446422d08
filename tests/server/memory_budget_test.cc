// The memory budget on its own (server/runtime/memory_budget.h): waits park and resume on the
// pool, reservations are served in order, tenants under their share go first, and what a
// tenant over its share was promised for a large frame, and has not received, is taken back
// for a tenant under its share. A real pool; no server.
#include "server/runtime/memory_budget.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>

#include "tests/harness/wait.h"

namespace sluice {
namespace {

using testing::Eventually;

// Returns once every task submitted to `pool` before it has run (a pool of one thread runs its
// tasks in order): what has not happened by then will not happen without a new submission.
void Flush(WorkerPool& pool) {
  std::promise<void> done;
  pool.Submit([&done] { done.set_value(); });
  done.get_future().wait();
}

// A push stream reserves a large frame's announced size before it reads a piece of it: the
// bytes are charged when granted, waiters go in order (a later small one does not pass a
// large one that waits), and a reservation over the whole limit goes once nothing else is
// charged.
TEST(MemoryBudgetTest, ReservationsAreChargedWhenGrantedAndServedInOrder) {
  WorkerPool pool(1);  // in order: Flush shows what will not happen
  MemoryBudget budget(100, &pool);
  std::atomic<int> order{0}, big_at{-1}, small_at{-1}, huge_at{-1};
  budget.Reserve("", 60, [&] { order++; });
  ASSERT_TRUE(Eventually([&] { return order.load() == 1; }));
  EXPECT_EQ(budget.used(), 60u);
  budget.Reserve("", 70, [&] { big_at = order++; });      // 130 > 100: waits
  budget.WhenAvailable("", [&] { small_at = order++; });  // 60 < 100, but behind the big one
  Flush(pool);
  EXPECT_EQ(order.load(), 1) << "a waiter passed a reservation that waits before it";
  EXPECT_EQ(budget.parked_total(), 2u);
  budget.Release("", 60);  // 0: the 70 is charged, and 70 < 100 lets the small one go too
  // (Both are granted, in order, by this call, and run on the pool.)
  ASSERT_TRUE(Eventually([&] { return order.load() == 3; }));
  EXPECT_GE(big_at.load(), 1);
  EXPECT_GE(small_at.load(), 1);
  EXPECT_EQ(budget.used(), 70u);
  budget.Reserve("", 250, [&] { huge_at = order++; });  // over the limit: alone, once used is 0
  Flush(pool);
  EXPECT_EQ(huge_at.load(), -1);
  budget.Release("", 70);
  ASSERT_TRUE(Eventually([&] { return huge_at.load() == 3; }));
  EXPECT_EQ(budget.used(), 250u);
  budget.Release("", 250);
  EXPECT_EQ(budget.used(), 0u);
}

TEST(MemoryBudgetTest, WaitersParkWhileFullAndResumeOnThePoolWhenMemoryIsReleased) {
  WorkerPool pool(1);  // in order: Flush shows what will not happen
  MemoryBudget budget(100, &pool);
  std::atomic<int> resumed{0};
  std::atomic<bool> on_caller{false};
  const auto caller = std::this_thread::get_id();
  // Room: runs at once, but on the pool, never on the caller's thread.
  budget.WhenAvailable("", [&] {
    on_caller = std::this_thread::get_id() == caller;
    ++resumed;
  });
  ASSERT_TRUE(Eventually([&] { return resumed.load() == 1; }));
  EXPECT_FALSE(on_caller.load());
  EXPECT_EQ(budget.parked_total(), 0u);

  budget.Charge("", 150);  // always granted (the data is in memory already), now over the limit
  EXPECT_EQ(budget.used(), 150u);
  for (int i = 0; i < 3; ++i) budget.WhenAvailable("", [&] { ++resumed; });
  EXPECT_EQ(budget.parked_total(), 3u);
  Flush(pool);
  EXPECT_EQ(resumed.load(), 1) << "a waiter ran while the budget was full";

  budget.Release("", 40);  // 110: still full
  Flush(pool);
  EXPECT_EQ(resumed.load(), 1);
  budget.Release("", 20);  // 90: room, every waiter goes
  ASSERT_TRUE(Eventually([&] { return resumed.load() == 4; }));
  budget.Release("", 1000);  // more than was charged: clamps at zero
  EXPECT_EQ(budget.used(), 0u);
}

// A tenant alone may take the whole budget (its share is all of it); once another tenant
// waits, that one goes first while it is under its share, in whatever order they came.
TEST(MemoryBudgetTest, ATenantUnderItsShareGoesFirstAndAloneATenantMayTakeEverything) {
  WorkerPool pool(1);
  MemoryBudget budget(100, &pool);
  std::atomic<int> order{0}, a_at{-1}, b_at{-1};
  budget.Charge("a", 90);
  budget.Reserve("a", 10, [&] { order++; });  // alone: lent the rest
  ASSERT_TRUE(Eventually([&] { return order.load() == 1; }));
  EXPECT_EQ(budget.used_by("a"), 100u);
  EXPECT_EQ(budget.parked_total(), 0u);
  budget.Reserve("a", 30, [&] { a_at = order++; });  // full: waits, first
  budget.Reserve("b", 30, [&] { b_at = order++; });  // waits, second
  EXPECT_EQ(budget.active_tenants(), 2u);
  budget.Release("a", 40);  // 60 used: room for one 30; b (0 of its 50) goes before a (60)
  ASSERT_TRUE(Eventually([&] { return b_at.load() == 1; }));
  Flush(pool);
  EXPECT_EQ(a_at.load(), -1) << "a tenant over its share went before one under it";
  EXPECT_EQ(budget.used(), 90u);
  budget.Release("b", 30);  // b gone: a may borrow again
  ASSERT_TRUE(Eventually([&] { return a_at.load() == 2; }));
  EXPECT_EQ(budget.used_by("a"), 90u);
  EXPECT_EQ(budget.active_tenants(), 1u);
  budget.Release("a", 90);
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(budget.active_tenants(), 0u);
}

// Two large frames announced by tenant A hold the whole budget and receive nothing: tenant B's
// small request takes back the younger one's promise (down to A's share), not the bytes that
// came; A's stream reads on into what is left, then asks again and waits until B is done.
TEST(MemoryBudgetTest, AnAnnouncementAloneHoldsNothingAnotherTenantNeeds) {
  WorkerPool pool(1);
  MemoryBudget budget(100, &pool);
  MemoryBudget::Frame f1, f2;
  std::atomic<int> granted{0};
  budget.Announce(&f1, "a", 50);
  budget.Promise(&f1, [&] { granted++; });
  budget.Announce(&f2, "a", 50);
  budget.Promise(&f2, [&] { granted++; });
  ASSERT_TRUE(Eventually([&] { return granted.load() == 2; }));
  EXPECT_EQ(budget.used(), 100u);
  EXPECT_TRUE(budget.Arrived(&f2, 10));  // 10 came: firm; 40 still promised

  std::atomic<bool> b_in{false};
  budget.Reserve("b", 30, [&] { b_in = true; });  // under its share of 50: A gives back 30
  ASSERT_TRUE(Eventually([&] { return b_in.load(); }));
  EXPECT_EQ(budget.revoked_total(), 1u);
  EXPECT_EQ(budget.used_by("a"), 70u);
  EXPECT_EQ(budget.used(), 100u);

  EXPECT_TRUE(budget.Arrived(&f2, 5));    // 5 of the 10 left of its promise: read on
  EXPECT_FALSE(budget.Arrived(&f2, 10));  // 5 past it: charged all the same; ask again
  EXPECT_EQ(budget.used_by("a"), 75u);
  std::atomic<bool> rest{false};
  budget.Promise(&f2, [&] { rest = true; });  // 25 more: a is over its share, b holds 30
  Flush(pool);
  EXPECT_FALSE(rest.load()) << "a tenant over its share took memory another tenant held";
  budget.Release("b", 30);  // 70 + 25 fits
  ASSERT_TRUE(Eventually([&] { return rest.load(); }));
  EXPECT_EQ(budget.used_by("a"), 100u);
  EXPECT_TRUE(budget.Arrived(&f2, 25));
  budget.Drop(&f1);
  budget.Drop(&f2);
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(budget.active_tenants(), 0u);
}

// Bytes that came are never taken back: a tenant whose frames hold real bytes over its share
// makes the other wait (its frames complete and give everything back).
TEST(MemoryBudgetTest, BytesThatCameAreNotTakenBack) {
  WorkerPool pool(1);
  MemoryBudget budget(100, &pool);
  MemoryBudget::Frame f;
  std::atomic<bool> granted{false}, b_in{false};
  budget.Announce(&f, "a", 100);
  budget.Promise(&f, [&] { granted = true; });
  ASSERT_TRUE(Eventually([&] { return granted.load(); }));
  EXPECT_TRUE(budget.Arrived(&f, 95));
  budget.WhenAvailable("b", [&] { b_in = true; });  // full; a byte of the promise goes back
  ASSERT_TRUE(Eventually([&] { return b_in.load(); }));
  EXPECT_EQ(budget.revoked_total(), 1u);
  budget.Reserve("b", 40, [&] { b_in = false; });  // 40 more: only 4 could be taken back
  Flush(pool);
  EXPECT_TRUE(b_in.load()) << "bytes that came were taken back";
  EXPECT_EQ(budget.revoked_total(), 1u);
  EXPECT_TRUE(budget.Arrived(&f, 5));  // complete (a byte past its promise, charged)
  EXPECT_EQ(budget.used_by("a"), 100u);
  budget.Drop(&f);
  ASSERT_TRUE(Eventually([&] { return !b_in.load(); }));
  EXPECT_EQ(budget.used(), 40u);
  budget.Release("b", 40);
}

// What waits on readers holds at most three quarters of the budget while its tenant is alone,
// no more than its share once another tenant is active, and a reservation of it that must wait
// holds nobody up: another tenant's request, and its own tenant's pushes, go past it.
TEST(MemoryBudgetTest, ReadersReservationsLeaveAQuarterFreeAndHoldNobodyUp) {
  WorkerPool pool(1);
  MemoryBudget budget(100, &pool);
  std::atomic<int> granted{0};
  for (int i = 0; i < 10; ++i) budget.ReserveLeavingShare("a", 15, [&] { granted++; });
  ASSERT_TRUE(Eventually([&] { return granted.load() == 5; }));
  Flush(pool);
  EXPECT_EQ(granted.load(), 5) << "readers took more than 3/4 of the budget";
  EXPECT_FALSE(budget.TryReserveLeavingShare("a", 15));
  // Its waiting reservations are first in line; b's request and a's own push go past them.
  std::atomic<bool> b_in{false}, a_push{false};
  budget.WhenAvailable("b", [&] { b_in = true; });
  budget.WhenAvailable("a", [&] { a_push = true; });
  ASSERT_TRUE(Eventually([&] { return b_in.load() && a_push.load(); }));
  budget.Reserve("b", 10, [&] { b_in = false; });
  ASSERT_TRUE(Eventually([&] { return !b_in.load(); }));
  budget.Release("a", 45);  // a at 30, b active: its share is 50, one more reader (to 45)
  ASSERT_TRUE(Eventually([&] { return granted.load() == 6; }));
  Flush(pool);
  EXPECT_EQ(granted.load(), 6) << "a's readers passed its share of 50";
  EXPECT_EQ(budget.used_by("a"), 45u);
  budget.Release("b", 10);  // a alone again: to 3/4 of the budget
  ASSERT_TRUE(Eventually([&] { return granted.load() == 8; }));
  Flush(pool);
  EXPECT_EQ(granted.load(), 8);
  budget.Release("a", 75);
  ASSERT_TRUE(Eventually([&] { return granted.load() == 10; }));
  EXPECT_TRUE(budget.TryReserveLeavingShare("a", 15));  // nobody waits, and it fits
  budget.Release("a", 45);
  EXPECT_EQ(budget.used(), 0u);
}

// Credit (PushFlow) cannot be taken back once granted, so a tenant's outstanding credit (granted,
// its message not come) is capped at a quarter of the budget: a tenant that asks and sends
// nothing leaves the rest to the others, and its capped asks hold nobody up.
TEST(MemoryBudgetTest, ATenantsOutstandingCreditIsCappedAtAQuarter) {
  WorkerPool pool(1);
  MemoryBudget budget(100, &pool);
  EXPECT_TRUE(budget.TryReserveCredit("a", 20));
  EXPECT_FALSE(budget.TryReserveCredit("a", 10)) << "20 + 10 outstanding is past 25";
  std::atomic<bool> a_next{false}, b_got{false};
  budget.ReserveCredit("a", 10, [&] { a_next = true; });
  budget.Reserve("b", 70, [&] { b_got = true; });  // memory there is: a's capped ask waits alone
  ASSERT_TRUE(Eventually([&] { return b_got.load(); }));
  Flush(pool);
  EXPECT_FALSE(a_next.load());
  EXPECT_EQ(budget.used(), 90u);
  budget.CreditUsed("a", 20);  // a's message came: held still, no longer outstanding
  ASSERT_TRUE(Eventually([&] { return a_next.load(); }));
  EXPECT_EQ(budget.used(), 100u);
  budget.Release("a", 20);
  budget.CreditReturned("a", 10);  // a's second credit goes back unused
  budget.Release("b", 70);
  EXPECT_EQ(budget.used(), 0u);
  // The first grant goes whatever its size (a message larger than the cap is still sent).
  EXPECT_TRUE(budget.TryReserveCredit("a", 60));
  budget.CreditReturned("a", 60);
  EXPECT_EQ(budget.used(), 0u);
}

}  // namespace
}  // namespace sluice
