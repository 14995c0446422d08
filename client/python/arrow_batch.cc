#include "client/python/arrow_batch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/endian.h"

namespace sluice::py {
namespace {

bool Bit(const void* bitmap, int64_t i) {
  return (static_cast<const uint8_t*>(bitmap)[i / 8] >> (i % 8)) & 1;
}

// The Arrow C data interface carries no buffer sizes: a producer's lengths and offsets say how
// far each buffer reaches, and a lying one would have us read outside it. What a batch claims is
// bounded (kMaxBufferBytes a buffer, kMaxColumns), its arithmetic checked for overflow, and each
// buffer's claimed extent checked to lie in memory this process has mapped (mincore says ENOMEM
// where a page is not), so that a claim past the end of memory is an error, not a crash. (A
// buffer shorter than claimed but followed by other mapped memory cannot be told apart.)
constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 36;  // 64 GiB
constexpr int64_t kMaxColumns = 1 << 16;
// Rows in one batch (a null column is made a byte a row).
constexpr int64_t kMaxRows = (int64_t{1} << 31) - 1;

bool Mapped(const void* p, uint64_t bytes) {
  if (bytes == 0) return true;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t from = reinterpret_cast<uintptr_t>(p);
  uintptr_t end;
  if (__builtin_add_overflow(from, bytes, &end)) return false;
  unsigned char vec[4096];
  for (uintptr_t at = from & ~(page - 1); at < end;) {
    const uintptr_t window = std::min<uintptr_t>(end - at, page * sizeof(vec));
    if (::mincore(reinterpret_cast<void*>(at), window, vec) != 0 && errno == ENOMEM) return false;
    at += window;
  }
  return true;
}

// a * b + c, false on overflow of int64 (all non-negative).
bool MulAdd(int64_t a, int64_t b, int64_t c, int64_t* out) {
  int64_t m;
  return !__builtin_mul_overflow(a, b, &m) && !__builtin_add_overflow(m, c, out);
}

}  // namespace

bool IsUtf8(const uint8_t* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n && (LoadLE64(p + i) & 0x8080808080808080ULL) == 0) {
      i += 8;
      continue;
    }
    const uint8_t b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((b & 0xe0) == 0xc0) {
      len = 2;
      cp = b & 0x1f;
    } else if ((b & 0xf0) == 0xe0) {
      len = 3;
      cp = b & 0x0f;
    } else if ((b & 0xf8) == 0xf0) {
      len = 4;
      cp = b & 0x07;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) return false;
    i += len;
  }
  return true;
}

bool TakeArrowColumns(const ArrowSchema& schema, const ArrowArray& batch, size_t* rows,
                      std::vector<ArrowColumn>* columns, ArrowRefusal* why) {
  std::vector<ArrowColumn>& out = *columns;
  out.clear();
  const auto refuse = [why](ArrowRefusal::Kind kind, std::string message) {
    *why = ArrowRefusal{kind, std::move(message)};
    return false;
  };
  if (schema.format == nullptr || std::strcmp(schema.format, "+s") != 0) {
    return refuse(ArrowRefusal::kType,
                  absl::StrCat("an Arrow stream of record batches (struct arrays) is "
                               "taken, not one of format '",
                               schema.format ? schema.format : "", "'"));
  }
  if (schema.n_children < 0 || schema.n_children > kMaxColumns) {
    return refuse(ArrowRefusal::kValue, absl::StrCat("an Arrow schema of ", schema.n_children,
                                                     " columns: 0 to ", kMaxColumns, " are taken"));
  }
  if (batch.length > kMaxRows) {
    return refuse(ArrowRefusal::kValue, absl::StrCat("an Arrow batch of ", batch.length,
                                                     " rows: at most ", kMaxRows, " in one"));
  }
  if (batch.n_children != schema.n_children || batch.length < 0 || batch.offset < 0) {
    return refuse(ArrowRefusal::kValue, "an Arrow batch does not fit its schema");
  }
  if (batch.null_count != 0 && batch.n_buffers > 0 && batch.buffers != nullptr &&
      batch.buffers[0] != nullptr) {
    return refuse(ArrowRefusal::kType,
                  "an Arrow batch with null rows (not null values) has no rows to write");
  }
  const int64_t n = batch.length;
  *rows = static_cast<size_t>(n);
  for (int64_t j = 0; j < schema.n_children; ++j) {
    if (schema.children == nullptr || schema.children[j] == nullptr || batch.children == nullptr ||
        batch.children[j] == nullptr) {
      return refuse(ArrowRefusal::kValue, "an Arrow batch lacks a column its schema has");
    }
    const ArrowSchema& cs = *schema.children[j];
    const ArrowArray& ca = *batch.children[j];
    ArrowColumn c;
    c.name = cs.name != nullptr ? cs.name : "";
    const std::string format = cs.format != nullptr ? cs.format : "";
    const std::string col = "column '" + c.name + "'";
    if (cs.dictionary != nullptr || ca.dictionary != nullptr) {
      return refuse(ArrowRefusal::kType,
                    col + " is dictionary-encoded (categorical): decode it first");
    }
    int64_t off, end, rows;  // the column's rows [off, end) in its buffers; rows it must have
    if (ca.offset < 0 || ca.length < 0 || __builtin_add_overflow(batch.offset, ca.offset, &off) ||
        __builtin_add_overflow(off, n, &end) || __builtin_add_overflow(batch.offset, n, &rows) ||
        ca.length < rows) {
      return refuse(ArrowRefusal::kValue,
                    absl::StrCat(col, " (length ", ca.length, ", offset ", ca.offset,
                                 ") does not hold its batch's rows (length ", n, ", offset ",
                                 batch.offset, ")"));
    }
    // The lambdas below answer nullptr once they refused (`why` says why): then return false.
    bool refused = false;
    const auto refuse_column = [&](ArrowRefusal::Kind kind, std::string message) {
      refused = true;
      refuse(kind, std::move(message));
      return static_cast<const uint8_t*>(nullptr);
    };
    auto buffer = [&](int64_t k) -> const uint8_t* {
      if (ca.n_buffers <= k || ca.buffers == nullptr || ca.buffers[k] == nullptr) {
        return refuse_column(ArrowRefusal::kValue, col + " lacks a buffer its format needs");
      }
      return static_cast<const uint8_t*>(ca.buffers[k]);
    };
    // Buffer k, checked to reach `bytes` bytes (what the column's length and offset say).
    auto reaching = [&](int64_t k, int64_t bytes, bool overflowed) -> const uint8_t* {
      const uint8_t* b = buffer(k);
      if (b == nullptr) return nullptr;
      if (overflowed || bytes < 0 || static_cast<uint64_t>(bytes) > kMaxBufferBytes) {
        return refuse_column(ArrowRefusal::kValue,
                             absl::StrCat(col, ": its length and offset put buffer ", k, " past ",
                                          kMaxBufferBytes, " bytes"));
      }
      if (!Mapped(b, static_cast<uint64_t>(bytes))) {
        return refuse_column(
            ArrowRefusal::kValue,
            absl::StrCat(col, ": buffer ", k, " does not hold the ", bytes,
                         " bytes its length and offset say (it reaches past this process's "
                         "memory)"));
      }
      return b;
    };
    auto bits = [&](int64_t k) {  // a bitmap reaching row `end`
      return reaching(k, end / 8 + (end % 8 != 0 ? 1 : 0), false);
    };
    auto fixed = [&](ArrowColumn::Kind kind, size_t size) {
      c.kind = kind;
      c.itemsize = size;
      if (n == 0) return;
      int64_t bytes = 0;
      const bool overflowed = !MulAdd(end, static_cast<int64_t>(size), 0, &bytes);
      const uint8_t* values = reaching(1, bytes, overflowed);
      if (values != nullptr) c.data = values + off * size;
    };
    if (format == "n") {  // the null type: every value is null
      c.kind = ArrowColumn::Kind::kBool;
      c.itemsize = 1;
      c.owned_values.assign(n, 0);
      c.owned_nulls.assign(n, 1);
      c.data = c.owned_values.data();
      c.nulls = c.owned_nulls.data();
    } else {
      if (format == "c" || format == "s" || format == "i" || format == "l") {
        fixed(ArrowColumn::Kind::kInt, format == "c"   ? 1
                                       : format == "s" ? 2
                                       : format == "i" ? 4
                                                       : 8);
      } else if (format == "C" || format == "S" || format == "I" || format == "L") {
        fixed(ArrowColumn::Kind::kUint, format == "C"   ? 1
                                        : format == "S" ? 2
                                        : format == "I" ? 4
                                                        : 8);
      } else if (format == "f") {
        fixed(ArrowColumn::Kind::kFloat32, 4);
      } else if (format == "g") {
        fixed(ArrowColumn::Kind::kFloat64, 8);
      } else if (format == "b") {
        c.kind = ArrowColumn::Kind::kBool;
        c.itemsize = 1;
        c.owned_values.resize(n);
        const uint8_t* values = n == 0 ? nullptr : bits(1);
        if (refused) return false;
        for (int64_t i = 0; i < n; ++i) c.owned_values[i] = Bit(values, off + i);
        c.data = c.owned_values.data();
      } else if (format == "u" || format == "U" || format == "z" || format == "Z") {
        const bool str = format == "u" || format == "U";
        c.kind = str ? ArrowColumn::Kind::kStrOffsets : ArrowColumn::Kind::kBinOffsets;
        c.offsets64 = format == "U" || format == "Z";
        const size_t w = c.offsets64 ? 8 : 4;
        if (n > 0) {
          int64_t bytes = 0;
          const bool overflowed = !MulAdd(end, static_cast<int64_t>(w), static_cast<int64_t>(w),
                                          &bytes);  // offsets [0, end]
          const uint8_t* offsets = reaching(1, bytes, overflowed);
          if (offsets == nullptr) return false;
          c.offsets = offsets + off * w;
          auto at = [&](int64_t i) -> int64_t {
            return c.offsets64 ? static_cast<int64_t>(LoadLE64(c.offsets + 8 * i))
                               : static_cast<int32_t>(LoadLE32(c.offsets + 4 * i));
          };
          for (int64_t i = 0; i < n; ++i) {
            const int64_t from = at(i), to = at(i + 1);
            if (from < 0 || to < from || to - from > 0xffffffffLL) {
              return refuse(ArrowRefusal::kValue, absl::StrCat(col, ", row ", i, ": bad offsets"));
            }
          }
          // The values' bytes reach the last offset (the offsets only go up).
          c.data = reaching(2, at(n), false);
          if (c.data == nullptr) return false;
          for (int64_t i = 0; str && i < n; ++i) {
            const int64_t from = at(i), to = at(i + 1);
            if (!IsUtf8(c.data + from, static_cast<size_t>(to - from))) {
              return refuse(ArrowRefusal::kUnicode, absl::StrCat(col, ", row ", i, ": not UTF-8"));
            }
          }
        }
      } else {
        return refuse(
            ArrowRefusal::kType,
            absl::StrCat(col, " has Arrow format '", format,
                         "': columns carry ints, floats (32 or 64 bits), bools, utf8, binary "
                         "and nulls; cast it first"));
      }
      if (ca.null_count != 0 && n > 0 && ca.n_buffers > 0 && ca.buffers != nullptr &&
          ca.buffers[0] != nullptr) {
        const uint8_t* validity = bits(0);
        if (validity == nullptr) return false;
        c.owned_nulls.resize(n);
        for (int64_t i = 0; i < n; ++i) c.owned_nulls[i] = !Bit(validity, off + i);
        c.nulls = c.owned_nulls.data();
      }
    }
    if (refused) return false;
    for (const ArrowColumn& other : out) {
      if (other.name == c.name)
        return refuse(ArrowRefusal::kValue, "two columns are named '" + c.name + "'");
    }
    out.push_back(std::move(c));
  }
  return true;
}

}  // namespace sluice::py
