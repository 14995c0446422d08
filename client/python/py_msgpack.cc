#include "client/python/py_msgpack.h"

#include <cstring>
#include <msgpack.hpp>

namespace sluice::py {

namespace pb = pybind11;

void Raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw pb::error_already_set();
}

namespace {

struct StringBuffer {
  std::string* out;
  void write(const char* data, size_t n) { out->append(data, n); }
};
using Packer = msgpack::packer<StringBuffer>;

std::string TypeName(pb::handle o) { return Py_TYPE(o.ptr())->tp_name; }

void PackInt(Packer& pk, pb::handle o) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o.ptr(), &overflow);
  if (overflow == 0) {
    if (v == -1 && PyErr_Occurred()) throw pb::error_already_set();
    pk.pack_int64(v);
    return;
  }
  if (overflow > 0) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(o.ptr());
    if (!(u == static_cast<unsigned long long>(-1) && PyErr_Occurred())) {
      pk.pack_uint64(u);
      return;
    }
    PyErr_Clear();
  }
  Raise(PyExc_OverflowError,
        "int " + pb::str(o).cast<std::string>().substr(0, 60) +
            " does not fit msgpack's 64 bits; pass it as a str, or enable pickle_fallback");
}

uint32_t Length(Py_ssize_t n, const char* what) {
  if (n < 0 || static_cast<uint64_t>(n) > 0xffffffffu) {
    Raise(PyExc_ValueError, std::string(what) + " longer than msgpack's 4 GiB - 1 limit");
  }
  return static_cast<uint32_t>(n);
}

// `pk` appends to `*out` as it goes: both may be written to. Only exact built-in types are
// encoded: a subclass (IntEnum, a namedtuple, numpy.float64) would come back as its base type,
// so it goes the way of any other object msgpack cannot carry.
void PackImpl(Packer& pk, std::string* out, pb::handle o, bool pickle_fallback, int depth) {
  if (depth > kMaxDepth) {
    Raise(PyExc_ValueError, "object nested deeper than 512 levels (a cycle?)");
  }
  PyObject* p = o.ptr();
  if (p == Py_None) {
    pk.pack_nil();
  } else if (p == Py_True || p == Py_False) {
    p == Py_True ? pk.pack_true() : pk.pack_false();
  } else if (PyLong_CheckExact(p)) {
    PackInt(pk, o);
  } else if (PyFloat_CheckExact(p)) {
    // float 64 always: msgpack-cxx's pack_double writes whole numbers (2.0, -0.0) as ints,
    // which would come back as a different type.
    const double d = PyFloat_AS_DOUBLE(p);
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    out->push_back(static_cast<char>(0xcb));
    for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(bits >> (56 - 8 * i)));
  } else if (PyUnicode_CheckExact(p)) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(p, &n);
    if (s == nullptr) throw pb::error_already_set();  // e.g. a lone surrogate
    pk.pack_str(Length(n, "a str"));
    pk.pack_str_body(s, static_cast<uint32_t>(n));
  } else if (PyBytes_CheckExact(p)) {
    const uint32_t n = Length(PyBytes_GET_SIZE(p), "a bytes");
    pk.pack_bin(n);
    pk.pack_bin_body(PyBytes_AS_STRING(p), n);
  } else if (PyByteArray_CheckExact(p) || PyMemoryView_Check(p)) {
    Py_buffer view;
    if (PyObject_GetBuffer(p, &view, PyBUF_SIMPLE) != 0) throw pb::error_already_set();
    const Py_ssize_t len = view.len;
    if (len < 0 || static_cast<uint64_t>(len) > 0xffffffffu) PyBuffer_Release(&view);
    const uint32_t n = Length(len, "a buffer");
    pk.pack_bin(n);
    pk.pack_bin_body(static_cast<const char*>(view.buf), n);
    PyBuffer_Release(&view);
  } else if (PyDict_CheckExact(p)) {
    if (pickle_fallback) {
      // Pickling an element runs Python code, which may change this dict: encode a snapshot
      // of its items, holding references.
      pb::list items = pb::reinterpret_steal<pb::list>(PyDict_Items(p));
      if (!items) throw pb::error_already_set();
      pk.pack_map(Length(PyList_GET_SIZE(items.ptr()), "a dict"));
      for (pb::handle kv : items) {
        PackImpl(pk, out, PyTuple_GET_ITEM(kv.ptr(), 0), pickle_fallback, depth + 1);
        PackImpl(pk, out, PyTuple_GET_ITEM(kv.ptr(), 1), pickle_fallback, depth + 1);
      }
    } else {
      // Without the fallback no Python code runs while encoding (nothing is allocated that
      // the collector tracks, no method is called), so nothing can change the dict under us.
      pk.pack_map(Length(PyDict_GET_SIZE(p), "a dict"));
      Py_ssize_t pos = 0;
      PyObject *k, *v;
      while (PyDict_Next(p, &pos, &k, &v)) {
        PackImpl(pk, out, k, false, depth + 1);
        PackImpl(pk, out, v, false, depth + 1);
      }
    }
  } else if (PyList_CheckExact(p) && !pickle_fallback) {
    // As for a dict: without the fallback the list cannot change while it is encoded.
    const Py_ssize_t n = PyList_GET_SIZE(p);
    pk.pack_array(Length(n, "a list"));
    for (Py_ssize_t i = 0; i < n; ++i) PackImpl(pk, out, PyList_GET_ITEM(p, i), false, depth + 1);
  } else if (PyList_CheckExact(p) || PyTuple_CheckExact(p)) {
    // With the fallback, a list may change while an element is pickled: a tuple snapshot holds
    // its elements.
    pb::tuple items = PyTuple_CheckExact(p) ? pb::reinterpret_borrow<pb::tuple>(o)
                                            : pb::reinterpret_steal<pb::tuple>(PyList_AsTuple(p));
    if (!items) throw pb::error_already_set();
    const Py_ssize_t n = PyTuple_GET_SIZE(items.ptr());
    pk.pack_array(Length(n, "a list"));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PackImpl(pk, out, PyTuple_GET_ITEM(items.ptr(), i), pickle_fallback, depth + 1);
    }
  } else if (pickle_fallback) {
    pb::bytes pickled = pb::module_::import("pickle").attr("dumps")(o, 5);
    const std::string_view b = pickled;
    pk.pack_ext(Length(static_cast<Py_ssize_t>(b.size()), "a pickled object"), kPickleExt);
    pk.pack_ext_body(b.data(), static_cast<uint32_t>(b.size()));
  } else {
    Raise(PyExc_TypeError,
          "cannot encode an object of type '" + TypeName(o) +
              "' as msgpack: msgpack has no form for it (or only its base type's), and any "
              "other would come back as a different object; convert it (a set to a sorted "
              "list, an enum to its value, say) or open the writer with pickle_fallback=True");
  }
}

pb::object Steal(PyObject* o) {
  if (o == nullptr) throw pb::error_already_set();
  return pb::reinterpret_steal<pb::object>(o);
}

// Short ASCII map keys already decoded, by a hash of their bytes (MapKey). Touched only with
// the GIL held; the strs it holds live as long as the process.
constexpr uint64_t kCachedKeyMax = 24;
constexpr size_t kKeyCacheSlots = 1024;
PyObject* g_key_cache[kKeyCacheSlots] = {};

// A single-pass decoder straight into Python objects.
class Decoder {
 public:
  Decoder(std::string_view in, bool allow_pickle) : in_(in), allow_pickle_(allow_pickle) {}

  pb::object Value(bool as_key, int depth) {
    if (depth > kMaxDepth) Fail("nested deeper than 512 levels");
    const uint8_t t = Byte();
    if (t <= 0x7f) return pb::int_(t);
    if (t >= 0xe0) return pb::int_(static_cast<int8_t>(t));
    if ((t & 0xe0) == 0xa0) return Str(t & 0x1f);
    if ((t & 0xf0) == 0x90) return Array(t & 0x0f, as_key, depth);
    if ((t & 0xf0) == 0x80) return Map(t & 0x0f, depth);
    switch (t) {
      case 0xc0:
        return pb::none();
      case 0xc2:
        return pb::bool_(false);
      case 0xc3:
        return pb::bool_(true);
      case 0xc4:
        return Bin(Be(1));
      case 0xc5:
        return Bin(Be(2));
      case 0xc6:
        return Bin(Be(4));
      case 0xc7:
        return Ext(Be(1));
      case 0xc8:
        return Ext(Be(2));
      case 0xc9:
        return Ext(Be(4));
      case 0xca: {
        const uint32_t bits = static_cast<uint32_t>(Be(4));
        float f;
        std::memcpy(&f, &bits, 4);
        return pb::float_(f);
      }
      case 0xcb: {
        const uint64_t bits = Be(8);
        double d;
        std::memcpy(&d, &bits, 8);
        return pb::float_(d);
      }
      case 0xcc:
        return pb::int_(Be(1));
      case 0xcd:
        return pb::int_(Be(2));
      case 0xce:
        return pb::int_(Be(4));
      case 0xcf:
        return pb::reinterpret_steal<pb::object>(PyLong_FromUnsignedLongLong(Be(8)));
      case 0xd0:
        return pb::int_(static_cast<int8_t>(Be(1)));
      case 0xd1:
        return pb::int_(static_cast<int16_t>(Be(2)));
      case 0xd2:
        return pb::int_(static_cast<int32_t>(Be(4)));
      case 0xd3:
        return pb::reinterpret_steal<pb::object>(PyLong_FromLongLong(static_cast<int64_t>(Be(8))));
      case 0xd4:
        return Ext(1);
      case 0xd5:
        return Ext(2);
      case 0xd6:
        return Ext(4);
      case 0xd7:
        return Ext(8);
      case 0xd8:
        return Ext(16);
      case 0xd9:
        return Str(Be(1));
      case 0xda:
        return Str(Be(2));
      case 0xdb:
        return Str(Be(4));
      case 0xdc:
        return Array(Be(2), as_key, depth);
      case 0xdd:
        return Array(Be(4), as_key, depth);
      case 0xde:
        return Map(Be(2), depth);
      case 0xdf:
        return Map(Be(4), depth);
      default:
        Fail("unknown type byte 0xc1");
    }
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    Raise(PyExc_ValueError, "malformed msgpack at byte " + std::to_string(pos_) + ": " + what);
  }
  const char* Take(uint64_t n) {
    if (n > in_.size() - pos_) Fail("truncated");
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint8_t Byte() { return static_cast<uint8_t>(*Take(1)); }
  uint64_t Be(int n) {
    const auto* p = reinterpret_cast<const uint8_t*>(Take(n));
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
    return v;
  }
  pb::object Str(uint64_t n) { return Str(Take(n), n); }
  static pb::object Str(const char* p, uint64_t n) {
    PyObject* s = PyUnicode_DecodeUTF8(p, static_cast<Py_ssize_t>(n), "strict");
    if (s == nullptr) throw pb::error_already_set();
    return pb::reinterpret_steal<pb::object>(s);
  }
  pb::object Bin(uint64_t n) {
    const char* p = Take(n);
    return pb::bytes(p, n);
  }
  // Every element takes a byte at least: all the elements claimed so far, at every level,
  // must fit the input, or a few bytes could make the decoder allocate gigabytes.
  void Claim(uint64_t n) {
    claimed_ += n;
    if (n > in_.size() || claimed_ > in_.size()) Fail("more elements claimed than bytes");
  }
  pb::object Array(uint64_t n, bool as_key, int depth) {
    Claim(n);
    const auto len = static_cast<Py_ssize_t>(n);
    if (as_key) {
      pb::object t = Steal(PyTuple_New(len));
      for (Py_ssize_t i = 0; i < len; ++i) {
        PyTuple_SET_ITEM(t.ptr(), i, Value(true, depth + 1).release().ptr());
      }
      return t;
    }
    pb::object l = Steal(PyList_New(len));
    for (Py_ssize_t i = 0; i < len; ++i) {
      PyList_SET_ITEM(l.ptr(), i, Value(false, depth + 1).release().ptr());
    }
    return l;
  }
  pb::object Map(uint64_t n, int depth) {
    Claim(2 * n);
    pb::object d = Steal(PyDict_New());
    for (uint64_t i = 0; i < n; ++i) {
      pb::object k = MapKey(depth + 1);
      pb::object v = Value(false, depth + 1);
      if (PyDict_SetItem(d.ptr(), k.ptr(), v.ptr()) != 0) throw pb::error_already_set();
    }
    return d;
  }
  // A map's key; short ASCII strs (the field names of records, repeated in every one) come
  // from a cache, so that each is made (and its hash computed) once, not once per record.
  pb::object MapKey(int depth) {
    if (pos_ < in_.size()) {
      const auto t = static_cast<uint8_t>(in_[pos_]);
      if ((t & 0xe0) == 0xa0 && (t & 0x1f) <= kCachedKeyMax) {
        ++pos_;
        return CachedStr(t & 0x1f);
      }
    }
    return Value(true, depth);
  }
  pb::object CachedStr(uint64_t n) {
    const char* p = Take(n);
    uint32_t h = 2166136261u;  // FNV-1a
    bool ascii = true;
    for (uint64_t i = 0; i < n; ++i) {
      h = (h ^ static_cast<uint8_t>(p[i])) * 16777619u;
      ascii &= static_cast<uint8_t>(p[i]) < 0x80;
    }
    if (!ascii) return Str(p, n);
    PyObject*& slot = g_key_cache[(h ^ (h >> 16)) % kKeyCacheSlots];
    if (slot != nullptr && PyUnicode_GET_LENGTH(slot) == static_cast<Py_ssize_t>(n) &&
        std::memcmp(PyUnicode_1BYTE_DATA(slot), p, n) == 0) {
      return pb::reinterpret_borrow<pb::object>(slot);
    }
    pb::object s = Str(p, n);
    Py_XDECREF(slot);  // a str: freeing it runs no Python code
    slot = s.inc_ref().ptr();
    return s;
  }
  pb::object Ext(uint64_t n) {
    const auto type = static_cast<int8_t>(Byte());
    const char* p = Take(n);
    if (type != kPickleExt) Fail("msgpack ext type " + std::to_string(type) + " is not known");
    if (!allow_pickle_) {
      Raise(PyExc_ValueError,
            "a value was pickled by a writer with pickle_fallback=True; open the reader with "
            "allow_pickle=True to unpickle it (only for data you trust)");
    }
    return pb::module_::import("pickle").attr("loads")(pb::bytes(p, n));
  }

  std::string_view in_;
  size_t pos_ = 0;
  uint64_t claimed_ = 0;  // elements claimed by every array and map so far
  const bool allow_pickle_;
};

}  // namespace

void Pack(pb::handle o, bool pickle_fallback, std::string* out) {
  StringBuffer buf{out};
  Packer pk(buf);
  PackImpl(pk, out, o, pickle_fallback, 0);
}

pb::object Unpack(std::string_view bytes, bool allow_pickle, bool as_key) {
  Decoder d(bytes, allow_pickle);
  pb::object v = d.Value(as_key, 0);
  if (!d.done()) {
    Raise(PyExc_ValueError, "malformed msgpack: bytes left after the value");
  }
  return v;
}

}  // namespace sluice::py
