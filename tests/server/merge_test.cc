// The k-way merge on its own, over runs held in memory: intermediate passes through files when
// the runs exceed the fan-in keep key order and stability, and a cancelled reader stops them.
#include "server/rules/merge.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice {
namespace {

using testing::TempDir;

class VectorRun final : public RunSource {
 public:
  explicit VectorRun(std::vector<std::pair<std::string, std::string>> records)
      : records_(std::move(records)) {}
  absl::StatusOr<bool> Next(Record* out) override {
    if (pos_ == records_.size()) return false;
    *out = Record{records_[pos_].first, records_[pos_].second};
    ++pos_;
    return true;
  }
  void Release() override {}
  size_t resident_bytes() const override { return 0; }
  uint64_t size_bytes() const override { return records_.size(); }

 private:
  std::vector<std::pair<std::string, std::string>> records_;
  size_t pos_ = 0;
};

std::vector<std::unique_ptr<RunSource>> SortedRuns(int runs, int per_run) {
  std::vector<std::unique_ptr<RunSource>> out;
  for (int r = 0; r < runs; ++r) {
    std::vector<std::pair<std::string, std::string>> recs;
    for (int i = 0; i < per_run; ++i) {
      char key[16];
      std::snprintf(key, sizeof(key), "k%05d", (i * 7 + r) % 50);
      recs.emplace_back(key, "r" + std::to_string(r) + "#" + std::to_string(i));
    }
    std::stable_sort(recs.begin(), recs.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    out.push_back(std::make_unique<VectorRun>(std::move(recs)));
  }
  return out;
}

TEST(MergeTest, PassesBeyondTheFanInKeepOrderAndStabilityAndStopWhenCancelled) {
  TempDir dir;
  MergeOptions opts;
  opts.fan_in = 3;
  opts.tmp_dir = dir.path();
  opts.chunk_bytes = 256;  // many intermediate frames
  std::atomic<bool> cancelled{false};
  opts.cancelled = &cancelled;
  auto merged = MergedStream::Make(SortedRuns(10, 40), opts);
  ASSERT_OK(merged);
  EXPECT_GE((*merged)->intermediate_passes(), 1u);
  std::vector<std::pair<std::string, std::string>> got;
  std::vector<Record> batch;
  for (;;) {
    batch.clear();
    auto more = (*merged)->NextBatch(1000, &batch);
    ASSERT_OK(more);
    if (!*more) break;
    for (const Record& r : batch) got.emplace_back(std::string(r.key), std::string(r.value));
  }
  ASSERT_EQ(got.size(), 400u);
  for (size_t i = 1; i < got.size(); ++i) {
    ASSERT_LE(got[i - 1].first, got[i].first);
    if (got[i - 1].first == got[i].first) {  // equal keys: run order, then position in the run
      const int r0 = std::stoi(got[i - 1].second.substr(1)),
                r1 = std::stoi(got[i].second.substr(1));
      ASSERT_LE(r0, r1) << got[i - 1].second << " before " << got[i].second;
    }
  }
  cancelled = true;
  auto stopped = MergedStream::Make(SortedRuns(10, 40), opts);
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace sluice
