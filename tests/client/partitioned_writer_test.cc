// The client's writer and reader logic over in-memory streams (client/transport.h): routing to
// several streams, flushing within the budget, the commit each stream gets, errors and aborts;
// the reader's decoding and its errors. The gRPC streams are tested in client_test.cc.
#include "client/partitioned_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/frame_stream_reader.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"

namespace sluice {
namespace {

using absl::StatusCode;
using testing::DecodeRows;
using testing::EncodeRows;
using testing::Rows;
using testing::StatusIs;

// Keeps what it is sent; fails SendFrame from frame `fail_at` on, if set.
struct FakePush {
  std::mutex mu;
  std::vector<std::pair<uint32_t, std::string>> frames;  // sent
  bool committed = false, cancelled = false;
  uint64_t commit_frames = 0, commit_records = 0;
  int fail_at = -1;
  // Told to the writer once `notify_at` frames were sent (a server's notices with its credit).
  int notify_at = -1;
  std::vector<SegmentNotice> notices;
  absl::Status failure = absl::InvalidArgumentError("frame 3 for partition 1: rejected");
};

class FakePushStream final : public PushStream {
 public:
  explicit FakePushStream(FakePush* state) : s_(state) {}
  std::string* NewFrame(uint32_t partition) override {
    partition_ = partition;
    pending_.clear();
    return &pending_;
  }
  absl::Status SendFrame() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->fail_at >= 0 && static_cast<int>(s_->frames.size()) >= s_->fail_at) {
      return s_->failure;
    }
    s_->frames.emplace_back(partition_, pending_);
    return absl::OkStatus();
  }
  absl::Status SendCommit(uint64_t frames, uint64_t records) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->commit_frames = frames;
    s_->commit_records = records;
    return absl::OkStatus();
  }
  absl::StatusOr<WriteResult> FinishCommit() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->committed = true;
    WriteResult r;
    r.frames = s_->commit_frames;
    r.records = s_->commit_records;
    return r;
  }
  void Cancel() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->cancelled = true;
  }
  std::vector<SegmentNotice> TakeSegments() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->notify_at < 0 || static_cast<int>(s_->frames.size()) < s_->notify_at) return {};
    s_->notify_at = -1;
    return std::move(s_->notices);
  }

 private:
  FakePush* const s_;
  uint32_t partition_ = 0;
  std::string pending_;
};

std::vector<std::unique_ptr<PushStream>> Streams(std::vector<FakePush>& states) {
  std::vector<std::unique_ptr<PushStream>> out;
  for (FakePush& s : states) out.push_back(std::make_unique<FakePushStream>(&s));
  return out;
}

TEST(PartitionedWriterTest, PartitionsGoToTheirStreamsAndEachCommitsWhatItCarried) {
  std::vector<FakePush> states(3);
  // 6 partitions: p -> stream p % 3.
  WriterOptions opts;
  opts.buffer_bytes = 8 << 10;  // many flushes
  ASSERT_OK_AND_ASSIGN(
      auto writer, PartitionedWriter::Make(6, Streams(states), {{0}, {1}, {2}, {0}, {1}, {2}}, opts,
                                           FrameLimits{}));
  std::map<std::string, std::string> sent;
  for (int i = 0; i < 5000; ++i) {
    const std::string key = "key" + std::to_string(i);
    const std::string value = "value" + std::to_string(i * 31);
    ASSERT_OK(writer->Add(key, value));
    sent[key] = value;
  }
  ASSERT_OK_AND_ASSIGN(WriteResult result, writer->Close());
  EXPECT_EQ(result.records, 5000u);
  std::map<std::string, std::string> got;
  uint64_t frames = 0;
  for (size_t s = 0; s < states.size(); ++s) {
    ASSERT_TRUE(states[s].committed);
    EXPECT_FALSE(states[s].cancelled);
    EXPECT_EQ(states[s].commit_frames, states[s].frames.size());
    uint64_t records = 0;
    for (const auto& [partition, frame] : states[s].frames) {
      EXPECT_EQ(partition % 3, s) << "partition " << partition << " on stream " << s;
      for (const auto& [k, v] : DecodeRows(frame)) {
        EXPECT_EQ(HashPartition(k, 6), partition);
        got[k] = v;
        ++records;
      }
    }
    EXPECT_EQ(states[s].commit_records, records);
    frames += states[s].frames.size();
  }
  EXPECT_GT(frames, 6u);  // the budget forced flushes before Close
  EXPECT_EQ(result.frames, frames);
  EXPECT_EQ(got, sent);
}

TEST(PartitionedWriterTest, SortedWritersSendSortedFramesOfBoundedSize) {
  std::vector<FakePush> states(1);
  WriterOptions opts;
  opts.sort_by_key = true;
  opts.frame_bytes = 1000;
  ASSERT_OK_AND_ASSIGN(auto writer,
                       PartitionedWriter::Make(1, Streams(states), {}, opts, FrameLimits{}));
  for (int i = 0; i < 2000; ++i) ASSERT_OK(writer->Add("k" + std::to_string(i * 7919 % 2000), "v"));
  ASSERT_OK(writer->Close());
  ASSERT_GT(states[0].frames.size(), 1u);
  for (const auto& [p, frame] : states[0].frames) {
    const Rows rows = DecodeRows(frame);
    size_t bytes = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      bytes += rows[i].first.size() + rows[i].second.size();
      if (i > 0) {
        EXPECT_FALSE(KeyLess(rows[i].first, rows[i - 1].first));
      }
    }
    EXPECT_LE(bytes, 1000u);
  }
}

// A sorted flush is cut at sorted_frame_bytes (256 KiB by default), an unsorted one at
// frame_bytes: one 1 MiB flush of one partition is four sorted frames, one unsorted frame.
TEST(PartitionedWriterTest, SortedFlushesAreCutIntoSmallerFrames) {
  for (const bool sorted : {true, false}) {
    std::vector<FakePush> states(1);
    WriterOptions opts;
    opts.sort_by_key = sorted;
    opts.buffer_bytes = 4u << 20;
    ASSERT_OK_AND_ASSIGN(auto writer,
                         PartitionedWriter::Make(1, Streams(states), {}, opts, FrameLimits{}));
    const std::string value(1000, 'v');
    for (int i = 0; i < 1024; ++i)
      ASSERT_OK(writer->Add(absl::StrCat("k", i * 7919 % 1024), value));
    ASSERT_OK(writer->Close());
    size_t most = 0;
    for (const auto& [p, frame] : states[0].frames) {
      size_t bytes = 0;
      for (const auto& [k, v] : DecodeRows(frame)) bytes += k.size() + v.size();
      most = std::max(most, bytes);
    }
    EXPECT_EQ(states[0].frames.size(), sorted ? 4u : 1u) << "sorted " << sorted;
    EXPECT_LE(most, sorted ? opts.sorted_frame_bytes : opts.frame_bytes);
  }
}

TEST(PartitionedWriterTest, AStreamErrorIsTheWritersAndNothingCommits) {
  std::vector<FakePush> states(2);
  states[1].fail_at = 3;
  WriterOptions opts;
  opts.buffer_bytes = 4 << 10;
  ASSERT_OK_AND_ASSIGN(
      auto writer, PartitionedWriter::Make(2, Streams(states), {{0}, {1}}, opts, FrameLimits{}));
  absl::Status st;
  for (int i = 0; i < 20000 && st.ok(); ++i) st = writer->Add("k" + std::to_string(i), "value");
  if (st.ok()) st = writer->Close().status();
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, "frame 3 for partition 1: rejected"));
  EXPECT_FALSE(states[0].committed);
  EXPECT_FALSE(states[1].committed);
  writer.reset();
  EXPECT_TRUE(states[0].cancelled);
  EXPECT_TRUE(states[1].cancelled);
}

TEST(PartitionedWriterTest, AbortAndDestructionCancelEveryStream) {
  for (bool abort : {true, false}) {
    std::vector<FakePush> states(2);
    {
      ASSERT_OK_AND_ASSIGN(
          auto writer, PartitionedWriter::Make(2, Streams(states), {{0}, {1}}, {}, FrameLimits{}));
      ASSERT_OK(writer->Add("a", "b"));
      if (abort) {
        writer->Abort();
        EXPECT_THAT(writer->Add("c", "d"), StatusIs(StatusCode::kFailedPrecondition, "closed"));
      }
    }
    for (const FakePush& s : states) {
      EXPECT_TRUE(s.cancelled);
      EXPECT_FALSE(s.committed);
    }
  }
}

// A wide writer's memory follows its records, not its partition count (it must not keep a
// chunk for every partition it has a record for: 8,192 partitions x 1 KiB here), and its one
// flush at Close sends one frame per partition it holds records of, each with that
// partition's records in arrival order (sorted by key when asked: stably, keys repeat).
TEST(PartitionedWriterTest, AWideWritersMemoryFollowsItsRecords) {
  for (bool sorted : {false, true}) {
    std::vector<FakePush> states(1);
    WriterOptions opts;
    opts.sort_by_key = sorted;
    constexpr uint32_t kPartitions = 8192;
    ASSERT_OK_AND_ASSIGN(auto writer, PartitionedWriter::Make(kPartitions, Streams(states), {},
                                                              opts, FrameLimits{}));
    std::map<uint32_t, std::vector<std::pair<std::string, std::string>>> sent;
    constexpr int kRecords = 3000;
    for (int i = 0; i < kRecords; ++i) {
      const std::string key = "k" + std::to_string((i * 7919) % 1000);
      const std::string value = std::string(100, 'v') + std::to_string(i);
      ASSERT_OK(writer->Add(key, value));
      sent[HashPartition(key, kPartitions)].emplace_back(key, value);
    }
    // One 1 MiB chunk (the budget's sixteenth), and 56 bytes a record (its entry and view).
    EXPECT_LE(writer->buffered_bytes(), size_t{1 << 20} + kRecords * 56);
    ASSERT_OK_AND_ASSIGN(WriteResult result, writer->Close());
    EXPECT_EQ(result.frames, sent.size()) << "one frame per partition written";
    ASSERT_EQ(states[0].frames.size(), sent.size());
    for (const auto& [partition, frame] : states[0].frames) {
      auto want = sent[partition];
      if (sorted) {
        std::stable_sort(want.begin(), want.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      Rows got = DecodeRows(frame);
      ASSERT_EQ(got.size(), want.size()) << "partition " << partition;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].first, want[i].first);
        EXPECT_EQ(got[i].second, want[i].second);
      }
    }
  }
}

// A flush sends the partitions holding the larger half of the fill's bytes and carries the
// others' records into the next fill: a skewed writer's small partitions wait until they are
// among the largest instead of going out a few records at every flush, and every partition's
// records still arrive in the order they were added (UNORDERED: no sort), across fills.
TEST(PartitionedWriterTest, SmallPartitionsWaitForFramesOfTheirOwnInArrivalOrder) {
  std::vector<FakePush> states(1);
  WriterOptions opts;
  opts.buffer_bytes = 64 << 10;
  constexpr uint32_t kPartitions = 50;
  // Key "h<n>": partition 0 (nine records in ten); "s<n>": 1 + n % 49.
  opts.partitioner = [](std::string_view key, uint32_t) -> uint32_t {
    if (key[0] == 'h') return 0;
    return 1 + static_cast<uint32_t>(std::stoul(std::string(key.substr(1))) % 49);
  };
  ASSERT_OK_AND_ASSIGN(
      auto writer, PartitionedWriter::Make(kPartitions, Streams(states), {}, opts, FrameLimits{}));
  constexpr int kRecords = 20000;
  for (int i = 0; i < kRecords; ++i) {
    const std::string key = (i % 10 == 0 ? "s" : "h") + std::to_string(i);
    ASSERT_OK(writer->Add(key, std::to_string(i)));
  }
  ASSERT_OK_AND_ASSIGN(WriteResult result, writer->Close());
  EXPECT_EQ(result.records, uint64_t{kRecords});
  std::vector<int> last(kPartitions, -1);
  uint64_t small_frames = 0, records = 0;
  for (const auto& [partition, frame] : states[0].frames) {
    if (partition != 0) ++small_frames;
    for (const auto& [k, v] : DecodeRows(frame)) {
      const int seq = std::stoi(v);
      EXPECT_GT(seq, last[partition]) << "partition " << partition << " out of order";
      last[partition] = seq;
      ++records;
    }
  }
  EXPECT_EQ(records, uint64_t{kRecords});
  // 20,000 records take ~27 fills of this budget: one frame of each of the 49 small partitions
  // at every flush would be ~1,300; kept back, they go out a few times each.
  EXPECT_LT(small_frames, 49u * 6) << "small partitions sent at every flush";
}

// What a flush ranks and carries is what the budget counts, 56 bytes a record beside its key
// and value: records with nothing in them, or a few large ones beside many tiny ones, keep
// the writer within its budget and its flushes sending (ranking by key and value bytes alone
// carried empty records at every flush, never sending them, past the budget).
TEST(PartitionedWriterTest, EmptyAndTinyRecordsKeepTheBudgetAndAreSent) {
  for (bool mixed : {false, true}) {
    std::vector<FakePush> states(1);
    WriterOptions opts;
    opts.buffer_bytes = 16 << 10;
    constexpr uint32_t kPartitions = 41;
    // mixed: partition 0 gets 1 KiB records (1 in 20), the others 1-byte ones; else all empty.
    opts.partitioner = [](std::string_view key, uint32_t) -> uint32_t {
      return key.empty() ? 0 : static_cast<uint32_t>(key[0] - '0');
    };
    ASSERT_OK_AND_ASSIGN(auto writer, PartitionedWriter::Make(kPartitions, Streams(states), {},
                                                              opts, FrameLimits{}));
    constexpr int kRecords = 20000;
    const std::string large(1024, 'x');
    for (int i = 0; i < kRecords; ++i) {
      if (!mixed) {
        ASSERT_OK(writer->Add("", ""));
      } else if (i % 20 == 0) {
        ASSERT_OK(writer->Add("", large));
      } else {
        ASSERT_OK(writer->Add(std::string(1, static_cast<char>('0' + 1 + i % 40)), ""));
      }
      ASSERT_LE(writer->buffered_bytes(), opts.buffer_bytes + 2048) << "record " << i;
    }
    ASSERT_OK_AND_ASSIGN(WriteResult result, writer->Close());
    EXPECT_EQ(result.records, uint64_t{kRecords});
    uint64_t records = 0;
    for (const auto& [partition, frame] : states[0].frames) records += DecodeRows(frame).size();
    EXPECT_EQ(records, uint64_t{kRecords});
    // ~20,000 x 56 bytes (and 1 MiB of large values) over a 16 KiB budget: some 70-140 flushes,
    // each sending part of the partitions (3,022 frames measured for the mixed case); a frame a
    // record would be 20,000.
    EXPECT_LT(result.frames, 5000u) << (mixed ? "mixed" : "empty");
  }
}

// Uniform data over many flushes: partitions are sent when among the largest, so frames hold
// more than the budget's even share of a partition (each flush sending every partition gives
// one frame per partition per fill).
TEST(PartitionedWriterTest, WideFlushesSendTheLargestPartitions) {
  std::vector<FakePush> states(1);
  WriterOptions opts;
  opts.buffer_bytes = 256 << 10;
  constexpr uint32_t kPartitions = 256;
  ASSERT_OK_AND_ASSIGN(
      auto writer, PartitionedWriter::Make(kPartitions, Streams(states), {}, opts, FrameLimits{}));
  constexpr int kRecords = 100000;
  const std::string value(32, 'v');
  for (int i = 0; i < kRecords; ++i) ASSERT_OK(writer->Add("key" + std::to_string(i), value));
  ASSERT_OK_AND_ASSIGN(WriteResult result, writer->Close());
  // A fill holds ~2,600 records (~40 bytes, and 56 of entry and view); sending every partition
  // at every flush would make ~38 fills x 256 = ~9,800 frames.
  EXPECT_LT(result.frames, 7000u);
  EXPECT_EQ(result.records, uint64_t{kRecords});
}

// Cluster mode: each partition on two streams (its replicas), every frame sent to both, every
// stream prepared before the one decision, whose answer says whether the attempt won.
TEST(PartitionedWriterTest, ReplicatedPartitionsGoToEveryReplicaAndOneDecisionCommits) {
  for (uint64_t winner : {7u, 3u}) {
    std::vector<FakePush> states(3);
    int decisions = 0;
    bool all_prepared = false;
    auto decide = [&]() -> absl::StatusOr<uint64_t> {
      ++decisions;
      all_prepared = true;
      for (FakePush& s : states) all_prepared = all_prepared && s.committed;
      return winner;
    };
    WriterOptions opts;
    opts.buffer_bytes = 8 << 10;
    // 3 partitions: p on streams p and (p + 1) % 3.
    ASSERT_OK_AND_ASSIGN(auto writer,
                         PartitionedWriter::Make(3, Streams(states), {{0, 1}, {1, 2}, {2, 0}}, opts,
                                                 FrameLimits{}, decide, /*attempt=*/7));
    for (int i = 0; i < 3000; ++i) {
      ASSERT_OK(writer->Add("key" + std::to_string(i), "value" + std::to_string(i)));
    }
    ASSERT_OK_AND_ASSIGN(WriteResult result, writer->Close());
    EXPECT_EQ(decisions, 1);
    EXPECT_TRUE(all_prepared) << "decided before every stream had prepared";
    EXPECT_EQ(result.duplicate, winner != 7);
    EXPECT_EQ(result.winning_attempt, winner);
    EXPECT_EQ(result.records, 3000u);  // each record once, not once per replica
    // Each partition's frames, identical and in the same order, on both of its streams.
    for (uint32_t p = 0; p < 3; ++p) {
      std::vector<std::string> a, b;
      for (const auto& [partition, frame] : states[p].frames) {
        if (partition == p) a.push_back(frame);
      }
      for (const auto& [partition, frame] : states[(p + 1) % 3].frames) {
        if (partition == p) b.push_back(frame);
      }
      EXPECT_FALSE(a.empty());
      EXPECT_EQ(a, b) << "partition " << p;
    }
    uint64_t frames = 0;
    for (const FakePush& s : states) frames += s.frames.size();
    EXPECT_EQ(frames, 2 * result.frames);
  }
}

// Huge partitions (docs/cluster.md): once a stream tells of a partition's new segment, the
// partition's next frames go to the segment's streams under its stored id; segments a writer
// cannot route (a server without a stream here, a partition it does not have) change nothing.
TEST(PartitionedWriterTest, APartitionsFramesFollowTheSegmentsItsStreamsTellOf) {
  std::vector<FakePush> states(3);
  states[0].notify_at = 4;
  states[0].notices = {SegmentNotice{5, 0, {2}},   // partition 0's first segment, on node 2
                       SegmentNotice{6, 0, {9}},   // a node without a stream: not taken
                       SegmentNotice{7, 3, {1}},   // a partition the shuffle does not have
                       SegmentNotice{1, 0, {1}}};  // not a segment id
  WriterOptions opts;
  opts.buffer_bytes = 4 << 10;
  opts.partitioner = [](std::string_view key, uint32_t) -> uint32_t {
    return key[0] == 'a' ? 0 : 1;
  };
  PartitionedWriter::SegmentRouting routing;
  routing.stream_of_node = {0, 1, 2};
  // Partition 1 had a segment on node 0 before the writer opened.
  routing.segments = {SegmentNotice{4, 1, {0}}};
  ASSERT_OK_AND_ASSIGN(auto writer, PartitionedWriter::Make(2, Streams(states), {{0}, {1}}, opts,
                                                            FrameLimits{}, nullptr, 0, routing));
  for (int i = 0; i < 2000; ++i) {
    ASSERT_OK(
        writer->Add((i % 4 == 0 ? "b" : "a") + std::to_string(i), "value" + std::to_string(i)));
  }
  ASSERT_OK_AND_ASSIGN(WriteResult result, writer->Close());
  EXPECT_EQ(result.records, 2000u);
  std::map<uint32_t, uint64_t> records;  // by stored partition
  uint64_t before = 0;                   // partition 0's frames before its segment
  for (size_t s = 0; s < states.size(); ++s) {
    for (const auto& [q, frame] : states[s].frames) {
      records[q] += DecodeRows(frame).size();
      if (q == 0) ++before;
      // Stored partition -> the stream of its server.
      EXPECT_EQ(s, q == 0 ? 0u : q == 5 ? 2u : q == 4 ? 0u : 99u) << "stored partition " << q;
    }
  }
  EXPECT_GE(before, 1u) << "partition 0 began on its own server";
  EXPECT_GT(records[5], 0u) << "partition 0 moved to its segment";
  EXPECT_EQ(records[0] + records[5], 1500u);
  EXPECT_EQ(records[4], 500u) << "partition 1 went to its segment from the start";
  EXPECT_EQ(records.count(1), 0u);
  EXPECT_EQ(writer->segment_frames(), states[2].frames.size() + states[0].frames.size() - before);
}

TEST(PartitionedWriterTest, AFailedDecisionFailsTheClose) {
  std::vector<FakePush> states(2);
  auto decide = []() -> absl::StatusOr<uint64_t> {
    return absl::UnavailableError("server unreachable at 127.0.0.9:1: etcd is down");
  };
  ASSERT_OK_AND_ASSIGN(auto writer, PartitionedWriter::Make(2, Streams(states), {{0, 1}, {1, 0}},
                                                            {}, FrameLimits{}, decide, 1));
  ASSERT_OK(writer->Add("k", "v"));
  EXPECT_THAT(writer->Close(), StatusIs(StatusCode::kUnavailable, "etcd is down"));
}

TEST(PartitionedWriterTest, BadRoutesAndRecordsAreRefused) {
  std::vector<FakePush> states(2);
  EXPECT_THAT(PartitionedWriter::Make(3, Streams(states), {{0}, {1}, {2}}, {}, FrameLimits{}),
              StatusIs(StatusCode::kInvalidArgument, "routed to stream 2 of 2"));
  EXPECT_THAT(PartitionedWriter::Make(3, Streams(states), {{0}, {1}}, {}, FrameLimits{}),
              StatusIs(StatusCode::kInvalidArgument, "routes for 2 partitions"));
  EXPECT_THAT(PartitionedWriter::Make(3, Streams(states), {{0}, {}, {1}}, {}, FrameLimits{}),
              StatusIs(StatusCode::kInvalidArgument, "partition 1 has no stream"));
  EXPECT_THAT(PartitionedWriter::Make(3, {}, {}, {}, FrameLimits{}),
              StatusIs(StatusCode::kInvalidArgument, "push stream"));
  WriterOptions opts;
  opts.partitioner = [](std::string_view, uint32_t n) { return n; };
  FrameLimits small;
  small.max_uncompressed_bytes = 1000;
  ASSERT_OK_AND_ASSIGN(auto writer, PartitionedWriter::Make(2, Streams(states), {}, opts, small));
  EXPECT_THAT(writer->Add("k", "v"), StatusIs(StatusCode::kInvalidArgument, "returned 2 for 2"));
  opts.partitioner = nullptr;
  ASSERT_OK_AND_ASSIGN(writer, PartitionedWriter::Make(2, Streams(states), {}, opts, small));
  EXPECT_THAT(writer->Add("k", std::string(600, 'x')),
              StatusIs(StatusCode::kInvalidArgument, "too large for one frame"));
}

// Hands out the given frames, then an end or an error.
class FakeFetchStream final : public FetchStream {
 public:
  FakeFetchStream(std::vector<std::string> frames, absl::Status end, std::atomic<bool>* cancelled)
      : frames_(std::move(frames)), end_(std::move(end)), cancelled_(cancelled) {}
  absl::StatusOr<bool> Next(const std::string** frame) override {
    if (next_ == frames_.size()) {
      if (!end_.ok()) return end_;
      return false;
    }
    *frame = &frames_[next_++];
    return true;
  }
  void Cancel() override { *cancelled_ = true; }
  const std::vector<uint32_t>& mappers() const override { return mappers_; }
  const std::vector<uint64_t>& attempts() const override { return attempts_; }

 private:
  std::vector<uint32_t> mappers_;
  std::vector<uint64_t> attempts_;
  std::vector<std::string> frames_;
  absl::Status end_;
  std::atomic<bool>* cancelled_;
  size_t next_ = 0;
};

TEST(FrameStreamReaderTest, RecordsOfEveryFrameThenTheStreamsEnd) {
  std::atomic<bool> cancelled{false};
  FrameStreamReader reader(
      std::make_unique<FakeFetchStream>(
          std::vector<std::string>{EncodeRows({{"a", "1"}, {"b", "2"}}), EncodeRows({}),
                                   EncodeRows({{"c", "3"}})},
          absl::FailedPreconditionError("2 of 2 mappers have not committed"), &cancelled),
      FrameLimits{}, "here");
  Record r;
  std::string keys;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(bool more, reader.Next(&r));
    ASSERT_TRUE(more);
    keys += std::string(r.key);
  }
  EXPECT_EQ(keys, "abc");
  EXPECT_THAT(reader.Next(&r), StatusIs(StatusCode::kFailedPrecondition, "2 of 2 mappers"));
  EXPECT_FALSE(cancelled.load());
}

TEST(FrameStreamReaderTest, ABadFrameIsDataLossAndAnUnfinishedReadIsCancelled) {
  std::atomic<bool> cancelled{false};
  std::string bad = EncodeRows({{"a", "1"}});
  bad[bad.size() - 1] ^= 1;
  {
    FrameStreamReader reader(std::make_unique<FakeFetchStream>(std::vector<std::string>{bad},
                                                               absl::OkStatus(), &cancelled),
                             FrameLimits{}, "server-x");
    Record r;
    EXPECT_THAT(reader.Next(&r), StatusIs(StatusCode::kDataLoss, "bad frame from server-x: "));
  }
  EXPECT_TRUE(cancelled.load());
}

}  // namespace
}  // namespace sluice
