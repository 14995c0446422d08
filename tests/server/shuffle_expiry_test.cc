// --shuffle_ttl_s's rules on their own (ShuffleExpiry), on a real registry, with the clock
// handed in: a shuffle goes once idle for the lifetime, each use (a push, a fetch, a status
// call: ShuffleStore::Touch) starts its idle time again, and one a push is writing to stays.
#include "server/rules/shuffle_expiry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {
namespace {

using std::chrono::milliseconds;

TEST(ShuffleExpiryTest, IdleShufflesGoAndUsedOrWrittenOnesStay) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
  const milliseconds ttl(60000);
  ShuffleExpiry expiry(registry.get(), ttl);
  for (const char* id : {"idle", "used", "written"})
    ASSERT_OK(registry->Create({id, 1, 0}).status());
  ASSERT_OK_AND_ASSIGN(auto idle, registry->Get("idle"));
  ASSERT_OK_AND_ASSIGN(auto used, registry->Get("used"));
  const auto made = std::max(idle->last_used(), used->last_used());  // both made by then
  while (std::chrono::steady_clock::now() <= made) {
  }  // the use below comes strictly later
  used->Touch();
  ASSERT_GT(used->last_used(), made);
  ASSERT_OK_AND_ASSIGN(auto written, registry->GetForWriting("written"));  // a push writes

  EXPECT_EQ(expiry.ExpireIdle(idle->last_used() + ttl - milliseconds(1)), 0u)
      << "nothing is idle that long";
  // Past the lifetime of both creations: only the one not used since goes.
  EXPECT_EQ(expiry.ExpireIdle(made + ttl), 1u);
  EXPECT_THAT(registry->Get("idle").status(), StatusIs(absl::StatusCode::kNotFound, "idle"));
  EXPECT_OK(registry->Get("used").status()) << "its use started its idle time again";
  EXPECT_EQ(expiry.ExpireIdle(used->last_used() + ttl), 1u);
  EXPECT_THAT(registry->Get("used").status(), StatusIs(absl::StatusCode::kNotFound, "used"));
  EXPECT_EQ(expiry.ExpireIdle(written->last_used() + 10 * ttl), 0u) << "a push is writing to it";
  written->EndWriter();
  EXPECT_EQ(expiry.ExpireIdle(written->last_used() + ttl), 1u);
  EXPECT_TRUE(registry->List().empty());
}

TEST(ShuffleExpiryTest, ItLooksAQuarterOfTheLifetimeApartWithinBounds) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
  EXPECT_EQ(ShuffleExpiry(registry.get(), milliseconds(2000)).period(), milliseconds(500));
  EXPECT_EQ(ShuffleExpiry(registry.get(), milliseconds(200)).period(), milliseconds(100));
  EXPECT_EQ(ShuffleExpiry(registry.get(), std::chrono::hours(24)).period(),
            std::chrono::seconds(60));
}

}  // namespace
}  // namespace sluice::testing
