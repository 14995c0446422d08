#include "client/python/py_writer.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/python/py_arrow.h"
#include "client/python/py_call.h"
#include "client/python/py_column_decoder.h"
#include "client/python/py_columns.h"
#include "client/python/py_msgpack.h"
#include "client/shuffle_client.h"
#include "rpc/error_reason.h"

namespace sluice::py {
namespace {

namespace pb = pybind11;

class Writer {
 public:
  Writer(std::unique_ptr<ShuffleWriter> w, bool pickle_fallback)
      : writer_(std::move(w)), pickle_fallback_(pickle_fallback) {}

  void Write(pb::handle key, pb::handle value) {
    auto lock = LockWithoutGil(mu_);  // one thread at a time
    Live();
    key_.clear();
    value_.clear();
    Pack(key, false, &key_);
    Pack(value, pickle_fallback_, &value_);
    absl::Status st = CallWithoutGil([&] { return writer_->Add(key_, value_); });
    Check(st);
  }

  // (key, value) pairs from any iterable; encoded in batches with the GIL, added without it.
  uint64_t WriteMany(pb::iterable items) {
    auto lock = LockWithoutGil(mu_);
    Live();
    constexpr size_t kBatchBytes = 1 << 20;
    std::vector<std::pair<size_t, size_t>> cuts;  // key end, value end in buf_
    uint64_t n = 0;
    auto flush = [&] {
      absl::Status st;
      {
        pb::gil_scoped_release release;
        size_t at = 0;
        for (const auto& [kend, vend] : cuts) {
          st = writer_->Add(std::string_view(buf_).substr(at, kend - at),
                            std::string_view(buf_).substr(kend, vend - kend));
          if (!st.ok()) break;
          at = vend;
        }
      }
      buf_.clear();
      cuts.clear();
      Check(st);
    };
    buf_.clear();
    try {
      for (pb::handle item : items) {
        if (!PyTuple_Check(item.ptr()) || PyTuple_GET_SIZE(item.ptr()) != 2) {
          PyErr_SetString(PyExc_TypeError, "write_many takes (key, value) pairs");
          throw pb::error_already_set();
        }
        Pack(PyTuple_GET_ITEM(item.ptr(), 0), false, &buf_);
        const size_t kend = buf_.size();
        Pack(PyTuple_GET_ITEM(item.ptr(), 1), pickle_fallback_, &buf_);
        cuts.emplace_back(kend, buf_.size());
        ++n;
        if (buf_.size() >= kBatchBytes) flush();
      }
      flush();
    } catch (...) {
      // Some pairs were added and some not: a commit now would have a hole. The attempt is
      // discarded; close() says so, and a new attempt starts over.
      DiscardAttempt();
      throw;
    }
    return n;
  }

  // Rows of numpy columns (py_columns.h): each row a record whose key is its `key` column and
  // whose value is the map of its columns, built and added without the GIL. A column that
  // cannot be taken raises before any row is added; a failure while adding discards the attempt
  // as write_many's does.
  uint64_t WriteColumns(pb::handle cols, const std::string& key) {
    auto lock = LockWithoutGil(mu_);
    Live();
    size_t rows = 0;
    std::vector<ColumnIn> in = TakeColumns(cols, &rows);
    return AddRows(in, rows, key);
  }

  // An Arrow stream (a PyCapsule "arrow_array_stream", moved out of it here), batch by batch
  // as write_columns. A batch that cannot be taken after others were added discards the
  // attempt, as a failure while adding does.
  uint64_t WriteArrowStream(pb::capsule cap, const std::string& key) {
    auto lock = LockWithoutGil(mu_);
    Live();
    auto* src =
        static_cast<ArrowArrayStream*>(PyCapsule_GetPointer(cap.ptr(), "arrow_array_stream"));
    if (src == nullptr) throw pb::error_already_set();
    if (src->release == nullptr) {
      PyErr_SetString(PyExc_ValueError, "the Arrow stream was consumed already");
      throw pb::error_already_set();
    }
    ArrowArrayStream stream = *src;
    src->release = nullptr;  // ours now
    ArrowReleaser<ArrowArrayStream> stream_guard{&stream};
    auto failed = [&](int rc, const char* what) {
      const char* e = stream.get_last_error(&stream);
      PyErr_SetString(PyExc_ValueError, (std::string("the Arrow stream failed to give its ") +
                                         what + ": " + (e ? e : std::strerror(rc)))
                                            .c_str());
      throw pb::error_already_set();
    };
    ArrowSchema schema{};
    ArrowReleaser<ArrowSchema> schema_guard{&schema};
    if (int rc = stream.get_schema(&stream, &schema); rc != 0) failed(rc, "schema");
    uint64_t total = 0;
    try {
      while (true) {
        ArrowArray batch{};
        ArrowReleaser<ArrowArray> batch_guard{&batch};
        if (int rc = stream.get_next(&stream, &batch); rc != 0) failed(rc, "next batch");
        if (batch.release == nullptr) break;
        size_t rows = 0;
        std::vector<ColumnIn> in = TakeArrowBatch(schema, batch, &rows);
        total += AddRows(in, rows, key);
      }
    } catch (...) {
      if (total > 0 && writer_ != nullptr) DiscardAttempt();
      throw;
    }
    return total;
  }

  // One record batch: a PyCapsule "arrow_schema" and one "arrow_array" (__arrow_c_array__).
  uint64_t WriteArrowArray(pb::capsule schema_cap, pb::capsule array_cap, const std::string& key) {
    auto lock = LockWithoutGil(mu_);
    Live();
    auto* sp = static_cast<ArrowSchema*>(PyCapsule_GetPointer(schema_cap.ptr(), "arrow_schema"));
    if (sp == nullptr) throw pb::error_already_set();
    auto* ap = static_cast<ArrowArray*>(PyCapsule_GetPointer(array_cap.ptr(), "arrow_array"));
    if (ap == nullptr) throw pb::error_already_set();
    if (ap->release == nullptr) {
      PyErr_SetString(PyExc_ValueError, "the Arrow array was consumed already");
      throw pb::error_already_set();
    }
    ArrowArray batch = *ap;
    ap->release = nullptr;  // moved out: ours now; the schema stays the capsule's
    ArrowReleaser<ArrowArray> batch_guard{&batch};
    size_t rows = 0;
    std::vector<ColumnIn> in = TakeArrowBatch(*sp, batch, &rows);
    return AddRows(in, rows, key);
  }

  // Adds the rows of `in` (GIL held on entry; released while rows are made and added).
  uint64_t AddRows(std::vector<ColumnIn>& in, size_t rows, const std::string& key) {
    size_t key_col = 0;
    while (key_col < in.size() && in[key_col].name != key) ++key_col;
    if (key_col == in.size()) {
      PyErr_SetString(PyExc_ValueError,
                      ("no column named '" + key + "' to key the rows by").c_str());
      throw pb::error_already_set();
    }
    absl::Status st;
    {
      // Rows are made a megabyte at a time, then added: two phases, timed apart (timings()).
      pb::gil_scoped_release release;
      RowEncoder rows_of(in, key_col);
      std::vector<std::pair<size_t, size_t>> cuts;  // value end, key end in buf_
      for (size_t i = 0; i < rows && st.ok();) {
        const Clock::time_point t0 = Clock::now();
        buf_.clear();
        cuts.clear();
        for (; i < rows && buf_.size() < (1u << 20); ++i) {
          const size_t at = buf_.size();
          const size_t value_size = rows_of.AppendRow(i, &buf_);
          cuts.emplace_back(at + value_size, buf_.size());
        }
        const Clock::time_point t1 = Clock::now();
        size_t at = 0;
        for (const auto& [vend, kend] : cuts) {
          st = writer_->Add(std::string_view(buf_).substr(vend, kend - vend),
                            std::string_view(buf_).substr(at, vend - at));
          if (!st.ok()) break;
          at = kend;
        }
        encode_s_ += Seconds(t1 - t0);
        add_s_ += Seconds(Clock::now() - t1);
      }
    }
    if (!st.ok()) {
      DiscardAttempt();
      Throw(st);
    }
    return rows;
  }

  void DiscardAttempt() {
    {
      pb::gil_scoped_release release;
      writer_->Abort();
    }
    writer_.reset();
    failed_ = true;
  }

  pb::dict Close() {
    auto lock = LockWithoutGil(mu_);
    Live();
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<WriteResult> r = CallWithoutGil([&] { return writer_->Close(); });
    close_s_ = Seconds(Clock::now() - t0);
    writer_.reset();
    WriteResult res = Check(std::move(r));
    pb::dict d;
    d["duplicate"] = res.duplicate;
    d["winning_attempt"] = res.winning_attempt;
    d["frames"] = res.frames;
    d["records"] = res.records;
    d["bytes"] = res.bytes;
    return d;
  }

  // Seconds spent so far: making rows of columns, adding them to the writer, and closing it
  // (the last flush, pushes and the commit). For the bench's per-step costs.
  pb::dict Timings() {
    auto lock = LockWithoutGil(mu_);
    pb::dict d;
    d["encode_rows_s"] = encode_s_;
    d["add_s"] = add_s_;
    d["close_s"] = close_s_;
    return d;
  }

  void Abort() {
    auto lock = LockWithoutGil(mu_);
    if (writer_ == nullptr) return;
    pb::gil_scoped_release release;
    writer_->Abort();
    writer_.reset();
  }

 private:
  void Live() const {
    if (failed_) {
      Throw(absl::FailedPreconditionError(
          "write_many or write_columns failed part-way, so the attempt was discarded; write it "
          "again with a new writer"));
    }
    if (writer_ == nullptr) Throw(absl::FailedPreconditionError("the writer is closed"));
  }
  std::mutex mu_;
  std::unique_ptr<ShuffleWriter> writer_;
  const bool pickle_fallback_;
  bool failed_ = false;  // write_many or write_columns failed part-way: the attempt was discarded
  std::string key_, value_, buf_;
  double encode_s_ = 0, add_s_ = 0, close_s_ = 0;
};

}  // namespace

void BindWriter(pybind11::module_& m) {
  namespace pb = pybind11;
  pb::class_<Writer>(m, "Writer")
      .def("write", &Writer::Write, pb::arg("key"), pb::arg("value"))
      .def("write_many", &Writer::WriteMany, pb::arg("items"))
      .def("write_columns", &Writer::WriteColumns, pb::arg("columns"), pb::arg("key"))
      .def("timings", &Writer::Timings)
      .def("write_arrow_stream", &Writer::WriteArrowStream, pb::arg("stream"), pb::arg("key"))
      .def("write_arrow_array", &Writer::WriteArrowArray, pb::arg("schema"), pb::arg("array"),
           pb::arg("key"))
      .def("close", &Writer::Close)
      .def("abort", &Writer::Abort);
}

pybind11::object NewWriter(std::unique_ptr<ShuffleWriter> writer, bool pickle_fallback) {
  return pybind11::cast(std::make_unique<Writer>(std::move(writer), pickle_fallback));
}

}  // namespace sluice::py
