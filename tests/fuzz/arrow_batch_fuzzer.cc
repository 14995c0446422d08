// libFuzzer target: Arrow C data interface batches built from the input, within the
// specification's structure (a struct schema of typed children, each child array with its
// buffers), with every field the reader checks drawn from the input: formats, child counts,
// NULL pointers, lengths and offsets (small, or from a table of hostile values), null counts,
// and the contents of offsets buffers (consistent, or negative, decreasing or past any buffer).
// Buffers are allocated to what the specification says a producer must give for small claims;
// hostile claims get tiny buffers, which the reader must refuse before it reads them. ASan and
// UBSan catch any read outside a buffer or any overflow (client/python/arrow_batch.h).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "client/python/arrow_batch.h"

namespace {

using sluice::py::ArrowColumn;
using sluice::py::ArrowRefusal;

// Each is refused by the reader's bounds alone (negative, overflowing, or past its row and byte
// caps once multiplied out), wherever the heap lies: a claim that stays within a mapped heap but
// past its buffer cannot be told from a true one (the interface carries no sizes), and is not a
// producer within the specification.
constexpr int64_t kHostile[] = {-1,
                                -(int64_t{1} << 40),
                                int64_t{1} << 40,
                                int64_t{1} << 62,
                                std::numeric_limits<int64_t>::max(),
                                std::numeric_limits<int64_t>::max() - 1,
                                std::numeric_limits<int64_t>::min()};
const char* const kFormats[] = {"c", "s", "i", "l", "C", "S", "I",    "L",  "f",  "g",
                                "b", "u", "U", "z", "Z", "n", "tsu:", "+s", "+l", ""};

// a + b, held at the ends of int64_t (hostile offsets and lengths are near them; the harness's
// own sums must not overflow).
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
  return r;
}

// What the batch's pieces point to, kept until the reader is done.
struct Arena {
  std::vector<std::unique_ptr<std::vector<uint8_t>>> blobs;
  std::deque<std::string> strings;  // (a deque: the c_str()s stay put as it grows)
  const uint8_t* Blob(size_t n, FuzzedDataProvider& in) {
    auto b = std::make_unique<std::vector<uint8_t>>(n);
    const std::vector<uint8_t> bytes = in.ConsumeBytes<uint8_t>(n);
    if (!bytes.empty()) std::memcpy(b->data(), bytes.data(), bytes.size());
    blobs.push_back(std::move(b));
    return blobs.back()->data();
  }
  uint8_t* Zeroed(size_t n) {
    blobs.push_back(std::make_unique<std::vector<uint8_t>>(n));
    return blobs.back()->data();
  }
};

// A length or offset: mostly small, now and then hostile (`hostile` set then).
int64_t Claim(FuzzedDataProvider& in, int64_t small_max, bool* hostile) {
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    *hostile = true;
    return kHostile[in.ConsumeIntegralInRange<size_t>(0, std::size(kHostile) - 1)];
  }
  return in.ConsumeIntegralInRange<int64_t>(0, small_max);
}

size_t Width(const std::string& f) {
  if (f == "c" || f == "C") return 1;
  if (f == "s" || f == "S") return 2;
  if (f == "i" || f == "I" || f == "f") return 4;
  return 8;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Arena arena;
  bool hostile = false;
  const int64_t length = Claim(in, 40, &hostile);
  const int64_t offset = Claim(in, 8, &hostile);
  const int ncols = in.ConsumeIntegralInRange<int>(0, 5);
  std::vector<ArrowSchema> kid_schemas(ncols);
  std::vector<ArrowArray> kid_arrays(ncols);
  std::vector<ArrowSchema*> schema_ptrs(ncols + 1);
  std::vector<ArrowArray*> array_ptrs(ncols + 1);
  std::vector<std::vector<const void*>> buffer_lists(ncols);
  for (int j = 0; j < ncols; ++j) {
    ArrowSchema& s = kid_schemas[j];
    ArrowArray& a = kid_arrays[j];
    s = ArrowSchema{};
    a = ArrowArray{};
    const std::string format =
        in.ConsumeBool() ? kFormats[in.ConsumeIntegralInRange<size_t>(0, 3)]
                         : kFormats[in.ConsumeIntegralInRange<size_t>(0, std::size(kFormats) - 1)];
    arena.strings.push_back(format);
    arena.strings.push_back(in.ConsumeRandomLengthString(8));
    s.format = in.ConsumeIntegralInRange<int>(0, 31) == 0
                   ? nullptr
                   : arena.strings[arena.strings.size() - 2].c_str();
    s.name = arena.strings.back().c_str();
    bool column_hostile = hostile;
    const int64_t col_offset = Claim(in, 4, &column_hostile);
    const int64_t extra = in.ConsumeIntegralInRange<int64_t>(0, 3);
    a.offset = col_offset;
    // Long enough for the batch's rows, or (refused) one short, or negative.
    a.length =
        in.ConsumeIntegralInRange<int>(0, 15) == 0
            ? -1
            : SaturatingAdd(SaturatingAdd(length, offset), extra - (in.ConsumeBool() ? 0 : 1));
    a.null_count = in.ConsumeIntegralInRange<int>(0, 2) == 0 ? 0 : in.ConsumeIntegralInRange(-1, 3);
    // The rows the reader may read: [0, end) of each buffer's units.
    const int64_t end = column_hostile ? 0 : offset + col_offset + length;
    const size_t bitmap_bytes = static_cast<size_t>((end + 7) / 8);
    std::vector<const void*>& bufs = buffer_lists[j];
    bufs.push_back(in.ConsumeBool() ? nullptr : arena.Blob(bitmap_bytes, in));  // validity
    if (format == "b") {
      bufs.push_back(arena.Blob(bitmap_bytes, in));
    } else if (format == "u" || format == "U" || format == "z" || format == "Z") {
      const bool wide = format == "U" || format == "Z";
      const size_t w = wide ? 8 : 4;
      uint8_t* offs = arena.Zeroed((static_cast<size_t>(end) + 1) * w);
      int64_t at = 0;
      const int corrupt = in.ConsumeIntegralInRange<int>(0, 7);  // 0..2: break one offset
      const int64_t bad_row = in.ConsumeIntegralInRange<int64_t>(0, end);
      for (int64_t i = 0; i <= end; ++i) {
        int64_t v = at;
        if (corrupt < 3 && i == bad_row) {
          v = corrupt == 0 ? -5 : corrupt == 1 ? at - 1 : (int64_t{1} << 40);
          if (!wide && corrupt == 2) v = std::numeric_limits<int32_t>::min();
        }
        if (wide) {
          std::memcpy(offs + 8 * i, &v, 8);
        } else {
          const int32_t v32 = static_cast<int32_t>(v);
          std::memcpy(offs + 4 * i, &v32, 4);
        }
        at += in.ConsumeIntegralInRange<int64_t>(0, 6);
      }
      bufs.push_back(offs);
      // The values' bytes reach the last offset (a corrupted one, negative, decreasing or past
      // the byte cap, is refused before they are read).
      bufs.push_back(arena.Blob(static_cast<size_t>(at), in));
    } else if (format != "n") {
      bufs.push_back(arena.Blob(static_cast<size_t>(end) * Width(format), in));
    }
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0 && !bufs.empty()) bufs.pop_back();
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0 && bufs.size() > 1) bufs[1] = nullptr;
    a.n_buffers = static_cast<int64_t>(bufs.size());
    a.buffers = bufs.empty() ? nullptr : bufs.data();
    schema_ptrs[j] = &s;
    array_ptrs[j] = &a;
    if (in.ConsumeIntegralInRange<int>(0, 31) == 0) schema_ptrs[j] = nullptr;
    if (in.ConsumeIntegralInRange<int>(0, 31) == 0) array_ptrs[j] = nullptr;
  }
  ArrowSchema schema{};
  schema.format = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? "l" : "+s";
  schema.n_children = ncols;
  schema.children = schema_ptrs.data();
  ArrowArray batch{};
  batch.length = length;
  batch.offset = offset;
  batch.n_children = ncols;
  batch.children = array_ptrs.data();
  batch.n_buffers = 1;
  const void* no_validity[1] = {nullptr};
  batch.buffers = no_validity;
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      schema.n_children = batch.n_children = kHostile[in.ConsumeIntegralInRange<size_t>(0, 1)];
      break;
    case 1:
      schema.children = nullptr;
      batch.children = nullptr;
      break;
    case 2:
      batch.n_children = ncols + 1;
      break;
    default:
      break;
  }
  size_t rows = 0;
  std::vector<ArrowColumn> columns;
  ArrowRefusal why;
  if (sluice::py::TakeArrowColumns(schema, batch, &rows, &columns, &why)) {
    // Taken: every value the writer would read is inside its buffer (ASan watches).
    for (const ArrowColumn& c : columns) {
      uint64_t sum = 0;
      for (size_t i = 0; i < rows; ++i) {
        if (c.nulls != nullptr) sum += c.nulls[i];
        if (c.kind == ArrowColumn::Kind::kStrOffsets || c.kind == ArrowColumn::Kind::kBinOffsets) {
          const int64_t to = c.offsets64 ? reinterpret_cast<const int64_t*>(c.offsets)[i + 1]
                                         : reinterpret_cast<const int32_t*>(c.offsets)[i + 1];
          if (to > 0) sum += c.data[to - 1];
        } else if (c.data != nullptr) {
          sum += c.data[i * c.itemsize + c.itemsize - 1];
        }
      }
      if (sum == 0xdeadbeef) std::abort();  // (keeps the reads)
    }
  } else if (why.message.empty()) {
    std::abort();  // a refusal always says why
  }
  return 0;
}
