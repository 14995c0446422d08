#include "client/python/py_column_decoder.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/python/py_column_cells.h"
#include "client/python/py_msgpack.h"
#include "codec/endian.h"
#include "codec/msgpack_scan.h"

namespace sluice::py {

namespace pb = pybind11;

namespace {

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

}  // namespace

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
