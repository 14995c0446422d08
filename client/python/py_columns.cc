#include "client/python/py_columns.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/python/arrow_c.h"
#include "client/python/py_msgpack.h"
#include "codec/endian.h"
#include "codec/msgpack_scan.h"

namespace sluice::py {

namespace pb = pybind11;

namespace {

std::string Quoted(const std::string& name) { return "'" + name + "'"; }

// --- writing ------------------------------------------------------------------------------

void AppendStrHeader(size_t n, std::string* out) {
  uint8_t h[5];
  size_t len;
  if (n < 32) {
    h[0] = static_cast<uint8_t>(0xa0 | n);
    len = 1;
  } else if (n < 256) {
    h[0] = 0xd9;
    h[1] = static_cast<uint8_t>(n);
    len = 2;
  } else if (n < 65536) {
    h[0] = 0xda;
    StoreBE16(h + 1, static_cast<uint16_t>(n));
    len = 3;
  } else {
    h[0] = 0xdb;
    StoreBE32(h + 1, static_cast<uint32_t>(n));
    len = 5;
  }
  out->append(reinterpret_cast<const char*>(h), len);
}

void AppendBinHeader(size_t n, std::string* out) {
  uint8_t h[5];
  size_t len;
  if (n < 256) {
    h[0] = 0xc4;
    h[1] = static_cast<uint8_t>(n);
    len = 2;
  } else if (n < 65536) {
    h[0] = 0xc5;
    StoreBE16(h + 1, static_cast<uint16_t>(n));
    len = 3;
  } else {
    h[0] = 0xc6;
    StoreBE32(h + 1, static_cast<uint32_t>(n));
    len = 5;
  }
  out->append(reinterpret_cast<const char*>(h), len);
}

void AppendMapHeader(size_t n, std::string* out) {
  uint8_t h[5];
  size_t len;
  if (n < 16) {
    h[0] = static_cast<uint8_t>(0x80 | n);
    len = 1;
  } else if (n < 65536) {
    h[0] = 0xde;
    StoreBE16(h + 1, static_cast<uint16_t>(n));
    len = 3;
  } else {
    h[0] = 0xdf;
    StoreBE32(h + 1, static_cast<uint32_t>(n));
    len = 5;
  }
  out->append(reinterpret_cast<const char*>(h), len);
}

void AppendInt(int64_t v, std::string* out) {
  uint8_t b[9];
  const uint8_t* e = mp::WriteInt(b, v);
  out->append(reinterpret_cast<const char*>(b), e - b);
}

void AppendUint(uint64_t v, std::string* out) {
  if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    AppendInt(static_cast<int64_t>(v), out);
    return;
  }
  uint8_t b[9];
  b[0] = 0xcf;
  StoreBE64(b + 1, v);
  out->append(reinterpret_cast<const char*>(b), 9);
}

void AppendFloat64(double d, std::string* out) {
  uint8_t b[9];
  b[0] = 0xcb;
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  StoreBE64(b + 1, bits);
  out->append(reinterpret_cast<const char*>(b), 9);
}

void AppendFloat32(float f, std::string* out) {
  uint8_t b[5];
  b[0] = 0xca;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  StoreBE32(b + 1, bits);
  out->append(reinterpret_cast<const char*>(b), 5);
}

int64_t LoadInt(const uint8_t* p, size_t size) {
  switch (size) {
    case 1:
      return static_cast<int8_t>(*p);
    case 2: {
      int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

uint64_t LoadUint(const uint8_t* p, size_t size) {
  switch (size) {
    case 1:
      return *p;
    case 2:
      return LoadLE16(p);
    case 4:
      return LoadLE32(p);
    default:
      return LoadLE64(p);
  }
}

// A numpy str element (UCS-4, NUL-padded: numpy drops trailing NULs) as UTF-8. Code points were
// checked by TakeColumns.
void Ucs4ToUtf8(const uint8_t* p, size_t chars, std::string* out) {
  out->clear();
  while (chars > 0 && LoadLE32(p + 4 * (chars - 1)) == 0) --chars;
  for (size_t c = 0; c < chars; ++c) {
    const uint32_t cp = LoadLE32(p + 4 * c);
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
}

// An object column: str and bytes elements are read in place later, without the GIL (their
// objects held meanwhile, so that no other thread can free them); other elements are packed now
// by the dict path's encoder (the one place Python objects become msgpack), naming the column
// and row in any error.
void TakeObjects(const pb::array& a, ColumnIn* c) {
  const size_t n = a.shape(0);
  auto* const* objs = reinterpret_cast<PyObject* const*>(a.data());
  c->objects.resize(n);
  c->refs.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    PyObject* o = objs[i];
    ColumnIn::Object& x = c->objects[i];
    x.data = nullptr;
    x.at = x.size = 0;
    if ((c->nulls != nullptr && c->nulls[i] != 0) || o == nullptr || o == Py_None) {
      x.type = ColumnIn::Object::kNil;
    } else if (PyUnicode_CheckExact(o)) {
      Py_ssize_t size = 0;
      x.data = PyUnicode_AsUTF8AndSize(o, &size);
      if (x.data == nullptr) {
        pb::error_already_set e;
        Raise(PyExc_UnicodeError, absl::StrCat("column ", Quoted(c->name), ", row ", i, ": ",
                                               pb::str(e.value()).cast<std::string>()));
      }
      x.type = ColumnIn::Object::kStr;
      x.size = static_cast<uint64_t>(size);
      Py_INCREF(o);
      c->refs.push_back(o);
    } else if (PyBytes_CheckExact(o)) {
      x.type = ColumnIn::Object::kBin;
      x.data = PyBytes_AS_STRING(o);
      x.size = static_cast<uint64_t>(PyBytes_GET_SIZE(o));
      Py_INCREF(o);
      c->refs.push_back(o);
    } else {
      x.type = ColumnIn::Object::kPacked;
      x.at = c->packed.size();
      try {
        Pack(o, /*pickle_fallback=*/false, &c->packed);
      } catch (pb::error_already_set& e) {
        const std::string what = pb::str(e.value()).cast<std::string>();
        Raise(e.type().ptr(), absl::StrCat("column ", Quoted(c->name), ", row ", i, ": ", what));
      }
      x.size = c->packed.size() - x.at;
    }
    if (x.size > 0xffffffffu) {
      Raise(PyExc_ValueError, absl::StrCat("column ", Quoted(c->name), ", row ", i,
                                           ": longer than msgpack's 4 GiB - 1 limit"));
    }
  }
}

}  // namespace

std::string PackedName(const std::string& name) {
  std::string out;
  AppendStrHeader(name.size(), &out);
  return out + name;
}

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

ColumnIn::~ColumnIn() {
  for (PyObject* o : refs) Py_DECREF(o);
}

std::vector<ColumnIn> TakeColumns(pb::handle cols, size_t* rows) {
  std::vector<ColumnIn> out;
  *rows = 0;
  for (pb::handle item : cols) {
    pb::tuple t = pb::reinterpret_borrow<pb::tuple>(item);
    ColumnIn c;
    c.name = t[0].cast<std::string>();
    for (const ColumnIn& other : out) {
      if (other.name == c.name) Raise(PyExc_ValueError, "two columns are named " + Quoted(c.name));
    }
    if (!pb::isinstance<pb::array>(t[1])) {
      Raise(PyExc_TypeError, "column " + Quoted(c.name) + " is not a numpy array");
    }
    pb::array a = pb::reinterpret_borrow<pb::array>(t[1]);
    if (a.ndim() != 1) {
      Raise(PyExc_ValueError, absl::StrCat("column ", Quoted(c.name), " has ", a.ndim(),
                                           " dimensions; a column has one"));
    }
    const size_t n = a.shape(0);
    if (out.empty()) {
      *rows = n;
    } else if (n != *rows) {
      Raise(PyExc_ValueError, absl::StrCat("column ", Quoted(c.name), " has ", n, " rows, column ",
                                           Quoted(out[0].name), " has ", *rows));
    }
    if (n > 1 && a.strides(0) != a.itemsize()) {
      Raise(PyExc_ValueError, "column " + Quoted(c.name) + " is not contiguous");
    }
    if (!t[2].is_none()) {
      pb::array nulls = pb::reinterpret_borrow<pb::array>(t[2]);
      if (nulls.ndim() != 1 || static_cast<size_t>(nulls.shape(0)) != n ||
          nulls.dtype().kind() != 'b' || (n > 1 && nulls.strides(0) != 1)) {
        Raise(PyExc_ValueError, "column " + Quoted(c.name) + ": its null mask does not fit it");
      }
      c.nulls = static_cast<const uint8_t*>(nulls.data());
    }
    c.data = static_cast<const uint8_t*>(a.data());
    c.itemsize = a.itemsize();
    const char kind = a.dtype().kind();
    const size_t size = c.itemsize;
    const bool int_size = size == 1 || size == 2 || size == 4 || size == 8;
    if (kind == 'i' && int_size) {
      c.kind = ColumnIn::Kind::kInt;
    } else if (kind == 'u' && int_size) {
      c.kind = ColumnIn::Kind::kUint;
    } else if (kind == 'f' && size == 4) {
      c.kind = ColumnIn::Kind::kFloat32;
    } else if (kind == 'f' && size == 8) {
      c.kind = ColumnIn::Kind::kFloat64;
    } else if (kind == 'b') {
      c.kind = ColumnIn::Kind::kBool;
    } else if (kind == 'U') {
      c.kind = ColumnIn::Kind::kUcs4;
      for (size_t i = 0; i < n * size / 4; ++i) {
        const uint32_t cp = LoadLE32(c.data + 4 * i);
        if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) {
          Raise(PyExc_UnicodeError,
                absl::StrCat("column ", Quoted(c.name), ", row ", i / (size / 4), ": code point ",
                             cp, " cannot be encoded as UTF-8"));
        }
      }
    } else if (kind == 'S') {
      c.kind = ColumnIn::Kind::kFixedBytes;
    } else if (kind == 'O') {
      c.kind = ColumnIn::Kind::kObject;
      TakeObjects(a, &c);
    } else {
      Raise(PyExc_TypeError,
            absl::StrCat("column ", Quoted(c.name), " has dtype ",
                         pb::str(a.dtype()).cast<std::string>(),
                         ": columns carry ints, floats (32 or 64 bits), bools, str, bytes and "
                         "nulls; convert it first"));
    }
    c.packed_name = PackedName(c.name);
    out.push_back(std::move(c));
  }
  return out;
}

RowEncoder::RowEncoder(absl::Span<const ColumnIn> cols, size_t key_col)
    : cols_(cols), key_col_(key_col) {}

void RowEncoder::Row(size_t i, std::string* key, std::string* value) {
  value->clear();
  AppendMapHeader(cols_.size(), value);
  size_t key_at = 0, key_end = 0;
  for (size_t j = 0; j < cols_.size(); ++j) {
    const ColumnIn& c = cols_[j];
    value->append(c.packed_name);
    const size_t at = value->size();
    const uint8_t* p = c.data + i * c.itemsize;
    if (c.nulls != nullptr && c.nulls[i] != 0) {
      value->push_back(static_cast<char>(0xc0));
    } else {
      switch (c.kind) {
        case ColumnIn::Kind::kInt:
          AppendInt(LoadInt(p, c.itemsize), value);
          break;
        case ColumnIn::Kind::kUint:
          AppendUint(LoadUint(p, c.itemsize), value);
          break;
        case ColumnIn::Kind::kFloat32: {
          float f;
          std::memcpy(&f, p, 4);
          AppendFloat32(f, value);
          break;
        }
        case ColumnIn::Kind::kFloat64: {
          double d;
          std::memcpy(&d, p, 8);
          AppendFloat64(d, value);
          break;
        }
        case ColumnIn::Kind::kBool:
          value->push_back(static_cast<char>(*p != 0 ? 0xc3 : 0xc2));
          break;
        case ColumnIn::Kind::kUcs4:
          Ucs4ToUtf8(p, c.itemsize / 4, &scratch_);
          AppendStrHeader(scratch_.size(), value);
          value->append(scratch_);
          break;
        case ColumnIn::Kind::kFixedBytes: {
          size_t len = c.itemsize;
          while (len > 0 && p[len - 1] == 0) --len;
          AppendBinHeader(len, value);
          value->append(reinterpret_cast<const char*>(p), len);
          break;
        }
        case ColumnIn::Kind::kStrOffsets:
        case ColumnIn::Kind::kBinOffsets: {
          const uint64_t from =
              c.offsets64 ? LoadLE64(c.offsets + 8 * i) : LoadLE32(c.offsets + 4 * i);
          const uint64_t to =
              c.offsets64 ? LoadLE64(c.offsets + 8 * (i + 1)) : LoadLE32(c.offsets + 4 * (i + 1));
          if (c.kind == ColumnIn::Kind::kStrOffsets) {
            AppendStrHeader(to - from, value);
          } else {
            AppendBinHeader(to - from, value);
          }
          value->append(reinterpret_cast<const char*>(c.data) + from, to - from);
          break;
        }
        case ColumnIn::Kind::kObject: {
          const ColumnIn::Object& x = c.objects[i];
          switch (x.type) {
            case ColumnIn::Object::kStr:
              AppendStrHeader(x.size, value);
              value->append(x.data, x.size);
              break;
            case ColumnIn::Object::kBin:
              AppendBinHeader(x.size, value);
              value->append(x.data, x.size);
              break;
            case ColumnIn::Object::kNil:
              value->push_back(static_cast<char>(0xc0));
              break;
            case ColumnIn::Object::kPacked:
              value->append(c.packed, x.at, x.size);
              break;
          }
          break;
        }
      }
    }
    if (j == key_col_) {
      key_at = at;
      key_end = value->size();
    }
  }
  const ColumnIn& k = cols_[key_col_];
  if (k.kind == ColumnIn::Kind::kFloat32 && !(k.nulls != nullptr && k.nulls[i] != 0)) {
    // `write` sends a Python float, always a float64: a float32 key routes as that one would.
    float f;
    std::memcpy(&f, k.data + i * 4, 4);
    key->clear();
    AppendFloat64(f, key);
  } else {
    key->assign(*value, key_at, key_end - key_at);
  }
}

// --- reading ------------------------------------------------------------------------------

namespace {

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
const uint8_t* ParseCell(const uint8_t* base, const uint8_t* p, const uint8_t* end, Cell* c) {
  if (p >= end) return nullptr;
  c->at = p - base;
  c->header = 0;
  const uint8_t b = *p;
  const size_t avail = end - p;
  auto fixed = [&](uint8_t type, size_t size) -> const uint8_t* {
    if (avail < size) return nullptr;
    c->type = type;
    c->len = size;
    return p + size;
  };
  auto body = [&](uint8_t type, size_t header, size_t n) -> const uint8_t* {
    if (avail < header || avail - header < n) return nullptr;
    c->type = type;
    c->header = static_cast<uint8_t>(header);
    c->len = header + n;
    return p + header + n;
  };
  if (b < 0x80) {
    c->v.i = b;
    return fixed(kInt, 1);
  }
  if (b >= 0xe0) {
    c->v.i = static_cast<int8_t>(b);
    return fixed(kInt, 1);
  }
  if (b >= 0xa0 && b <= 0xbf) return body(kStr, 1, b & 0x1f);
  switch (b) {
    case 0xc0:
      return fixed(kNil, 1);
    case 0xc2:
    case 0xc3:
      c->v.b = b == 0xc3;
      return fixed(kBool, 1);
    case 0xcc:
      if (avail < 2) return nullptr;
      c->v.i = p[1];
      return fixed(kInt, 2);
    case 0xcd:
      if (avail < 3) return nullptr;
      c->v.i = LoadBE16(p + 1);
      return fixed(kInt, 3);
    case 0xce:
      if (avail < 5) return nullptr;
      c->v.i = LoadBE32(p + 1);
      return fixed(kInt, 5);
    case 0xcf: {
      if (avail < 9) return nullptr;
      const uint64_t u = LoadBE64(p + 1);
      c->v.u = u;
      return fixed(u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? kUint : kInt,
                   9);
    }
    case 0xd0:
      if (avail < 2) return nullptr;
      c->v.i = static_cast<int8_t>(p[1]);
      return fixed(kInt, 2);
    case 0xd1:
      if (avail < 3) return nullptr;
      c->v.i = static_cast<int16_t>(LoadBE16(p + 1));
      return fixed(kInt, 3);
    case 0xd2:
      if (avail < 5) return nullptr;
      c->v.i = static_cast<int32_t>(LoadBE32(p + 1));
      return fixed(kInt, 5);
    case 0xd3:
      if (avail < 9) return nullptr;
      c->v.i = static_cast<int64_t>(LoadBE64(p + 1));
      return fixed(kInt, 9);
    case 0xca: {
      if (avail < 5) return nullptr;
      const uint32_t bits = LoadBE32(p + 1);
      std::memcpy(&c->v.f, &bits, 4);
      return fixed(kF32, 5);
    }
    case 0xcb: {
      if (avail < 9) return nullptr;
      const uint64_t bits = LoadBE64(p + 1);
      std::memcpy(&c->v.d, &bits, 8);
      return fixed(kF64, 9);
    }
    case 0xd9:
      return avail < 2 ? nullptr : body(kStr, 2, p[1]);
    case 0xda:
      return avail < 3 ? nullptr : body(kStr, 3, LoadBE16(p + 1));
    case 0xdb:
      return avail < 5 ? nullptr : body(kStr, 5, LoadBE32(p + 1));
    case 0xc4:
      return avail < 2 ? nullptr : body(kBin, 2, p[1]);
    case 0xc5:
      return avail < 3 ? nullptr : body(kBin, 3, LoadBE16(p + 1));
    case 0xc6:
      return avail < 5 ? nullptr : body(kBin, 5, LoadBE32(p + 1));
    default: {  // arrays, maps, ext: Python values (an object column)
      mp::ScanError err = mp::ScanError::kOk;
      const uint8_t* next = mp::SkipObject(p, end, &err);
      if (next == nullptr) return nullptr;
      c->type = kOther;
      c->len = next - p;
      return next;
    }
  }
}

// A map header at p: its field count, or nullptr when p is not a map.
const uint8_t* ParseMapHeader(const uint8_t* p, const uint8_t* end, size_t* n) {
  if (p >= end) return nullptr;
  const uint8_t b = *p;
  if (b >= 0x80 && b <= 0x8f) {
    *n = b & 0x0f;
    return p + 1;
  }
  if (b == 0xde && end - p >= 3) {
    *n = LoadBE16(p + 1);
    return p + 3;
  }
  if (b == 0xdf && end - p >= 5) {
    *n = LoadBE32(p + 1);
    return p + 5;
  }
  return nullptr;
}

const char* TypeNameOf(uint8_t b) {
  if (b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3)) return "an int";
  if (b >= 0x90 && b <= 0x9f) return "an array";
  if (b >= 0xa0 && b <= 0xbf) return "a str";
  switch (b) {
    case 0xc0:
      return "nil";
    case 0xc2:
    case 0xc3:
      return "a bool";
    case 0xca:
    case 0xcb:
      return "a float";
    case 0xdc:
    case 0xdd:
      return "an array";
    case 0xd9:
    case 0xda:
    case 0xdb:
      return "a str";
    case 0xc4:
    case 0xc5:
    case 0xc6:
      return "a bytes";
    default:
      return "an ext";
  }
}

constexpr size_t kMaxFields = 4096;

// The one type a column's values take, from the cell types seen: exact only (ints with uint64s
// only when none is negative; float32 with float64 as float64); kObject otherwise.
enum class Resolved { kBool, kInt64, kUint64, kFloat32, kFloat64, kStr, kBin, kNil, kObject };

Resolved Resolve(uint32_t seen, bool negative) {
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

}  // namespace

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

ColumnDecoder::ColumnDecoder() : state_(std::make_unique<State>()) {}

size_t ColumnDecoder::retained_bytes() const {
  size_t bytes = state_->group_starts.capacity() * sizeof(int64_t);
  for (const State::Column& c : state_->cols) bytes += c.cells.capacity() * sizeof(Cell);
  return bytes;
}
ColumnDecoder::~ColumnDecoder() = default;

absl::Status ColumnDecoder::Decode(std::string_view arena, absl::Span<const RecordAt> records,
                                   const std::string& key_column, bool groups,
                                   const std::vector<std::string>* only) {
  State& s = *state_;
  const auto* base = reinterpret_cast<const uint8_t*>(arena.data());
  s.rows = records.size();
  s.groups = groups;
  s.group_starts.clear();
  s.fields = 0;
  s.keys = !key_column.empty();
  auto column = [&](size_t j) -> State::Column& {
    if (j >= s.cols.size()) s.cols.resize(j + 1);
    State::Column& c = s.cols[j];
    c.cells.clear();
    c.seen = 0;
    c.negative = false;
    c.stamp = 0;
    c.wanted = true;
    return c;
  };
  s.out.clear();
  Cell skipped;  // the cells of fields not asked for: parsed (and so checked), not kept
  auto fields_of = [&](size_t r) {
    std::string names;
    for (size_t j = 0; j < s.fields; ++j) absl::StrAppend(&names, j ? ", " : "", s.cols[j].name);
    return absl::StrCat("record ", r, "'s fields differ from record 0's (", names, ")");
  };
  for (size_t r = 0; r < records.size(); ++r) {
    const RecordAt& rec = records[r];
    const uint8_t* p = base + rec.at + rec.key_size;
    const uint8_t* end = p + rec.value_size;
    size_t n = 0;
    const uint8_t* q = ParseMapHeader(p, end, &n);
    if (q == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "record ", r, "'s value is ", p < end ? TypeNameOf(*p) : "empty",
          ", not a map of fields: only maps read as columns (read it with batches())"));
    }
    p = q;
    if (r == 0) {
      if (n > kMaxFields) {
        return absl::InvalidArgumentError(
            absl::StrCat("record 0 has ", n, " fields, more than ", kMaxFields));
      }
      s.fields = n;
    } else if (n != s.fields) {
      return absl::InvalidArgumentError(fields_of(r));
    }
    for (size_t j = 0; j < n; ++j) {
      Cell name;
      q = ParseCell(base, p, end, &name);
      if (q == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("record ", r, " is malformed"));
      if (name.type != kStr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "record ", r, "'s field ", j, " is named by ", TypeNameOf(*p), ", not a str"));
      }
      const std::string_view nm(arena.data() + name.at + name.header, name.len - name.header);
      p = q;
      size_t k = j;
      if (r == 0) {
        State::Column& c = column(j);
        c.name.assign(nm);
        c.wanted = only == nullptr || std::find(only->begin(), only->end(), nm) != only->end();
        for (size_t o = 0; o < j; ++o) {
          if (s.cols[o].name == nm) {
            return absl::InvalidArgumentError(
                absl::StrCat("record 0 has two fields named '", std::string(nm), "'"));
          }
        }
      } else if (s.cols[j].name != nm) {
        for (k = 0; k < s.fields && s.cols[k].name != nm; ++k) {
        }
        if (k == s.fields) return absl::InvalidArgumentError(fields_of(r));
      }
      State::Column& c = s.cols[k];
      if (c.stamp == r + 1) return absl::InvalidArgumentError(fields_of(r));
      c.stamp = r + 1;
      Cell& cell = c.wanted ? c.cells.emplace_back() : skipped;
      q = ParseCell(base, p, end, &cell);
      if (q == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("record ", r, " is malformed"));
      p = q;
      if (!c.wanted) continue;
      c.seen |= 1u << cell.type;
      c.negative |= cell.type == kInt && cell.v.i < 0;
    }
    if (p != end) {
      return absl::InvalidArgumentError(absl::StrCat("record ", r, " has bytes past its value"));
    }
  }
  for (size_t j = 0; j < s.fields; ++j) {
    if (s.cols[j].wanted) s.out.push_back(j);
  }
  if (only != nullptr && !records.empty()) {
    for (const std::string& name : *only) {
      bool found = name == key_column;
      for (size_t j = 0; j < s.fields && !found; ++j) found = s.cols[j].name == name;
      if (!found) {
        std::string names;
        for (size_t j = 0; j < s.fields; ++j) {
          absl::StrAppend(&names, j ? ", " : "", s.cols[j].name);
        }
        return absl::InvalidArgumentError(
            absl::StrCat("no field named '", name, "' (the fields: ", names, ")"));
      }
    }
  }
  if (s.keys) {
    s.out.push_back(s.fields);
    for (size_t j = 0; j < s.fields; ++j) {
      if (s.cols[j].name == key_column) {
        return absl::InvalidArgumentError(
            absl::StrCat("the values have a field named '", key_column,
                         "' already: name the keys' column otherwise"));
      }
    }
    State::Column& c = column(s.fields);
    c.name = key_column;
    for (const RecordAt& rec : records) {
      const uint8_t* p = base + rec.at;
      Cell& cell = c.cells.emplace_back();
      if (ParseCell(base, p, p + rec.key_size, &cell) != p + rec.key_size) {
        return absl::InvalidArgumentError("a key is not one msgpack value");
      }
      c.seen |= 1u << cell.type;
      c.negative |= cell.type == kInt && cell.v.i < 0;
    }
  }
  if (groups) {
    for (size_t r = 0; r < records.size(); ++r) {
      if (r == 0 || arena.substr(records[r].at, records[r].key_size) !=
                        arena.substr(records[r - 1].at, records[r - 1].key_size)) {
        s.group_starts.push_back(static_cast<int64_t>(r));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Interns the str objects of a column: repeated values (a category, a constant) share one
// object, as they would in a pandas frame built from Python values.
class StrCache {
 public:
  PyObject* Get(std::string_view bytes) {
    const size_t h = std::hash<std::string_view>()(bytes) & (kSlots - 1);
    Slot& s = slots_[h];
    if (s.obj != nullptr && s.bytes == bytes) {
      Py_INCREF(s.obj);
      return s.obj;
    }
    PyObject* o =
        PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "strict");
    if (o == nullptr) return nullptr;
    Py_XDECREF(s.obj);
    Py_INCREF(o);
    s.obj = o;
    s.bytes = bytes;
    return o;
  }
  ~StrCache() {
    for (Slot& s : slots_) Py_XDECREF(s.obj);
  }

 private:
  static constexpr size_t kSlots = 1024;
  struct Slot {
    std::string_view bytes;
    PyObject* obj = nullptr;
  };
  Slot slots_[kSlots];
};

template <typename T>
pb::array NumericArray(const std::vector<Cell>& cells, T (*get)(const Cell&), pb::object* mask,
                       bool has_nil) {
  pb::array_t<T> a(cells.size());
  T* out = a.mutable_data();
  for (size_t i = 0; i < cells.size(); ++i) out[i] = cells[i].type == kNil ? T{} : get(cells[i]);
  if (has_nil) {
    pb::array_t<bool> m(cells.size());
    bool* mo = m.mutable_data();
    for (size_t i = 0; i < cells.size(); ++i) mo[i] = cells[i].type == kNil;
    *mask = m;
  }
  return std::move(a);
}

}  // namespace

namespace {

// An exported Arrow array's buffers, owned by its private_data until its release.
struct ArrowChild {
  std::vector<uint8_t> validity, values, offsets;
  const void* buffers[3] = {nullptr, nullptr, nullptr};
};

void ReleaseChild(ArrowArray* a) {
  delete static_cast<ArrowChild*>(a->private_data);
  a->release = nullptr;
}

struct ArrowParent {
  std::vector<ArrowArray> children;
  std::vector<ArrowArray*> child_ptrs;
  const void* buffers[1] = {nullptr};
};

void ReleaseParent(ArrowArray* a) {
  auto* p = static_cast<ArrowParent*>(a->private_data);
  for (ArrowArray* c : p->child_ptrs) {
    if (c->release != nullptr) c->release(c);
  }
  delete p;
  a->release = nullptr;
}

const char* FormatOf(Resolved t) {
  switch (t) {
    case Resolved::kBool:
      return "b";
    case Resolved::kInt64:
      return "l";
    case Resolved::kUint64:
      return "L";
    case Resolved::kFloat32:
      return "f";
    case Resolved::kFloat64:
      return "g";
    case Resolved::kStr:
      return "U";
    case Resolved::kBin:
      return "Z";
    case Resolved::kNil:
      return "n";
    case Resolved::kObject:
      break;
  }
  return "";
}

template <typename T>
void Values(const std::vector<Cell>& cells, T (*get)(const Cell&), std::vector<uint8_t>* out) {
  out->resize(cells.size() * sizeof(T));
  T* v = reinterpret_cast<T*>(out->data());
  for (size_t i = 0; i < cells.size(); ++i) v[i] = cells[i].type == kNil ? T{} : get(cells[i]);
}

}  // namespace

absl::Status ColumnDecoder::ToArrow(std::string_view arena, std::vector<std::string>* formats,
                                    std::vector<std::string>* names, ArrowArray* out) {
  State& s = *state_;
  const size_t ncols = s.out.size();
  const bool first = formats->empty() && names->empty();
  if (first) {  // the schema is this batch's, if every column has an Arrow type
    std::vector<std::string> f, n;
    for (size_t j = 0; j < ncols; ++j) {
      const State::Column& c = s.cols[s.out[j]];
      const Resolved t = Resolve(c.seen, c.negative);
      if (t == Resolved::kObject) {
        return absl::InvalidArgumentError(absl::StrCat(
            "column '", c.name,
            "' mixes types or nests values: Arrow has no type for it (read it with frames())"));
      }
      f.push_back(FormatOf(t));
      n.push_back(c.name);
    }
    *formats = std::move(f);
    *names = std::move(n);
  } else if (names->size() != ncols) {
    return absl::InvalidArgumentError(
        absl::StrCat("this batch has ", ncols, " columns, the stream's first had ", names->size()));
  }
  auto parent = std::make_unique<ArrowParent>();
  parent->children.resize(ncols);
  auto fail = [&](absl::Status st) {  // gives back the columns made so far
    for (ArrowArray* c : parent->child_ptrs) c->release(c);
    return st;
  };
  for (size_t j = 0; j < ncols; ++j) {
    const State::Column& c = s.cols[s.out[j]];
    if (c.name != (*names)[j]) {
      return fail(absl::InvalidArgumentError(absl::StrCat("column ", j, " is '", c.name,
                                                          "' in this batch, '", (*names)[j],
                                                          "' in the stream's first")));
    }
    const Resolved t = Resolve(c.seen, c.negative);
    const std::string& want = (*formats)[j];
    // Fits the schema exactly: the same type, all nil, ints none negative as uint64, float32s
    // as float64.
    const bool fits = t == Resolved::kNil || want == FormatOf(t) ||
                      (want == "L" && t == Resolved::kInt64 && !c.negative) ||
                      (want == "g" && t == Resolved::kFloat32);
    if (!fits) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "column '", c.name, "' is of Arrow format '", FormatOf(t), "' in this batch but '", want,
          "' in the stream's schema (its first batch): ask for more rows a batch, so that one "
          "batch holds the partition")));
    }
    const size_t n = c.cells.size();
    auto child = std::make_unique<ArrowChild>();
    ArrowArray& a = parent->children[j];
    a = ArrowArray{};
    a.length = static_cast<int64_t>(n);
    int64_t nulls = 0;
    for (const Cell& x : c.cells) nulls += x.type == kNil;
    a.null_count = nulls;
    if (want == "n") {
      a.n_buffers = 0;
    } else {
      if (nulls > 0) {
        child->validity.assign((n + 7) / 8, 0);
        for (size_t i = 0; i < n; ++i) {
          if (c.cells[i].type != kNil)
            child->validity[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
        }
        child->buffers[0] = child->validity.data();
      }
      a.n_buffers = 2;
      const char f = want[0];
      if (f == 'b') {
        child->values.assign((n + 7) / 8, 0);
        for (size_t i = 0; i < n; ++i) {
          if (c.cells[i].type == kBool && c.cells[i].v.b) {
            child->values[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
          }
        }
      } else if (f == 'l') {
        Values<int64_t>(
            c.cells, +[](const Cell& x) { return x.v.i; }, &child->values);
      } else if (f == 'L') {
        Values<uint64_t>(
            c.cells, +[](const Cell& x) { return x.v.u; }, &child->values);
      } else if (f == 'f') {
        Values<float>(
            c.cells, +[](const Cell& x) { return x.v.f; }, &child->values);
      } else if (f == 'g') {
        Values<double>(
            c.cells, +[](const Cell& x) { return x.type == kF32 ? double{x.v.f} : x.v.d; },
            &child->values);
      } else {  // 'U', 'Z': int64 offsets, then the bytes
        a.n_buffers = 3;
        child->offsets.resize((n + 1) * 8);
        auto* offs = reinterpret_cast<int64_t*>(child->offsets.data());
        size_t total = 0;
        for (const Cell& x : c.cells) total += x.type == kNil ? 0 : x.len - x.header;
        child->values.resize(total);
        int64_t at = 0;
        for (size_t i = 0; i < n; ++i) {
          offs[i] = at;
          const Cell& x = c.cells[i];
          if (x.type == kNil) continue;
          const size_t len = x.len - x.header;
          if (f == 'U' &&
              !IsUtf8(reinterpret_cast<const uint8_t*>(arena.data()) + x.at + x.header, len)) {
            return fail(absl::InvalidArgumentError(
                absl::StrCat("column '", c.name, "', row ", i, ": a str that is not UTF-8")));
          }
          if (len > 0) std::memcpy(child->values.data() + at, arena.data() + x.at + x.header, len);
          at += static_cast<int64_t>(len);
        }
        offs[n] = at;
        child->buffers[1] = child->offsets.data();
        child->buffers[2] = child->values.data();
      }
      if (a.n_buffers == 2) child->buffers[1] = child->values.data();
    }
    a.buffers = child->buffers;
    a.private_data = child.release();
    a.release = ReleaseChild;
    parent->child_ptrs.push_back(&a);
  }
  *out = ArrowArray{};
  out->length = static_cast<int64_t>(s.rows);
  out->n_buffers = 1;
  out->n_children = static_cast<int64_t>(ncols);
  out->buffers = parent->buffers;
  out->children = parent->child_ptrs.data();
  out->release = ReleaseParent;
  out->private_data = parent.release();
  return absl::OkStatus();
}

pb::tuple ColumnDecoder::ToPython(std::string_view arena, absl::Span<const RecordAt> records,
                                  bool allow_pickle) {
  State& s = *state_;
  pb::list columns;
  for (const size_t j : s.out) {
    State::Column& c = s.cols[j];
    const bool has_nil = (c.seen & (1u << kNil)) != 0;
    const Resolved type = Resolve(c.seen, c.negative);
    pb::object mask = pb::none();
    pb::array values;
    if (type == Resolved::kBool) {
      values = NumericArray<bool>(
          c.cells, +[](const Cell& x) { return x.v.b; }, &mask, has_nil);
    } else if (type == Resolved::kUint64) {
      values = NumericArray<uint64_t>(
          c.cells, +[](const Cell& x) { return x.v.u; }, &mask, has_nil);
    } else if (type == Resolved::kInt64) {
      values = NumericArray<int64_t>(
          c.cells, +[](const Cell& x) { return x.v.i; }, &mask, has_nil);
    } else if (type == Resolved::kFloat32) {
      values = NumericArray<float>(
          c.cells, +[](const Cell& x) { return x.v.f; }, &mask, has_nil);
    } else if (type == Resolved::kFloat64) {
      values = NumericArray<double>(
          c.cells, +[](const Cell& x) { return x.type == kF32 ? double{x.v.f} : x.v.d; }, &mask,
          has_nil);
    } else {
      // str, bytes, all nil, or mixed: an object array (None for nil). Strs are decoded (and
      // checked as UTF-8) here; anything not a str or bytes goes through the dict path's decoder.
      values = pb::array(pb::dtype("O"),
                         std::vector<pb::ssize_t>{static_cast<pb::ssize_t>(c.cells.size())});
      auto** out = reinterpret_cast<PyObject**>(values.mutable_data());
      StrCache strs;
      for (size_t i = 0; i < c.cells.size(); ++i) {
        const Cell& x = c.cells[i];
        PyObject* o;
        if (x.type == kNil) {
          o = Py_None;
          Py_INCREF(o);
        } else if (x.type == kStr) {
          o = strs.Get(arena.substr(x.at + x.header, x.len - x.header));
          if (o == nullptr) {
            const std::string what = pb::error_already_set().what();
            Raise(PyExc_ValueError, absl::StrCat("column '", c.name, "', row ", i,
                                                 ": a str that is not UTF-8 (", what, ")"));
          }
        } else if (x.type == kBin) {
          o = PyBytes_FromStringAndSize(arena.data() + x.at + x.header,
                                        static_cast<Py_ssize_t>(x.len - x.header));
          if (o == nullptr) throw pb::error_already_set();
        } else {
          o = Unpack(arena.substr(x.at, x.len), allow_pickle).release().ptr();
        }
        Py_XDECREF(out[i]);
        out[i] = o;
      }
    }
    columns.append(pb::make_tuple(c.name, values, mask));
  }
  pb::object starts = pb::none();
  pb::object keys = pb::none();
  if (s.groups) {
    pb::array_t<int64_t> st(s.group_starts.size());
    std::memcpy(st.mutable_data(), s.group_starts.data(), s.group_starts.size() * 8);
    pb::list ks;
    for (const int64_t r : s.group_starts) {
      const RecordAt& rec = records[r];
      ks.append(Unpack(arena.substr(rec.at, rec.key_size), allow_pickle, /*as_key=*/true));
    }
    starts = st;
    keys = ks;
  }
  return pb::make_tuple(columns, s.rows, starts, keys);
}

}  // namespace sluice::py
