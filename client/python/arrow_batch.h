// An Arrow record batch (the C data interface, arrow_c.h) read into columns, apart from Python:
// every field the producer gives is checked before a byte is read (formats, counts, null
// pointers, lengths and offsets without overflow, and each buffer's claimed extent within this
// process's memory), so that a producer that breaks the specification gets a refusal saying what
// is wrong, never a crash or bytes from outside its buffers. The Python module's Writer
// (py_arrow.cc) raises the refusal; tests/fuzz/arrow_batch_fuzzer.cc fuzzes it.
#ifndef SLUICE_CLIENT_PYTHON_ARROW_BATCH_H_
#define SLUICE_CLIENT_PYTHON_ARROW_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "client/python/arrow_c.h"

namespace sluice::py {

/// One column of a batch, its values where the producer has them (or made here: bitmaps as one
/// byte per row).
struct ArrowColumn {
  enum class Kind : uint8_t { kInt, kUint, kFloat32, kFloat64, kBool, kStrOffsets, kBinOffsets };
  std::string name;
  Kind kind = Kind::kInt;
  size_t itemsize = 0;               ///< bytes per value (fixed-width kinds)
  const uint8_t* data = nullptr;     ///< values, or the bytes the offsets point into
  const uint8_t* nulls = nullptr;    ///< 1 = null, or nullptr: none
  const uint8_t* offsets = nullptr;  ///< kStrOffsets, kBinOffsets: n + 1 of them
  bool offsets64 = false;
  std::vector<uint8_t> owned_values, owned_nulls;  ///< what data and nulls point into, if made
};

/// Why a batch was not taken: a type it does not carry, a value that breaks the specification,
/// or a string that is not UTF-8.
struct ArrowRefusal {
  enum Kind { kType, kValue, kUnicode };
  Kind kind = kValue;
  std::string message;
};

/// Reads `batch` (a struct array) under `schema` into *columns and its row count into *rows;
/// false with *why when it cannot.
bool TakeArrowColumns(const ArrowSchema& schema, const ArrowArray& batch, size_t* rows,
                      std::vector<ArrowColumn>* columns, ArrowRefusal* why);

/// Whether the `n` bytes at `p` are UTF-8.
bool IsUtf8(const uint8_t* p, size_t n);

}  // namespace sluice::py

#endif  // SLUICE_CLIENT_PYTHON_ARROW_BATCH_H_
