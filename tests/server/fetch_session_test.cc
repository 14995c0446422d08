// FetchSession's rules with no transport: a registry on a real temporary directory, attempts
// pushed through PushAttempt, frames taken one at a time as the fetch stream would. Each check
// the fetch relies on, the two orders, and the budget's charges.
#include "server/rules/fetch_session.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/rules/push_attempt.h"
#include "tests/harness/fetch_fixture.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice {
namespace {

using absl::StatusCode;
using testing::Bytes;
using testing::DecodeRows;
using testing::EncodeRows;
using testing::Rows;
using testing::StatusIs;

class FetchSessionTest : public testing::FetchFixture {
 protected:
  // Every frame of the session, as they come.
  std::vector<std::string> Drain(FetchSession& session) {
    std::vector<std::string> frames;
    std::string frame;
    for (;;) {
      auto more = session.Next(&frame);
      EXPECT_OK(more);
      if (!more.ok() || !*more) break;
      EXPECT_GE(budget_.used(), frame.size());  // charged while it is out
      frames.push_back(frame);
      session.Sent();
    }
    return frames;
  }
};

TEST_F(FetchSessionTest, RequestsAreCheckedBeforeAnythingIsRead) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 2, 3}));
  ASSERT_OK(registry_->Create(ShuffleParams{"open", 1, 0}));
  FetchSpec spec;
  spec.shuffle_id = "missing";
  EXPECT_THAT(FetchSession::Make(spec, deps_, nullptr), StatusIs(StatusCode::kNotFound, "missing"));
  spec.shuffle_id = "s";
  spec.partition = 2;
  EXPECT_THAT(FetchSession::Make(spec, deps_, nullptr),
              StatusIs(StatusCode::kInvalidArgument, "partition 2 is out of range [0, 2)"));
  spec.partition = 1;
  spec.require_complete = true;
  Push("s", 1, {EncodeRows({{"a", "1"}})});
  EXPECT_THAT(FetchSession::Make(spec, deps_, nullptr),
              StatusIs(StatusCode::kFailedPrecondition, "2 of 3 mappers have not committed"));
  spec.shuffle_id = "open";
  spec.partition = 0;
  EXPECT_THAT(FetchSession::Make(spec, deps_, nullptr),
              StatusIs(StatusCode::kFailedPrecondition, "num_mappers = 0"));
  spec.require_complete = false;
  spec.zstd_level = kMaxFetchZstdLevel + 1;
  EXPECT_THAT(FetchSession::Make(spec, deps_, nullptr),
              StatusIs(StatusCode::kInvalidArgument, "out of range [1, 9]"));
  spec.zstd_level = kMaxFetchZstdLevel;
  EXPECT_OK(FetchSession::Make(spec, deps_, nullptr));
}

TEST_F(FetchSessionTest, UnorderedHandsOutTheStoredFramesAsPushed) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));
  const std::string f1 = EncodeRows({{"b", "1"}, {"a", "2"}});
  const std::string f2 = EncodeRows({{"c", "3"}});
  const std::string f3 = EncodeRows({{"a", "4"}});
  Push("s", 5, {f3});
  Push("s", 2, {f1, f2});
  FetchSpec spec;
  spec.shuffle_id = "s";
  ASSERT_OK_AND_ASSIGN(auto session, FetchSession::Make(spec, deps_, nullptr));
  EXPECT_FALSE(session->key_order());
  // Mapper order, then arrival; the bytes exactly as pushed.
  EXPECT_EQ(Drain(*session), (std::vector<std::string>{f1, f2, f3}));
  EXPECT_EQ(budget_.used(), 0u);
}

TEST_F(FetchSessionTest, KeyOrderMergesEveryRunInTheLayoutAndChunksAskedFor) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));
  Rows all;
  for (uint32_t m = 0; m < 4; ++m) {
    std::vector<std::string> frames;
    for (int f = 0; f < 3; ++f) {
      Rows rows;
      for (int i = 0; i < 50; ++i) {
        rows.emplace_back("k" + std::to_string((i * 7 + f * 13 + m) % 40),
                          std::to_string(m) + "/" + std::to_string(f) + "/" + std::to_string(i));
      }
      all.insert(all.end(), rows.begin(), rows.end());
      frames.push_back(EncodeRows(rows));
    }
    Push("s", m, frames);
  }
  FetchSpec spec;
  spec.shuffle_id = "s";
  spec.key_order = true;
  spec.layout = LayoutChoice::kOpaque;
  spec.uncompressed = true;
  spec.target_chunk_bytes = 500;
  std::vector<std::string> frames;
  {
    ASSERT_OK_AND_ASSIGN(auto session, FetchSession::Make(spec, deps_, nullptr));
    EXPECT_TRUE(session->key_order());
    frames = Drain(*session);
    EXPECT_GT(budget_.used(), 0u);  // the merge's resident frames, while it lives
  }
  EXPECT_EQ(budget_.used(), 0u);
  Rows got;
  for (const std::string& f : frames) {
    const Rows rows = DecodeRows(f);
    EXPECT_LE(rows.size(), 500u / 4);
    got.insert(got.end(), rows.begin(), rows.end());
  }
  ASSERT_EQ(got.size(), all.size());
  for (size_t i = 1; i < got.size(); ++i) EXPECT_FALSE(KeyLess(got[i].first, got[i - 1].first));
  std::sort(all.begin(), all.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, all);
}

TEST_F(FetchSessionTest, DroppingASessionMidwayReturnsItsCharges) {
  ASSERT_OK(registry_->Create(ShuffleParams{"s", 1, 0}));
  Push("s", 0, {EncodeRows({{"a", std::string(1000, 'x')}}), EncodeRows({{"b", "y"}})});
  for (bool key_order : {false, true}) {
    FetchSpec spec;
    spec.shuffle_id = "s";
    spec.key_order = key_order;
    ASSERT_OK_AND_ASSIGN(auto session, FetchSession::Make(spec, deps_, nullptr));
    std::string frame;
    ASSERT_OK_AND_ASSIGN(bool more, session->Next(&frame));
    ASSERT_TRUE(more);
    EXPECT_GE(budget_.used(), frame.size());
    session.reset();  // never Sent(): the reader went away
    EXPECT_EQ(budget_.used(), 0u) << "order " << key_order;
  }
}

}  // namespace
}  // namespace sluice
