// How the Python module calls into the C++ client: an error is raised as sluice.Error (with
// `code`, `message`, `retryable`, `reason`, `retry_after`), a client call that may block runs
// with the GIL let go, and a lock is taken without holding the GIL while it waits.
#ifndef SLUICE_CLIENT_PYTHON_PY_CALL_H_
#define SLUICE_CLIENT_PYTHON_PY_CALL_H_

#include <pybind11/pybind11.h>

#include <chrono>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::py {

/// sluice._sluice.Error, made by the module's init.
void SetErrorType(PyObject* error);
/// Raises `st` as sluice.Error.
[[noreturn]] void Throw(const absl::Status& st);

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) Throw(v.status());
  return std::move(v).value();
}
inline void Check(const absl::Status& st) {
  if (!st.ok()) Throw(st);
}

/// Takes `mu` with the GIL let go while it waits: a thread holding the GIL must never wait for
/// a lock whose holder needs the GIL back (writers and readers let it go around their calls).
std::unique_lock<std::mutex> LockWithoutGil(std::mutex& mu);

/// Runs a client call (which may block on the network) with the GIL let go; other Python
/// threads run meanwhile. What it returns is checked once the GIL is back.
template <typename F>
auto CallWithoutGil(F&& call) -> decltype(call()) {
  pybind11::gil_scoped_release release;
  return call();
}

using Clock = std::chrono::steady_clock;
inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
/// A timeout given in seconds; ValueError unless more than 0 and at most a year.
std::chrono::milliseconds Millis(double seconds);

}  // namespace sluice::py

#endif  // SLUICE_CLIENT_PYTHON_PY_CALL_H_
