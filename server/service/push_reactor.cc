#include "server/service/push_reactor.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/status_macros.h"
#include "rpc/grpc_glue.h"
#include "server/service/call_edge.h"
#include "server/service/stream_phase.h"

namespace sluice {
namespace {

using v1::PushReply;
using v1::PushRequest;
using v1::PushResponse;
using ReadBase = grpc::ServerReadReactor<PushRequest>;
using FlowBase = grpc::ServerBidiReactor<PushRequest, PushReply>;

// One reactor for both push calls. Push (ReadBase) reads a message whenever the budget has
// room and charges it once it is in hand; PushFlow (FlowBase) grants credit from the budget
// before its client sends a frames or piece message, so nothing arrives that was not counted
// first.
template <typename Base>
class PushReactor final : public Base {
  static constexpr bool kFlow = std::is_same_v<Base, FlowBase>;

 public:
  PushReactor(const ServiceDeps& deps, grpc::CallbackServerContext* ctx, PushResponse* response)
      : deps_(deps), ctx_(ctx), attempt_(deps.registry, deps.push) {
    response_ = kFlow ? reply_.mutable_done() : response;
    absl::StatusOr<CallContext> call = ResolveCaller(deps_, ctx_);
    if (!call.ok()) {
      this->Finish(ToCaller(call.status()));
      return;
    }
    call_ = *std::move(call);
    auto admitted = StreamAdmission::Enter(StreamKind::kPush, call_, deps_.admission);
    if (!admitted.ok()) {
      this->Finish(ToCaller(admitted.status()));
      return;
    }
    admission_ = *std::move(admitted);
    // Taken: the client learns it before it sends anything (a stream refused, or one on a dead
    // connection, is told at its open).
    this->StartSendInitialMetadata();
    ReadNext();
  }

  void OnReadDone(bool ok) override {
    const bool ours = phase_.Claim();
    deps_.watchdog->Disarm(watch_);
    if (!ours) return;  // the idle timeout ended the stream (Expire)
    if (!ok) {          // the client closed, cancelled or broke the stream without a commit
      deps_.pool->Submit([this] {
        // OnCancel may come after this read's failure: ask the call itself too.
        Fail(cancelled_.load() || ctx_->IsCancelled()
                 ? absl::CancelledError("push stream cancelled; the attempt was discarded")
                 : absl::FailedPreconditionError(
                       "push stream ended without a commit message; the attempt was discarded"));
      });
      return;
    }
    const uint64_t size = request_.ByteSizeLong();
    const auto kind = request_.kind_case();
    if (kFlow && kind == PushRequest::kAsk) {
      // Answered here, off the pool: the client waits for it, and the pool may be busy with
      // other streams' frames.
      const absl::StatusOr<uint64_t> asked = TakeAsk();
      if (!asked.ok()) {
        deps_.pool->Submit([this, st = asked.status()] { Fail(st); });
        return;
      }
      Grant(*asked);
      return;
    }
    if (kFlow && kind == PushRequest::kFrames) {
      // Its memory was reserved when its credit was granted: that is its charge now.
      if (!admission_->UseCredit(size)) {
        deps_.pool->Submit([this, size] { Fail(BeyondCredit(size, admission_->credit())); });
        return;
      }
    } else if (kFlow && kind == PushRequest::kPiece) {
      // A large frame's piece, its data within the credit its promise gave.
      const uint64_t data = request_.piece().data().size();
      if (data > piece_credit_) {
        deps_.pool->Submit([this, data] { Fail(BeyondCredit(data, piece_credit_)); });
        return;
      }
      piece_credit_ -= data;
      admission_->Charge(size);
    } else {
      admission_->Charge(size);
    }
    deps_.pool->Submit([this] { Handle(); });
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

  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override {
    deps_.watchdog->Disarm(watch_);
    delete this;  // the admission gives back what the stream held
  }

 private:
  static absl::Status BeyondCredit(uint64_t size, uint64_t credit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", size, "-byte push message came with ", credit,
        " bytes of credit: PushFlow sends a frames message only within credit it asked for "
        "(PushRequest.ask) and was granted, and a large frame's pieces only once its size was "
        "granted; the attempt was discarded"));
  }

  // An ask for the next frames message's credit (PushFlow): the bytes asked for.
  absl::StatusOr<uint64_t> TakeAsk() {
    const uint64_t bytes = request_.ask().bytes();
    if (bytes == 0 || bytes > static_cast<uint64_t>(rpc::kMaxPushMessageBytes)) {
      return absl::InvalidArgumentError(absl::StrCat("an ask for ", bytes,
                                                     " bytes: a push message is 1 to ",
                                                     rpc::kMaxPushMessageBytes, " bytes"));
    }
    if (attempt_.large_frame_size() > 0) {
      return absl::InvalidArgumentError(
          "an ask in the middle of a large frame: its pieces come within the credit its size "
          "was granted");
    }
    if (admission_->credit() + bytes > static_cast<uint64_t>(rpc::kMaxPushMessageBytes)) {
      return absl::InvalidArgumentError(
          "an ask while holding credit: ask for the next message once the last one is sent");
    }
    return bytes;
  }

  // Waits for the next message, for at most the idle timeout; and, while a large frame's
  // memory is promised, for no longer than the idle timeout since the promise, however its
  // pieces trickle in.
  void ReadNext() {
    phase_.Wait();
    const auto now = Watchdog::Clock::now();
    auto deadline = now + deps_.timeouts.push_idle;
    frame_deadline_ = credit_deadline_ = false;
    if (admission_->holds_large_frame()) {
      const auto frame_deadline = admission_->large_frame_since() + deps_.timeouts.push_idle;
      if (frame_deadline < deadline) {
        deadline = frame_deadline;
        frame_deadline_ = true;
      }
    }
    // Credit granted is memory held for a message the client has in hand: it comes at once, or
    // the credit goes back with the attempt (a client that asks and sends nothing holds the
    // budget no longer than this).
    if (admission_->credit() != 0 && now + deps_.timeouts.push_credit < deadline) {
      deadline = now + deps_.timeouts.push_credit;
      credit_deadline_ = true;
    }
    watch_ = deps_.watchdog->Arm(deadline, [this] { Expire(); });
    this->StartRead(&request_);
  }

  // On the watchdog's thread: no message came in time. The read stays pending (it completes
  // once the stream ends); the attempt is discarded and the stream ended from the pool.
  void Expire() {
    if (!phase_.Expire()) return;
    deps_.pool->Submit([this] {
      Fail(absl::DeadlineExceededError(
          credit_deadline_
              ? absl::StrCat("credit for a ", admission_->credit(),
                             "-byte message was granted and the message did not come within ",
                             Seconds(deps_.timeouts.push_credit),
                             " s (--push_credit_timeout_s); the attempt was discarded")
          : frame_deadline_
              ? absl::StrCat("a large frame took over ", Seconds(deps_.timeouts.push_idle),
                             " s to arrive (--push_idle_timeout_s); the attempt was discarded")
              : absl::StrCat("push stream idle for ", Seconds(deps_.timeouts.push_idle),
                             " s waiting for its next message (--push_idle_timeout_s); the "
                             "attempt was discarded")));
    });
  }

  void Handle() {
    absl::Status st = cancelled_.load() ? absl::CancelledError("push stream cancelled") : Forward();
    CountTaken();
    admission_->ReleaseCharge();
    // The message's memory goes with its charge: a stream waiting for its client's next
    // message, or for the budget, holds none of it (a protobuf message keeps its strings'
    // capacity when cleared: an idle stream used to keep ~1 MiB each, outside the budget).
    PushRequest().Swap(&request_);
    if (attempt_.large_frame_size() == 0) admission_->ReleaseLargeFrame();  // stored, or none
    if (st.ok() && attempt_.large_frame_size() > 0) {
      if (!admission_->holds_large_frame()) {
        // Just announced: its whole size is promised before any piece of it is read (and,
        // with PushFlow, before its client sends one: the promise is its pieces' credit).
        const uint64_t size = attempt_.large_frame_size();
        st = admission_->ReserveLargeFrame(kBlockHeaderSize + size, [this, size] {
          if constexpr (kFlow) {
            piece_credit_ = size;
            SendCredit(size);
          }
          ReadNext();
        });
        if (st.ok()) return;  // ReadNext once granted
      } else if (piece_bytes_ > 0 && !admission_->LargeFrameArrived(piece_bytes_)) {
        // The rest of its promise went to a tenant under its share: ask again.
        admission_->PromiseRestOfLargeFrame([this] { ReadNext(); });
        return;
      }
    }
    if (!st.ok()) {
      Fail(st);
      return;
    }
    if (committed_) {
      End(grpc::Status::OK);
      return;
    }
    if constexpr (kFlow) {
      ReadNext();  // what comes next is an ask, or within credit granted
      return;
    }
    if (admission_->holds_large_frame()) {
      ReadNext();  // its memory is reserved already: the next piece may come at once
      return;
    }
    admission_->WhenBudgetAllows([this] { ReadNext(); });
  }

  // Credit for an `n`-byte message, reserved from the budget at once or once there is room
  // (the client waits for it meanwhile, its message in its own memory).
  void Grant(uint64_t n) {
    if (admission_->TryReserveCredit(n)) {
      SendCredit(n);
      ReadNext();
      return;
    }
    admission_->ReserveCredit(n, [this, n] {
      SendCredit(n);
      ReadNext();
    });
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
      if (meter_ != nullptr && meter_->count() > told_segments_) {
        for (const SegmentMeter::Segment& g : meter_->After(told_segments_)) {
          v1::PlacementSegment* out = credit_msg_.add_segments();
          out->set_partition_id(g.id);
          out->set_parent(g.parent);
          out->mutable_nodes()->Add(g.replicas.begin(), g.replicas.end());
          ++told_segments_;
        }
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

  // What the attempt took since the last message, into the server's counters.
  void CountTaken() {
    ServerMetrics& m = *deps_.metrics;
    ServerMetrics::Add(m.push_frames, attempt_.frames() - counted_frames_);
    ServerMetrics::Add(m.push_records, attempt_.records() - counted_records_);
    ServerMetrics::Add(m.push_bytes, attempt_.bytes() - counted_bytes_);
    counted_frames_ = attempt_.frames();
    counted_records_ = attempt_.records();
    counted_bytes_ = attempt_.bytes();
  }

  absl::Status Forward() {
    piece_bytes_ = 0;
    switch (request_.kind_case()) {
      case PushRequest::kOpen: {
        const auto& open = request_.open();
        SLUICE_ASSIGN_OR_RETURN(const std::string id, call_.Kept(open.shuffle_id()));
        std::shared_ptr<const std::vector<bool>> kept;
        if (!attempt_.opened()) {
          SLUICE_ASSIGN_OR_RETURN(kept, deps_.node->PrepareToPush(id, open.placement_epoch()));
        }
        SLUICE_RETURN_IF_ERROR(
            attempt_.Open(id, open.mapper_id(), open.attempt_id(), std::move(kept)));
        shuffle_id_ = id;
        std::shared_ptr<SegmentMeter> meter = deps_.node->Meter(id);
        if (meter != nullptr) {
          // Counted among the shuffle's writers here while the stream lives (each may send a
          // segment a little after its next is made: SegmentMeter::ask_bytes).
          meter->Enter();
          among_writers_ = std::shared_ptr<void>(nullptr, [meter](void*) { meter->Leave(); });
        }
        std::lock_guard<std::mutex> lock(write_mu_);
        meter_ = std::move(meter);
        return absl::OkStatus();
      }
      case PushRequest::kFrames: {
        frames_.clear();
        uint64_t bytes = 0;
        for (const auto& pf : request_.frames().frames()) {
          frames_.push_back(PushAttempt::Frame{
              pf.partition_id(),
              absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(pf.frame().data()),
                                  pf.frame().size())});
          bytes += kBlockHeaderSize + pf.frame().size();
        }
        SLUICE_RETURN_IF_ERROR(admission_->CheckStored(bytes));
        for (const PushAttempt::Frame& f : frames_) SLUICE_RETURN_IF_ERROR(KeepNow(f.partition));
        SLUICE_RETURN_IF_ERROR(attempt_.AddFrames(frames_));
        for (const PushAttempt::Frame& f : frames_) Stored(f.partition, f.bytes.size());
        return absl::OkStatus();
      }
      case PushRequest::kLargeFrame: {
        // Reserved by Handle once the announce is taken (its size within the cap).
        const uint32_t partition = request_.large_frame().partition_id();
        SLUICE_RETURN_IF_ERROR(KeepNow(partition));
        SLUICE_RETURN_IF_ERROR(
            attempt_.BeginLargeFrame(partition, request_.large_frame().frame_size()));
        Stored(partition, request_.large_frame().frame_size());  // (counted as announced)
        return absl::OkStatus();
      }
      case PushRequest::kPiece: {
        // (Its promise lasts the idle timeout: ReadNext waits for a piece no longer.)
        const std::string& data = request_.piece().data();
        piece_bytes_ = data.size();
        return attempt_.AddPiece(
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
      }
      case PushRequest::kAsk:  // PushFlow's are taken in OnReadDone
        return absl::InvalidArgumentError(
            "an ask message is for PushFlow; Push reads without credit");
      case PushRequest::kCommit: {
        // The credentials again: a token taken out of --auth_file while the stream was open
        // commits nothing (it is read again every --auth_reload_s).
        SLUICE_RETURN_IF_ERROR(CheckCallerAgain(
            deps_, ctx_, call_, "checked again at the commit; the attempt was discarded"));
        const auto started = std::chrono::steady_clock::now();
        SLUICE_ASSIGN_OR_RETURN(
            const PushSummary summary,
            attempt_.Commit(request_.commit().frame_count(), request_.commit().record_count(),
                            request_.commit().prepare()));
        deps_.metrics->commit_seconds.Observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
        ServerMetrics::Add(
            summary.duplicate ? deps_.metrics->duplicate_commits : deps_.metrics->commits, 1);
        response_->set_duplicate(summary.duplicate);
        response_->set_prepared(summary.prepared);
        response_->set_frames(summary.frames);
        response_->set_records(summary.records);
        response_->set_bytes(summary.bytes);
        committed_ = true;
        return absl::OkStatus();
      }
      default:
        return absl::InvalidArgumentError("empty push message");
    }
  }

  // A frame for a stored partition the open did not know to be kept here: a huge partition's
  // segment made since, which the record read again may say is (docs/cluster.md).
  absl::Status KeepNow(uint32_t partition) {
    if (attempt_.Keeps(partition)) return absl::OkStatus();
    SLUICE_ASSIGN_OR_RETURN(auto kept, deps_.node->KeptNow(shuffle_id_, partition));
    attempt_.Rekeep(std::move(kept));
    return absl::OkStatus();  // (AddFrames refuses it if it is still not kept)
  }
  // Counts a frame stored here; one that takes its segment past the split size has the record
  // asked for the next (a failure is logged and asked again by a later frame).
  void Stored(uint32_t partition, uint64_t frame_bytes) {
    if (meter_ != nullptr && meter_->Add(partition, kBlockHeaderSize + frame_bytes)) {
      (void)deps_.node->Split(shuffle_id_, partition);
    }
  }

  void Fail(const absl::Status& st) {
    admission_->ReleaseLargeFrame();
    if (attempt_.opened()) ServerMetrics::Add(deps_.metrics->aborted_attempts, 1);
    attempt_.Abort(st);
    End(ToCaller(st));
  }

  const ServiceDeps& deps_;
  grpc::CallbackServerContext* const ctx_;
  PushResponse* response_ = nullptr;  // PushFlow: reply_'s
  CallContext call_;
  std::unique_ptr<StreamAdmission> admission_;  // null until admitted
  PushRequest request_;
  PushAttempt attempt_;
  std::vector<PushAttempt::Frame> frames_;  // the current message's, for AddFrames
  std::string shuffle_id_;                  // as kept (the tenant's prefix on it), once open
  std::shared_ptr<SegmentMeter> meter_;     // its huge partitions (null: not split); write_mu_
  uint32_t told_segments_ = 0;              // segments told to the writer (write_mu_)
  std::shared_ptr<void> among_writers_;     // its place among the meter's writers
  std::atomic<bool> cancelled_{false};
  bool committed_ = false;
  uint64_t piece_bytes_ = 0;      // the size of the piece of a large frame just taken
  bool frame_deadline_ = false;   // the current wait ends when the frame's promise does
  bool credit_deadline_ = false;  // the current wait ends when unused credit must go back
  StreamPhase phase_;
  uint64_t watch_ = 0;  // the watchdog entry of the current wait
  uint64_t counted_frames_ = 0, counted_records_ = 0, counted_bytes_ = 0;  // CountTaken
  // PushFlow.
  uint64_t piece_credit_ = 0;  // a large frame's bytes its client may still send
  PushReply reply_;            // the last message (done)
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
