#include "client/python/py_columns.h"

#include <pybind11/numpy.h>

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/python/py_msgpack.h"
#include "codec/endian.h"
#include "codec/msgpack_scan.h"

namespace sluice::py {

namespace pb = pybind11;

namespace {

std::string Quoted(const std::string& name) { return "'" + name + "'"; }

// --- writing ------------------------------------------------------------------------------

// The codec's canonical writers (codec/msgpack_scan.h), appending to a string.
template <typename Write>
void AppendWith(std::string* out, Write write) {
  uint8_t b[9];
  const uint8_t* e = write(b);
  out->append(reinterpret_cast<const char*>(b), e - b);
}

void AppendStrHeader(size_t n, std::string* out) {
  AppendWith(out, [n](uint8_t* b) { return mp::WriteStrHeader(b, static_cast<uint32_t>(n)); });
}

void AppendBinHeader(size_t n, std::string* out) {
  AppendWith(out, [n](uint8_t* b) { return mp::WriteBinHeader(b, static_cast<uint32_t>(n)); });
}

void AppendMapHeader(size_t n, std::string* out) {
  AppendWith(out, [n](uint8_t* b) { return mp::WriteMapHeader(b, static_cast<uint32_t>(n)); });
}

void AppendInt(int64_t v, std::string* out) {
  AppendWith(out, [v](uint8_t* b) { return mp::WriteInt(b, v); });
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

size_t RowEncoder::AppendRow(size_t i, std::string* out) {
  std::string* const value = out;
  const size_t start = out->size();
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
  const size_t value_size = out->size() - start;
  const ColumnIn& k = cols_[key_col_];
  if (k.kind == ColumnIn::Kind::kFloat32 && !(k.nulls != nullptr && k.nulls[i] != 0)) {
    // `write` sends a Python float, always a float64: a float32 key routes as that one would.
    float f;
    std::memcpy(&f, k.data + i * 4, 4);
    AppendFloat64(f, out);
  } else {  // the key column's bytes again (resize first: the copy's source is in *out)
    const size_t n = key_end - key_at;
    out->resize(out->size() + n);
    std::memcpy(out->data() + out->size() - n, out->data() + key_at, n);
  }
  return value_size;
}

}  // namespace sluice::py
