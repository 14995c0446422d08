// FetchStream's policy with no transport (server/rules/fetch_stream.h): the test plays the
// reactor, doing what each step says, and moves a fake clock instead of sleeping. The reader's
// stall deadline, parking a stalled KEY merge for a fetch that waits (sooner for a tenant over
// its share) and resuming it exactly where it was, the credentials checked again at most once
// per interval, a merge that waits for the budget before it starts, and the first chunk's
// report.
#include "server/rules/fetch_stream.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/harness/frames.h"
#include "tests/harness/stream_fixture.h"

namespace sluice::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Do = FetchStream::Step::Do;
using Step = FetchStream::Step;
using FetchHost = RecordingHost<FetchStream>;

constexpr uint32_t kMappers = 3;
constexpr int kPerMapper = 20;  // records of ~1 KiB each

// One fetch as its reactor holds it: the session, its host and the chunk it builds.
struct Fetch {
  FetchHost host;
  std::string chunk;
  std::unique_ptr<FetchStream> stream;
};

class FetchStreamTest : public StreamFixture {
 protected:
  // `id`'s partition 0: mapper m's keys k000.. with i*kMappers + m, one sorted frame each.
  void PushKeyed(const std::string& id) {
    ASSERT_OK(registry_->Create(ShuffleParams{id, 1, kMappers}).status());
    for (uint32_t m = 0; m < kMappers; ++m) {
      Rows rows;
      for (int i = 0; i < kPerMapper; ++i) {
        rows.emplace_back(absl::StrFormat("k%03d", i * kMappers + m), std::string(1000, 'a' + m));
      }
      PushAttempt a(registry_.get(), PushLimits{});
      ASSERT_OK(a.Open(id, m, 1));
      ASSERT_OK(a.AddFrame(0, Bytes(EncodeRows(rows))));
      ASSERT_OK(a.Commit(1, rows.size()));
    }
  }

  std::unique_ptr<Fetch> Open(const std::string& id, bool key_order, const CallContext& call = {},
                              FetchStreamOptions options = {}) {
    auto f = std::make_unique<Fetch>();
    FetchSpec spec;
    spec.shuffle_id = id;
    spec.key_order = key_order;
    spec.target_chunk_bytes = 4 << 10;  // many chunks
    auto s = FetchStream::Make(spec, options, call, deps_, &f->host, &f->chunk);
    EXPECT_OK(s.status());
    if (!s.ok()) return nullptr;
    f->stream = *std::move(s);
    return f;
  }

  // Does what `step` says until the stream writes, finishes or cancels (work runs here; a wait
  // is followed to the step it resumes with, unless `follow_waits` is false: then a wait is
  // returned as kNothing).
  static Step Run(Fetch& f, Step step, bool follow_waits = true) {
    while (step.what == Do::kWork || step.what == Do::kNothing) {
      if (step.what == Do::kWork) {
        step = f.stream->Work();
        continue;
      }
      if (!follow_waits) return step;
      std::optional<Step> resumed = f.host.NextResumed();
      if (!resumed.has_value()) return Step();
      step = *std::move(resumed);
    }
    return step;
  }

  // The reader takes chunk after chunk to the end from `step` (a kWrite): their keys.
  static std::vector<std::string> ReadToEnd(Fetch& f, Step step) {
    std::vector<std::string> keys;
    while (step.what == Do::kWrite) {
      for (const auto& [key, value] : DecodeRows(f.chunk)) keys.push_back(key);
      if (step.last) return keys;
      f.stream->StopParking();
      step = Run(f, f.stream->Written(true));
    }
    EXPECT_EQ(step.what, Do::kFinish);
    EXPECT_OK(step.status);
    return keys;
  }

  static std::vector<std::string> AllKeys() {
    std::vector<std::string> keys;
    for (uint32_t k = 0; k < kMappers * kPerMapper; ++k)
      keys.push_back(absl::StrFormat("k%03d", k));
    return keys;
  }
};

TEST_F(FetchStreamTest, AReaderThatTakesNoChunkIsCancelledAtTheStallDeadlineAndNotBefore) {
  PushKeyed("s");
  auto f = Open("s", /*key_order=*/false);
  Step first = f->stream->Start();
  ASSERT_EQ(first.what, Do::kWork);
  EXPECT_EQ(first.pool, FetchStream::Pool::kFetch) << "an UNORDERED fetch sets up on the pool";
  Step write = Run(*f, first);
  ASSERT_EQ(write.what, Do::kWrite);
  EXPECT_EQ(write.deadline, clock_.Now() + deps_.timeouts.fetch_stall);
  EXPECT_FALSE(write.park_check.has_value()) << "only a merge parks";
  clock_.Advance(deps_.timeouts.fetch_stall - milliseconds(1));
  EXPECT_EQ(f->stream->Expired().what, Do::kNothing);
  clock_.Advance(milliseconds(1));
  EXPECT_EQ(f->stream->Expired().what, Do::kCancel);
  // The cancelled write completes, not ok: the stream ends saying why.
  Step end = f->stream->Written(false);
  ASSERT_EQ(end.what, Do::kFinish);
  EXPECT_THAT(end.status, StatusIs(absl::StatusCode::kCancelled,
                                   "the reader took no chunk for 120 s (--fetch_stall_timeout_s)"));
  f.reset();
  EXPECT_EQ(budget_.used(), 0u);
}

TEST_F(FetchStreamTest, TheCredentialsAreCheckedAgainAtMostOncePerIntervalAsChunksGo) {
  PushKeyed("s");
  auto f = Open("s", /*key_order=*/false);
  Step step = Run(*f, f->stream->Start());
  ASSERT_EQ(step.what, Do::kWrite);
  EXPECT_EQ(f->host.checks(), 0) << "checked at the open";
  clock_.Advance(deps_.timeouts.caller_recheck - milliseconds(1));
  f->stream->StopParking();
  step = Run(*f, f->stream->Written(true));
  ASSERT_EQ(step.what, Do::kWrite);
  EXPECT_EQ(f->host.checks(), 0) << "not within the interval";
  clock_.Advance(milliseconds(1));
  f->host.SetCaller(absl::UnauthenticatedError("token not known"));
  step = Run(*f, f->stream->Written(true));
  ASSERT_EQ(step.what, Do::kFinish);
  EXPECT_THAT(step.status, StatusIs(absl::StatusCode::kUnauthenticated, "token not known"));
  EXPECT_EQ(f->host.checks(), 1);
}

TEST_F(FetchStreamTest, AStalledMergeParksForAFetchThatWaitsAndResumesExactlyWhereItWas) {
  PushKeyed("s");
  auto a = Open("s", /*key_order=*/true);
  Step first = a->stream->Start();
  ASSERT_EQ(first.what, Do::kWork);
  EXPECT_EQ(first.pool, FetchStream::Pool::kMerge) << "a KEY fetch sets up where it merges";
  Step written = Run(*a, first);
  ASSERT_EQ(written.what, Do::kWrite);
  ASSERT_FALSE(written.last);
  std::vector<std::string> keys;
  for (const auto& [key, value] : DecodeRows(a->chunk)) keys.push_back(key);
  ASSERT_TRUE(written.park_check.has_value());
  EXPECT_EQ(*written.park_check, clock_.Now() + FetchStream::kOverSharePark);
  // Nobody waits: the merge keeps its slot however long its reader stalls.
  clock_.Advance(deps_.timeouts.merge_park);
  std::optional<Clock::time_point> again = a->stream->ParkCheck();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, clock_.Now() + FetchStream::kParkRecheck);
  EXPECT_FALSE(a->stream->parked());
  // Another fetch waits for the one merge slot: the stalled merge gives it up.
  auto b = Open("s", /*key_order=*/true);
  EXPECT_EQ(Run(*b, b->stream->Start(), false).what, Do::kNothing) << "the slot is taken";
  EXPECT_FALSE(a->stream->ParkCheck().has_value()) << "parked: no more checks";
  EXPECT_TRUE(a->stream->parked());
  EXPECT_EQ(metrics_.merges_parked.load(), 1u);
  std::optional<Step> b_written = b->host.NextResumed();
  ASSERT_TRUE(b_written.has_value());
  // a's reader reads again: its merge waits for the slot, which b holds to its end.
  a->stream->StopParking();
  EXPECT_EQ(Run(*a, a->stream->Written(true), false).what, Do::kNothing);
  EXPECT_EQ(ReadToEnd(*b, *b_written), AllKeys());
  b.reset();
  std::optional<Step> resumed = a->host.NextResumed();
  ASSERT_TRUE(resumed.has_value());
  for (const std::string& k : ReadToEnd(*a, *resumed)) keys.push_back(k);
  EXPECT_EQ(keys, AllKeys()) << "every record once, in key order, across the park";
  a.reset();
  EXPECT_EQ(budget_.used(), 0u);
}

TEST_F(FetchStreamTest, ATenantOverItsShareOfMergeSlotsParksSoonerForOneUnderIt) {
  Gate two(2, &pool_);
  deps_.admission.merge_gate = &two;
  PushKeyed("a~s");
  PushKeyed("b~s");
  auto a1 = Open("s", true, Tenant("a"));
  auto a2 = Open("s", true, Tenant("a"));
  ASSERT_EQ(Run(*a1, a1->stream->Start()).what, Do::kWrite);
  ASSERT_EQ(Run(*a2, a2->stream->Start()).what, Do::kWrite);
  auto b = Open("s", true, Tenant("b"));
  EXPECT_EQ(Run(*b, b->stream->Start(), false).what, Do::kNothing) << "team-a holds both slots";
  clock_.Advance(FetchStream::kOverSharePark);
  EXPECT_FALSE(a1->stream->ParkCheck().has_value());
  EXPECT_TRUE(a1->stream->parked()) << "parked long before --merge_park_after_s";
  std::optional<Step> b_written = b->host.NextResumed();
  ASSERT_TRUE(b_written.has_value());
  EXPECT_EQ(b_written->what, Do::kWrite);
  // Team-a holds its share now: its other merge keeps its slot.
  ASSERT_TRUE(a2->stream->ParkCheck().has_value());
  EXPECT_FALSE(a2->stream->parked());
}

TEST_F(FetchStreamTest, AMergeThatHasNotStartedWaitsWhileTheBudgetIsFull) {
  PushKeyed("s");
  budget_.Charge("other", kBudget);
  auto f = Open("s", /*key_order=*/true);
  EXPECT_EQ(f->stream->Start().what, Do::kNothing);
  EXPECT_FALSE(f->host.HasResumed());
  budget_.Release("other", kBudget);
  std::optional<Step> setup = f->host.NextResumed();
  ASSERT_TRUE(setup.has_value());
  EXPECT_EQ(setup->what, Do::kWork);
  EXPECT_EQ(setup->pool, FetchStream::Pool::kMerge);
  EXPECT_EQ(ReadToEnd(*f, Run(*f, *setup)), AllKeys());
}

TEST_F(FetchStreamTest, TheFirstChunkAloneReportsTheMappersAndTheRange) {
  PushKeyed("s");
  auto f = std::make_unique<Fetch>();
  FetchSpec spec;
  spec.shuffle_id = "s";
  spec.key_order = true;
  spec.target_chunk_bytes = 4 << 10;
  spec.from_key = "k010";
  FetchStreamOptions options;
  options.report_mappers = true;
  ASSERT_OK_AND_ASSIGN(f->stream,
                       FetchStream::Make(spec, options, CallContext(), deps_, &f->host, &f->chunk));
  ASSERT_EQ(Run(*f, f->stream->Start()).what, Do::kWrite);
  EXPECT_TRUE(f->stream->report().key_range);
  ASSERT_NE(f->stream->report().mappers, nullptr);
  EXPECT_EQ(*f->stream->report().mappers, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(*f->stream->report().attempts, (std::vector<uint64_t>{1, 1, 1}));
  f->stream->StopParking();
  ASSERT_EQ(Run(*f, f->stream->Written(true)).what, Do::kWrite);
  EXPECT_FALSE(f->stream->report().key_range);
  EXPECT_EQ(f->stream->report().mappers, nullptr);
}

TEST_F(FetchStreamTest, ANameWithAnotherTenantsPrefixIsRefusedAndHoldsNothing) {
  PushKeyed("a~s");
  Fetch f;
  FetchSpec spec;
  spec.shuffle_id = "a~s";
  EXPECT_FALSE(FetchStream::Make(spec, {}, Tenant("b"), deps_, &f.host, &f.chunk).ok());
  EXPECT_EQ(streams_.fetch(), 0u);
}

}  // namespace
}  // namespace sluice::testing
