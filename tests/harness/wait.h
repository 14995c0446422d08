// Waiting on conditions in tests: polls instead of sleeping a guessed time.
#ifndef SLUICE_TESTS_HARNESS_WAIT_H_
#define SLUICE_TESTS_HARNESS_WAIT_H_

#include <chrono>
#include <functional>
#include <thread>

namespace sluice::testing {

/// Polls `cond` every 20 ms for up to `limit`; whether it became true.
inline bool Eventually(const std::function<bool()>& cond,
                       std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_WAIT_H_
