// A fixture for tests of the fetch rules with no transport: a shuffle registry on a real
// temporary directory, what a FetchSession needs, and attempts pushed through PushAttempt as a
// push stream would push them.
#ifndef SLUICE_TESTS_HARNESS_FETCH_FIXTURE_H_
#define SLUICE_TESTS_HARNESS_FETCH_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/rules/fetch_session.h"
#include "server/rules/push_attempt.h"
#include "server/runtime/memory_budget.h"
#include "server/runtime/worker_pool.h"
#include "server/storage/shuffle_registry.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {

class FetchFixture : public ::testing::Test {
 protected:
  void SetUp() override { OpenRegistry(StoreOptions{}); }

  // Opens the registry again (a restart: every index from the logs alone).
  void OpenRegistry(const StoreOptions& options) {
    registry_.reset();
    ASSERT_OK_AND_ASSIGN(registry_, ShuffleRegistry::Open(dir_.path(), options));
    deps_.registry = registry_.get();
    deps_.budget = &budget_;
    deps_.merge.tmp_dir = dir_.path();
  }

  // Mapper m pushes one frame per entry of `frames` to partition 0, and commits.
  void Push(const std::string& id, uint32_t m, const std::vector<std::string>& frames) {
    PushAttempt a(registry_.get(), PushLimits{});
    ASSERT_OK(a.Open(id, m, 1));
    uint64_t records = 0;
    for (const std::string& f : frames) {
      ASSERT_OK(a.AddFrame(0, Bytes(f)));
      records += DecodeRows(f).size();
    }
    ASSERT_OK(a.Commit(frames.size(), records));
  }

  TempDir dir_;
  std::unique_ptr<ShuffleRegistry> registry_;
  WorkerPool pool_{1};
  MemoryBudget budget_{64 << 20, &pool_};
  FetchDeps deps_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_FETCH_FIXTURE_H_
