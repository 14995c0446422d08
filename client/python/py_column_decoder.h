// A reader's batches of records as columns (docs/python.md, "Columns"): each record's value, a
// map of fields, parsed into typed cells without the GIL, then given back as numpy arrays
// (ToPython, py_column_decoder.cc) or as an Arrow struct array (ToArrow, py_arrow.cc).
//
// A field's dtype is read from its values in the batch, never coerced: ints come back int64
// (uint64 when one exceeds int64 and none is negative), floats float64 (float32 when all were
// written as such), bools bool, str and bytes as object arrays; nils make a mask; a field whose
// values mix types (or nest) comes back as an object array of Python values.
#ifndef SLUICE_CLIENT_PYTHON_PY_COLUMN_DECODER_H_
#define SLUICE_CLIENT_PYTHON_PY_COLUMN_DECODER_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

struct ArrowArray;

namespace sluice::py {

/// Where a record lives in a reader's arena: its key, then its value.
struct RecordAt {
  size_t at, key_size, value_size;
};

/// Decodes batches of records into columns. Keeps its buffers from batch to batch.
class ColumnDecoder {
 public:
  ColumnDecoder();
  ~ColumnDecoder();
  ColumnDecoder(const ColumnDecoder&) = delete;
  ColumnDecoder& operator=(const ColumnDecoder&) = delete;

  /// Without the GIL: parses the batch's values (and its keys, as a column named `key_column`
  /// when that is not empty; and the runs of equal key bytes when `groups`). A value that is not
  /// a map with str field names, or whose fields differ from the first record's, is an error
  /// naming the record and the fields. `only`: the fields to give back (nullptr: all); the others
  /// are checked as fully but not kept; a name no record has is an error.
  absl::Status Decode(std::string_view arena, absl::Span<const RecordAt> records,
                      const std::string& key_column, bool groups,
                      const std::vector<std::string>* only = nullptr);

  /// Without the GIL: the batch as an Arrow struct array (ArrowArray; see arrow_c.h), one child
  /// per column. `formats` and `names` are the stream's schema: filled from this batch when
  /// empty, else this batch must fit them (an all-nil column fits any). A column that mixes
  /// types or nests values has no Arrow type: an error naming it.
  absl::Status ToArrow(std::string_view arena, std::vector<std::string>* formats,
                       std::vector<std::string>* names, struct ArrowArray* out);

  /// Memory kept for the next batch.
  size_t retained_bytes() const;

  /// With the GIL: (columns, rows, group_starts, group_keys) where columns is a list of (name,
  /// ndarray, mask) with mask None or a bool ndarray (True = null); group_starts an int64
  /// ndarray of each run's first row (None without `groups`), group_keys the runs' keys.
  pybind11::tuple ToPython(std::string_view arena, absl::Span<const RecordAt> records,
                           bool allow_pickle);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace sluice::py

#endif  // SLUICE_CLIENT_PYTHON_PY_COLUMN_DECODER_H_
