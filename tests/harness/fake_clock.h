// A clock tests move by hand, for the transport-free stream sessions (server/runtime/clock.h):
// a deadline is reached by Advance, never by sleeping.
#ifndef SLUICE_TESTS_HARNESS_FAKE_CLOCK_H_
#define SLUICE_TESTS_HARNESS_FAKE_CLOCK_H_

#include <atomic>
#include <chrono>

#include "server/runtime/clock.h"

namespace sluice::testing {

class FakeClock final : public Clock {
 public:
  time_point Now() const override { return now_.load(); }
  void Advance(duration d) { now_.store(now_.load() + d); }

 private:
  std::atomic<time_point> now_{time_point(std::chrono::hours(1))};
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_FAKE_CLOCK_H_
