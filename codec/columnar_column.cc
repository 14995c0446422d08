// Plain-range detection and the msgpack header bytes' column types (columnar_column.h).
#include "codec/columnar_column.h"

#include <cmath>

namespace sluice::columnar_internal {
namespace {

// n * log2(n) for n in [0, kPlainSample].
struct NLog2NTable {
  float v[kPlainSample + 1];
  NLog2NTable() {
    v[0] = 0;
    for (size_t i = 1; i <= kPlainSample; ++i) {
      v[i] = static_cast<float>(static_cast<double>(i) * std::log2(static_cast<double>(i)));
    }
  }
};

}  // namespace

bool LooksPlain(const uint8_t* p, size_t n) {
  if (n < kMinPlainSpan) return false;
  static const NLog2NTable kTable;
  uint16_t hist[256] = {};
  // Up to kPlainSample bytes: all of a short range, else kPlainBlocks runs of contiguous bytes
  // spread over it. Contiguous runs see every byte position of short values (a fixed stride
  // would see one position of values whose size it divides), and spreading them sees the
  // range's start, middle and end.
  size_t m = 0;
  if (n <= kPlainSample) {
    for (size_t i = 0; i < n; ++i) ++hist[p[i]];
    m = n;
  } else {
    constexpr size_t kRun = kPlainSample / kPlainBlocks;
    for (size_t k = 0; k < kPlainBlocks; ++k) {
      const uint8_t* q = p + (n - kRun) * k / (kPlainBlocks - 1);
      for (size_t i = 0; i < kRun; ++i) ++hist[q[i]];
    }
    m = kPlainSample;
  }
  // Plug-in entropy with the Miller-Madow correction for the small sample:
  // H = log2(m) - sum(c log2 c) / m + (K - 1) / (2 m ln 2).
  float sum = 0;
  int used = 0;
  for (int c = 0; c < 256; ++c) {
    sum += kTable.v[hist[c]];
    used += hist[c] != 0;
  }
  const double md = static_cast<double>(m);
  const double h = std::log2(md) - sum / md + (used - 1) / (2 * md * 0.6931471805599453);
  return h >= kPlainBits;
}

bool ClassifyScalar(uint8_t b, ColumnType* t) {
  if (b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3)) {
    *t = ColumnType::kInt;
  } else if ((b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb)) {
    *t = ColumnType::kStr;
  } else if (b >= 0xc4 && b <= 0xc6) {
    *t = ColumnType::kBin;
  } else if (b == 0xc0) {
    *t = ColumnType::kNil;
  } else if (b == 0xc2 || b == 0xc3) {
    *t = ColumnType::kBool;
  } else if (b == 0xca) {
    *t = ColumnType::kFloat32;
  } else if (b == 0xcb) {
    *t = ColumnType::kFloat64;
  } else {
    return false;
  }
  return true;
}

const char* DescribeByte(uint8_t b) {
  if ((b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf)) return "a nested map or array";
  if ((b >= 0xc7 && b <= 0xc9) || (b >= 0xd4 && b <= 0xd8)) return "an ext value";
  if (b == 0xc1) return "the reserved byte 0xc1";
  return "an unsupported value";
}

}  // namespace sluice::columnar_internal
