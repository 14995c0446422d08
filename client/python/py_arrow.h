// Arrow's C stream interface in and out of the Python client (docs/python.md, "Arrow"): any
// object with `__arrow_c_stream__` (pyarrow, Polars, DuckDB, nanoarrow...) can be written as
// columns, and a reader's columns can be read by any of them, through the plain C ABI of
// arrow_c.h: Sluice links no Arrow library.
#ifndef SLUICE_CLIENT_PYTHON_PY_ARROW_H_
#define SLUICE_CLIENT_PYTHON_PY_ARROW_H_

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/python/arrow_c.h"
#include "client/python/py_columns.h"

namespace sluice::py {

/// The columns of one record batch (a struct array and its struct schema) as the row encoder
/// reads them; they point into the batch, which must outlive them. Raises TypeError naming a
/// column whose Arrow type columns cannot carry (timestamps, dictionaries, lists...), and
/// ValueError for a batch that is not well formed (offsets, UTF-8).
std::vector<ColumnIn> TakeArrowBatch(const ArrowSchema& schema, const ArrowArray& batch,
                                     size_t* rows);

/// Releases an Arrow structure on scope exit, if it has not been released or moved.
template <typename T>
struct ArrowReleaser {
  T* owned;
  ~ArrowReleaser() {
    if (owned != nullptr && owned->release != nullptr) owned->release(owned);
  }
};

/// Where an exported stream's batches come from. Called with the GIL held; may raise.
class ArrowBatches {
 public:
  virtual ~ArrowBatches() = default;
  /// The schema of the batches: formats and names of the struct's children.
  virtual absl::Status Schema(std::vector<std::string>* formats,
                              std::vector<std::string>* names) = 0;
  /// The next batch into *out; out->release == nullptr at the end.
  virtual absl::Status Next(ArrowArray* out) = 0;
};

/// A PyCapsule named "arrow_array_stream" holding an ArrowArrayStream over `batches`. Its
/// callbacks take the GIL themselves, so a consumer may call them from any thread.
pybind11::capsule ExportStream(std::unique_ptr<ArrowBatches> batches);

}  // namespace sluice::py

#endif  // SLUICE_CLIENT_PYTHON_PY_ARROW_H_
