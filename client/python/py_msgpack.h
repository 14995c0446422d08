// Python objects to msgpack and back, in C++ (the one place the Python client encodes items):
// no per-item msgpack.packb call in Python. Called with the GIL held.
//
// Encoding: None, bool, int (64-bit signed or unsigned; larger raise OverflowError), float,
// str (UTF-8), bytes/bytearray/memoryview (bin), dict (map), list and tuple (array). Anything
// else (set, frozenset, a custom class) raises TypeError naming its type: msgpack has no form
// for it, and encoding it as something else would hand the reducer a different object (the
// seed's frozenset bug). With `pickle_fallback`, such objects are pickled into a msgpack ext
// of type kPickleExt instead, and come back only for a reader that allows pickle.
//
// Decoding: the reverse; arrays come back as lists, or as tuples inside a map key or a group
// key (so that they can be hashed); str must be valid UTF-8.
#ifndef SLUICE_CLIENT_PYTHON_PY_MSGPACK_H_
#define SLUICE_CLIENT_PYTHON_PY_MSGPACK_H_

#include <pybind11/pybind11.h>

#include <string>
#include <string_view>

namespace sluice::py {

inline constexpr int8_t kPickleExt = 80;  // 'P'
inline constexpr int kMaxDepth = 512;

/// Raises a Python exception of `type` with `message` (throws pybind11::error_already_set).
[[noreturn]] void Raise(PyObject* type, const std::string& message);

/// Appends the msgpack encoding of `o` to `*out`. Raises (pybind11::error_already_set or a
/// Python exception) for what cannot be encoded; `*out` is then left partly written.
void Pack(pybind11::handle o, bool pickle_fallback, std::string* out);

/// The object `bytes` encodes (exactly one msgpack value). `as_key`: arrays become tuples.
/// ValueError for malformed or trailing bytes; pickled objects need `allow_pickle`.
pybind11::object Unpack(std::string_view bytes, bool allow_pickle, bool as_key = false);

}  // namespace sluice::py

#endif  // SLUICE_CLIENT_PYTHON_PY_MSGPACK_H_
