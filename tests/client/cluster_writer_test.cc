// The cluster writer's failures (client/cluster_writer.h), transport-free: which stream broke
// without an answer, and what the attempt fails with once the server is revived or not.
#include "client/cluster_writer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rpc/error_reason.h"
#include "tests/harness/status_matchers.h"

namespace sluice::client_internal {
namespace {

using testing::StatusIs;

// A stream whose sends fail with `failure` once it is set.
class ScriptedStream final : public PushStream {
 public:
  explicit ScriptedStream(absl::Status* failure) : failure_(failure) {}
  std::string* NewFrame(uint32_t) override { return &frame_; }
  absl::Status SendFrame() override { return *failure_; }
  absl::Status SendCommit(uint64_t, uint64_t) override { return *failure_; }
  absl::StatusOr<WriteResult> FinishCommit() override {
    if (!failure_->ok()) return *failure_;
    return WriteResult{};
  }
  void Cancel() override {}

 private:
  absl::Status* failure_;
  std::string frame_;
};

// A writer whose Add and Close fail with `failure` once it is set.
class ScriptedWriter final : public ShuffleWriter {
 public:
  explicit ScriptedWriter(absl::Status* failure) : failure_(failure) {}
  absl::Status Add(std::string_view, std::string_view) override { return *failure_; }
  absl::StatusOr<WriteResult> Close() override {
    if (!failure_->ok()) return *failure_;
    return WriteResult{};
  }
  void Abort() override {}

 private:
  absl::Status* failure_;
};

absl::Status Refused() { return absl::UnavailableError("failed to connect: Connection refused"); }

TEST(ClusterWriterTest, AStreamNotesOnlyABreakWithoutAnAnswerBeforeItIsCancelled) {
  absl::Status failure;
  WatchedStream answered(std::make_unique<ScriptedStream>(&failure));
  failure = FromServer(absl::ResourceExhaustedError("over budget"));
  EXPECT_FALSE(answered.SendFrame().ok());
  EXPECT_OK(answered.unanswered()) << "the server answered";
  failure = FromServer(absl::UnavailableError("draining"));
  EXPECT_FALSE(answered.SendCommit(1, 1).ok());
  EXPECT_OK(answered.unanswered()) << "an UNAVAILABLE the server sent is an answer";
  failure = Refused();
  EXPECT_FALSE(answered.FinishCommit().ok());
  EXPECT_THAT(answered.unanswered(), StatusIs(absl::StatusCode::kUnavailable, "refused"));

  WatchedStream cancelled(std::make_unique<ScriptedStream>(&failure));
  cancelled.Cancel();
  EXPECT_FALSE(cancelled.SendFrame().ok());
  EXPECT_OK(cancelled.unanswered()) << "cancelled for another stream's failure first";
}

TEST(ClusterWriterTest, TheFirstUnansweredStreamsServerIsRevivedOnceAndTheRestAsTheyAre) {
  absl::Status stream_failure, writer_failure;
  WatchedStream s0(std::make_unique<ScriptedStream>(&stream_failure));
  absl::Status other;
  WatchedStream s1(std::make_unique<ScriptedStream>(&other));
  std::vector<std::string> revived;
  int forgotten = 0;
  ClusterWriter::Hooks hooks;
  hooks.forget = [&] { ++forgotten; };
  hooks.revive = [&](const std::string& node, const std::string&, absl::Status) {
    revived.push_back(node);
    return WithReason(absl::UnavailableError("moved"), ErrorReason::kPlacementChanged);
  };
  ClusterWriter writer(std::make_unique<ScriptedWriter>(&writer_failure),
                       {{"n0", "a0", &s0}, {"n1", "a1", &s1}}, hooks);
  EXPECT_OK(writer.Add("k", "v"));
  // n1's stream broke unanswered; the writer's failure follows.
  other = Refused();
  (void)s1.SendFrame();
  writer_failure = Refused();
  const absl::Status st = writer.Add("k", "v");
  EXPECT_EQ(ReasonOf(st), ErrorReason::kPlacementChanged);
  EXPECT_EQ(revived, std::vector<std::string>{"n1"});
  EXPECT_FALSE(writer.Close().ok());
  EXPECT_EQ(revived.size(), 1u) << "once per attempt";
  // A server's answer is passed on as it is; NOT_KEPT forgets the placement.
  ClusterWriter kept(std::make_unique<ScriptedWriter>(&writer_failure), {}, hooks);
  writer_failure = WithReason(FromServer(absl::FailedPreconditionError("keeps no replica")),
                              ErrorReason::kNotKept);
  const absl::Status stale = kept.Add("k", "v");
  EXPECT_THAT(stale, StatusIs(absl::StatusCode::kUnavailable, "routed afresh"));
  EXPECT_EQ(forgotten, 1);
}

TEST(ClusterWriterTest, AnAttemptFailsRetryablyWhateverTheReviveSays) {
  const absl::Status cause = Refused();
  // The shuffle moved on: PLACEMENT_CHANGED, naming the server and the epoch.
  absl::Status st =
      AfterRevive("job", 0, "n2", "127.0.0.4:7070", cause, ShuffleClient::Revive{1, true});
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "n2 at 127.0.0.4:7070 did not answer"));
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "placement epoch 1"));
  EXPECT_EQ(ReasonOf(st), ErrorReason::kPlacementChanged);
  // Nothing moved: the cause itself.
  st = AfterRevive("job", 1, "n2", "", cause, ShuffleClient::Revive{1, false});
  EXPECT_EQ(st, cause);
  // Refused now (a drained server restarting): UNAVAILABLE with its reason and retry time.
  st = AfterRevive("job", 0, "n2", "", cause,
                   WithReason(absl::UnavailableError("drained to restart"), ErrorReason::kDraining,
                              std::chrono::milliseconds(2000)));
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "not registered now"));
  EXPECT_EQ(ReasonOf(st), ErrorReason::kDraining);
  EXPECT_EQ(RetryAfterOf(st), std::chrono::milliseconds(2000));
}

}  // namespace
}  // namespace sluice::client_internal
