#include "client/python/py_arrow.h"

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/python/py_msgpack.h"
#include "codec/endian.h"

namespace sluice::py {

namespace pb = pybind11;

namespace {

bool Bit(const void* bitmap, int64_t i) {
  return (static_cast<const uint8_t*>(bitmap)[i / 8] >> (i % 8)) & 1;
}

}  // namespace

std::vector<ColumnIn> TakeArrowBatch(const ArrowSchema& schema, const ArrowArray& batch,
                                     size_t* rows) {
  if (schema.format == nullptr || std::strcmp(schema.format, "+s") != 0) {
    Raise(PyExc_TypeError, absl::StrCat("an Arrow stream of record batches (struct arrays) is "
                                        "taken, not one of format '",
                                        schema.format ? schema.format : "", "'"));
  }
  if (batch.n_children != schema.n_children || batch.length < 0 || batch.offset < 0) {
    Raise(PyExc_ValueError, "an Arrow batch does not fit its schema");
  }
  if (batch.null_count != 0 && batch.n_buffers > 0 && batch.buffers != nullptr &&
      batch.buffers[0] != nullptr) {
    Raise(PyExc_TypeError, "an Arrow batch with null rows (not null values) has no rows to write");
  }
  const int64_t n = batch.length;
  *rows = static_cast<size_t>(n);
  std::vector<ColumnIn> out;
  for (int64_t j = 0; j < schema.n_children; ++j) {
    if (schema.children == nullptr || schema.children[j] == nullptr || batch.children == nullptr ||
        batch.children[j] == nullptr) {
      Raise(PyExc_ValueError, "an Arrow batch lacks a column its schema has");
    }
    const ArrowSchema& cs = *schema.children[j];
    const ArrowArray& ca = *batch.children[j];
    ColumnIn c;
    c.name = cs.name != nullptr ? cs.name : "";
    const std::string format = cs.format != nullptr ? cs.format : "";
    const std::string col = "column '" + c.name + "'";
    if (cs.dictionary != nullptr || ca.dictionary != nullptr) {
      Raise(PyExc_TypeError, col + " is dictionary-encoded (categorical): decode it first");
    }
    const int64_t off = batch.offset + ca.offset;
    if (ca.length < batch.offset + n || ca.offset < 0) {
      Raise(PyExc_ValueError, col + " is shorter than its batch");
    }
    auto buffer = [&](int64_t k) -> const uint8_t* {
      if (ca.n_buffers <= k || ca.buffers == nullptr || ca.buffers[k] == nullptr) {
        Raise(PyExc_ValueError, col + " lacks a buffer its format needs");
      }
      return static_cast<const uint8_t*>(ca.buffers[k]);
    };
    auto fixed = [&](ColumnIn::Kind kind, size_t size) {
      c.kind = kind;
      c.itemsize = size;
      c.data = n == 0 ? nullptr : buffer(1) + off * size;
    };
    if (format == "n") {  // the null type: every value is null
      c.kind = ColumnIn::Kind::kBool;
      c.itemsize = 1;
      c.owned_values.assign(n, 0);
      c.owned_nulls.assign(n, 1);
      c.data = c.owned_values.data();
      c.nulls = c.owned_nulls.data();
    } else {
      if (format == "c" || format == "s" || format == "i" || format == "l") {
        fixed(ColumnIn::Kind::kInt, format == "c" ? 1 : format == "s" ? 2 : format == "i" ? 4 : 8);
      } else if (format == "C" || format == "S" || format == "I" || format == "L") {
        fixed(ColumnIn::Kind::kUint, format == "C" ? 1 : format == "S" ? 2 : format == "I" ? 4 : 8);
      } else if (format == "f") {
        fixed(ColumnIn::Kind::kFloat32, 4);
      } else if (format == "g") {
        fixed(ColumnIn::Kind::kFloat64, 8);
      } else if (format == "b") {
        c.kind = ColumnIn::Kind::kBool;
        c.itemsize = 1;
        c.owned_values.resize(n);
        const uint8_t* bits = n == 0 ? nullptr : buffer(1);
        for (int64_t i = 0; i < n; ++i) c.owned_values[i] = Bit(bits, off + i);
        c.data = c.owned_values.data();
      } else if (format == "u" || format == "U" || format == "z" || format == "Z") {
        const bool str = format == "u" || format == "U";
        c.kind = str ? ColumnIn::Kind::kStrOffsets : ColumnIn::Kind::kBinOffsets;
        c.offsets64 = format == "U" || format == "Z";
        const size_t w = c.offsets64 ? 8 : 4;
        if (n > 0) {
          c.offsets = buffer(1) + off * w;
          c.data = buffer(2);
          auto at = [&](int64_t i) -> int64_t {
            return c.offsets64 ? static_cast<int64_t>(LoadLE64(c.offsets + 8 * i))
                               : static_cast<int32_t>(LoadLE32(c.offsets + 4 * i));
          };
          for (int64_t i = 0; i < n; ++i) {
            const int64_t from = at(i), to = at(i + 1);
            if (from < 0 || to < from || to - from > 0xffffffffLL) {
              Raise(PyExc_ValueError, absl::StrCat(col, ", row ", i, ": bad offsets"));
            }
            if (str && !IsUtf8(c.data + from, static_cast<size_t>(to - from))) {
              Raise(PyExc_UnicodeError, absl::StrCat(col, ", row ", i, ": not UTF-8"));
            }
          }
        }
      } else {
        Raise(PyExc_TypeError,
              absl::StrCat(col, " has Arrow format '", format,
                           "': columns carry ints, floats (32 or 64 bits), bools, utf8, binary "
                           "and nulls; cast it first"));
      }
      if (ca.null_count != 0 && n > 0 && ca.n_buffers > 0 && ca.buffers != nullptr &&
          ca.buffers[0] != nullptr) {
        c.owned_nulls.resize(n);
        for (int64_t i = 0; i < n; ++i) c.owned_nulls[i] = !Bit(ca.buffers[0], off + i);
        c.nulls = c.owned_nulls.data();
      }
    }
    for (const ColumnIn& other : out) {
      if (other.name == c.name) Raise(PyExc_ValueError, "two columns are named '" + c.name + "'");
    }
    c.packed_name = PackedName(c.name);
    out.push_back(std::move(c));
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

}  // namespace sluice::py
