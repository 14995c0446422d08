// PushStream: the policy of one push stream (Push or PushFlow), apart from any transport. The
// gRPC reactor (server/service/push_reactor.cc) converts each message into a PushMessage, hands
// it here and does what the answer says: read the next message by a deadline, sending credit
// first; run the message's work on the worker pool; or finish the stream. Tests drive the same
// session with a fake clock and a fake host (tests/server/push_stream_test.cc).
//
//   auto stream = PushStream::Make(PushStream::Kind::kFlow, call, deps, &host);
//   Do((*stream)->Start());                        // kRead: the open message
//   ... on a message: Do(stream->Received(&message, false));
//   ... on the pool:  Do(stream->Work());          // kRead, kFinish, or nothing (a wait)
//   ... at a read's deadline: Do(stream->Expired());
//
// What it decides (docs/api.md, "Push"):
//   - Admission: the stream's slots (StreamAdmission) are taken by Make and given back with it.
//   - Memory: a message is charged once it is in hand (Push) or within credit reserved before
//     its client sent it (PushFlow: an ask, granted from the budget); the next read of a Push
//     waits until the budget has room. A large frame (announced by its size, sent in pieces)
//     is promised its whole size before its first piece is read; a promise taken back for
//     another tenant is asked for again before the next piece.
//   - Deadlines: the next message within --push_idle_timeout_s; a large frame's pieces within
//     that of its promise; a message granted credit within --push_credit_timeout_s.
//   - The attempt (PushAttempt), the huge partitions' segments it writes to (SegmentMeter:
//     told to a PushFlow writer with its credit), the credentials again at the commit, and the
//     push counters.
//
// Threads: Received and Expired are called on the transport's threads and decide without the
// disk; Work runs on the pool; a wait's next step comes through Host::Resume on the pool. One
// step is out at a time: the host does what a step says before the session is called again
// (but Expired, which may race Received: whichever comes first takes the wait).
#ifndef SLUICE_SERVER_RULES_PUSH_STREAM_H_
#define SLUICE_SERVER_RULES_PUSH_STREAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/rules/push_attempt.h"
#include "server/rules/segment_meter.h"
#include "server/rules/stream_deps.h"
#include "server/rules/stream_phase.h"
#include "server/runtime/clock.h"
#include "server/security/call_context.h"

namespace sluice {

/// One message of a push stream, as its transport received it. Its spans point into the
/// transport's message, which stays untouched until the session calls Host::MessageDone.
struct PushMessage {
  enum class Kind { kEmpty, kOpen, kFrames, kLargeFrame, kPiece, kAsk, kCommit };
  Kind kind = Kind::kEmpty;
  uint64_t wire_bytes = 0;  ///< its size as received: what it is charged in the memory budget
  // kOpen
  absl::string_view shuffle_id;
  uint32_t mapper = 0;
  uint64_t attempt = 0;
  uint32_t placement_epoch = 0;
  // kFrames
  std::vector<PushAttempt::Frame> frames;
  // kLargeFrame: its partition and size; kAsk: the bytes asked for (in `size`)
  uint32_t partition = 0;
  uint64_t size = 0;
  // kPiece
  absl::Span<const uint8_t> piece;
  // kCommit
  uint64_t frame_count = 0, record_count = 0;
  bool prepare = false;
};

class PushStream {
 public:
  enum class Kind {
    kPush,  ///< Push: messages read whenever the budget has room, charged once in hand
    kFlow,  ///< PushFlow: messages sent within credit the stream granted before
  };

  /// What the transport does next.
  struct Step {
    enum class Do {
      kNothing,  ///< nothing now: a wait's step comes through Host::Resume, or another came first
      kWork,     ///< run Work() on the worker pool
      kRead,     ///< send `credit` bytes of credit (PushFlow, when not 0), then read the next
                 ///< message; call Expired() if none came by `deadline`
      kFinish,   ///< end the stream with `status` (OK: committed, summary() says what)
    };
    Step() = default;
    explicit Step(Do what) : what(what) {}
    Do what = Do::kNothing;
    Clock::time_point deadline{};
    uint64_t credit = 0;
    absl::Status status;
  };

  /// What the session asks of its transport.
  class Host {
   public:
    virtual ~Host() = default;
    /// A step decided after a wait (for the budget, for credit, for a large frame's promise),
    /// on the pool.
    virtual void Resume(Step step) = 0;
    /// The message handed to Received is done with: its memory may go (it is called before any
    /// wait, so that a waiting stream holds none of it).
    virtual void MessageDone() = 0;
    /// The caller's credentials again (OK while they still name the tenant and role the stream
    /// opened with); `then` ends the refusal's message.
    virtual absl::Status CheckCaller(absl::string_view then) = 0;
  };

  /// Admits a stream of `kind` for `call`: RESOURCE_EXHAUSTED naming the quota or limit that is
  /// full, UNAVAILABLE while the server drains. `deps` and `host` outlive the session.
  static absl::StatusOr<std::unique_ptr<PushStream>> Make(Kind kind, const CallContext& call,
                                                          const StreamDeps& deps, Host* host);
  ~PushStream();
  PushStream(const PushStream&) = delete;
  PushStream& operator=(const PushStream&) = delete;

  /// The first step: read the open message.
  Step Start();
  /// A message came (`message`, until Host::MessageDone), or the stream ended without one
  /// (null: `cancelled` says whether its client cancelled it). Nothing when the read's deadline
  /// came first.
  Step Received(const PushMessage* message, bool cancelled);
  /// On the pool: handles what Received or Expired handed over.
  Step Work();
  /// The last kRead's deadline passed: kWork (to end the stream) if it came before the message
  /// and is due by the clock; nothing otherwise.
  Step Expired();
  /// The client cancelled the call: what is handled next ends the stream.
  void Cancel() { cancelled_.store(true); }

  /// The attempt's summary, once a kFinish with OK says it committed.
  const PushSummary& summary() const { return summary_; }
  /// The huge partitions' segments made since the last call (PushFlow tells its writer with the
  /// next credit, so that their partitions' frames go to them). Any thread.
  std::vector<SegmentMeter::Segment> SegmentsToTell();

 private:
  PushStream(Kind kind, const CallContext& call, const StreamDeps& deps, Host* host)
      : kind_(kind), call_(call), deps_(deps), host_(host), attempt_(deps.registry, deps.push) {}
  bool flow() const { return kind_ == Kind::kFlow; }
  Step ReadStep(uint64_t credit = 0);
  Step Grant(uint64_t bytes);
  Step Fail(const absl::Status& st);
  absl::StatusOr<uint64_t> TakeAsk(uint64_t bytes) const;
  absl::Status Handle(const PushMessage& m);
  absl::Status Open(const PushMessage& m);
  absl::Status Commit(const PushMessage& m);
  absl::Status KeepNow(uint32_t partition);
  void Stored(uint32_t partition, uint64_t frame_bytes);
  void CountTaken();
  static absl::Status BeyondCredit(uint64_t size, uint64_t credit);
  // Runs on the pool once a large frame's promise is granted: the next read, the promise's
  // pieces as credit with PushFlow.
  void Promised(uint64_t credit);

  const Kind kind_;
  const CallContext call_;
  const StreamDeps& deps_;
  Host* const host_;
  std::unique_ptr<StreamAdmission> admission_;
  PushAttempt attempt_;
  const PushMessage* message_ = nullptr;  // received, until Work handles it
  absl::Status failed_;                   // what Work ends the stream with, when not OK
  std::atomic<bool> cancelled_{false};
  bool committed_ = false;
  PushSummary summary_;
  std::string shuffle_id_;           // as kept (the tenant's prefix on it), once open
  uint64_t piece_bytes_ = 0;         // the size of the piece of a large frame just taken
  uint64_t piece_credit_ = 0;        // PushFlow: a large frame's bytes its client may still send
  Clock::time_point promised_at_{};  // when the large frame's promise was last granted
  // The wait for the next message, and why it ends when it does.
  StreamPhase phase_;
  std::atomic<Clock::rep> deadline_{0};
  enum class Until { kIdle, kLargeFrame, kCredit };
  Until until_ = Until::kIdle;
  uint64_t counted_frames_ = 0, counted_records_ = 0, counted_bytes_ = 0;  // CountTaken
  // The huge partitions' meter, its writers counted while the stream lives.
  std::mutex meter_mu_;
  std::shared_ptr<SegmentMeter> meter_;  // null: the shuffle's partitions do not split
  uint32_t told_segments_ = 0;
  std::shared_ptr<void> among_writers_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_PUSH_STREAM_H_
