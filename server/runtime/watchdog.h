// Watchdog: deadlines for things that must make progress (a push stream waiting for its next
// message, a fetch waiting for its reader to take a chunk). Arm() registers a deadline and what
// to do when it passes; Disarm() takes it back. One thread checks the deadlines a few times a
// second and runs the expired ones' callbacks, outside its lock.
//
// Disarm() and expiry race safely: Disarm() returns true if it took the entry back before it
// fired, and false if the callback ran or is running, in which case Disarm() first waits for
// it to return. So once Disarm() returns, the callback will not touch its owner again.
//
// Thread safety: every method may be called from any thread, but not from a callback.
#ifndef SLUICE_SERVER_RUNTIME_WATCHDOG_H_
#define SLUICE_SERVER_RUNTIME_WATCHDOG_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace sluice {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  /// Checks deadlines every `tick`.
  explicit Watchdog(std::chrono::milliseconds tick = std::chrono::milliseconds(100));
  ~Watchdog();  // stops; callbacks still armed never run
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Runs `on_expiry` (on the watchdog's thread) once `deadline` passes, unless disarmed first.
  /// Returns the id to disarm it with (never 0).
  uint64_t Arm(Clock::time_point deadline, std::function<void()> on_expiry);
  /// True if the entry was taken back before it fired; false if it fired (its callback has
  /// returned by now), was disarmed already, or `id` is 0.
  bool Disarm(uint64_t id);

  size_t armed() const;

 private:
  void Run();

  const std::chrono::milliseconds tick_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Entry {
    Clock::time_point deadline;
    std::function<void()> on_expiry;
  };
  std::map<uint64_t, Entry> entries_;
  uint64_t next_id_ = 1;
  uint64_t running_ = 0;  // the id whose callback is running, or 0
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RUNTIME_WATCHDOG_H_
