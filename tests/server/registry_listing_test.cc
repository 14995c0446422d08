// ShuffleRegistry's listing pages (ListShuffles' source): each shuffle once, in id order, in
// whatever state it is (open, closed while idle, being opened, damaged), while shuffles open and
// close under the listing (issue 50, item 6: 2,074 entries for 2,000 shuffles, one id twice,
// with GetShuffle calls running).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/shuffle_client.h"
#include "server/storage/shuffle_registry.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {
namespace {

// Every id after `after` with `prefix`, through pages of `page` ids: what a client paging
// ListShuffles sees.
std::vector<std::string> PageThrough(const ShuffleRegistry& registry, const std::string& prefix,
                                     size_t page) {
  std::vector<std::string> seen;
  std::string after = prefix;
  for (;;) {
    const std::vector<ShuffleRegistry::Listed> listed = registry.ListPage(prefix, after, page);
    for (const auto& l : listed) seen.push_back(l.id);
    if (listed.size() < page) return seen;
    after = listed.back().id;
  }
}

TEST(RegistryListingTest, APageListsEachShuffleOnceInIdOrderWithItsState) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
  for (const char* id : {"t~a", "t~b", "t~c", "u~a"}) {
    ASSERT_OK(registry->Create({id, 1, 1}).status());
  }
  registry.reset();
  ASSERT_OK_AND_ASSIGN(
      registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}, ShuffleRegistry::Opening::kLazy));
  ASSERT_OK(registry->Get("t~b").status());  // open; the others listed, not opened
  const std::vector<ShuffleRegistry::Listed> page = registry->ListPage("t~", "t~", 10);
  ASSERT_EQ(page.size(), 3u);
  EXPECT_EQ(page[0].id, "t~a");
  EXPECT_EQ(page[0].store, nullptr) << "not open";
  EXPECT_EQ(page[1].id, "t~b");
  EXPECT_NE(page[1].store, nullptr);
  EXPECT_EQ(page[2].id, "t~c");
  EXPECT_EQ(registry->ListPage("t~", "t~b", 10).size(), 1u) << "after the token only";
  EXPECT_EQ(registry->ListPage("", "", 2).size(), 2u) << "at most a page";
}

TEST(RegistryListingTest, PagingWhileShufflesOpenAndCloseListsEachOnce) {
  TempDir dir;
  constexpr int kShuffles = 300;
  {
    ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{}));
    for (int i = 0; i < kShuffles; ++i) {
      ASSERT_OK(registry->Create({absl::StrFormat("s%04d", i), 1, 1}).status());
    }
  }
  ASSERT_OK_AND_ASSIGN(auto registry, ShuffleRegistry::Open(dir.path(), StoreOptions{},
                                                            ShuffleRegistry::Opening::kLazy));
  registry->set_open_limits(16, ~uint64_t{0});
  std::atomic<bool> stop{false};
  std::vector<std::thread> churn;
  for (int t = 0; t < 3; ++t) {
    churn.emplace_back([&, t] {
      std::mt19937 rng(t);
      auto later = std::chrono::steady_clock::now();
      while (!stop.load()) {
        // Opens shuffle after shuffle; past the limit, idle ones close to make room.
        (void)registry->Get(absl::StrFormat("s%04d", rng() % kShuffles));
        later += std::chrono::seconds(10);
        registry->CloseIdle(later);
      }
    });
  }
  for (int round = 0; round < 40; ++round) {
    const std::vector<std::string> seen = PageThrough(*registry, "", 17);
    const std::set<std::string> once(seen.begin(), seen.end());
    ASSERT_EQ(once.size(), seen.size()) << "an id listed twice in round " << round;
    ASSERT_EQ(seen.size(), static_cast<size_t>(kShuffles)) << "round " << round;
  }
  stop.store(true);
  for (auto& t : churn) t.join();
}

// The same through the server: ListShuffles paged by a client while GetShuffle calls open and
// close shuffles past --max_open_shuffles (each listed once, every one listed).
TEST(RegistryListingTest, ListShufflesWhileGetShuffleCallsChurnListsEachOnce) {
  constexpr int kShuffles = 400;
  MiniServerOptions o;
  o.server.max_open_shuffles = 16;
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(o));
  ASSERT_OK_AND_ASSIGN(auto client, server->Client());
  for (int i = 0; i < kShuffles; ++i) {
    ASSERT_OK(client->CreateShuffle(absl::StrFormat("s%04d", i), 1, 1).status());
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> churn;
  for (int t = 0; t < 3; ++t) {
    churn.emplace_back([&, t] {
      auto c = server->Client();
      if (!c.ok()) return;
      std::mt19937 rng(t);
      while (!stop.load()) (void)(*c)->GetShuffle(absl::StrFormat("s%04d", rng() % kShuffles));
    });
  }
  for (int round = 0; round < 10; ++round) {
    ASSERT_OK_AND_ASSIGN(std::vector<ShuffleStatus> listed, client->ListShuffles());
    std::set<std::string> once;
    for (const ShuffleStatus& s : listed) {
      EXPECT_TRUE(once.insert(s.shuffle_id).second) << s.shuffle_id << " twice, round " << round;
    }
    EXPECT_EQ(listed.size(), static_cast<size_t>(kShuffles)) << "round " << round;
  }
  stop.store(true);
  for (auto& t : churn) t.join();
}

}  // namespace
}  // namespace sluice::testing
