#include "client/python/py_reader.h"

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

// A reader's batch buffers. Fresh memory is slow to touch (a page fault per 4 KiB), so a process
// keeps a few sets from readers that ended for the next ones: a reducer reading partition after
// partition touches its buffers once.
struct ReadBuffers {
  std::string arena;
  std::vector<RecordAt> records;
  ColumnDecoder columns;
};

class BufferPool {
 public:
  static std::unique_ptr<ReadBuffers> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return std::make_unique<ReadBuffers>();
    std::unique_ptr<ReadBuffers> b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  static void Give(std::unique_ptr<ReadBuffers> b) {
    if (b == nullptr || b->arena.capacity() + b->records.capacity() * sizeof(RecordAt) +
                                b->columns.retained_bytes() >
                            kKeepBytes) {
      return;  // a whole partition's (to_pandas): freed
    }
    b->arena.clear();
    b->records.clear();
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < kKeep) free_.push_back(std::move(b));
  }

 private:
  static constexpr size_t kKeep = 2;
  static constexpr size_t kKeepBytes = 32u << 20;
  static inline std::mutex mu_;
  static inline std::vector<std::unique_ptr<ReadBuffers>> free_;
};

class Reader {
 public:
  Reader(std::unique_ptr<ShuffleReader> r, bool raw, bool allow_pickle)
      : reader_(std::move(r)),
        raw_(raw),
        allow_pickle_(allow_pickle),
        buffers_(BufferPool::Take()),
        arena_(buffers_->arena),
        records_(buffers_->records),
        columns_(buffers_->columns) {}
  ~Reader() {
    {
      pb::gil_scoped_release release;
      reader_.reset();
    }
    BufferPool::Give(std::move(buffers_));
  }

  // Up to `max_records` (key, value) pairs, decoded; an empty list at the end. The fetch runs
  // without the GIL; records are copied out (the reader's views end at its next call).
  pb::list NextBatch(size_t max_records) {
    auto lock = LockWithoutGil(mu_);
    pb::list out;
    Fetch(max_records, kBatchBytes, /*whole_groups=*/false);
    for (size_t i = 0; i < records_.size(); ++i) {
      out.append(pb::make_tuple(Unpack(Key(i), allow_pickle_, /*as_key=*/true), Value(i)));
    }
    return out;
  }

  // Whole groups: (key, [values]) for runs of equal key bytes (the order and the routing are
  // by those bytes, so grouping is too: 1 and True, or 1 and 1.0, are different keys). A group
  // may span batches: it is returned once it is complete. An empty list at the end.
  pb::list NextGroups(size_t max_records) {
    auto lock = LockWithoutGil(mu_);
    pb::list out;
    while (out.empty() && (reader_ != nullptr || group_open_)) {
      Fetch(max_records, kBatchBytes, /*whole_groups=*/false);
      for (size_t i = 0; i < records_.size(); ++i) {
        const std::string_view key = Key(i);
        if (group_open_ && key == group_key_) {
          group_values_.append(Value(i));
          continue;
        }
        if (group_open_) out.append(pb::make_tuple(group_decoded_, group_values_));
        group_key_ = key;
        group_decoded_ = Unpack(key, allow_pickle_, /*as_key=*/true);
        group_values_ = pb::list();
        group_values_.append(Value(i));
        group_open_ = true;
      }
      if (reader_ == nullptr && group_open_) {  // the end: the last group is complete
        out.append(pb::make_tuple(group_decoded_, group_values_));
        group_open_ = false;
      }
    }
    return out;
  }

  // Up to `max_records` records (and about `max_bytes` of them; 0 = no bound) as columns
  // (ColumnDecoder::ToPython's tuple), or None at the end. `key_column`: the keys as a column
  // of that name too. `whole_groups`: the batch ends where a key does (a key's records are never
  // split over two batches), with the runs of equal keys. A batch that cannot be columns raises
  // ValueError and ends the read.
  pb::object NextColumns(size_t max_records, size_t max_bytes, const std::string& key_column,
                         bool whole_groups, const std::optional<std::vector<std::string>>& only) {
    auto lock = LockWithoutGil(mu_);
    if (max_bytes == 0) max_bytes = std::numeric_limits<size_t>::max();
    const Clock::time_point t0 = Clock::now();
    Fetch(max_records, max_bytes, whole_groups);
    const Clock::time_point t1 = Clock::now();
    fetch_s_ += Seconds(t1 - t0);
    if (records_.empty()) return pb::none();
    absl::Status st = CallWithoutGil(
        [&] { return columns_.Decode(arena_, records_, key_column, whole_groups, Only(only)); });
    const Clock::time_point t2 = Clock::now();
    decode_s_ += Seconds(t2 - t1);
    if (!st.ok()) {
      {
        pb::gil_scoped_release release;
        reader_.reset();
      }
      has_pending_ = false;
      PyErr_SetString(PyExc_ValueError, std::string(st.message()).c_str());
      throw pb::error_already_set();
    }
    pb::tuple out = columns_.ToPython(arena_, records_, allow_pickle_);
    to_python_s_ += Seconds(Clock::now() - t2);
    return out;
  }

  // The next batch (up to `max_records` records) as an Arrow struct array fitting the stream's
  // schema (`formats`, `names`; filled by the first batch); out->release == nullptr at the end.
  absl::Status NextArrow(size_t max_records, const std::string& key_column,
                         const std::optional<std::vector<std::string>>& only,
                         std::vector<std::string>* formats, std::vector<std::string>* names,
                         ArrowArray* out) {
    auto lock = LockWithoutGil(mu_);
    *out = ArrowArray{};
    Fetch(max_records, 64u << 20, /*whole_groups=*/false);
    if (records_.empty()) return absl::OkStatus();
    return CallWithoutGil([&] {
      absl::Status st = columns_.Decode(arena_, records_, key_column, false, Only(only));
      return st.ok() ? columns_.ToArrow(arena_, formats, names, out) : st;
    });
  }

  // Seconds spent so far in next_columns: fetching records, parsing them into columns, and
  // making the numpy arrays (and str objects). For the bench's per-step costs.
  pb::dict Timings() {
    auto lock = LockWithoutGil(mu_);
    pb::dict d;
    d["fetch_s"] = fetch_s_;
    d["decode_s"] = decode_s_;
    d["to_python_s"] = to_python_s_;
    return d;
  }

  void Close() {
    auto lock = LockWithoutGil(mu_);
    pb::gil_scoped_release release;
    reader_.reset();  // cancels the fetch
    has_pending_ = false;
  }

 private:
  std::string_view Key(size_t i) const {
    return std::string_view(arena_).substr(records_[i].at, records_[i].key_size);
  }
  pb::object Value(size_t i) const {
    const std::string_view v = std::string_view(arena_).substr(
        records_[i].at + records_[i].key_size, records_[i].value_size);
    return raw_ ? pb::bytes(v.data(), v.size()) : Unpack(v, allow_pickle_);
  }

  static constexpr size_t kBatchBytes = 4u << 20;

  static const std::vector<std::string>* Only(const std::optional<std::vector<std::string>>& o) {
    return o.has_value() ? &*o : nullptr;
  }

  // Up to `max_records` records (and about `max_bytes`) into arena_ and records_ (copies: the
  // reader's views end at its next call), without the GIL; reader_ is reset at the end. With
  // `whole_groups`, the batch goes on while the key stays that of its last record, and the first
  // record of the next key waits in pending_ for the next batch. Raises the reader's error.
  void Fetch(size_t max_records, size_t max_bytes, bool whole_groups) {
    if (max_records == 0) {
      PyErr_SetString(PyExc_ValueError, "a batch is at least 1 record");
      throw pb::error_already_set();
    }
    arena_.clear();
    records_.clear();
    if (has_pending_) {
      records_.push_back({0, pending_key_size_, pending_.size() - pending_key_size_});
      arena_.append(pending_);
      has_pending_ = false;
    }
    if (reader_ == nullptr) return;
    absl::Status failed;
    {
      pb::gil_scoped_release release;
      Record r;
      while (true) {
        const bool full = records_.size() >= max_records || arena_.size() >= max_bytes;
        if (full && !whole_groups) break;
        absl::StatusOr<bool> more = reader_->Next(&r);
        if (!more.ok()) {
          failed = more.status();
          break;
        }
        if (!*more) {
          reader_.reset();
          break;
        }
        if (full && r.key != Key(records_.size() - 1)) {  // the next key's first record
          pending_.assign(r.key);
          pending_.append(r.value);
          pending_key_size_ = r.key.size();
          has_pending_ = true;
          break;
        }
        records_.push_back({arena_.size(), r.key.size(), r.value.size()});
        arena_.append(r.key);
        arena_.append(r.value);
      }
    }
    if (!failed.ok()) {
      reader_.reset();
      group_open_ = false;
      has_pending_ = false;
      Throw(failed);
    }
  }

  std::mutex mu_;
  std::unique_ptr<ShuffleReader> reader_;
  const bool raw_, allow_pickle_;
  // The batch Fetch copied: each record's key then value, one after another in arena_ (a
  // buffer reused from batch to batch).
  std::unique_ptr<ReadBuffers> buffers_;
  std::string& arena_;
  std::vector<RecordAt>& records_;
  // Fetch with whole_groups: the first record of the next batch (key, then value).
  bool has_pending_ = false;
  std::string pending_;
  size_t pending_key_size_ = 0;
  ColumnDecoder& columns_;
  double fetch_s_ = 0, decode_s_ = 0, to_python_s_ = 0;
  // NextGroups: the group still open at the end of the last batch.
  bool group_open_ = false;
  std::string group_key_;
  pb::object group_decoded_;
  pb::list group_values_;
};

// A reader's batches for an exported Arrow stream: the schema is the first batch's.
class ReaderBatches : public ArrowBatches {
 public:
  ReaderBatches(pb::object reader, size_t rows, std::string keys,
                std::optional<std::vector<std::string>> only)
      : keep_(std::move(reader)),
        reader_(keep_.cast<Reader*>()),
        rows_(rows),
        keys_(std::move(keys)),
        only_(std::move(only)) {}
  ~ReaderBatches() override {
    if (first_.release != nullptr) first_.release(&first_);
  }
  absl::Status Schema(std::vector<std::string>* formats, std::vector<std::string>* names) override {
    absl::Status st = Start();
    *formats = formats_;
    *names = names_;
    return st;
  }
  absl::Status Next(ArrowArray* out) override {
    if (absl::Status st = Start(); !st.ok()) return st;
    if (first_.release != nullptr) {
      *out = first_;
      first_.release = nullptr;
      return absl::OkStatus();
    }
    *out = ArrowArray{};
    if (ended_) return absl::OkStatus();
    absl::Status st = reader_->NextArrow(rows_, keys_, only_, &formats_, &names_, out);
    if (out->release == nullptr) ended_ = true;
    return st;
  }

 private:
  // Reads the first batch, which gives the schema; its error is every later call's too.
  absl::Status Start() {
    if (started_) return start_error_;
    started_ = true;
    try {
      start_error_ = reader_->NextArrow(rows_, keys_, only_, &formats_, &names_, &first_);
    } catch (pb::error_already_set& e) {  // the read failed (a sluice.Error): so do later calls
      start_error_ = absl::UnavailableError(e.what());
      throw;
    }
    if (first_.release == nullptr) ended_ = true;
    return start_error_;
  }
  pb::object keep_;  // the Python reader, alive while the stream is
  Reader* reader_;
  const size_t rows_;
  const std::string keys_;
  const std::optional<std::vector<std::string>> only_;
  std::vector<std::string> formats_, names_;
  bool started_ = false, ended_ = false;
  absl::Status start_error_;
  ArrowArray first_{};
};

}  // namespace

void BindReader(pybind11::module_& m) {
  namespace pb = pybind11;
  pb::class_<Reader>(m, "Reader")
      .def("next_batch", &Reader::NextBatch, pb::arg("max_records") = 1024)
      .def("next_groups", &Reader::NextGroups, pb::arg("max_records") = 1024)
      .def("next_columns", &Reader::NextColumns, pb::arg("max_records"), pb::arg("max_bytes"),
           pb::arg("key_column"), pb::arg("whole_groups"), pb::arg("only") = pb::none())
      .def("timings", &Reader::Timings)
      .def(
          "arrow_stream",
          [](pb::object self, size_t rows, const std::string& keys,
             std::optional<std::vector<std::string>> only) {
            if (rows == 0) throw pb::value_error("a batch is at least 1 record");
            return ExportStream(
                std::make_unique<ReaderBatches>(std::move(self), rows, keys, std::move(only)));
          },
          pb::arg("rows"), pb::arg("key_column"), pb::arg("only") = pb::none())
      .def("close", &Reader::Close);
}

pybind11::object NewReader(std::unique_ptr<ShuffleReader> reader, bool raw, bool allow_pickle) {
  return pybind11::cast(std::make_unique<Reader>(std::move(reader), raw, allow_pickle));
}

}  // namespace sluice::py
