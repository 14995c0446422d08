// The cells a ColumnDecoder parses a batch into, shared by its two outputs: numpy arrays
// (py_column_decoder.cc) and Arrow arrays (py_arrow.cc). Internal to client/python/.
#ifndef SLUICE_CLIENT_PYTHON_PY_COLUMN_CELLS_H_
#define SLUICE_CLIENT_PYTHON_PY_COLUMN_CELLS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/python/py_column_decoder.h"

namespace sluice::py {

enum CellType : uint8_t { kNil, kBool, kInt, kUint, kF32, kF64, kStr, kBin, kOther };

// One value of one record: its type, its scalar, and where its msgpack lies in the arena.
struct Cell {
  uint64_t at;   // the msgpack value's first byte in the arena
  uint64_t len;  // its bytes
  union {
    int64_t i;
    uint64_t u;
    double d;
    float f;
    bool b;
  } v;
  uint8_t type;
  uint8_t header;  // kStr/kBin: the header's bytes before the body
};

// Parses one msgpack value at p (any valid encoding, canonical or not). nullptr: malformed.

// The one type a column's values take, from the cell types seen: exact only (ints with uint64s
// only when none is negative; float32 with float64 as float64); kObject otherwise.
enum class Resolved { kBool, kInt64, kUint64, kFloat32, kFloat64, kStr, kBin, kNil, kObject };

inline Resolved Resolve(uint32_t seen, bool negative) {
  const uint32_t nonnil = seen & ~(1u << kNil);
  if (nonnil == 0) return Resolved::kNil;
  if (nonnil == (1u << kBool)) return Resolved::kBool;
  if (nonnil == (1u << kInt)) return Resolved::kInt64;
  if (nonnil == (1u << kUint) || (nonnil == (1u << kUint) + (1u << kInt) && !negative)) {
    return Resolved::kUint64;
  }
  if (nonnil == (1u << kF32)) return Resolved::kFloat32;
  if (nonnil == (1u << kF64) || nonnil == (1u << kF64) + (1u << kF32)) return Resolved::kFloat64;
  if (nonnil == (1u << kStr)) return Resolved::kStr;
  if (nonnil == (1u << kBin)) return Resolved::kBin;
  return Resolved::kObject;
}

struct ColumnDecoder::State {
  struct Column {
    std::string name;
    std::vector<Cell> cells;
    uint32_t seen = 0;  // bit per CellType
    bool negative = false;
    uint64_t stamp = 0;  // the last record that filled it (+1)
    bool wanted = true;  // asked for: its cells are kept (others are only checked)
  };
  std::vector<Column> cols;
  std::vector<size_t> out;  // the columns given back, in order: wanted fields, then the keys
  size_t fields = 0;        // cols[0, fields) are the values' fields; one more holds the keys
  bool keys = false;
  bool groups = false;
  std::vector<int64_t> group_starts;
  size_t rows = 0;
};

}  // namespace sluice::py

#endif  // SLUICE_CLIENT_PYTHON_PY_COLUMN_CELLS_H_
