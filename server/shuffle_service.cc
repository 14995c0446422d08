#include "server/shuffle_service.h"

#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "spdlog/spdlog.h"

namespace sluice {

using v1::FetchRequest;
using v1::FetchResponse;
using v1::PushRequest;
using v1::PushResponse;

grpc::Status ToGrpc(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

namespace {

// Scratch a pool thread's push decoder may keep between messages.
constexpr size_t kKeptDecoderScratch = 8u << 20;
// Fetches compress at most at this zstd level: the server compresses for every reducer.
constexpr uint32_t kMaxFetchZstdLevel = 9;
// Every pool thread keeps one decoder for validating pushed frames, so that allocates nothing
// per stream.
FrameDecoder& ThreadDecoder(const FrameLimits& limits) {
  thread_local std::unique_ptr<FrameDecoder> decoder;
  if (decoder == nullptr) {
    DecodeOptions opts;
    opts.limits = limits;
    opts.keys_only = true;  // every byte checked; values are not needed to accept a frame
    decoder = std::make_unique<FrameDecoder>(opts);
  }
  return *decoder;
}

// One mapper attempt: open, frames..., commit. Reads one message at a time; each is handled on
// the pool, and the next read starts only once it is done and the memory budget has room.
class PushReactor final : public grpc::ServerReadReactor<PushRequest> {
 public:
  PushReactor(ShuffleServiceImpl::Deps deps, PushResponse* response)
      : deps_(deps), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed, cancelled or broke the stream without a commit
      deps_.pool->Submit([this] {
        Fail(cancelled_.load()
                 ? absl::CancelledError("push stream cancelled; the attempt was discarded")
                 : absl::FailedPreconditionError(
                       "push stream ended without a commit message; the attempt was discarded"));
      });
      return;
    }
    charged_ = request_.ByteSizeLong();
    deps_.budget->Charge(charged_);
    deps_.pool->Submit([this] { Handle(); });
  }

  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override { delete this; }

 private:
  void Handle() {
    absl::Status st = cancelled_.load() ? absl::CancelledError("push stream cancelled") : Process();
    deps_.budget->Release(charged_);
    charged_ = 0;
    if (!st.ok()) {
      Fail(st);
      return;
    }
    if (committed_) {
      Finish(grpc::Status::OK);
      return;
    }
    deps_.budget->WhenAvailable([this] { StartRead(&request_); });
  }

  absl::Status Process() {
    switch (request_.kind_case()) {
      case PushRequest::kOpen: {
        if (store_ != nullptr) {
          return absl::InvalidArgumentError("second open message in one push stream");
        }
        const auto& open = request_.open();
        auto store = deps_.registry->Get(open.shuffle_id());
        if (!store.ok()) return store.status();
        const ShuffleParams& params = (*store)->params();
        if (params.num_mappers != 0 && open.mapper_id() >= params.num_mappers) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mapper ", open.mapper_id(), " is out of range [0, ", params.num_mappers, ")"));
        }
        store_ = std::move(store).value();
        mapper_ = open.mapper_id();
        attempt_ = open.attempt_id();
        return absl::OkStatus();
      }
      case PushRequest::kFrames: {
        if (store_ == nullptr) return absl::InvalidArgumentError("frames before the open message");
        FrameDecoder& decoder = ThreadDecoder(deps_.limits);
        // Pool threads live as long as the server: after an unusually large frame, let its
        // scratch go rather than keep a cap's worth per thread.
        struct Trim {
          FrameDecoder& d;
          ~Trim() { d.TrimScratch(kKeptDecoderScratch); }
        } trim{decoder};
        for (const auto& pf : request_.frames().frames()) {
          if (frames_ >= deps_.max_frames_per_attempt) {
            // Its list of blocks is kept until the commit (24 bytes a frame), then indexed.
            return absl::ResourceExhaustedError(absl::StrCat(
                "attempt reached ", deps_.max_frames_per_attempt,
                " frames, the most one attempt may push (--max_frames_per_attempt): send "
                "larger frames"));
          }
          if (pf.partition_id() >= store_->params().num_partitions) {
            return absl::InvalidArgumentError(
                absl::StrCat("frame ", frames_, ": partition ", pf.partition_id(),
                             " is out of range [0, ", store_->params().num_partitions, ")"));
          }
          const auto bytes = absl::MakeConstSpan(
              reinterpret_cast<const uint8_t*>(pf.frame().data()), pf.frame().size());
          absl::Status st = decoder.Decode(bytes, &decoded_);
          if (!st.ok()) {
            return absl::InvalidArgumentError(absl::StrCat("frame ", frames_, " for partition ",
                                                           pf.partition_id(), ": ", st.message()));
          }
          const auto records = static_cast<uint32_t>(decoded_.size());
          auto block = store_->Append(mapper_, attempt_, pf.partition_id(), bytes, records);
          if (!block.ok()) return block.status();
          blocks_.push_back(*block);
          ++frames_;
          records_ += records;
          bytes_ += pf.frame().size();
        }
        return absl::OkStatus();
      }
      case PushRequest::kCommit: {
        if (store_ == nullptr) return absl::InvalidArgumentError("commit before the open message");
        const auto& commit = request_.commit();
        if (commit.frame_count() != frames_ || commit.record_count() != records_) {
          return absl::InvalidArgumentError(absl::StrCat(
              "commit says ", commit.frame_count(), " frames and ", commit.record_count(),
              " records, the server received ", frames_, " frames and ", records_, " records"));
        }
        commit_tried_ = true;
        auto outcome = store_->Commit(mapper_, attempt_, blocks_);
        if (!outcome.ok()) return outcome.status();
        const bool duplicate = *outcome == CommitOutcome::kDuplicate;
        if (duplicate) store_->Discard(blocks_);
        response_->set_duplicate(duplicate);
        response_->set_frames(frames_);
        response_->set_records(records_);
        response_->set_bytes(bytes_);
        committed_ = true;
        spdlog::info(
            "event=commit shuffle={} mapper={} attempt={} frames={} records={} bytes={} "
            "duplicate={}",
            store_->params().shuffle_id, mapper_, attempt_, frames_, records_, bytes_, duplicate);
        return absl::OkStatus();
      }
      default:
        return absl::InvalidArgumentError("empty push message");
    }
  }

  void Fail(const absl::Status& st) {
    // After a failed commit its record may be on disk anyway: leave the blocks for recovery to
    // judge rather than punching out data a durable record might point at.
    if (store_ != nullptr && !blocks_.empty() && !commit_tried_) store_->Discard(blocks_);
    if (store_ != nullptr) {
      spdlog::info("event=push_failed shuffle={} mapper={} attempt={} code={} error=\"{}\"",
                   store_->params().shuffle_id, mapper_, attempt_,
                   absl::StatusCodeToString(st.code()), std::string(st.message()));
    }
    Finish(ToGrpc(st));
  }

  const ShuffleServiceImpl::Deps deps_;
  PushResponse* const response_;
  PushRequest request_;
  uint64_t charged_ = 0;
  std::atomic<bool> cancelled_{false};
  std::shared_ptr<ShuffleStore> store_;
  uint32_t mapper_ = 0;
  uint64_t attempt_ = 0;
  std::vector<BlockRef> blocks_;
  uint64_t frames_ = 0, records_ = 0, bytes_ = 0;
  bool committed_ = false;
  bool commit_tried_ = false;
  DecodedFrame decoded_;
};

// One partition. UNORDERED: the stored frames as they were pushed, one per response, each
// read and checksum-verified on the pool while the previous one is on the wire. KEY: a k-way
// merge of the partition's runs, re-encoded in chunks the reducer asked for.
class FetchReactor final : public grpc::ServerWriteReactor<FetchResponse> {
 public:
  FetchReactor(ShuffleServiceImpl::Deps deps, const FetchRequest* request)
      : deps_(deps), request_(*request) {
    // Setup reads the store under its locks: keep gRPC threads free of any lock wait.
    deps_.pool->Submit([this] {
      absl::Status st = Setup(request_);
      if (!st.ok()) {
        Finish(ToGrpc(st));
        return;
      }
      Next();
    });
  }

  void OnWriteDone(bool ok) override {
    deps_.budget->Release(charged_);
    charged_ = 0;
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "fetch stream broken"));
      return;
    }
    // Fetches are not throttled by the budget (their memory is bounded: one chunk, plus at most
    // fan-in frames for a merge, all counted so that pushes slow down); waiting here could wait
    // on memory this very fetch holds.
    deps_.pool->Submit([this] { Next(); });
  }
  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override {
    deps_.budget->Release(merge_charged_);
    if (admitted_) deps_.merge_gate->Leave();
    delete this;
  }

 private:
  absl::Status Setup(const FetchRequest& req) {
    auto store = deps_.registry->Get(req.shuffle_id());
    if (!store.ok()) return store.status();
    store_ = std::move(store).value();
    const ShuffleParams& params = store_->params();
    partition_ = req.partition_id();
    if (partition_ >= params.num_partitions) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition ", partition_, " is out of range [0, ", params.num_partitions, ")"));
    }
    if (req.require_complete() && params.num_mappers == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("require_complete needs the shuffle's mapper count, and shuffle ",
                       params.shuffle_id, " was created without one (num_mappers = 0)"));
    }
    if (req.require_complete()) {
      const size_t have = store_->CommittedMappers().size();
      if (have < params.num_mappers) {
        return absl::FailedPreconditionError(absl::StrCat(
            params.num_mappers - have, " of ", params.num_mappers, " mappers have not committed"));
      }
    }
    key_order_ = req.order() == v1::KEY;
    switch (req.layout()) {
      case v1::LAYOUT_OPAQUE:
        encode_.layout = LayoutChoice::kOpaque;
        break;
      case v1::LAYOUT_MSGPACK:
        encode_.layout = LayoutChoice::kMsgpack;
        break;
      case v1::LAYOUT_COLUMNAR:
        encode_.layout = LayoutChoice::kColumnar;
        break;
      default:
        encode_.layout = LayoutChoice::kAuto;
    }
    encode_.compression = req.uncompressed() ? Compression::kNone : Compression::kZstd;
    if (req.zstd_level() > kMaxFetchZstdLevel) {
      return absl::InvalidArgumentError(
          absl::StrCat("zstd_level ", req.zstd_level(), " is out of range [1, ", kMaxFetchZstdLevel,
                       "] (0 means 3): the server compresses fetches for "
                       "every reducer, so it keeps to the fast levels"));
    }
    encode_.zstd_level = req.zstd_level() == 0 ? 3 : static_cast<int>(req.zstd_level());
    encode_.limits = deps_.limits;
    const size_t cap = deps_.limits.max_uncompressed_bytes / 2;
    chunk_bytes_ = req.target_chunk_bytes() == 0 ? (1u << 20) : req.target_chunk_bytes();
    chunk_bytes_ = std::min(chunk_bytes_, cap);
    blocks_ = store_->CommittedBlocks(partition_);
    return absl::OkStatus();
  }

  void Next() {
    if (key_order_ && !admitted_) {
      // Wait for a merge slot holding nothing; resume on the pool once admitted.
      deps_.merge_gate->Enter([this] {
        admitted_ = true;
        Next();
      });
      return;
    }
    absl::Status st = key_order_ ? NextMerged() : NextStored();
    if (!st.ok()) {
      deps_.budget->Release(charged_);
      charged_ = 0;
      spdlog::error("event=fetch_failed shuffle={} partition={} error=\"{}\"",
                    store_->params().shuffle_id, partition_, std::string(st.message()));
      Finish(ToGrpc(st));
      return;
    }
    if (done_) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&response_);
  }

  absl::Status NextStored() {
    if (next_ == blocks_.size()) {
      done_ = true;
      return absl::OkStatus();
    }
    const BlockRef& b = blocks_[next_++];
    charged_ = b.frame_size;
    deps_.budget->Charge(charged_);
    return store_->ReadFrame(b, response_.mutable_frame());
  }

  absl::Status NextMerged() {
    if (merged_ == nullptr) {
      DecodeOptions dopts;
      dopts.limits = deps_.limits;
      decoder_ = std::make_unique<FrameDecoder>(dopts);
      run_decoder_.decoder = decoder_.get();
      std::vector<std::unique_ptr<RunSource>> runs;
      runs.reserve(blocks_.size());
      for (const BlockRef& b : blocks_) runs.push_back(StoredFrameRun(store_, b, &run_decoder_));
      MergeOptions mopts = deps_.merge;
      mopts.cancelled = &cancelled_;  // intermediate passes stop when the reducer goes away
      auto merged = MergedStream::Make(std::move(runs), mopts);
      if (!merged.ok()) return merged.status();
      merged_ = std::move(merged).value();
      encoder_ = std::make_unique<FrameEncoder>(encode_);
    }
    batch_.clear();
    auto more = merged_->NextBatch(chunk_bytes_, &batch_);
    if (!more.ok()) return more.status();
    if (!*more) {
      done_ = true;
      return absl::OkStatus();
    }
    std::string* frame = response_.mutable_frame();
    frame->clear();
    absl::Status st = encoder_->Encode(batch_, frame);
    if (!st.ok()) return st;
    charged_ = frame->size();
    deps_.budget->Charge(charged_);
    // The runs' frames stay resident between chunks: keep their count in the budget current.
    // (With the buffer the runs read stored frames into and the decoder's scratch.)
    const size_t resident =
        merged_->resident_bytes() + run_decoder_.bytes.capacity() + decoder_->scratch_bytes();
    if (resident > merge_charged_) {
      deps_.budget->Charge(resident - merge_charged_);
    } else {
      deps_.budget->Release(merge_charged_ - resident);
    }
    merge_charged_ = resident;
    return absl::OkStatus();
  }

  const ShuffleServiceImpl::Deps deps_;
  const FetchRequest request_;
  std::shared_ptr<ShuffleStore> store_;
  uint32_t partition_ = 0;
  bool key_order_ = false;
  EncodeOptions encode_;
  size_t chunk_bytes_ = 1 << 20;
  std::vector<BlockRef> blocks_;
  size_t next_ = 0;
  bool done_ = false;
  uint64_t charged_ = 0;
  FetchResponse response_;
  // KEY order only.
  std::unique_ptr<FrameDecoder> decoder_;
  RunDecoder run_decoder_;  // shared by the merge's runs
  std::atomic<bool> cancelled_{false};
  std::unique_ptr<MergedStream> merged_;
  std::unique_ptr<FrameEncoder> encoder_;
  std::vector<Record> batch_;
  uint64_t merge_charged_ = 0;  // the runs' resident bytes, counted in the budget
  bool admitted_ = false;       // holds a merge slot
};

}  // namespace

void ShuffleServiceImpl::FillInfo(const ShuffleStore& store, bool partitions,
                                  v1::ShuffleInfo* info) {
  const ShuffleParams& p = store.params();
  info->set_shuffle_id(p.shuffle_id);
  info->set_num_partitions(p.num_partitions);
  info->set_num_mappers(p.num_mappers);
  for (uint32_t m : store.CommittedMappers()) info->add_committed_mappers(m);
  if (!partitions) return;
  for (uint32_t i = 0; i < p.num_partitions; ++i) {
    const PartitionStats s = store.Stats(i);
    auto* pi = info->add_partitions();
    pi->set_partition_id(i);
    pi->set_records(s.records);
    pi->set_bytes(s.bytes);
    pi->set_frames(s.frames);
  }
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::CreateShuffle(grpc::CallbackServerContext* ctx,
                                                            const v1::CreateShuffleRequest* req,
                                                            v1::CreateShuffleResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  deps_.pool->Submit([this, reactor, req, resp] {  // creates directories and syncs: off-thread
    ShuffleParams params{req->shuffle_id(), req->num_partitions(), req->num_mappers()};
    auto created = deps_.registry->Create(params);
    if (created.ok()) {
      resp->set_created(*created);
      if (*created) {
        spdlog::info("event=create shuffle={} partitions={} mappers={}", params.shuffle_id,
                     params.num_partitions, params.num_mappers);
      }
    }
    reactor->Finish(ToGrpc(created.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::GetShuffle(grpc::CallbackServerContext* ctx,
                                                         const v1::GetShuffleRequest* req,
                                                         v1::ShuffleInfo* resp) {
  auto* reactor = ctx->DefaultReactor();
  deps_.pool->Submit([this, reactor, req, resp] {  // store locks may wait on an fsync
    auto store = deps_.registry->Get(req->shuffle_id());
    if (store.ok()) FillInfo(**store, /*partitions=*/true, resp);
    reactor->Finish(ToGrpc(store.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::ListShuffles(grpc::CallbackServerContext* ctx,
                                                           const v1::ListShufflesRequest*,
                                                           v1::ListShufflesResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  deps_.pool->Submit([this, reactor, resp] {
    for (const auto& store : deps_.registry->List()) {
      FillInfo(*store, /*partitions=*/false, resp->add_shuffles());
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::DeleteShuffle(grpc::CallbackServerContext* ctx,
                                                            const v1::DeleteShuffleRequest* req,
                                                            v1::DeleteShuffleResponse*) {
  auto* reactor = ctx->DefaultReactor();
  deps_.pool->Submit([this, reactor, req] {  // removes files: off-thread
    absl::Status st = deps_.registry->Delete(req->shuffle_id());
    if (st.ok()) spdlog::info("event=delete shuffle={}", req->shuffle_id());
    reactor->Finish(ToGrpc(st));
  });
  return reactor;
}

grpc::ServerReadReactor<PushRequest>* ShuffleServiceImpl::Push(grpc::CallbackServerContext*,
                                                               PushResponse* resp) {
  return new PushReactor(deps_, resp);
}

grpc::ServerWriteReactor<FetchResponse>* ShuffleServiceImpl::Fetch(grpc::CallbackServerContext*,
                                                                   const FetchRequest* req) {
  return new FetchReactor(deps_, req);
}

}  // namespace sluice
