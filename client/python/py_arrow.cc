#include "client/python/py_arrow.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/python/arrow_batch.h"
#include "client/python/py_column_cells.h"
#include "client/python/py_msgpack.h"
#include "codec/endian.h"

namespace sluice::py {

namespace pb = pybind11;

std::vector<ColumnIn> TakeArrowBatch(const ArrowSchema& schema, const ArrowArray& batch,
                                     size_t* rows) {
  std::vector<ArrowColumn> columns;
  ArrowRefusal why;
  if (!TakeArrowColumns(schema, batch, rows, &columns, &why)) {
    Raise(why.kind == ArrowRefusal::kType      ? PyExc_TypeError
          : why.kind == ArrowRefusal::kUnicode ? PyExc_UnicodeError
                                               : PyExc_ValueError,
          why.message);
  }
  std::vector<ColumnIn> out(columns.size());
  for (size_t j = 0; j < columns.size(); ++j) {
    ArrowColumn& a = columns[j];
    ColumnIn& c = out[j];
    switch (a.kind) {
      case ArrowColumn::Kind::kInt:
        c.kind = ColumnIn::Kind::kInt;
        break;
      case ArrowColumn::Kind::kUint:
        c.kind = ColumnIn::Kind::kUint;
        break;
      case ArrowColumn::Kind::kFloat32:
        c.kind = ColumnIn::Kind::kFloat32;
        break;
      case ArrowColumn::Kind::kFloat64:
        c.kind = ColumnIn::Kind::kFloat64;
        break;
      case ArrowColumn::Kind::kBool:
        c.kind = ColumnIn::Kind::kBool;
        break;
      case ArrowColumn::Kind::kStrOffsets:
        c.kind = ColumnIn::Kind::kStrOffsets;
        break;
      case ArrowColumn::Kind::kBinOffsets:
        c.kind = ColumnIn::Kind::kBinOffsets;
        break;
    }
    c.name = std::move(a.name);
    c.packed_name = PackedName(c.name);
    c.itemsize = a.itemsize;
    c.offsets = a.offsets;
    c.offsets64 = a.offsets64;
    // (Moving a vector keeps its buffer: data and nulls still point into it.)
    c.owned_values = std::move(a.owned_values);
    c.owned_nulls = std::move(a.owned_nulls);
    c.data = a.data;
    c.nulls = a.nulls;
  }
  return out;
}

namespace {

// An exported schema: the struct and its children own their strings.
struct SchemaPrivate {
  std::string format, name;
  std::vector<ArrowSchema> children;
  std::vector<ArrowSchema*> child_ptrs;
};

void ReleaseSchema(ArrowSchema* s) {
  auto* p = static_cast<SchemaPrivate*>(s->private_data);
  for (ArrowSchema* c : p->child_ptrs) {
    if (c->release != nullptr) c->release(c);
  }
  delete p;
  s->release = nullptr;
}

void MakeSchema(const std::string& format, const std::string& name, ArrowSchema* out) {
  auto p = std::make_unique<SchemaPrivate>();
  p->format = format;
  p->name = name;
  *out = ArrowSchema{};
  out->format = p->format.c_str();
  out->name = p->name.c_str();
  out->flags = ARROW_FLAG_NULLABLE;
  out->release = ReleaseSchema;
  out->private_data = p.release();
}

struct StreamPrivate {
  std::unique_ptr<ArrowBatches> batches;
  std::string error;
};

// Runs a stream callback with the GIL, turning errors into errno and get_last_error's text.
template <typename F>
int WithGil(ArrowArrayStream* s, F&& f) {
  auto* p = static_cast<StreamPrivate*>(s->private_data);
  PyGILState_STATE g = PyGILState_Ensure();
  int rc = 0;
  try {
    absl::Status st = f(p);
    if (!st.ok()) {
      p->error = std::string(st.message());
      rc = EINVAL;
    }
  } catch (pb::error_already_set& e) {
    p->error = e.what();
    rc = EIO;
  } catch (const std::exception& e) {
    p->error = e.what();
    rc = EIO;
  }
  PyGILState_Release(g);
  return rc;
}

int GetSchema(ArrowArrayStream* s, ArrowSchema* out) {
  return WithGil(s, [&](StreamPrivate* p) -> absl::Status {
    std::vector<std::string> formats, names;
    absl::Status st = p->batches->Schema(&formats, &names);
    if (!st.ok()) return st;
    MakeSchema("+s", "", out);
    auto* sp = static_cast<SchemaPrivate*>(out->private_data);
    sp->children.resize(formats.size());
    for (size_t j = 0; j < formats.size(); ++j) {
      MakeSchema(formats[j], names[j], &sp->children[j]);
      sp->child_ptrs.push_back(&sp->children[j]);
    }
    out->flags = 0;
    out->n_children = static_cast<int64_t>(formats.size());
    out->children = sp->child_ptrs.data();
    return absl::OkStatus();
  });
}

int GetNext(ArrowArrayStream* s, ArrowArray* out) {
  return WithGil(s, [&](StreamPrivate* p) { return p->batches->Next(out); });
}

const char* GetLastError(ArrowArrayStream* s) {
  auto* p = static_cast<StreamPrivate*>(s->private_data);
  return p->error.empty() ? nullptr : p->error.c_str();
}

void ReleaseStream(ArrowArrayStream* s) {
  PyGILState_STATE g = PyGILState_Ensure();  // the batches hold Python objects
  delete static_cast<StreamPrivate*>(s->private_data);
  PyGILState_Release(g);
  s->release = nullptr;
}

}  // namespace

pb::capsule ExportStream(std::unique_ptr<ArrowBatches> batches) {
  auto* stream = new ArrowArrayStream{};
  auto p = std::make_unique<StreamPrivate>();
  p->batches = std::move(batches);
  stream->get_schema = GetSchema;
  stream->get_next = GetNext;
  stream->get_last_error = GetLastError;
  stream->release = ReleaseStream;
  stream->private_data = p.release();
  // The capsule's destructor releases a stream no consumer moved out, then frees the struct.
  return pb::capsule(stream, "arrow_array_stream", [](PyObject* cap) {
    auto* st = static_cast<ArrowArrayStream*>(PyCapsule_GetPointer(cap, "arrow_array_stream"));
    if (st == nullptr) {
      PyErr_Clear();
      return;
    }
    if (st->release != nullptr) st->release(st);
    delete st;
  });
}

// --- a reader's batches as Arrow arrays ---------------------------------------------------

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

}  // namespace sluice::py
