// A fixture for tests of the stream sessions (server/rules/push_stream.h, fetch_stream.h) with
// no transport: a registry on a real temporary directory, real pools, budget and merge gate, a
// fake clock, and a host that records what a session asks of its transport. A test plays the
// transport: it does what each step says (Work on "the pool" is a call from the test's thread;
// a wait's step arrives through the host, from the pool's threads) and moves the clock by hand.
#ifndef SLUICE_TESTS_HARNESS_STREAM_FIXTURE_H_
#define SLUICE_TESTS_HARNESS_STREAM_FIXTURE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/rules/cluster_node.h"
#include "server/rules/stream_deps.h"
#include "server/runtime/memory_budget.h"
#include "server/runtime/worker_pool.h"
#include "server/security/call_context.h"
#include "server/security/tenancy.h"
#include "server/storage/shuffle_registry.h"
#include "tests/harness/fake_clock.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {

/// What a session asks of its transport, recorded: the steps it resumes with after a wait (in
/// order, from any thread), the messages it is done with, and the credentials checks (answered
/// with `caller`).
template <typename Session>
class RecordingHost : public Session::Host {
 public:
  using Step = typename Session::Step;

  void Resume(Step step) override {
    std::lock_guard<std::mutex> lock(mu_);
    resumed_.push_back(std::move(step));
    cv_.notify_all();
  }
  absl::Status CheckCaller(absl::string_view) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++checks_;
    return caller_;
  }

  /// The next step resumed after a wait, waiting up to `limit` for it (nullopt: none came).
  std::optional<Step> NextResumed(std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, limit, [&] { return !resumed_.empty(); })) return std::nullopt;
    Step step = std::move(resumed_.front());
    resumed_.pop_front();
    return step;
  }
  /// Whether a step was resumed (without waiting).
  bool HasResumed() {
    std::lock_guard<std::mutex> lock(mu_);
    return !resumed_.empty();
  }
  int checks() {
    std::lock_guard<std::mutex> lock(mu_);
    return checks_;
  }
  void SetCaller(absl::Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    caller_ = std::move(st);
  }

 protected:
  std::mutex mu_;

 private:
  std::condition_variable cv_;
  std::deque<Step> resumed_;
  int checks_ = 0;
  absl::Status caller_;
};

class StreamFixture : public ::testing::Test {
 protected:
  static constexpr uint64_t kBudget = 8 << 20;

  StreamFixture()
      : registry_(*ShuffleRegistry::Open(dir_.path(), StoreOptions{})),
        node_(registry_.get(), /*clustered=*/false) {
    deps_.registry = registry_.get();
    deps_.node = &node_;
    deps_.admission =
        AdmissionDeps{&tenants_, &streams_, &budget_, &gate_, registry_.get(), &node_};
    deps_.fetch.registry = registry_.get();
    deps_.fetch.budget = &budget_;
    deps_.fetch.merge.tmp_dir = dir_.path();
    deps_.metrics = &metrics_;
    deps_.clock = &clock_;
  }

  static CallContext Tenant(const std::string& name) {
    return CallContext(Identity{name, Role::kTenant, TenantQuota{}}, TenantLimits{});
  }

  TempDir dir_;
  std::unique_ptr<ShuffleRegistry> registry_;
  ClusterNode node_;
  Tenants tenants_;
  OpenStreams streams_{64, 64};
  WorkerPool pool_{2};
  MemoryBudget budget_{kBudget, &pool_};
  Gate gate_{1, &pool_};
  ServerMetrics metrics_;
  FakeClock clock_;
  StreamDeps deps_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_STREAM_FIXTURE_H_
