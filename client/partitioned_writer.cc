#include "client/partitioned_writer.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/status_macros.h"

namespace sluice {
namespace client_internal {

// Fixed-size chunks that a writer's partition buffers share. Buffers grow chunk by chunk and
// give their chunks back once sent, so the memory a writer holds follows what it buffers
// (the budget) rather than every partition's largest size so far, and is reused, not
// re-fetched from the system: fresh pages are the costliest bytes a mapper touches.
class ChunkPool {
 public:
  explicit ChunkPool(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}
  size_t chunk_bytes() const { return chunk_bytes_; }
  // A chunk of at least `bytes` (a standard chunk unless the record is larger).
  std::unique_ptr<char[]> Get(size_t bytes) {
    if (bytes <= chunk_bytes_) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        auto c = std::move(free_.back());
        free_.pop_back();
        return c;
      }
    }
    return std::unique_ptr<char[]>(new char[std::max(bytes, chunk_bytes_)]);
  }
  void Put(std::unique_ptr<char[]> chunk, size_t size) {
    if (size != chunk_bytes_) return;  // an oversized one: freed
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(chunk));
  }

 private:
  const size_t chunk_bytes_;
  std::mutex mu_;
  std::vector<std::unique_ptr<char[]>> free_;
};

// Records of one partition, buffered: keys and values back to back in chunks, and a view of
// each record (views stay valid: chunks never move).
struct PartitionBuffer {
  struct Chunk {
    std::unique_ptr<char[]> data;
    size_t size = 0, used = 0;
  };
  std::vector<Chunk> chunks;
  std::vector<Record> records;
  size_t chunk_bytes = 0;  // sum of chunk sizes
  size_t data = 0;         // sum of the records' key and value sizes

  // What the budget counts: the chunks held, and the records' views.
  size_t bytes() const { return chunk_bytes + records.size() * sizeof(Record); }
  void Add(ChunkPool& pool, std::string_view key, std::string_view value) {
    const size_t need = key.size() + value.size();
    if (chunks.empty() || chunks.back().size - chunks.back().used < need) {
      Chunk c;
      c.size = std::max(need, pool.chunk_bytes());
      c.data = pool.Get(c.size);
      chunk_bytes += c.size;
      chunks.push_back(std::move(c));
    }
    Chunk& c = chunks.back();
    char* k = c.data.get() + c.used;
    if (!key.empty()) std::memcpy(k, key.data(), key.size());
    char* v = k + key.size();
    if (!value.empty()) std::memcpy(v, value.data(), value.size());
    c.used += need;
    data += need;
    records.push_back(Record{std::string_view(k, key.size()), std::string_view(v, value.size())});
  }
  // Gives the chunks back; keeps the records array's capacity.
  void Release(ChunkPool& pool) {
    for (Chunk& c : chunks) pool.Put(std::move(c.data), c.size);
    chunks.clear();
    records.clear();
    chunk_bytes = 0;
    data = 0;
  }
};

}  // namespace client_internal

using client_internal::ChunkPool;
using client_internal::PartitionBuffer;

struct PartitionedWriter::Buffers {
  Buffers(size_t chunk_bytes, uint32_t partitions) : pool(chunk_bytes), parts(partitions) {}
  ChunkPool pool;
  std::vector<PartitionBuffer> parts;
};

// One hand-over to the sender: one partition's buffer, or many small ones together.
struct PartitionedWriter::Job {
  struct Part {
    uint32_t partition = 0;
    PartitionBuffer buffer;
  };
  std::vector<Part> parts;  // parts[0, used) are this job's; the rest keep arrays for reuse
  size_t used = 0;
  void Add(uint32_t partition, PartitionBuffer& b) {
    if (used == parts.size()) parts.emplace_back();
    Part& part = parts[used++];
    part.partition = partition;
    std::swap(part.buffer, b);
  }
};

absl::StatusOr<std::unique_ptr<PartitionedWriter>> PartitionedWriter::Make(
    uint32_t num_partitions, std::vector<std::unique_ptr<PushStream>> streams,
    std::vector<std::vector<uint32_t>> routes, WriterOptions options, FrameLimits limits,
    Decider decide, uint64_t attempt) {
  if (num_partitions == 0) return absl::InvalidArgumentError("a writer needs partitions");
  if (streams.empty()) return absl::InvalidArgumentError("a writer needs a push stream");
  if (routes.empty()) routes.assign(num_partitions, {0});
  if (routes.size() != num_partitions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "routes for ", routes.size(), " partitions, the shuffle has ", num_partitions));
  }
  for (size_t p = 0; p < routes.size(); ++p) {
    if (routes[p].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("partition ", p, " has no stream"));
    }
    for (uint32_t s : routes[p]) {
      if (s >= streams.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("a partition is routed to stream ", s, " of ", streams.size()));
      }
    }
  }
  return std::unique_ptr<PartitionedWriter>(
      new PartitionedWriter(num_partitions, std::move(streams), std::move(routes),
                            std::move(options), limits, std::move(decide), attempt));
}

PartitionedWriter::PartitionedWriter(uint32_t num_partitions,
                                     std::vector<std::unique_ptr<PushStream>> streams,
                                     std::vector<std::vector<uint32_t>> routes,
                                     WriterOptions options, FrameLimits limits, Decider decide,
                                     uint64_t attempt)
    : limits_(limits),
      options_(std::move(options)),
      num_partitions_(num_partitions),
      streams_(std::move(streams)),
      routes_(std::move(routes)),
      decide_(std::move(decide)),
      attempt_(attempt),
      // Chunks of 1/8 of a partition's even share of the budget (256 B to 1 MiB): the partly
      // filled last chunks of all partitions hold at most 1/8 of the budget (unless there are
      // more than budget / 2 KiB partitions), so flushes stay large.
      buffers_(std::make_unique<Buffers>(
          std::clamp<size_t>(options_.buffer_bytes / 8 / num_partitions, 256, 1u << 20),
          num_partitions)),
      frames_(streams_.size(), 0),
      records_(streams_.size(), 0) {
  if (!options_.partitioner) options_.partitioner = HashPartition;
  sender_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sluice-send");
    SendLoop();
  });
}

PartitionedWriter::~PartitionedWriter() {
  if (!finished_) Abort();
}

absl::Status PartitionedWriter::Add(std::string_view key, std::string_view value) {
  if (finished_) return absl::FailedPreconditionError("the writer is closed");
  const uint32_t p = options_.partitioner(key, num_partitions_);
  if (p >= num_partitions_) {
    return absl::InvalidArgumentError(
        absl::StrCat("partitioner returned ", p, " for ", num_partitions_, " partitions"));
  }
  if (key.size() + value.size() > limits_.max_uncompressed_bytes / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("record of ", key.size() + value.size(), " bytes is too large for one frame"));
  }
  std::vector<PartitionBuffer>& parts = buffers_->parts;
  PartitionBuffer& b = parts[p];
  const size_t before = b.bytes();
  b.Add(buffers_->pool, key, value);
  buffered_ += b.bytes() - before;
  if (buffered_ > options_.buffer_bytes) {
    // Flush the partition holding the most records' bytes (never an empty one).
    size_t largest = 0;
    for (size_t i = 1; i < parts.size(); ++i) {
      if (parts[i].data > parts[largest].data) largest = i;
    }
    if (parts[largest].records.empty()) return absl::OkStatus();
    // A wide writer's partitions are all small: flushing them one by one would be a hand-over
    // (and a scan for the largest) for every few records. When even the largest holds less
    // than 1/16 of the budget, the largest partitions go together, as one job, until half the
    // budget is free: frames stay as large as the largest-first rule makes them.
    if (parts[largest].data < options_.buffer_bytes / 16) return FlushLargest(buffered_ / 2);
    return Flush(static_cast<uint32_t>(largest));
  }
  return absl::OkStatus();
}

absl::StatusOr<WriteResult> PartitionedWriter::Close() {
  if (finished_) return absl::FailedPreconditionError("the writer is closed");
  SLUICE_RETURN_IF_ERROR(FlushLargest(buffered_));
  StopSender();
  finished_ = true;
  absl::Status send_error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    send_error = send_error_;
  }
  if (!send_error.ok()) {
    CancelStreams();
    return send_error;
  }
  // Every stream's commit first, then the answers: the servers sync at once, not in turn.
  for (size_t s = 0; s < streams_.size(); ++s) {
    if (absl::Status st = streams_[s]->SendCommit(frames_[s], records_[s]); !st.ok()) {
      CancelStreams();
      return st;
    }
  }
  WriteResult total;
  for (size_t s = 0; s < streams_.size(); ++s) {
    auto r = streams_[s]->FinishCommit();
    if (!r.ok()) {
      CancelStreams();
      return r.status();
    }
    total.duplicate = total.duplicate || r->duplicate;
    total.frames += r->frames;
    total.records += r->records;
    total.bytes += r->bytes;
  }
  if (!decide_) return total;
  // Prepared everywhere: one decision makes it the mapper's commit, or a duplicate.
  SLUICE_ASSIGN_OR_RETURN(const uint64_t winner, decide_());
  WriteResult out = sent_;
  out.duplicate = winner != attempt_;
  out.winning_attempt = winner;
  return out;
}

void PartitionedWriter::Abort() {
  if (finished_) return;
  finished_ = true;
  CancelStreams();  // first: a sender blocked on a stream gets out
  StopSender();
}

void PartitionedWriter::CancelStreams() {
  for (auto& s : streams_) s->Cancel();
}

// Hands partition p's buffer to the sender; waits while two flushes are already in flight.
absl::Status PartitionedWriter::Flush(uint32_t p) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, NextJob());
  PartitionBuffer& b = buffers_->parts[p];
  buffered_ -= b.bytes();
  job->Add(p, b);
  buffered_ += b.bytes();
  return Submit(std::move(job));
}

// Hands the largest partitions' buffers to the sender, as one job, until at least `bytes` of
// the budget are free; bytes = all: every non-empty partition.
absl::Status PartitionedWriter::FlushLargest(size_t bytes) {
  std::vector<uint32_t>& order = flush_order_;
  order.clear();
  for (uint32_t p = 0; p < num_partitions_; ++p) {
    if (!buffers_->parts[p].records.empty()) order.push_back(p);
  }
  if (bytes < buffered_) {
    std::sort(order.begin(), order.end(), [this](uint32_t a, uint32_t b) {
      return buffers_->parts[a].data > buffers_->parts[b].data;
    });
  }
  std::unique_ptr<Job> job;
  const size_t target = buffered_ > bytes ? buffered_ - bytes : 0;
  for (uint32_t p : order) {
    if (job != nullptr && buffered_ <= target) break;
    PartitionBuffer& b = buffers_->parts[p];
    if (job == nullptr) {
      SLUICE_ASSIGN_OR_RETURN(job, NextJob());
    }
    buffered_ -= b.bytes();
    job->Add(p, b);
    buffered_ += b.bytes();
  }
  return job == nullptr ? absl::OkStatus() : Submit(std::move(job));
}

absl::StatusOr<std::unique_ptr<PartitionedWriter::Job>> PartitionedWriter::NextJob() {
  std::unique_ptr<Job> job;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return jobs_.size() < 2 || !send_error_.ok(); });
    if (!send_error_.ok()) return send_error_;
    if (!spare_.empty()) {  // a sent job: its arrays are reused
      job = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  if (job == nullptr) job = std::make_unique<Job>();
  job->used = 0;
  return job;
}

absl::Status PartitionedWriter::Submit(std::unique_ptr<Job> job) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back(std::move(job));
  cv_.notify_all();
  return absl::OkStatus();
}

void PartitionedWriter::SendLoop() {
  EncodeOptions eopts;
  eopts.layout = options_.layout;
  eopts.zstd_level = options_.zstd_level;
  eopts.sort_by_key = options_.sort_by_key;
  eopts.limits = limits_;
  FrameEncoder encoder(eopts);
  for (;;) {
    Job* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !jobs_.empty() || stopping_; });
      if (jobs_.empty()) return;
      job = jobs_.front().get();
    }
    absl::Status st;
    for (size_t k = 0; k < job->used; ++k) {
      if (st.ok()) st = Send(job->parts[k].partition, job->parts[k].buffer, encoder);
      job->parts[k].buffer.Release(buffers_->pool);
    }
    std::lock_guard<std::mutex> lock(mu_);
    spare_.push_back(std::move(jobs_.front()));
    jobs_.pop_front();
    if (!st.ok() && send_error_.ok()) send_error_ = st;
    cv_.notify_all();
    if (!send_error_.ok()) return;
  }
}

absl::Status PartitionedWriter::Send(uint32_t partition, PartitionBuffer& buffer,
                                     FrameEncoder& encoder) {
  std::vector<Record>& records = buffer.records;
  if (options_.sort_by_key) StableSortByKey(absl::MakeSpan(records), &sort_scratch_);
  const std::vector<uint32_t>& route = routes_[partition];
  PushStream& first = *streams_[route[0]];
  // Frames of at most frame_bytes of records each (the stream packs small ones into messages),
  // encoded once and sent on each of the partition's streams.
  size_t i = 0;
  while (i < records.size()) {
    size_t j = i, bytes = 0;
    while (j < records.size() &&
           (j == i ||
            bytes + records[j].key.size() + records[j].value.size() <= options_.frame_bytes)) {
      bytes += records[j].key.size() + records[j].value.size();
      ++j;
    }
    std::string* frame = first.NewFrame(partition);
    SLUICE_RETURN_IF_ERROR(encoder.Encode(absl::MakeConstSpan(records.data() + i, j - i), frame));
    sent_.frames += 1;
    sent_.records += j - i;
    sent_.bytes += frame->size();
    for (size_t r = 1; r < route.size(); ++r) {  // copies first: sending may take the buffer
      *streams_[route[r]]->NewFrame(partition) = *frame;
      SLUICE_RETURN_IF_ERROR(streams_[route[r]]->SendFrame());
    }
    SLUICE_RETURN_IF_ERROR(first.SendFrame());
    for (uint32_t s : route) {
      ++frames_[s];
      records_[s] += j - i;
    }
    i = j;
  }
  return absl::OkStatus();
}

void PartitionedWriter::StopSender() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (sender_.joinable()) sender_.join();
}

}  // namespace sluice
