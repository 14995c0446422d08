// StreamPhase: a stream's wait for progress (the next message, the reader taking a chunk) as
// its reactor and the watchdog both see it. Wait() opens a wait; then either the event
// (Claim) or the watchdog's deadline (Expire) takes it, whichever comes first, and the other
// learns it came second.
#ifndef SLUICE_SERVER_RULES_STREAM_PHASE_H_
#define SLUICE_SERVER_RULES_STREAM_PHASE_H_

#include <atomic>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"

namespace sluice {

class StreamPhase {
 public:
  void Wait() { phase_.store(kWaiting); }
  /// The awaited event came: true if it came first (the stream goes on).
  bool Claim() { return Take(kBusy); }
  /// The deadline passed: true if it came first (the stream is ended).
  bool Expire() { return Take(kExpired); }

 private:
  enum : int { kBusy = 0, kWaiting = 1, kExpired = 2 };
  bool Take(int to) {
    int waiting = kWaiting;
    return phase_.compare_exchange_strong(waiting, to);
  }
  std::atomic<int> phase_{kBusy};
};

/// A timeout as its flag gives it, in seconds ("300", "2.5").
inline std::string Seconds(std::chrono::milliseconds d) {
  return absl::StrCat(std::chrono::duration<double>(d).count());
}

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_STREAM_PHASE_H_
