#include "server/rules/push_stream.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/storage/block_format.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<PushStream>> PushStream::Make(Kind kind, const CallContext& call,
                                                             const StreamDeps& deps, Host* host) {
  std::unique_ptr<PushStream> s(new PushStream(kind, call, deps, host));
  SLUICE_ASSIGN_OR_RETURN(s->admission_,
                          StreamAdmission::Enter(StreamKind::kPush, call, deps.admission));
  // A plain Push client sends without credit: gRPC may hold its stream window and a message
  // that the budget never sees (not reading does not stop it), so plain streams are counted.
  if (kind == Kind::kPush) SLUICE_RETURN_IF_ERROR(s->admission_->EnterPlainPush());
  return s;
}

// (The attempt aborts itself if it neither committed nor failed; the admission gives back
// what the stream held.)
PushStream::~PushStream() = default;

PushStream::Step PushStream::Start() { return ReadStep(); }

// Waits for the next message, for at most the idle timeout; and, while a large frame's memory
// is promised, for no longer than the idle timeout since the promise, however its pieces
// trickle in.
PushStream::Step PushStream::ReadStep(uint64_t credit) {
  phase_.Wait();
  const Clock::time_point now = deps_.clock->Now();
  Clock::time_point deadline = now + deps_.timeouts.push_idle;
  until_ = Until::kIdle;
  if (admission_->holds_large_frame()) {
    const Clock::time_point frame_deadline = promised_at_ + deps_.timeouts.push_idle;
    if (frame_deadline < deadline) {
      deadline = frame_deadline;
      until_ = Until::kLargeFrame;
    }
  }
  // Credit granted is memory held for a message the client has in hand: it comes at once, or
  // the credit goes back with the attempt (a client that asks and sends nothing holds the
  // budget no longer than this).
  if (admission_->credit() != 0 && now + deps_.timeouts.push_credit < deadline) {
    deadline = now + deps_.timeouts.push_credit;
    until_ = Until::kCredit;
  }
  deadline_.store(deadline.time_since_epoch().count());
  Step step;
  step.what = Step::Do::kRead;
  step.deadline = deadline;
  step.credit = credit;
  return step;
}

PushStream::Step PushStream::Expired() {
  const Clock::time_point deadline{Clock::duration(deadline_.load())};
  if (deps_.clock->Now() < deadline || !phase_.Expire()) return Step{};
  const std::string idle = Seconds(deps_.timeouts.push_idle);
  switch (until_) {
    case Until::kCredit:
      failed_ = absl::DeadlineExceededError(
          absl::StrCat("credit for a ", admission_->credit(),
                       "-byte message was granted and the message did not come within ",
                       Seconds(deps_.timeouts.push_credit),
                       " s (--push_credit_timeout_s); the attempt was discarded"));
      break;
    case Until::kLargeFrame:
      failed_ = absl::DeadlineExceededError(
          absl::StrCat("a large frame took over ", idle,
                       " s to arrive (--push_idle_timeout_s); the attempt was discarded"));
      break;
    case Until::kIdle:
      failed_ = absl::DeadlineExceededError(
          absl::StrCat("push stream idle for ", idle,
                       " s waiting for its next message (--push_idle_timeout_s); the attempt "
                       "was discarded"));
      break;
  }
  // The read stays pending (it completes once the stream ends); the attempt is discarded on
  // the pool.
  return Step{Step::Do::kWork};
}

PushStream::Step PushStream::Received(const PushMessage* m, bool cancelled) {
  if (!phase_.Claim()) return Step{};  // the deadline ended the stream (Expired)
  if (m == nullptr) {  // the client closed, cancelled or broke the stream without a commit
    failed_ = cancelled || cancelled_.load()
                  ? absl::CancelledError("push stream cancelled; the attempt was discarded")
                  : absl::FailedPreconditionError(
                        "push stream ended without a commit message; the attempt was discarded");
    return Step{Step::Do::kWork};
  }
  const uint64_t size = m->wire_bytes;
  if (flow() && m->kind == PushMessage::Kind::kAsk) {
    // Answered at once, off the pool: the client waits for it, and the pool may be busy with
    // other streams' frames.
    const absl::StatusOr<uint64_t> asked = TakeAsk(m->size);
    if (!asked.ok()) {
      failed_ = asked.status();
      return Step{Step::Do::kWork};
    }
    return Grant(*asked);
  }
  if (flow() && m->kind == PushMessage::Kind::kFrames) {
    // Its memory was reserved when its credit was granted: that is its charge now.
    if (!admission_->UseCredit(size)) {
      failed_ = BeyondCredit(size, admission_->credit());
      return Step{Step::Do::kWork};
    }
  } else if (flow() && m->kind == PushMessage::Kind::kPiece) {
    // A large frame's piece, its data within the credit its promise gave.
    const uint64_t data = m->piece.size();
    if (data > piece_credit_) {
      failed_ = BeyondCredit(data, piece_credit_);
      return Step{Step::Do::kWork};
    }
    piece_credit_ -= data;
    admission_->Charge(size);
  } else {
    admission_->Charge(size);
  }
  message_ = m;
  return Step{Step::Do::kWork};
}

absl::Status PushStream::BeyondCredit(uint64_t size, uint64_t credit) {
  return absl::InvalidArgumentError(absl::StrCat(
      "a ", size, "-byte push message came with ", credit,
      " bytes of credit: PushFlow sends a frames message only within credit it asked for "
      "(PushRequest.ask) and was granted, and a large frame's pieces only once its size was "
      "granted; the attempt was discarded"));
}

// An ask for the next frames message's credit (PushFlow): the bytes asked for.
absl::StatusOr<uint64_t> PushStream::TakeAsk(uint64_t bytes) const {
  const uint64_t max = deps_.push.max_message_bytes;
  if (bytes == 0 || bytes > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("an ask for ", bytes, " bytes: a push message is 1 to ", max, " bytes"));
  }
  if (!attempt_.opened()) {
    return absl::InvalidArgumentError(
        "an ask before the open message: a push stream opens its attempt first");
  }
  if (attempt_.large_frame_size() > 0) {
    return absl::InvalidArgumentError(
        "an ask in the middle of a large frame: its pieces come within the credit its size "
        "was granted");
  }
  if (admission_->credit() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an ask while holding credit (", admission_->credit(),
        " bytes granted, their message not sent): ask for the next message once the last one "
        "is sent"));
  }
  return bytes;
}

// Credit for an `n`-byte message, reserved from the budget at once or once there is room (the
// client waits for it meanwhile, its message in its own memory).
PushStream::Step PushStream::Grant(uint64_t n) {
  if (admission_->TryReserveCredit(n)) return ReadStep(n);
  admission_->ReserveCredit(n, [this, n] { host_->Resume(ReadStep(n)); });
  return Step{};
}

void PushStream::Promised(uint64_t credit) {
  promised_at_ = deps_.clock->Now();
  host_->Resume(ReadStep(credit));
}

PushStream::Step PushStream::Work() {
  if (!failed_.ok()) {  // Received or Expired decided the end
    // (Not MessageDone: after Expired the transport's read is still pending into its message.)
    return Fail(failed_);
  }
  absl::Status st =
      cancelled_.load() ? absl::CancelledError("push stream cancelled") : Handle(*message_);
  message_ = nullptr;
  CountTaken();
  admission_->ReleaseCharge();
  // The message's memory goes with its charge: a stream waiting for its client's next message,
  // or for the budget, holds none of it.
  host_->MessageDone();
  if (attempt_.large_frame_size() == 0) admission_->ReleaseLargeFrame();  // stored, or none
  if (st.ok() && attempt_.large_frame_size() > 0) {
    if (!admission_->holds_large_frame()) {
      // Just announced: its whole size is promised before any piece of it is read (and, with
      // PushFlow, before its client sends one: the promise is its pieces' credit).
      const uint64_t size = attempt_.large_frame_size();
      st = admission_->ReserveLargeFrame(kBlockHeaderSize + size, [this, size] {
        if (flow()) piece_credit_ = size;
        Promised(flow() ? size : 0);
      });
      if (st.ok()) return Step{};  // the read once granted
    } else if (piece_bytes_ > 0 && !admission_->LargeFrameArrived(piece_bytes_)) {
      // The rest of its promise went to a tenant under its share: ask again.
      admission_->PromiseRestOfLargeFrame([this] { Promised(0); });
      return Step{};
    }
  }
  if (!st.ok()) return Fail(st);
  if (committed_) return Step{Step::Do::kFinish};
  // PushFlow: what comes next is an ask, or within credit granted. A large frame's memory is
  // reserved already: its next piece may come at once.
  if (flow() || admission_->holds_large_frame()) return ReadStep();
  admission_->WhenBudgetAllows([this] { host_->Resume(ReadStep()); });
  return Step{};
}

PushStream::Step PushStream::Fail(const absl::Status& st) {
  admission_->ReleaseLargeFrame();
  if (attempt_.opened()) ServerMetrics::Add(deps_.metrics->aborted_attempts, 1);
  attempt_.Abort(st);
  Step step{Step::Do::kFinish};
  step.status = st;
  return step;
}

// What the attempt took since the last message, into the server's counters.
void PushStream::CountTaken() {
  ServerMetrics& m = *deps_.metrics;
  ServerMetrics::Add(m.push_frames, attempt_.frames() - counted_frames_);
  ServerMetrics::Add(m.push_records, attempt_.records() - counted_records_);
  ServerMetrics::Add(m.push_bytes, attempt_.bytes() - counted_bytes_);
  counted_frames_ = attempt_.frames();
  counted_records_ = attempt_.records();
  counted_bytes_ = attempt_.bytes();
}

absl::Status PushStream::Handle(const PushMessage& m) {
  piece_bytes_ = 0;
  switch (m.kind) {
    case PushMessage::Kind::kOpen:
      return Open(m);
    case PushMessage::Kind::kFrames: {
      uint64_t bytes = 0;
      for (const PushAttempt::Frame& f : m.frames) bytes += kBlockHeaderSize + f.bytes.size();
      SLUICE_RETURN_IF_ERROR(admission_->CheckStored(bytes));
      for (const PushAttempt::Frame& f : m.frames) SLUICE_RETURN_IF_ERROR(KeepNow(f.partition));
      SLUICE_RETURN_IF_ERROR(attempt_.AddFrames(m.frames));
      for (const PushAttempt::Frame& f : m.frames) Stored(f.partition, f.bytes.size());
      return absl::OkStatus();
    }
    case PushMessage::Kind::kLargeFrame:
      // Reserved by Work once the announce is taken (its size within the cap).
      SLUICE_RETURN_IF_ERROR(KeepNow(m.partition));
      SLUICE_RETURN_IF_ERROR(attempt_.BeginLargeFrame(m.partition, m.size));
      Stored(m.partition, m.size);  // (counted as announced)
      return absl::OkStatus();
    case PushMessage::Kind::kPiece:
      // (Its promise lasts the idle timeout: ReadStep waits for a piece no longer.)
      piece_bytes_ = m.piece.size();
      return attempt_.AddPiece(m.piece);
    case PushMessage::Kind::kAsk:  // PushFlow's are taken by Received
      return absl::InvalidArgumentError(
          "an ask message is for PushFlow; Push reads without credit");
    case PushMessage::Kind::kCommit:
      return Commit(m);
    case PushMessage::Kind::kEmpty:
      break;
  }
  return absl::InvalidArgumentError("empty push message");
}

absl::Status PushStream::Open(const PushMessage& m) {
  SLUICE_ASSIGN_OR_RETURN(const std::string id, call_.Kept(m.shuffle_id));
  std::shared_ptr<const std::vector<bool>> kept;
  if (!attempt_.opened()) {
    SLUICE_ASSIGN_OR_RETURN(kept, deps_.node->PrepareToPush(id, m.placement_epoch));
  }
  SLUICE_RETURN_IF_ERROR(attempt_.Open(id, m.mapper, m.attempt, std::move(kept)));
  shuffle_id_ = id;
  std::shared_ptr<SegmentMeter> meter = deps_.node->placements().Meter(id);
  if (meter != nullptr) {
    // Counted among the shuffle's writers while the stream lives (each may send a segment a
    // little after its next is made: SegmentMeter::ask_bytes).
    meter->Enter();
    among_writers_ = std::shared_ptr<void>(nullptr, [meter](void*) { meter->Leave(); });
  }
  std::lock_guard<std::mutex> lock(meter_mu_);
  meter_ = std::move(meter);
  return absl::OkStatus();
}

absl::Status PushStream::Commit(const PushMessage& m) {
  // The credentials again: a token taken out of --auth_file while the stream was open commits
  // nothing (it is read again every --auth_reload_s).
  SLUICE_RETURN_IF_ERROR(
      host_->CheckCaller("checked again at the commit; the attempt was discarded"));
  const Clock::time_point started = deps_.clock->Now();
  SLUICE_ASSIGN_OR_RETURN(summary_, attempt_.Commit(m.frame_count, m.record_count, m.prepare));
  deps_.metrics->commit_seconds.Observe(
      std::chrono::duration<double>(deps_.clock->Now() - started).count());
  ServerMetrics::Add(summary_.duplicate ? deps_.metrics->duplicate_commits : deps_.metrics->commits,
                     1);
  committed_ = true;
  return absl::OkStatus();
}

// A frame for a stored partition the open did not know to be kept here: a huge partition's
// segment made since, which the record read again may say is (docs/cluster.md).
absl::Status PushStream::KeepNow(uint32_t partition) {
  if (attempt_.Keeps(partition)) return absl::OkStatus();
  SLUICE_ASSIGN_OR_RETURN(auto kept, deps_.node->placements().KeptNow(shuffle_id_, partition));
  attempt_.Rekeep(std::move(kept));
  return absl::OkStatus();  // (AddFrames refuses it if it is still not kept)
}

// Counts a frame stored here; one that takes its segment past the split size has the record
// asked for the next (a failure is logged and asked again by a later frame).
void PushStream::Stored(uint32_t partition, uint64_t frame_bytes) {
  if (meter_ != nullptr && meter_->Add(partition, kBlockHeaderSize + frame_bytes)) {
    (void)deps_.node->placements().Split(shuffle_id_, partition);
  }
}

std::vector<SegmentMeter::Segment> PushStream::SegmentsToTell() {
  std::lock_guard<std::mutex> lock(meter_mu_);
  if (meter_ == nullptr || meter_->count() <= told_segments_) return {};
  std::vector<SegmentMeter::Segment> made = meter_->After(told_segments_);
  told_segments_ += static_cast<uint32_t>(made.size());
  return made;
}

}  // namespace sluice
