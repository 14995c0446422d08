// ShuffleRegistry's open limit under load (issue 50, item 7: --max_open_shuffles 16 overshot
// about 58 times, 300 sequential GetShuffle calls leaving 210 shuffles open): the limit is soft
// while shuffles are in use, but its overshoot is bounded (a quarter of it, at least 8): past
// that, shuffles nobody holds are closed at once, and while every open one is in use an open
// is UNAVAILABLE (retry) naming the flag.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "server/storage/shuffle_registry.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {
namespace {

class RegistryLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    {
      ASSERT_OK_AND_ASSIGN(auto r, ShuffleRegistry::Open(dir_.path(), StoreOptions{}));
      for (int i = 0; i < kShuffles; ++i) ASSERT_OK(r->Create({Id(i), 1, 1}).status());
    }
    ASSERT_OK_AND_ASSIGN(registry_, ShuffleRegistry::Open(dir_.path(), StoreOptions{},
                                                          ShuffleRegistry::Opening::kLazy));
    registry_->set_open_limits(16, ~uint64_t{0});
  }
  static std::string Id(int i) { return absl::StrFormat("s%04d", i); }

  static constexpr int kShuffles = 300;
  TempDir dir_;
  std::unique_ptr<ShuffleRegistry> registry_;
};

TEST_F(RegistryLimitsTest, SequentialOpensStayWithinTheLimitAndItsBoundedOvershoot) {
  size_t most = 0;
  for (int i = 0; i < kShuffles; ++i) {
    ASSERT_OK(registry_->Get(Id(i)).status());  // held for the call only, as GetShuffle does
    most = std::max(most, registry_->List().size());
  }
  EXPECT_LE(most, 16u + 8u) << "open at once, at most";
}

TEST_F(RegistryLimitsTest, WithEveryOpenShuffleInUseAnOpenIsUnavailableUntilOneIsLetGo) {
  std::vector<std::shared_ptr<ShuffleStore>> held;
  int i = 0;
  for (; i < kShuffles; ++i) {
    absl::StatusOr<std::shared_ptr<ShuffleStore>> s = registry_->Get(Id(i));
    if (!s.ok()) {
      EXPECT_THAT(s.status(), StatusIs(absl::StatusCode::kUnavailable, "--max_open_shuffles"));
      break;
    }
    held.push_back(*std::move(s));
  }
  EXPECT_EQ(held.size(), 16u + 8u) << "in use at once, at most";
  held.erase(held.begin());  // one call ends
  EXPECT_OK(registry_->Get(Id(i)).status()) << "room again";
}

// A background walk over the open shuffles (the expiry, the pre-merge, a metrics scrape) pins
// one at a time, not all of them: an open made while it is preempted halfway still finds idle
// ones to close (a walk that held every store at once made such an open UNAVAILABLE, "all 24
// open shuffles are in use", under load in CI).
TEST_F(RegistryLimitsTest, AWalkOverTheOpenShufflesKeepsNoneButTheOneItVisits) {
  for (int i = 0; i < 24; ++i) ASSERT_OK(registry_->Get(Id(i)).status());
  ASSERT_EQ(registry_->List().size(), 24u);
  int visited = 0;
  absl::Status opened;
  registry_->ForEachOpen([&](const std::shared_ptr<ShuffleStore>& store) {
    if (visited++ == 0) opened = registry_->Get(Id(100)).status();
    (void)store;
  });
  EXPECT_OK(opened);
  EXPECT_GE(visited, 1);
}

}  // namespace
}  // namespace sluice::testing
