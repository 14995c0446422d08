// _sluice: the Python client's native part (the package `sluice`, client/python/sluice/, wraps
// it). Encoding, compression and gRPC run in C++ with the GIL released; Python objects are
// turned into msgpack and back in C++ (py_msgpack.h). Errors are raised as sluice.Error with
// `code` (the gRPC status name, "NOT_FOUND", ...) and `message`.
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
#include "client/python/py_column_decoder.h"
#include "client/python/py_columns.h"
#include "client/python/py_msgpack.h"
#include "client/shuffle_client.h"
#include "rpc/error_reason.h"

namespace sluice::py {
namespace {

namespace pb = pybind11;

PyObject* g_error = nullptr;  // sluice._sluice.Error

[[noreturn]] void Throw(const absl::Status& st) {
  pb::object err = pb::reinterpret_borrow<pb::object>(g_error)(std::string(st.message()));
  err.attr("code") = absl::StatusCodeToString(st.code());
  err.attr("message") = std::string(st.message());
  // What an engine decides on (docs/api.md, "Errors and retries").
  err.attr("retryable") = Retryable(st);
  const ErrorReason reason = ReasonOf(st);
  err.attr("reason") = reason == ErrorReason::kNone ? pb::object(pb::none())
                                                    : pb::object(pb::str(ReasonName(reason)));
  const auto after = RetryAfterOf(st);
  err.attr("retry_after") =
      after.count() > 0 ? pb::object(pb::float_(after.count() / 1000.0)) : pb::none();
  PyErr_SetObject(g_error, err.ptr());
  throw pb::error_already_set();
}

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) Throw(v.status());
  return std::move(v).value();
}
void Check(const absl::Status& st) {
  if (!st.ok()) Throw(st);
}

// Takes `mu` with the GIL let go while it waits: a thread holding the GIL must never wait for a
// lock whose holder needs the GIL back (writers and readers let it go around their calls).
std::unique_lock<std::mutex> LockWithoutGil(std::mutex& mu) {
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  if (!lock.try_lock()) {
    pb::gil_scoped_release release;
    lock.lock();
  }
  return lock;
}

// Runs a client call (which may block on the network) with the GIL let go; other Python
// threads run meanwhile. What it returns is checked once the GIL is back.
template <typename F>
auto CallWithoutGil(F&& call) -> decltype(call()) {
  pb::gil_scoped_release release;
  return call();
}

using Clock = std::chrono::steady_clock;
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::chrono::milliseconds Millis(double seconds) {
  if (!(seconds > 0) || seconds > 86400.0 * 365) {
    PyErr_SetString(PyExc_ValueError, "a timeout must be more than 0 and at most a year");
    throw pb::error_already_set();
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

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

class Client {
 public:
  Client(const std::string& servers, double call_timeout_s, bool tls, const std::string& tls_ca,
         const std::string& tls_cert, const std::string& tls_key,
         const std::string& tls_server_name, const std::string& token, double keepalive_s,
         double keepalive_timeout_s, double placement_ttl_s, double unhealthy_for_s,
         double stream_timeout_s) {
    ClientOptions o;
    o.server = servers;
    o.call_deadline = Millis(call_timeout_s);
    o.keepalive_time = Millis(keepalive_s);
    o.keepalive_timeout = Millis(keepalive_timeout_s);
    o.placement_ttl = Millis(placement_ttl_s);
    o.unhealthy_for = Millis(unhealthy_for_s);
    if (stream_timeout_s != 0) o.stream_deadline = Millis(stream_timeout_s);  // 0: none
    o.tls.enabled = tls;
    o.tls.ca_file = tls_ca;
    o.tls.cert_file = tls_cert;
    o.tls.key_file = tls_key;
    o.tls.server_name = tls_server_name;
    o.token = token;
    absl::StatusOr<std::unique_ptr<ShuffleClient>> c =
        CallWithoutGil([&] { return ShuffleClient::Connect(o); });
    client_ = Check(std::move(c));
  }

  bool CreateShuffle(const std::string& id, uint32_t partitions, uint32_t mappers,
                     uint32_t replication) {
    absl::StatusOr<bool> r = CallWithoutGil(
        [&] { return client_->CreateShuffle(id, partitions, mappers, replication); });
    return Check(std::move(r));
  }

  void DeleteShuffle(const std::string& id) {
    absl::Status st = CallWithoutGil([&] { return client_->DeleteShuffle(id); });
    Check(st);
  }

  pb::dict GetShuffle(const std::string& id, uint32_t hot_keys) {
    StatusOptions options;
    options.hot_keys = hot_keys;
    absl::StatusOr<ShuffleStatus> r =
        CallWithoutGil([&] { return client_->GetShuffle(id, options); });
    ShuffleStatus s = Check(std::move(r));
    pb::dict d;
    d["shuffle_id"] = s.shuffle_id;
    d["num_partitions"] = s.num_partitions;
    d["num_mappers"] = s.num_mappers;
    d["committed_mappers"] = s.committed_mappers;
    pb::list parts;
    for (const auto& p : s.partitions) {
      pb::dict pd;
      pd["records"] = p.records;
      pd["bytes"] = p.bytes;
      pd["frames"] = p.frames;
      if (hot_keys > 0) {
        pb::list hot;
        for (const auto& h : p.hot_keys) {
          pb::dict hd;
          hd["key"] = pb::bytes(h.key);
          hd["cut"] = h.cut;
          hd["records"] = h.records;
          hd["bytes"] = h.bytes;
          hd["error"] = h.error;
          hot.append(hd);
        }
        pd["hot_keys"] = hot;
      }
      parts.append(pd);
    }
    d["partitions"] = parts;
    d["damaged"] = s.damaged;
    d["unavailable_partitions"] = s.unavailable_partitions;
    d["under_replicated_partitions"] = s.under_replicated_partitions;
    pb::dict lost;  // partition -> the mappers whose records of it no server holds
    for (const auto& l : s.lost_partitions) lost[pb::int_(l.partition)] = l.mappers;
    d["lost_partitions"] = lost;
    d["placement_epoch"] = s.placement_epoch;
    return d;
  }

  pb::dict GetSplits(const std::string& id, uint32_t partition, uint32_t slices) {
    absl::StatusOr<SplitKeys> r =
        CallWithoutGil([&] { return client_->GetSplits(id, partition, slices); });
    SplitKeys s = Check(std::move(r));
    pb::dict d;
    pb::list keys;
    for (const std::string& k : s.keys) keys.append(pb::bytes(k));
    d["keys"] = keys;
    d["slice_bytes"] = s.slice_bytes;
    d["partition_bytes"] = s.partition_bytes;
    d["frames"] = s.frames;
    d["frames_without_bounds"] = s.frames_without_bounds;
    return d;
  }

  pb::dict RevokeMappers(const std::string& id, const std::vector<uint32_t>& mappers,
                         uint32_t placement_epoch) {
    absl::StatusOr<ShuffleClient::Revocation> r =
        CallWithoutGil([&] { return client_->RevokeMappers(id, mappers, placement_epoch); });
    ShuffleClient::Revocation done = Check(std::move(r));
    pb::dict d;
    d["placement_epoch"] = done.placement_epoch;
    d["attempts"] = done.attempts;
    return d;
  }

  std::unique_ptr<Writer> OpenWriter(const std::string& id, uint32_t mapper, uint64_t attempt,
                                     bool sort_by_key, size_t buffer_bytes, int zstd_level,
                                     bool pickle_fallback) {
    WriterOptions o;
    o.sort_by_key = sort_by_key;
    o.buffer_bytes = buffer_bytes;
    o.zstd_level = zstd_level;
    absl::StatusOr<std::unique_ptr<ShuffleWriter>> w =
        CallWithoutGil([&] { return client_->OpenWriter(id, mapper, attempt, o); });
    return std::make_unique<Writer>(Check(std::move(w)), pickle_fallback);
  }

  std::unique_ptr<Reader> OpenReader(const std::string& id, uint32_t partition, bool key_order,
                                     bool require_complete, bool raw, bool allow_pickle,
                                     std::optional<std::string> from_key,
                                     std::optional<std::string> to_key) {
    ReaderOptions o;
    o.order = key_order ? FetchOrder::kKey : FetchOrder::kUnordered;
    o.require_complete = require_complete;
    o.from_key = from_key.value_or("");
    o.to_key = std::move(to_key);
    absl::StatusOr<std::unique_ptr<ShuffleReader>> r =
        CallWithoutGil([&] { return client_->OpenReader(id, partition, o); });
    return std::make_unique<Reader>(Check(std::move(r)), raw, allow_pickle);
  }

 private:
  std::unique_ptr<ShuffleClient> client_;
};

}  // namespace
}  // namespace sluice::py

PYBIND11_MODULE(_sluice, m) {
  namespace pb = pybind11;
  using namespace sluice::py;
  m.doc() = "Sluice's native client (use the `sluice` package)";
  g_error = PyErr_NewExceptionWithDoc(
      "sluice.Error",
      "A Sluice call failed: `code` is the gRPC status name (NOT_FOUND, UNAVAILABLE, ...), "
      "`message` what happened, `retryable` whether a retry (of a mapper: a new attempt) can "
      "succeed, `retry_after` the seconds the server suggests waiting (or None), `reason` why "
      "when the server says (ETCD_UNAVAILABLE, DRAINING, JOINING, NOT_KEPT, SETTLING, "
      "PLACEMENT_CHANGED, INCOMPLETE, REVOKED; or None).",
      nullptr, nullptr);
  m.attr("Error") = pb::handle(g_error);

  pb::class_<Client>(m, "Client")
      .def(pb::init<const std::string&, double, bool, const std::string&, const std::string&,
                    const std::string&, const std::string&, const std::string&, double, double,
                    double, double, double>(),
           pb::arg("servers"), pb::arg("call_timeout_s") = 30.0, pb::arg("tls") = false,
           pb::arg("tls_ca") = "", pb::arg("tls_cert") = "", pb::arg("tls_key") = "",
           pb::arg("tls_server_name") = "", pb::arg("token") = "", pb::arg("keepalive_s") = 10.0,
           pb::arg("keepalive_timeout_s") = 10.0, pb::arg("placement_ttl_s") = 10.0,
           pb::arg("unhealthy_for_s") = 30.0, pb::arg("stream_timeout_s") = 0.0)
      .def("create_shuffle", &Client::CreateShuffle, pb::arg("shuffle_id"), pb::arg("partitions"),
           pb::arg("mappers") = 0, pb::arg("replication") = 0)
      .def("delete_shuffle", &Client::DeleteShuffle, pb::arg("shuffle_id"))
      .def("get_shuffle", &Client::GetShuffle, pb::arg("shuffle_id"), pb::arg("hot_keys") = 0)
      .def("get_splits", &Client::GetSplits, pb::arg("shuffle_id"), pb::arg("partition"),
           pb::arg("slices"))
      .def("revoke_mappers", &Client::RevokeMappers, pb::arg("shuffle_id"), pb::arg("mappers"),
           pb::arg("placement_epoch"))
      .def("open_writer", &Client::OpenWriter, pb::keep_alive<0, 1>(), pb::arg("shuffle_id"),
           pb::arg("mapper"), pb::arg("attempt"), pb::arg("sort_by_key"), pb::arg("buffer_bytes"),
           pb::arg("zstd_level"), pb::arg("pickle_fallback"))
      .def("open_reader", &Client::OpenReader, pb::keep_alive<0, 1>(), pb::arg("shuffle_id"),
           pb::arg("partition"), pb::arg("key_order"), pb::arg("require_complete"), pb::arg("raw"),
           pb::arg("allow_pickle"), pb::arg("from_key") = pb::none(),
           pb::arg("to_key") = pb::none());
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
  m.def(
      "packb",
      [](pb::handle o, bool pickle_fallback) {
        std::string out;
        Pack(o, pickle_fallback, &out);
        return pb::bytes(out);
      },
      pb::arg("obj"), pb::arg("pickle_fallback") = false, "msgpack bytes of obj (as keys route)");
  m.def(
      "unpackb",
      [](pb::bytes b, bool allow_pickle) { return Unpack(std::string_view(b), allow_pickle); },
      pb::arg("data"), pb::arg("allow_pickle") = false);
  m.def(
      "partition_of",
      [](pb::handle key, uint32_t partitions) {
        std::string k;
        Pack(key, false, &k);
        return sluice::HashPartition(k, partitions);
      },
      pb::arg("key"), pb::arg("partitions"),
      "the partition a key goes to: xxh3-64 of its msgpack bytes, modulo the partition count");
}
