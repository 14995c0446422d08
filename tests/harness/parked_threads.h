// Whether threads of this process are parked: asleep, and staying asleep. A test that makes
// threads queue behind something it holds (a lock, a sync it has not let finish) waits on
// this instead of sleeping a guessed time before it lets them go.
//
// A thread counts as parked when it is asleep (state S) at two looks 20 ms apart and has not
// run in between (its voluntary and involuntary context switches unchanged). So, with every
// thread that could let it go parked too, it is parked for good: a thread seen asleep for a
// moment between two steps of its way (a contended mutex) does not count, and a thread
// preempted on its way is runnable (R), not asleep. Linux only (/proc/self/task); the looks
// allocate nothing, so the looking thread holds no allocator lock a watched thread may wait on.
//
// ThreadsParked(OtherThreads()) says an in-process server has done all it would do with what
// it was sent (every thread waits for something new): what it did not do by then, it will not
// do. (A thread in a timed sleep counts as parked: the server's data path has none.)
//
//   std::atomic<pid_t> tid{0};
//   std::thread t([&] { tid = ::gettid(); ... a call that must queue ... });
//   ASSERT_TRUE(Eventually([&] { return tid != 0 && ThreadsParked({tid}); }));
#ifndef SLUICE_TESTS_HARNESS_PARKED_THREADS_H_
#define SLUICE_TESTS_HARNESS_PARKED_THREADS_H_

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

namespace sluice::testing {

namespace internal {

struct ThreadLook {
  char state = '?';
  unsigned long switches = 0;  // voluntary + involuntary context switches
};

// /proc/self/task/<tid>/status, read into a stack buffer (no allocation).
inline bool LookAt(pid_t tid, ThreadLook* out) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/status", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* state = std::strstr(buf, "\nState:");
  const char* voluntary = std::strstr(buf, "\nvoluntary_ctxt_switches:");
  const char* involuntary = std::strstr(buf, "\nnonvoluntary_ctxt_switches:");
  if (state == nullptr || voluntary == nullptr || involuntary == nullptr) return false;
  state += std::strlen("\nState:");
  while (*state == ' ' || *state == '\t') ++state;
  out->state = *state;
  out->switches =
      std::strtoul(voluntary + std::strlen("\nvoluntary_ctxt_switches:"), nullptr, 10) +
      std::strtoul(involuntary + std::strlen("\nnonvoluntary_ctxt_switches:"), nullptr, 10);
  return true;
}

}  // namespace internal

/// Whether every thread of `tids` (this process's, as gettid() names them) is parked (see
/// above). Takes about 20 ms.
inline bool ThreadsParked(const std::vector<pid_t>& tids) {
  constexpr size_t kMax = 256;
  if (tids.size() > kMax) std::abort();
  internal::ThreadLook first[kMax];
  for (size_t i = 0; i < tids.size(); ++i) {
    if (!internal::LookAt(tids[i], &first[i]) || first[i].state != 'S') return false;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (size_t i = 0; i < tids.size(); ++i) {
    internal::ThreadLook then;
    if (!internal::LookAt(tids[i], &then) || then.state != 'S' ||
        then.switches != first[i].switches) {
      return false;
    }
  }
  return true;
}

/// Every thread of this process but the calling one (as gettid() names them).
inline std::vector<pid_t> OtherThreads() {
  std::vector<pid_t> out;
  const pid_t self = ::gettid();
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/task", ec), end; !ec && it != end;
       it.increment(ec)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(it->path().filename().c_str()));
    if (tid != self && tid != 0) out.push_back(tid);
  }
  return out;
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_PARKED_THREADS_H_
