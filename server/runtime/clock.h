// Clock: the time the transport-free stream sessions (server/rules/push_stream.h,
// fetch_stream.h) decide their deadlines by, injected so that their tests move it by hand
// (tests/harness/fake_clock.h) instead of sleeping. The server gives them Clock::Steady(), the
// steady clock the watchdog fires by, so a deadline a session sets is one the watchdog keeps.
#ifndef SLUICE_SERVER_RUNTIME_CLOCK_H_
#define SLUICE_SERVER_RUNTIME_CLOCK_H_

#include <chrono>

namespace sluice {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;

  virtual ~Clock() = default;
  virtual time_point Now() const = 0;

  /// The process's steady clock (never destroyed).
  static const Clock* Steady();
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RUNTIME_CLOCK_H_
