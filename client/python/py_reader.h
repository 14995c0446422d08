// The Python module's Reader (sluice.Reader wraps it): one partition's records, as Python
// objects, groups, column batches (numpy) or an Arrow stream; its batch buffers reused across
// readers.
#ifndef SLUICE_CLIENT_PYTHON_PY_READER_H_
#define SLUICE_CLIENT_PYTHON_PY_READER_H_

#include <pybind11/pybind11.h>

#include <memory>

#include "client/shuffle_client.h"

namespace sluice::py {

/// Registers the Reader class in the module.
void BindReader(pybind11::module_& m);
/// A Reader over `reader`: values as bytes when `raw`; pickled values unpickled when
/// `allow_pickle`.
pybind11::object NewReader(std::unique_ptr<ShuffleReader> reader, bool raw, bool allow_pickle);

}  // namespace sluice::py

#endif  // SLUICE_CLIENT_PYTHON_PY_READER_H_
