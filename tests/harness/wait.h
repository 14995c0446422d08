// Waiting on conditions in tests: polls instead of sleeping a guessed time; a child stopped
// once it is.
#ifndef SLUICE_TESTS_HARNESS_WAIT_H_
#define SLUICE_TESTS_HARNESS_WAIT_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cerrno>
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

/// Stops child process `pid` (SIGSTOP) and returns once every one of its threads has stopped:
/// kill() returns before, and a thread still running meanwhile may answer a call a test means
/// to find unanswered. Returns at once if the child has exited; nothing is reaped (WNOWAIT),
/// so whoever waits for its end still does.
inline void StopProcess(pid_t pid) {
  if (::kill(pid, SIGSTOP) != 0) return;
  siginfo_t info;
  while (::waitid(P_PID, static_cast<id_t>(pid), &info, WSTOPPED | WEXITED | WNOWAIT) < 0 &&
         errno == EINTR) {
  }
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_WAIT_H_
