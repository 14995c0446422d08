#include "server/service/push_reactor.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/string_view.h"
#include "rpc/grpc_glue.h"
#include "server/rules/push_stream.h"
#include "server/service/call_edge.h"

namespace sluice {
namespace {

using v1::PushReply;
using v1::PushRequest;
using v1::PushResponse;
using ReadBase = grpc::ServerReadReactor<PushRequest>;
using FlowBase = grpc::ServerBidiReactor<PushRequest, PushReply>;
using Step = PushStream::Step;

// The message as the session sees it: spans into `req`, which stays as it is until the session
// says it is done with it.
void Convert(const PushRequest& req, PushMessage* m) {
  m->kind = PushMessage::Kind::kEmpty;
  m->wire_bytes = req.ByteSizeLong();
  m->frames.clear();
  switch (req.kind_case()) {
    case PushRequest::kOpen:
      m->kind = PushMessage::Kind::kOpen;
      m->shuffle_id = req.open().shuffle_id();
      m->mapper = req.open().mapper_id();
      m->attempt = req.open().attempt_id();
      m->placement_epoch = req.open().placement_epoch();
      break;
    case PushRequest::kFrames:
      m->kind = PushMessage::Kind::kFrames;
      for (const auto& pf : req.frames().frames()) {
        m->frames.push_back(PushAttempt::Frame{
            pf.partition_id(),
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(pf.frame().data()),
                                pf.frame().size())});
      }
      break;
    case PushRequest::kLargeFrame:
      m->kind = PushMessage::Kind::kLargeFrame;
      m->partition = req.large_frame().partition_id();
      m->size = req.large_frame().frame_size();
      break;
    case PushRequest::kPiece:
      m->kind = PushMessage::Kind::kPiece;
      m->piece = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(req.piece().data().data()),
                                     req.piece().data().size());
      break;
    case PushRequest::kAsk:
      m->kind = PushMessage::Kind::kAsk;
      m->size = req.ask().bytes();
      break;
    case PushRequest::kCommit:
      m->kind = PushMessage::Kind::kCommit;
      m->frame_count = req.commit().frame_count();
      m->record_count = req.commit().record_count();
      m->prepare = req.commit().prepare();
      break;
    default:
      break;
  }
}

// One reactor for both push calls: it reads, writes (PushFlow's credit) and finishes as its
// PushStream says (server/rules/push_stream.h), and converts the messages.
template <typename Base>
class PushReactor final : public Base, private PushStream::Host {
  static constexpr bool kFlow = std::is_same_v<Base, FlowBase>;

 public:
  PushReactor(const ServiceDeps& deps, grpc::CallbackServerContext* ctx, PushResponse* response)
      : deps_(deps), ctx_(ctx) {
    response_ = kFlow ? reply_.mutable_done() : response;
    absl::StatusOr<CallContext> call = ResolveCaller(deps_, ctx_);
    if (!call.ok()) {
      this->Finish(ToCaller(call.status()));
      return;
    }
    call_ = *std::move(call);
    auto stream = PushStream::Make(kFlow ? PushStream::Kind::kFlow : PushStream::Kind::kPush, call_,
                                   deps_, this);
    if (!stream.ok()) {
      this->Finish(ToCaller(stream.status()));
      return;
    }
    stream_ = *std::move(stream);
    // Taken: the client learns it before it sends anything (a stream refused, or one on a dead
    // connection, is told at its open).
    this->StartSendInitialMetadata();
    Do(stream_->Start());
  }

  void OnReadDone(bool ok) override {
    deps_.watchdog->Disarm(watch_);
    if (ok) Convert(request_, &message_);
    Do(stream_->Received(ok ? &message_ : nullptr, cancelled_.load() || ctx_->IsCancelled()));
  }

  void OnWriteDone(bool /*ok*/) {
    std::lock_guard<std::mutex> lock(write_mu_);
    writing_ = false;
    if (final_.has_value()) {
      const grpc::Status st = *final_;
      final_.reset();
      FinalLocked(st);
    } else if (queued_credit_ != 0) {
      WriteCreditLocked(queued_credit_);
      queued_credit_ = 0;
    }
  }

  void OnCancel() override {
    cancelled_.store(true);
    if (stream_ != nullptr) stream_->Cancel();
  }
  void OnDone() override {
    deps_.watchdog->Disarm(watch_);
    delete this;  // the session gives back what the stream held
  }

 private:
  // PushStream::Host.
  void Resume(Step step) override { Do(std::move(step)); }
  void MessageDone() override {
    // A protobuf message keeps its strings' capacity when cleared: swapped with an empty one, a
    // stream waiting for its next message holds none of the last one's memory.
    PushRequest().Swap(&request_);
  }
  absl::Status CheckCaller(absl::string_view then) override {
    return CheckCallerAgain(deps_, ctx_, call_, then);
  }

  void Do(Step step) {
    switch (step.what) {
      case Step::Do::kNothing:
        return;
      case Step::Do::kWork:
        deps_.pool->Submit([this] { Do(stream_->Work()); });
        return;
      case Step::Do::kRead:
        if (step.credit != 0) SendCredit(step.credit);
        watch_ = deps_.watchdog->Arm(step.deadline, [this] { Do(stream_->Expired()); });
        this->StartRead(&request_);
        return;
      case Step::Do::kFinish:
        if (step.status.ok()) {
          const PushSummary& s = stream_->summary();
          response_->set_duplicate(s.duplicate);
          response_->set_prepared(s.prepared);
          response_->set_frames(s.frames);
          response_->set_records(s.records);
          response_->set_bytes(s.bytes);
        }
        End(ToCaller(step.status));
        return;
    }
  }

  void SendCredit(uint64_t n) {
    std::lock_guard<std::mutex> lock(write_mu_);
    if (writing_) {
      queued_credit_ += n;  // the last one's write has not completed yet
      return;
    }
    WriteCreditLocked(n);
  }
  void WriteCreditLocked(uint64_t n) {
    if constexpr (kFlow) {
      credit_msg_.set_credit(n);
      // The huge partitions' segments made since this stream last told its writer, which
      // routes their partitions' next frames to them (docs/cluster.md, "Huge partitions").
      credit_msg_.clear_segments();
      for (const SegmentMeter::Segment& g : stream_->SegmentsToTell()) {
        v1::PlacementSegment* out = credit_msg_.add_segments();
        out->set_partition_id(g.id);
        out->set_parent(g.parent);
        out->mutable_nodes()->Add(g.replicas.begin(), g.replicas.end());
      }
      writing_ = true;
      this->StartWrite(&credit_msg_);
    }
  }

  // Ends the stream with `st` (with the commit's response when OK), once no write is out.
  void End(const grpc::Status& st) {
    if constexpr (!kFlow) {
      this->Finish(st);
    } else {
      std::lock_guard<std::mutex> lock(write_mu_);
      if (writing_) {
        final_ = st;
        return;
      }
      FinalLocked(st);
    }
  }
  void FinalLocked(const grpc::Status& st) {
    if constexpr (kFlow) {
      if (st.ok()) {
        this->StartWriteAndFinish(&reply_, grpc::WriteOptions(), st);
      } else {
        this->Finish(st);
      }
    }
  }

  const ServiceDeps& deps_;
  grpc::CallbackServerContext* const ctx_;
  PushResponse* response_ = nullptr;  // PushFlow: reply_'s
  CallContext call_;
  std::unique_ptr<PushStream> stream_;  // null until admitted
  PushRequest request_;
  PushMessage message_;  // request_ as the session sees it
  std::atomic<bool> cancelled_{false};
  uint64_t watch_ = 0;  // the watchdog entry of the current read
  // PushFlow.
  PushReply reply_;  // the last message (done)
  PushReply credit_msg_;
  std::mutex write_mu_;  // one write out at a time: a credit, or the last message
  bool writing_ = false;
  uint64_t queued_credit_ = 0;         // granted while a write was out
  std::optional<grpc::Status> final_;  // the end, once the write out completes
};

}  // namespace

grpc::ServerReadReactor<v1::PushRequest>* StartPush(const ServiceDeps& deps,
                                                    grpc::CallbackServerContext* ctx,
                                                    v1::PushResponse* response) {
  return new PushReactor<ReadBase>(deps, ctx, response);
}

grpc::ServerBidiReactor<v1::PushRequest, v1::PushReply>* StartPushFlow(
    const ServiceDeps& deps, grpc::CallbackServerContext* ctx) {
  return new PushReactor<FlowBase>(deps, ctx, nullptr);
}

}  // namespace sluice
