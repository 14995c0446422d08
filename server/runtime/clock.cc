#include "server/runtime/clock.h"

namespace sluice {
namespace {

class SteadyClock final : public Clock {
 public:
  time_point Now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const Clock* Clock::Steady() {
  static const SteadyClock* const clock = new SteadyClock();
  return clock;
}

}  // namespace sluice
