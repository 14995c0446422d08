#include "client/python/py_call.h"

#include <string>

#include "rpc/error_reason.h"

namespace sluice::py {
namespace {

namespace pb = pybind11;

PyObject* g_error = nullptr;  // sluice._sluice.Error

}  // namespace

void SetErrorType(PyObject* error) { g_error = error; }

[[noreturn]] void Throw(const absl::Status& st) {
  pb::object err = pb::reinterpret_borrow<pb::object>(g_error)(std::string(st.message()));
  err.attr("code") = absl::StatusCodeToString(st.code());
  err.attr("message") = std::string(st.message());
  // What an engine decides on (docs/api.md, "Errors and retries").
  err.attr("retryable") = Retryable(st);
  const ErrorReason reason = ReasonOf(st);
  err.attr("reason") = reason == ErrorReason::kNone ? pb::object(pb::none())
                                                    : pb::object(pb::str(ReasonName(reason)));
  const auto after = RetryAfterOf(st);
  err.attr("retry_after") =
      after.count() > 0 ? pb::object(pb::float_(after.count() / 1000.0)) : pb::none();
  PyErr_SetObject(g_error, err.ptr());
  throw pb::error_already_set();
}

std::unique_lock<std::mutex> LockWithoutGil(std::mutex& mu) {
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  if (!lock.try_lock()) {
    pb::gil_scoped_release release;
    lock.lock();
  }
  return lock;
}

std::chrono::milliseconds Millis(double seconds) {
  if (!(seconds > 0) || seconds > 86400.0 * 365) {
    PyErr_SetString(PyExc_ValueError, "a timeout must be more than 0 and at most a year");
    throw pb::error_already_set();
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace sluice::py
