// The Python module's Writer (sluice.Writer wraps it): one mapper attempt's records, from
// Python objects (msgpack in C++), columns (numpy, pandas) or an Arrow stream.
#ifndef SLUICE_CLIENT_PYTHON_PY_WRITER_H_
#define SLUICE_CLIENT_PYTHON_PY_WRITER_H_

#include <pybind11/pybind11.h>

#include <memory>

#include "client/shuffle_client.h"

namespace sluice::py {

/// Registers the Writer class in the module.
void BindWriter(pybind11::module_& m);
/// A Writer over `writer` (objects that msgpack cannot encode are pickled when
/// `pickle_fallback`).
pybind11::object NewWriter(std::unique_ptr<ShuffleWriter> writer, bool pickle_fallback);

}  // namespace sluice::py

#endif  // SLUICE_CLIENT_PYTHON_PY_WRITER_H_
