#include "client/partitioned_writer.h"

#include <pthread.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace sluice {
namespace client_internal {

// Fixed-size chunks that a writer's fills share. A fill grows chunk by chunk and gives its
// chunks back once sent, so the memory a writer holds follows what it buffers and is reused,
// not re-fetched from the system: fresh pages are the costliest bytes a mapper touches.
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

// The records of one fill, all partitions together: keys and values back to back in pooled
// chunks, and one entry per record in arrival order. What a fill holds follows its records, not
// the partition count (a writer of 8,192 partitions with a few records in each holds a few
// records' worth, not 8,192 buffers).
struct Fill {
  struct Chunk {
    std::unique_ptr<char[]> data;
    size_t size = 0, used = 0;
  };
  struct Entry {
    const char* key;  // the value follows the key
    uint32_t key_size, value_size, partition;
  };
  // An entry's partition once its record was carried over into the next fill: not sent.
  static constexpr uint32_t kCarried = UINT32_MAX;
  std::vector<Chunk> chunks;
  std::vector<Entry> entries;
  size_t chunk_bytes = 0;  // sum of chunk sizes

  // What the budget counts: the chunks held, and for each record its entry and the view of it
  // the sender groups the fill into.
  static constexpr size_t kPerRecord = sizeof(Entry) + sizeof(Record);
  size_t bytes() const { return chunk_bytes + entries.size() * kPerRecord; }
  void Add(ChunkPool& pool, uint32_t partition, std::string_view key, std::string_view value) {
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
    if (!value.empty()) std::memcpy(k + key.size(), value.data(), value.size());
    c.used += need;
    entries.push_back(Entry{k, static_cast<uint32_t>(key.size()),
                            static_cast<uint32_t>(value.size()), partition});
  }
  // Gives the chunks back; keeps the entries array's capacity.
  void Release(ChunkPool& pool) {
    for (Chunk& c : chunks) pool.Put(std::move(c.data), c.size);
    chunks.clear();
    entries.clear();
    chunk_bytes = 0;
  }
};

}  // namespace client_internal

using client_internal::ChunkPool;
using client_internal::Fill;

// One hand-over to the sender: a whole fill.
struct PartitionedWriter::Job {
  Fill fill;
};

absl::StatusOr<std::unique_ptr<PartitionedWriter>> PartitionedWriter::Make(
    uint32_t num_partitions, std::vector<std::unique_ptr<PushStream>> streams,
    std::vector<std::vector<uint32_t>> routes, WriterOptions options, FrameLimits limits,
    Decider decide, uint64_t attempt, std::optional<SegmentRouting> segments) {
  if (num_partitions == 0) return absl::InvalidArgumentError("a writer needs partitions");
  if (options.buffer_bytes == 0 || options.buffer_bytes > kMaxBufferBytes) {
    return absl::InvalidArgumentError(absl::StrCat("buffer_bytes ", options.buffer_bytes,
                                                   " is out of range [1, ", kMaxBufferBytes, "]"));
  }
  if (streams.empty()) return absl::InvalidArgumentError("a writer needs a push stream");
  if (!routes.empty() && routes.size() != num_partitions) {
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
      new PartitionedWriter(num_partitions, std::move(streams), routes, std::move(options), limits,
                            std::move(decide), attempt, std::move(segments)));
}

PartitionedWriter::PartitionedWriter(uint32_t num_partitions,
                                     std::vector<std::unique_ptr<PushStream>> streams,
                                     const std::vector<std::vector<uint32_t>>& routes,
                                     WriterOptions options, FrameLimits limits, Decider decide,
                                     uint64_t attempt, std::optional<SegmentRouting> segments)
    : limits_(limits),
      options_(std::move(options)),
      num_partitions_(num_partitions),
      streams_(std::move(streams)),
      decide_(std::move(decide)),
      attempt_(attempt),
      // Chunks of 1/16 of the budget (256 B to 1 MiB), whatever the partition count: a fill's
      // records lie back to back whichever partitions they belong to.
      pool_(std::make_unique<ChunkPool>(
          std::clamp<size_t>(options_.buffer_bytes / 16, 256, 1u << 20))),
      fill_(std::make_unique<Job>()),
      frames_(streams_.size(), 0),
      records_(streams_.size(), 0) {
  if (!options_.partitioner) options_.partitioner = HashPartition;
  // Routes flattened (a writer of one stream keeps none): partition p's streams are
  // route_streams_[route_begin_[p], route_begin_[p + 1]).
  if (!routes.empty()) {
    route_begin_.reserve(routes.size() + 1);
    for (const std::vector<uint32_t>& r : routes) {
      route_begin_.push_back(static_cast<uint32_t>(route_streams_.size()));
      route_streams_.insert(route_streams_.end(), r.begin(), r.end());
    }
    route_begin_.push_back(static_cast<uint32_t>(route_streams_.size()));
  }
  if (segments.has_value() && !route_begin_.empty()) {
    target_.resize(num_partitions);
    for (uint32_t p = 0; p < num_partitions; ++p) target_[p] = p;
    stream_of_node_ = std::move(segments->stream_of_node);
    for (const SegmentNotice& s : segments->segments) Learn(s);
  }
  sender_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sluice-send");
    SendLoop();
  });
}

PartitionedWriter::~PartitionedWriter() {
  if (!finished_) Abort();
}

absl::Span<const uint32_t> PartitionedWriter::Route(uint32_t q) const {
  static constexpr uint32_t kFirst[1] = {0};
  if (route_begin_.empty()) return absl::MakeConstSpan(kFirst, 1);
  if (q >= num_partitions_) return segment_routes_.at(q);
  return absl::MakeConstSpan(route_streams_.data() + route_begin_[q],
                             route_begin_[q + 1] - route_begin_[q]);
}

void PartitionedWriter::Learn(const SegmentNotice& s) {
  // (What a server says is checked: a segment of no partition, or a node not in the
  // placement, is not routed to. One whose servers have no stream in this attempt is left for
  // the next attempt: the partition's frames go on to the segment they went to.)
  if (target_.empty() || s.partition_id < num_partitions_ || s.parent >= num_partitions_ ||
      s.nodes.empty() || segment_routes_.count(s.partition_id) != 0) {
    return;
  }
  std::vector<uint32_t> route;
  for (uint32_t n : s.nodes) {
    if (n >= stream_of_node_.size() || stream_of_node_[n] < 0) return;
    route.push_back(static_cast<uint32_t>(stream_of_node_[n]));
  }
  segment_routes_.emplace(s.partition_id, std::move(route));
  target_[s.parent] = std::max(target_[s.parent], s.partition_id);
}

void PartitionedWriter::TakeSegments(absl::Span<const uint32_t> route) {
  if (target_.empty()) return;
  const auto take = [this](PushStream& stream) {
    for (const SegmentNotice& s : stream.TakeSegments()) Learn(s);
  };
  if (route.empty()) {
    for (auto& stream : streams_) take(*stream);
  } else {
    for (uint32_t s : route) take(*streams_[s]);
  }
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
  fill_->fill.Add(*pool_, p, key, value);
  Count(p, key.size() + value.size() + Fill::kPerRecord);
  buffered_ = fill_->fill.bytes();
  if (buffered_ > options_.buffer_bytes) return Flush(/*all=*/false);
  return absl::OkStatus();
}

absl::StatusOr<WriteResult> PartitionedWriter::Close() {
  if (finished_) return absl::FailedPreconditionError("the writer is closed");
  SLUICE_RETURN_IF_ERROR(Flush(/*all=*/true));
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

void PartitionedWriter::Count(uint32_t partition, uint64_t bytes) {
  if (part_bytes_.empty()) part_bytes_.assign(num_partitions_, 0);
  if (part_bytes_[partition] == 0) touched_.push_back(partition);
  part_bytes_[partition] += bytes;
  fill_data_ += bytes;
}

// Hands the fill to the sender, once the one before it is sent, and starts the next (in the
// arrays of the one sent before, kept for reuse). Unless `all`, the partitions holding the
// smaller half of the fill's bytes, if under kCarryBelow each, stay: their records are copied
// into the next fill, so a small partition is sent when it is among the largest (frames ~1.5x
// the budget's even share of a partition, rather than one frame of every partition at every
// flush; a skewed writer's small partitions are not sent a few records at a time).
absl::Status PartitionedWriter::Flush(bool all) {
  if (fill_->fill.entries.empty()) return absl::OkStatus();
  std::unique_ptr<Job> next;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return jobs_.empty() || !send_error_.ok(); });
    if (!send_error_.ok()) return send_error_;
    if (spare_ != nullptr) next = std::move(spare_);
  }
  if (next == nullptr) next = std::make_unique<Job>();
  // (The copy runs while the sender is idle: the fill it copies from is not handed over yet,
  // which keeps the writer at two fills.)
  if (!all) CarryOver(next->fill);
  for (uint32_t p : touched_) part_bytes_[p] = 0;
  touched_.clear();
  fill_data_ = 0;
  for (const Fill::Entry& e : next->fill.entries) {
    Count(e.partition, uint64_t{e.key_size} + e.value_size + Fill::kPerRecord);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fill_));
    cv_.notify_all();
  }
  fill_ = std::move(next);
  buffered_ = fill_->fill.bytes();
  return absl::OkStatus();
}

// Copies the records of the partitions that hold the smaller half of the fill's bytes, and
// less than kCarryBelow each, into `next` (in arrival order) and marks them carried in the fill.
void PartitionedWriter::CarryOver(Fill& next) {
  std::vector<uint32_t>& order = touched_;
  if (order.size() < 2) return;
  std::sort(order.begin(), order.end(), [this](uint32_t a, uint32_t b) {
    return part_bytes_[a] != part_bytes_[b] ? part_bytes_[a] > part_bytes_[b] : a < b;
  });
  // Partitions of kCarryBelow or more are sent whatever their rank: their frames are large
  // already, and copying their records would cost more than the frames saved (a narrow writer
  // of 8 partitions would copy half its bytes at every flush).
  uint64_t sent = 0;
  size_t k = 0;
  while (k < order.size() && (2 * sent < fill_data_ || part_bytes_[order[k]] >= kCarryBelow)) {
    sent += part_bytes_[order[k++]];
  }
  if (k == order.size()) return;
  constexpr uint64_t kStays = UINT64_MAX;
  for (size_t i = k; i < order.size(); ++i) part_bytes_[order[i]] = kStays;
  for (Fill::Entry& e : fill_->fill.entries) {
    if (part_bytes_[e.partition] != kStays) continue;
    next.Add(*pool_, e.partition, std::string_view(e.key, e.key_size),
             std::string_view(e.key + e.key_size, e.value_size));
    e.partition = Fill::kCarried;
  }
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
    absl::Status st = SendFill(job->fill, encoder);
    job->fill.Release(*pool_);
    std::lock_guard<std::mutex> lock(mu_);
    spare_ = std::move(jobs_.front());
    jobs_.pop_front();
    if (!st.ok() && send_error_.ok()) send_error_ = st;
    cv_.notify_all();
    if (!send_error_.ok()) return;
  }
}

// Groups the fill's records by partition (a counting sort: stable, so each partition keeps its
// arrival order), then sends each partition's records.
absl::Status PartitionedWriter::SendFill(const Fill& fill, FrameEncoder& encoder) {
  std::vector<uint32_t>& start = group_start_;
  start.assign(num_partitions_ + 1, 0);
  for (const Fill::Entry& e : fill.entries) {
    if (e.partition != Fill::kCarried) ++start[e.partition + 1];
  }
  for (uint32_t p = 0; p < num_partitions_; ++p) start[p + 1] += start[p];
  grouped_.resize(start[num_partitions_]);
  {
    std::vector<uint32_t>& at = group_at_;
    at.assign(start.begin(), start.end() - 1);
    for (const Fill::Entry& e : fill.entries) {
      if (e.partition == Fill::kCarried) continue;
      grouped_[at[e.partition]++] = Record{std::string_view(e.key, e.key_size),
                                           std::string_view(e.key + e.key_size, e.value_size)};
    }
  }
  for (uint32_t p = 0; p < num_partitions_; ++p) {
    if (start[p] == start[p + 1]) continue;
    SLUICE_RETURN_IF_ERROR(
        Send(p, absl::MakeSpan(grouped_.data() + start[p], start[p + 1] - start[p]), encoder));
  }
  return absl::OkStatus();
}

absl::Status PartitionedWriter::Send(uint32_t partition, absl::Span<Record> records,
                                     FrameEncoder& encoder) {
  if (options_.sort_by_key) StableSortByKey(records, &sort_scratch_);
  TakeSegments({});
  // Frames of at most frame_bytes of records each (sorted: sorted_frame_bytes; the stream packs
  // small ones into messages), encoded once and sent on each of the partition's streams.
  const size_t most = options_.sort_by_key
                          ? std::min(options_.frame_bytes, options_.sorted_frame_bytes)
                          : options_.frame_bytes;
  size_t i = 0;
  while (i < records.size()) {
    // To the partition's newest segment (a frame's records go to one stored partition).
    const uint32_t q = target_.empty() ? partition : target_[partition];
    const absl::Span<const uint32_t> route = Route(q);
    PushStream& first = *streams_[route[0]];
    size_t j = i, bytes = 0;
    while (j < records.size() &&
           (j == i || bytes + records[j].key.size() + records[j].value.size() <= most)) {
      bytes += records[j].key.size() + records[j].value.size();
      ++j;
    }
    std::string* frame = first.NewFrame(q);
    SLUICE_RETURN_IF_ERROR(encoder.Encode(absl::MakeConstSpan(records.data() + i, j - i), frame));
    sent_.frames += 1;
    sent_.records += j - i;
    sent_.bytes += frame->size();
    for (size_t r = 1; r < route.size(); ++r) {  // copies first: sending may take the buffer
      *streams_[route[r]]->NewFrame(q) = *frame;
      SLUICE_RETURN_IF_ERROR(streams_[route[r]]->SendFrame());
    }
    SLUICE_RETURN_IF_ERROR(first.SendFrame());
    for (uint32_t s : route) {
      ++frames_[s];
      records_[s] += j - i;
    }
    if (q >= num_partitions_) ++segment_frames_;
    TakeSegments(route);  // (told with the credit its message waited for)
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
