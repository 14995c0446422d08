// Columns into the Python client's writer (docs/python.md, "Columns"): numpy arrays (and what
// pandas and Arrow hold as such) become msgpack records, one map of the row's fields per record.
// The per-row work runs without the GIL and makes no Python object; only object columns (str,
// bytes, mixed) are touched with it. Reading them back: py_column_decoder.h.
//
// A row written by `write_columns` is exactly the record `write(row[key], row_as_dict)` makes:
// the same key bytes (so the same partition and order), the same value bytes for the same
// Python values. The frame encoder then stores such batches in the COLUMNAR layout.
#ifndef SLUICE_CLIENT_PYTHON_PY_COLUMNS_H_
#define SLUICE_CLIENT_PYTHON_PY_COLUMNS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace sluice::py {

/// One column as the row encoder reads it. Built with the GIL (TakeColumns); read without it;
/// destroyed with it (it holds references to an object column's elements).
struct ColumnIn {
  enum class Kind : uint8_t {
    kInt,
    kUint,
    kFloat32,
    kFloat64,
    kBool,
    kUcs4,
    kFixedBytes,
    kObject,
    kStrOffsets,  // Arrow utf8 / large_utf8: offsets into data
    kBinOffsets,  // Arrow binary / large_binary
  };
  ColumnIn() = default;
  ColumnIn(ColumnIn&&) = default;
  ColumnIn& operator=(ColumnIn&&) = default;
  ~ColumnIn();
  std::string name;
  std::string packed_name;  // the name's msgpack str
  Kind kind = Kind::kObject;
  const uint8_t* data = nullptr;   // numpy's buffer (kept alive by the caller's objects)
  size_t itemsize = 0;             // bytes per element
  const uint8_t* nulls = nullptr;  // 1 = null (msgpack nil), or nullptr: none
  // kObject: element i is a str or bytes seen in place (the bytes of an object `refs` holds),
  // nil, or msgpack the dict path's encoder packed into `packed` (other types).
  struct Object {
    enum Type : uint8_t { kStr, kBin, kNil, kPacked } type;
    const char* data;  // kPacked: nullptr, and `at` is the offset in `packed`
    uint64_t at, size;
  };
  std::vector<Object> objects;
  std::string packed;
  std::vector<PyObject*> refs;
  // kStrOffsets, kBinOffsets: element i is data[offsets[i], offsets[i + 1]).
  const uint8_t* offsets = nullptr;
  bool offsets64 = false;
  // Bytes made for the column (an Arrow bitmap as one byte per element): data or nulls point in.
  std::vector<uint8_t> owned_values, owned_nulls;
};

/// A column name's msgpack str (the map key of each row's value).
std::string PackedName(const std::string& name);

/// Columns from Python: `cols` is a sequence of (name, 1-D C-contiguous ndarray, nulls) with
/// nulls None or a bool ndarray of the same length. Object columns are packed here (their
/// elements are Python objects already), by the dict path's encoder. Raises TypeError,
/// ValueError or OverflowError naming the column (and the row) on what it cannot take.
std::vector<ColumnIn> TakeColumns(pybind11::handle cols, size_t* rows);

/// Row i of `cols` as a record, appended to `out`: first its value, the map of every column,
/// then its key, the key column's value (a float32 key routes as the float64 `write` would
/// send). Returns the value's size. No GIL needed.
class RowEncoder {
 public:
  RowEncoder(absl::Span<const ColumnIn> cols, size_t key_col);
  size_t AppendRow(size_t i, std::string* out);

 private:
  absl::Span<const ColumnIn> cols_;
  size_t key_col_;
  std::string scratch_;
};

}  // namespace sluice::py

#endif  // SLUICE_CLIENT_PYTHON_PY_COLUMNS_H_
