#include "client/shuffle_client.h"

#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/status_macros.h"
#include "sluice/v1/shuffle.grpc.pb.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace sluice {
namespace {

namespace pb = sluice::v1;

absl::Status FromGrpc(const grpc::Status& st, const std::string& server) {
  if (st.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(st.error_code());
  if (code == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(
        absl::StrCat("server unreachable at ", server, ": ", st.error_message()));
  }
  return absl::Status(code, st.error_message());
}

ShuffleStatus FromProto(const pb::ShuffleInfo& info) {
  ShuffleStatus s;
  s.shuffle_id = info.shuffle_id();
  s.num_partitions = info.num_partitions();
  s.num_mappers = info.num_mappers();
  s.committed_mappers.assign(info.committed_mappers().begin(), info.committed_mappers().end());
  for (const auto& p : info.partitions()) {
    s.partitions.push_back(PartitionStatsInfo{p.records(), p.bytes(), p.frames()});
  }
  return s;
}

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

class GrpcWriter final : public ShuffleWriter {
 public:
  GrpcWriter(pb::ShuffleService::Stub* stub, const ClientOptions& client, uint32_t partitions,
             WriterOptions options)
      : client_(client),
        options_(std::move(options)),
        // Chunks of 1/8 of a partition's even share of the budget (256 B to 1 MiB): the
        // partly filled last chunks of all partitions hold at most 1/8 of the budget (unless
        // there are more than budget / 2 KiB partitions), so flushes stay large.
        pool_(std::clamp<size_t>(options_.buffer_bytes / 8 / std::max<uint32_t>(partitions, 1), 256,
                                 1u << 20)),
        buffers_(partitions) {
    if (!options_.partitioner) options_.partitioner = HashPartition;
    if (client_.stream_deadline.count() > 0) {
      ctx_.set_deadline(std::chrono::system_clock::now() + client_.stream_deadline);
    }
    stream_ = stub->Push(&ctx_, &response_);
    sender_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "sluice-send");
      SendLoop();
    });
  }
  ~GrpcWriter() override {
    if (!finished_) Abort();
  }

  absl::Status Open(const std::string& id, uint32_t mapper, uint64_t attempt) {
    pb::PushRequest open;
    open.mutable_open()->set_shuffle_id(id);
    open.mutable_open()->set_mapper_id(mapper);
    open.mutable_open()->set_attempt_id(attempt);
    if (!stream_->Write(open)) return StreamError();
    return absl::OkStatus();
  }

  absl::Status Add(std::string_view key, std::string_view value) override {
    if (finished_) return absl::FailedPreconditionError("the writer is closed");
    const uint32_t p = options_.partitioner(key, static_cast<uint32_t>(buffers_.size()));
    if (p >= buffers_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("partitioner returned ", p, " for ", buffers_.size(), " partitions"));
    }
    if (key.size() + value.size() > client_.limits.max_uncompressed_bytes / 2) {
      return absl::InvalidArgumentError(absl::StrCat("record of ", key.size() + value.size(),
                                                     " bytes is too large for one frame"));
    }
    PartitionBuffer& b = buffers_[p];
    const size_t before = b.bytes();
    b.Add(pool_, key, value);
    buffered_ += b.bytes() - before;
    if (buffered_ > options_.buffer_bytes) {
      // Flush the partition holding the most records' bytes (never an empty one).
      size_t largest = 0;
      for (size_t i = 1; i < buffers_.size(); ++i) {
        if (buffers_[i].data > buffers_[largest].data) largest = i;
      }
      if (buffers_[largest].records.empty()) return absl::OkStatus();
      return Flush(static_cast<uint32_t>(largest));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<WriteResult> Close() override {
    if (finished_) return absl::FailedPreconditionError("the writer is closed");
    for (uint32_t p = 0; p < buffers_.size(); ++p) {
      if (!buffers_[p].records.empty()) SLUICE_RETURN_IF_ERROR(Flush(p));
    }
    StopSender();
    finished_ = true;
    absl::Status send_error;
    {
      std::lock_guard<std::mutex> lock(mu_);
      send_error = send_error_;
    }
    if (!send_error.ok()) return send_error;
    pb::PushRequest commit;
    commit.mutable_commit()->set_frame_count(frames_);
    commit.mutable_commit()->set_record_count(records_);
    if (!stream_->Write(commit)) return StreamError();
    stream_->WritesDone();
    absl::Status st = FromGrpc(stream_->Finish(), client_.server);
    if (!st.ok()) return st;
    WriteResult r;
    r.duplicate = response_.duplicate();
    r.frames = response_.frames();
    r.records = response_.records();
    r.bytes = response_.bytes();
    return r;
  }

  void Abort() override {
    if (finished_) return;
    finished_ = true;
    ctx_.TryCancel();
    StopSender();
    (void)stream_->Finish();
  }

 private:
  absl::Status StreamError() {
    finished_ = true;
    StopSender();
    return FromGrpc(stream_->Finish(), client_.server);
  }

  // Hands partition p's buffer to the sender; waits while two flushes are already in flight.
  absl::Status Flush(uint32_t p) {
    Job job;
    job.partition = p;
    std::swap(job.buffer, buffers_[p]);
    buffered_ -= job.buffer.bytes();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return jobs_.size() < 2 || !send_error_.ok(); });
    if (!send_error_.ok()) return send_error_;
    if (!spare_.empty()) {  // reuse a returned buffer's records array
      std::swap(buffers_[p], spare_.back());
      spare_.pop_back();
      buffered_ += buffers_[p].bytes();
    }
    jobs_.push_back(std::move(job));
    cv_.notify_all();
    return absl::OkStatus();
  }

  struct Job {
    uint32_t partition = 0;
    PartitionBuffer buffer;
  };

  void SendLoop() {
    EncodeOptions eopts;
    eopts.layout = options_.layout;
    eopts.zstd_level = options_.zstd_level;
    eopts.sort_by_key = options_.sort_by_key;
    eopts.limits = client_.limits;
    FrameEncoder encoder(eopts);
    pb::PushRequest msg;
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !jobs_.empty() || stopping_; });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
      }
      absl::Status st = Send(job, encoder, &msg);
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.pop_front();
      if (!st.ok() && send_error_.ok()) send_error_ = st;
      job.buffer.Release(pool_);
      spare_.push_back(std::move(job.buffer));
      cv_.notify_all();
      if (!send_error_.ok()) return;
    }
  }

  absl::Status Send(Job& job, FrameEncoder& encoder, pb::PushRequest* msg) {
    std::vector<Record>* records = &job.buffer.records;
    if (options_.sort_by_key) StableSortByKey(absl::MakeSpan(*records), &sort_scratch_);
    // Frames of at most frame_bytes of records each; one message each.
    size_t i = 0;
    while (i < records->size()) {
      size_t j = i, bytes = 0;
      while (j < records->size() &&
             (j == i || bytes + (*records)[j].key.size() + (*records)[j].value.size() <=
                            options_.frame_bytes)) {
        bytes += (*records)[j].key.size() + (*records)[j].value.size();
        ++j;
      }
      msg->Clear();
      auto* f = msg->mutable_frames()->add_frames();
      f->set_partition_id(job.partition);
      std::string* frame = f->mutable_frame();
      absl::Status st = encoder.Encode(absl::MakeConstSpan(records->data() + i, j - i), frame);
      if (!st.ok()) return st;
      if (!stream_->Write(*msg)) {
        return absl::UnavailableError(
            absl::StrCat("push stream to ", client_.server, " broke (see Close() for why)"));
      }
      ++frames_;
      records_ += j - i;
      i = j;
    }
    return absl::OkStatus();
  }

  void StopSender() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (sender_.joinable()) sender_.join();
  }

  const ClientOptions client_;
  WriterOptions options_;
  grpc::ClientContext ctx_;
  pb::PushResponse response_;
  std::unique_ptr<grpc::ClientWriter<pb::PushRequest>> stream_;
  ChunkPool pool_;
  std::vector<PartitionBuffer> buffers_;
  size_t buffered_ = 0;
  bool finished_ = false;
  uint64_t frames_ = 0, records_ = 0;  // written by the sender, read after it stopped

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<PartitionBuffer> spare_;
  bool stopping_ = false;
  absl::Status send_error_;
  std::vector<Record> sort_scratch_;  // the sender's
  std::thread sender_;
};

class GrpcReader final : public ShuffleReader {
 public:
  GrpcReader(pb::ShuffleService::Stub* stub, const ClientOptions& client,
             const pb::FetchRequest& request)
      : server_(client.server) {
    if (client.stream_deadline.count() > 0) {
      ctx_.set_deadline(std::chrono::system_clock::now() + client.stream_deadline);
    }
    DecodeOptions dopts;
    dopts.limits = client.limits;
    decoder_ = std::make_unique<FrameDecoder>(dopts);
    stream_ = stub->Fetch(&ctx_, request);
  }
  ~GrpcReader() override {
    if (!done_) {
      ctx_.TryCancel();
      (void)stream_->Finish();
    }
  }

  absl::StatusOr<bool> Next(Record* out) override {
    while (pos_ >= frame_.size()) {
      if (done_) return false;
      if (!stream_->Read(&response_)) {
        done_ = true;
        absl::Status st = FromGrpc(stream_->Finish(), server_);
        if (!st.ok()) return st;
        return false;
      }
      absl::Status st = decoder_->Decode(response_.frame(), &frame_);
      if (!st.ok()) {
        return absl::DataLossError(absl::StrCat("bad frame from ", server_, ": ", st.message()));
      }
      pos_ = 0;
    }
    *out = frame_[pos_++];
    return true;
  }

 private:
  const std::string server_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<pb::FetchResponse>> stream_;
  pb::FetchResponse response_;
  std::unique_ptr<FrameDecoder> decoder_;
  DecodedFrame frame_;
  size_t pos_ = 0;
  bool done_ = false;
};

class GrpcClient final : public ShuffleClient {
 public:
  explicit GrpcClient(const ClientOptions& options) : options_(options) {
    grpc::ChannelArguments args;
    const int max = static_cast<int>(
        std::min<uint64_t>(INT32_MAX, uint64_t{options.limits.max_uncompressed_bytes} + (1 << 20)));
    args.SetMaxReceiveMessageSize(max);
    args.SetMaxSendMessageSize(max);
    channel_ = grpc::CreateCustomChannel(options.server, grpc::InsecureChannelCredentials(), args);
    stub_ = pb::ShuffleService::NewStub(channel_);
  }

  absl::StatusOr<bool> CreateShuffle(const std::string& id, uint32_t num_partitions,
                                     uint32_t num_mappers) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::CreateShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_num_partitions(num_partitions);
    req.set_num_mappers(num_mappers);
    pb::CreateShuffleResponse resp;
    absl::Status st = FromGrpc(stub_->CreateShuffle(&ctx, req, &resp), options_.server);
    if (!st.ok()) return st;
    return resp.created();
  }

  absl::StatusOr<ShuffleStatus> GetShuffle(const std::string& id) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::GetShuffleRequest req;
    req.set_shuffle_id(id);
    pb::ShuffleInfo info;
    absl::Status st = FromGrpc(stub_->GetShuffle(&ctx, req, &info), options_.server);
    if (!st.ok()) return st;
    return FromProto(info);
  }

  absl::StatusOr<std::vector<ShuffleStatus>> ListShuffles() override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::ListShufflesResponse resp;
    absl::Status st =
        FromGrpc(stub_->ListShuffles(&ctx, pb::ListShufflesRequest(), &resp), options_.server);
    if (!st.ok()) return st;
    std::vector<ShuffleStatus> out;
    for (const auto& info : resp.shuffles()) out.push_back(FromProto(info));
    return out;
  }

  absl::Status DeleteShuffle(const std::string& id) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::DeleteShuffleRequest req;
    req.set_shuffle_id(id);
    pb::DeleteShuffleResponse resp;
    return FromGrpc(stub_->DeleteShuffle(&ctx, req, &resp), options_.server);
  }

  absl::StatusOr<std::unique_ptr<ShuffleWriter>> OpenWriter(const std::string& id, uint32_t mapper,
                                                            uint64_t attempt,
                                                            const WriterOptions& options) override {
    auto status = GetShuffle(id);
    if (!status.ok()) return status.status();
    auto writer =
        std::make_unique<GrpcWriter>(stub_.get(), options_, status->num_partitions, options);
    absl::Status st = writer->Open(id, mapper, attempt);
    if (!st.ok()) return st;
    return std::unique_ptr<ShuffleWriter>(std::move(writer));
  }

  absl::StatusOr<std::unique_ptr<ShuffleReader>> OpenReader(const std::string& id,
                                                            uint32_t partition,
                                                            const ReaderOptions& options) override {
    pb::FetchRequest req;
    req.set_shuffle_id(id);
    req.set_partition_id(partition);
    req.set_order(options.order == FetchOrder::kKey ? pb::KEY : pb::UNORDERED);
    req.set_require_complete(options.require_complete);
    switch (options.layout) {
      case LayoutChoice::kOpaque:
        req.set_layout(pb::LAYOUT_OPAQUE);
        break;
      case LayoutChoice::kMsgpack:
        req.set_layout(pb::LAYOUT_MSGPACK);
        break;
      case LayoutChoice::kColumnar:
        req.set_layout(pb::LAYOUT_COLUMNAR);
        break;
      default:
        req.set_layout(pb::LAYOUT_AUTO);
    }
    req.set_target_chunk_bytes(static_cast<uint32_t>(options.chunk_bytes));
    return std::unique_ptr<ShuffleReader>(new GrpcReader(stub_.get(), options_, req));
  }

 private:
  void SetDeadline(grpc::ClientContext* ctx) const {
    if (options_.call_deadline.count() > 0) {
      ctx->set_deadline(std::chrono::system_clock::now() + options_.call_deadline);
    }
  }

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::ShuffleService::Stub> stub_;
};

}  // namespace

uint32_t HashPartition(std::string_view key, uint32_t num_partitions) {
  return static_cast<uint32_t>(XXH3_64bits(key.data(), key.size()) % num_partitions);
}

Partitioner RangePartitioner(std::vector<std::string> splits) {
  std::sort(splits.begin(), splits.end(),
            [](const std::string& a, const std::string& b) { return KeyLess(a, b); });
  return [splits = std::move(splits)](std::string_view key, uint32_t num_partitions) {
    // The number of splits <= key is the partition.
    const auto it =
        std::upper_bound(splits.begin(), splits.end(), key,
                         [](std::string_view k, const std::string& s) { return KeyLess(k, s); });
    const auto p = static_cast<uint32_t>(it - splits.begin());
    return std::min(p, num_partitions - 1);
  };
}

absl::StatusOr<bool> ShuffleReader::NextGroup(std::string* key, std::vector<std::string>* values) {
  values->clear();
  Record r;
  if (!has_pending_) {
    auto more = Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) return false;
    pending_key_.assign(r.key);
    pending_value_.assign(r.value);
  }
  has_pending_ = false;
  *key = pending_key_;
  values->push_back(pending_value_);
  for (;;) {
    auto more = Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) return true;
    if (r.key != *key) {
      pending_key_.assign(r.key);
      pending_value_.assign(r.value);
      has_pending_ = true;
      return true;
    }
    values->emplace_back(r.value);
  }
}

absl::StatusOr<std::unique_ptr<ShuffleClient>> ShuffleClient::Connect(
    const ClientOptions& options) {
  if (options.server.empty()) return absl::InvalidArgumentError("no server address");
  return std::unique_ptr<ShuffleClient>(new GrpcClient(options));
}

}  // namespace sluice
