// Columns in and out of the Python client (docs/python.md, "Columns"): numpy arrays (and what
// pandas holds as numpy) become msgpack records, one map of the row's fields per record, and
// records come back as numpy arrays, one per field. The per-row work runs without the GIL and
// makes no Python object; only object columns (str, bytes, mixed) are touched with it.
//
// A row written by `write_columns` is exactly the record `write(row[key], row_as_dict)` makes:
// the same key bytes (so the same partition and order), the same value bytes for the same
// Python values. The frame encoder then stores such batches in the COLUMNAR layout.
//
// Reading infers each field's dtype from the values of the batch, never coercing: ints come
// back int64 (uint64 when one exceeds int64 and none is negative), floats float64 (float32 when
// all were written as such), bools bool, str and bytes as object arrays; nils make a mask; a
// field whose values mix types (or nest) comes back as an object array of Python values.
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

struct ArrowArray;

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

/// Whether n bytes at p are valid UTF-8 (what a msgpack str must hold).
bool IsUtf8(const uint8_t* p, size_t n);

/// Columns from Python: `cols` is a sequence of (name, 1-D C-contiguous ndarray, nulls) with
/// nulls None or a bool ndarray of the same length. Object columns are packed here (their
/// elements are Python objects already), by the dict path's encoder. Raises TypeError,
/// ValueError or OverflowError naming the column (and the row) on what it cannot take.
std::vector<ColumnIn> TakeColumns(pybind11::handle cols, size_t* rows);

/// Row i of `cols` as a record: `key` is the key column's value (a float32 key routes as the
/// float64 `write` would send), `value` the map of every column. No GIL needed.
class RowEncoder {
 public:
  RowEncoder(absl::Span<const ColumnIn> cols, size_t key_col);
  void Row(size_t i, std::string* key, std::string* value);

 private:
  absl::Span<const ColumnIn> cols_;
  size_t key_col_;
  std::string scratch_;
};

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

#endif  // SLUICE_CLIENT_PYTHON_PY_COLUMNS_H_
