// PushStream's policy with no transport (server/rules/push_stream.h): the test plays the
// reactor, doing what each step says, and moves a fake clock instead of sleeping. Credit,
// deadlines, large frames' promises, the budget's back-pressure, the credentials at the commit
// and the race of a message with its deadline, each decided here as a live stream would be.
#include "server/rules/push_stream.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/harness/frames.h"
#include "tests/harness/stream_fixture.h"

namespace sluice::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Do = PushStream::Step::Do;
using Kind = PushMessage::Kind;

class PushHost final : public RecordingHost<PushStream> {
 public:
  void MessageDone() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
  }
  int done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

 private:
  int done_ = 0;
};

// (Messages point into their bytes, as a transport's do: `id` and `frame` outlive the message.)
PushMessage Open(absl::string_view id, uint32_t mapper) {
  PushMessage m;
  m.kind = Kind::kOpen;
  m.shuffle_id = id;
  m.mapper = mapper;
  m.attempt = 1;
  m.wire_bytes = 32;
  return m;
}
PushMessage Frames(const std::string& frame) {
  PushMessage m;
  m.kind = Kind::kFrames;
  m.frames.push_back(PushAttempt::Frame{0, Bytes(frame)});
  m.wire_bytes = frame.size() + 16;
  return m;
}
PushMessage Ask(uint64_t bytes) {
  PushMessage m;
  m.kind = Kind::kAsk;
  m.size = bytes;
  m.wire_bytes = 8;
  return m;
}
PushMessage Commit(uint64_t frames, uint64_t records) {
  PushMessage m;
  m.kind = Kind::kCommit;
  m.frame_count = frames;
  m.record_count = records;
  m.wire_bytes = 8;
  return m;
}
PushMessage LargeFrame(uint64_t size) {
  PushMessage m;
  m.kind = Kind::kLargeFrame;
  m.size = size;
  m.wire_bytes = 16;
  return m;
}
PushMessage Piece(const std::string& data) {
  PushMessage m;
  m.kind = Kind::kPiece;
  m.piece = Bytes(data);
  m.wire_bytes = data.size() + 8;
  return m;
}

class PushStreamTest : public StreamFixture {
 protected:
  void SetUp() override { ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 4}).status()); }

  std::unique_ptr<PushStream> Make(PushStream::Kind kind, const CallContext& call = {}) {
    auto s = PushStream::Make(kind, call, deps_, &host_);
    EXPECT_OK(s.status());
    return s.ok() ? *std::move(s) : nullptr;
  }
  // `m` came (`m` outlives the step's work).
  PushStream::Step Got(PushStream& s, const PushMessage& m) { return s.Received(&m, false); }
  // Hands `m` to the stream as the reactor would and runs its work: the step after it (a wait
  // is followed to the step it resumes with).
  PushStream::Step Send(PushStream& s, const PushMessage& m) {
    PushStream::Step step = s.Received(&m, false);
    if (step.what == Do::kWork) step = s.Work();
    if (step.what == Do::kNothing) {
      std::optional<PushStream::Step> resumed = host_.NextResumed();
      EXPECT_TRUE(resumed.has_value()) << "the stream waited and never resumed";
      if (resumed.has_value()) step = *std::move(resumed);
    }
    return step;
  }
  size_t Committed() { return (*registry_->Get("s"))->CommittedMappers().size(); }

  PushHost host_;
};

TEST_F(PushStreamTest, AStreamReadsItsMessagesAndFinishesWithTheCommitsSummary) {
  auto s = Make(PushStream::Kind::kPush);
  PushStream::Step step = s->Start();
  ASSERT_EQ(step.what, Do::kRead);
  EXPECT_EQ(step.deadline, clock_.Now() + deps_.timeouts.push_idle);
  EXPECT_EQ(step.credit, 0u) << "Push grants no credit";
  EXPECT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  const std::string frame = EncodeRows({{"a", "1"}, {"b", "2"}});
  EXPECT_EQ(Send(*s, Frames(frame)).what, Do::kRead);
  step = Send(*s, Commit(1, 2));
  ASSERT_EQ(step.what, Do::kFinish);
  EXPECT_OK(step.status);
  EXPECT_EQ(s->summary().frames, 1u);
  EXPECT_EQ(s->summary().records, 2u);
  EXPECT_FALSE(s->summary().duplicate);
  EXPECT_EQ(Committed(), 1u);
  EXPECT_EQ(host_.done(), 3) << "every message handled was given back to the transport";
  EXPECT_EQ(metrics_.commits.load(), 1u);
  EXPECT_EQ(metrics_.push_records.load(), 2u);
  EXPECT_EQ(budget_.used(), 0u) << "no message's charge outlives its handling";
}

TEST_F(PushStreamTest, AnIdleStreamEndsAtItsDeadlineAndNotBeforeWithItsAttemptDiscarded) {
  auto s = Make(PushStream::Kind::kPush);
  ASSERT_EQ(s->Start().what, Do::kRead);
  ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  ASSERT_EQ(Send(*s, Frames(EncodeRows({{"a", "1"}}))).what, Do::kRead);
  clock_.Advance(deps_.timeouts.push_idle - milliseconds(1));
  EXPECT_EQ(s->Expired().what, Do::kNothing) << "a deadline not due yet ends nothing";
  clock_.Advance(milliseconds(1));
  ASSERT_EQ(s->Expired().what, Do::kWork);
  PushStream::Step end = s->Work();
  ASSERT_EQ(end.what, Do::kFinish);
  EXPECT_THAT(end.status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                                   "push stream idle for 300 s waiting for its next message "
                                   "(--push_idle_timeout_s); the attempt was discarded"));
  EXPECT_EQ(metrics_.aborted_attempts.load(), 1u);
  // The read still pending completes once the stream ends: it is not handled.
  EXPECT_EQ(s->Received(nullptr, false).what, Do::kNothing);
  EXPECT_EQ(Committed(), 0u);
}

TEST_F(PushStreamTest, AMessageThatComesFirstTakesTheWaitFromItsDeadline) {
  auto s = Make(PushStream::Kind::kPush);
  ASSERT_EQ(s->Start().what, Do::kRead);
  clock_.Advance(deps_.timeouts.push_idle);
  const PushMessage open = Open("s", 0);
  ASSERT_EQ(s->Received(&open, false).what, Do::kWork);
  EXPECT_EQ(s->Expired().what, Do::kNothing) << "the message came first: the stream goes on";
  PushStream::Step next = s->Work();  // (Push reads on once the budget has room: a hop)
  if (next.what == Do::kNothing) next = host_.NextResumed().value_or(PushStream::Step());
  EXPECT_EQ(next.what, Do::kRead);
}

TEST_F(PushStreamTest, AStreamEndedWithoutACommitSaysWhetherItWasCancelled) {
  auto ended = Make(PushStream::Kind::kPush);
  ASSERT_EQ(ended->Start().what, Do::kRead);
  ASSERT_EQ(ended->Received(nullptr, false).what, Do::kWork);
  EXPECT_THAT(ended->Work().status,
              StatusIs(absl::StatusCode::kFailedPrecondition, "ended without a commit message"));
  auto cancelled = Make(PushStream::Kind::kPush);
  ASSERT_EQ(cancelled->Start().what, Do::kRead);
  ASSERT_EQ(cancelled->Received(nullptr, true).what, Do::kWork);
  EXPECT_THAT(cancelled->Work().status, StatusIs(absl::StatusCode::kCancelled, "cancelled"));
}

TEST_F(PushStreamTest, PushFlowSendsFramesOnlyWithinCreditAskedForAndGranted) {
  auto s = Make(PushStream::Kind::kFlow);
  ASSERT_EQ(s->Start().what, Do::kRead);
  ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  const std::string frame = EncodeRows({{"a", "1"}});
  const PushMessage frames = Frames(frame);
  // An ask is answered at once, off the pool: the credit goes out with the next read.
  const PushMessage ask = Ask(frames.wire_bytes);
  PushStream::Step granted = Got(*s, ask);
  ASSERT_EQ(granted.what, Do::kRead);
  EXPECT_EQ(granted.credit, frames.wire_bytes);
  EXPECT_EQ(budget_.used(), StreamAdmission::kCreditCopies * frames.wire_bytes)
      << "credit is memory reserved before the message comes";
  EXPECT_EQ(Send(*s, frames).what, Do::kRead);
  // A frames message with no credit left is refused, naming PushFlow's rule.
  PushStream::Step refused = Send(*s, frames);
  ASSERT_EQ(refused.what, Do::kFinish);
  EXPECT_THAT(refused.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                       "bytes of credit: PushFlow sends a frames message only "
                                       "within credit it asked for"));
  EXPECT_EQ(Committed(), 0u);
}

TEST_F(PushStreamTest, PushFlowRefusesAsksOfNothingOrOfMoreThanAMessage) {
  for (uint64_t bytes : {uint64_t{0}, deps_.push.max_message_bytes + 1}) {
    auto s = Make(PushStream::Kind::kFlow);
    ASSERT_EQ(s->Start().what, Do::kRead);
    ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
    PushStream::Step refused = Send(*s, Ask(bytes));
    ASSERT_EQ(refused.what, Do::kFinish) << bytes;
    EXPECT_THAT(refused.status,
                StatusIs(absl::StatusCode::kInvalidArgument, "a push message is 1 to"));
  }
}

TEST_F(PushStreamTest, UnusedCreditEndsTheStreamAtTheCreditTimeoutAndGoesBack) {
  auto s = Make(PushStream::Kind::kFlow);
  ASSERT_EQ(s->Start().what, Do::kRead);
  ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  const PushMessage ask = Ask(1000);
  PushStream::Step granted = Got(*s, ask);
  ASSERT_EQ(granted.what, Do::kRead);
  EXPECT_EQ(granted.deadline, clock_.Now() + deps_.timeouts.push_credit)
      << "a message granted credit comes within the credit timeout, not the idle one";
  clock_.Advance(deps_.timeouts.push_credit);
  ASSERT_EQ(s->Expired().what, Do::kWork);
  EXPECT_THAT(s->Work().status,
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "credit for a 1000-byte message was granted and the message did not come "
                       "within 10 s (--push_credit_timeout_s)"));
  s.reset();
  EXPECT_EQ(budget_.used(), 0u) << "the credit went back with the stream";
}

TEST_F(PushStreamTest, AskingWaitsForTheBudgetAndTheCreditGoesOutOnceGranted) {
  budget_.Charge("other", kBudget);  // another stream's messages fill the budget
  auto s = Make(PushStream::Kind::kFlow);
  ASSERT_EQ(s->Start().what, Do::kRead);
  ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  const PushMessage ask = Ask(4096);
  EXPECT_EQ(Got(*s, ask).what, Do::kNothing) << "the budget is full";
  EXPECT_FALSE(host_.HasResumed());
  budget_.Release("other", kBudget);
  std::optional<PushStream::Step> granted = host_.NextResumed();
  ASSERT_TRUE(granted.has_value());
  EXPECT_EQ(granted->what, Do::kRead);
  EXPECT_EQ(granted->credit, 4096u);
}

TEST_F(PushStreamTest, PushReadsItsNextMessageOnlyOnceTheBudgetHasRoom) {
  auto s = Make(PushStream::Kind::kPush);
  ASSERT_EQ(s->Start().what, Do::kRead);
  ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  budget_.Charge("other", kBudget);
  const std::string frame = EncodeRows({{"a", "1"}});
  const PushMessage frames = Frames(frame);
  ASSERT_EQ(s->Received(&frames, false).what, Do::kWork);
  EXPECT_EQ(s->Work().what, Do::kNothing) << "back-pressure: no read while the budget is full";
  EXPECT_EQ(host_.done(), 2) << "the message's memory went before the wait";
  EXPECT_FALSE(host_.HasResumed());
  budget_.Release("other", kBudget);
  std::optional<PushStream::Step> read = host_.NextResumed();
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->what, Do::kRead);
}

TEST_F(PushStreamTest, ALargeFrameIsPromisedBeforeItsPiecesWhichComeWithinTheIdleTimeOfIt) {
  auto s = Make(PushStream::Kind::kFlow);
  ASSERT_EQ(s->Start().what, Do::kRead);
  ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  const std::string frame = RandomValueFrame(3 << 20, 1);
  PushStream::Step promised = Send(*s, LargeFrame(frame.size()));
  ASSERT_EQ(promised.what, Do::kRead);
  EXPECT_EQ(promised.credit, frame.size()) << "the promise is its pieces' credit";
  EXPECT_GE(budget_.used(), frame.size());
  const Clock::time_point frame_deadline = clock_.Now() + deps_.timeouts.push_idle;
  // Pieces trickling in do not move the frame's deadline.
  const std::string first = frame.substr(0, 1 << 20);
  clock_.Advance(seconds(200));
  PushStream::Step next = Send(*s, Piece(first));
  ASSERT_EQ(next.what, Do::kRead);
  EXPECT_EQ(next.deadline, frame_deadline);
  clock_.Advance(seconds(100));
  ASSERT_EQ(s->Expired().what, Do::kWork);
  EXPECT_THAT(s->Work().status,
              StatusIs(absl::StatusCode::kDeadlineExceeded, "a large frame took over 300 s"));
  s.reset();
  EXPECT_EQ(budget_.used(), 0u) << "the frame's promise went back with the stream";
}

TEST_F(PushStreamTest, ALargeFramesPiecesComeWithinItsCreditAndNoAskComesBetween) {
  auto s = Make(PushStream::Kind::kFlow);
  ASSERT_EQ(s->Start().what, Do::kRead);
  ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  const std::string frame = RandomValueFrame(1 << 20, 2);
  ASSERT_EQ(Send(*s, LargeFrame(frame.size())).what, Do::kRead);
  PushStream::Step refused = Send(*s, Ask(100));
  ASSERT_EQ(refused.what, Do::kFinish);
  EXPECT_THAT(refused.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                       "an ask in the middle of a large frame"));

  auto t = Make(PushStream::Kind::kFlow);
  ASSERT_EQ(t->Start().what, Do::kRead);
  ASSERT_EQ(Send(*t, Open("s", 1)).what, Do::kRead);
  ASSERT_EQ(Send(*t, LargeFrame(frame.size())).what, Do::kRead);
  PushStream::Step beyond = Send(*t, Piece(frame + "extra"));
  ASSERT_EQ(beyond.what, Do::kFinish);
  EXPECT_THAT(beyond.status, StatusIs(absl::StatusCode::kInvalidArgument, "bytes of credit"));
}

TEST_F(PushStreamTest, ACommitChecksTheCallerAgainAndARevokedOneCommitsNothing) {
  auto s = Make(PushStream::Kind::kPush);
  ASSERT_EQ(s->Start().what, Do::kRead);
  ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  ASSERT_EQ(Send(*s, Frames(EncodeRows({{"a", "1"}}))).what, Do::kRead);
  host_.SetCaller(absl::UnauthenticatedError("token not known"));
  PushStream::Step end = Send(*s, Commit(1, 1));
  ASSERT_EQ(end.what, Do::kFinish);
  EXPECT_THAT(end.status, StatusIs(absl::StatusCode::kUnauthenticated, "token not known"));
  EXPECT_EQ(host_.checks(), 1);
  EXPECT_EQ(Committed(), 0u);
}

TEST_F(PushStreamTest, ACancelledCallHandlesNothingMore) {
  auto s = Make(PushStream::Kind::kPush);
  ASSERT_EQ(s->Start().what, Do::kRead);
  const PushMessage open = Open("s", 0);
  ASSERT_EQ(s->Received(&open, false).what, Do::kWork);
  s->Cancel();
  EXPECT_THAT(s->Work().status, StatusIs(absl::StatusCode::kCancelled, "cancelled"));
}

TEST_F(PushStreamTest, StreamsBeyondTheLimitAreRefusedAndHoldNothing) {
  OpenStreams one(1, 1);
  deps_.admission.streams = &one;
  auto first = Make(PushStream::Kind::kPush);
  ASSERT_NE(first, nullptr);
  EXPECT_THAT(PushStream::Make(PushStream::Kind::kFlow, CallContext(), deps_, &host_).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "--max_push_streams"));
  first.reset();
  EXPECT_EQ(one.push(), 0u);
}

// An ask while credit is held (its message not sent yet) is refused, however small, and so is
// an ask before the open: a client cannot hold more than one message's memory ahead of
// sending it, nor any before its attempt is known (issue 50).
TEST_F(PushStreamTest, AnAskWhileHoldingCreditOrBeforeTheOpenIsRefused) {
  auto early = Make(PushStream::Kind::kFlow);
  ASSERT_EQ(early->Start().what, Do::kRead);
  PushStream::Step refused = Send(*early, Ask(100));
  ASSERT_EQ(refused.what, Do::kFinish);
  EXPECT_THAT(refused.status,
              StatusIs(absl::StatusCode::kInvalidArgument, "an ask before the open message"));
  EXPECT_EQ(budget_.used(), 0u);

  auto s = Make(PushStream::Kind::kFlow);
  ASSERT_EQ(s->Start().what, Do::kRead);
  ASSERT_EQ(Send(*s, Open("s", 0)).what, Do::kRead);
  const PushMessage ask = Ask(100);
  ASSERT_EQ(Got(*s, ask).what, Do::kRead);
  refused = Send(*s, ask);
  ASSERT_EQ(refused.what, Do::kFinish);
  EXPECT_THAT(refused.status,
              StatusIs(absl::StatusCode::kInvalidArgument, "an ask while holding credit"));
  s.reset();
  EXPECT_EQ(budget_.used(), 0u);
}

// A plain Push stream's client sends without credit: gRPC may hold its stream window and a
// message that the budget never sees, and not reading does not stop it. So plain streams are
// counted (--max_plain_push_streams) and one past the limit is refused naming the flag and
// PushFlow; PushFlow streams are not counted (issue 50, item 4: 128 plain streams took a
// 16 MiB-budget server to 204 MiB).
TEST_F(PushStreamTest, PlainPushStreamsAreCountedAndOnePastTheLimitIsRefused) {
  OpenStreams streams(64, 64, /*max_plain_push=*/2);
  deps_.admission.streams = &streams;
  auto first = Make(PushStream::Kind::kPush);
  auto second = Make(PushStream::Kind::kPush);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(streams.plain_push(), 2u);
  EXPECT_THAT(PushStream::Make(PushStream::Kind::kPush, CallContext(), deps_, &host_).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "--max_plain_push_streams"));
  EXPECT_EQ(streams.push(), 2u) << "a refused stream holds no slot";
  EXPECT_NE(Make(PushStream::Kind::kFlow), nullptr) << "PushFlow is not counted";
  first.reset();
  EXPECT_NE(Make(PushStream::Kind::kPush), nullptr) << "room again once one ends";
}

}  // namespace
}  // namespace sluice::testing
