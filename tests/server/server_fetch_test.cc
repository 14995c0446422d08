// The service's fetches end to end (a real SluiceServer, the generated gRPC stub): complete
// partitions required, zstd levels, KEY order (stable merges of every run, layouts and chunk
// sizes, the merge fan-in and limit), and frames at the size cap across restarts.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/frame_format.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/status_matchers.h"
#include "tests/server/server_fixture.h"

namespace sluice {
namespace {

using server_test::Frame;
using server_test::Rows;
using server_test::ServerTest;
using testing::StatusIs;
namespace pb = sluice::v1;

TEST_F(ServerTest, RequireCompleteSaysHowManyMappersAreMissing) {
  ASSERT_OK(Create("s", 1, 3));
  pb::PushResponse resp;
  ASSERT_OK(Push("s", 1, 1, 1, 5, &resp));
  std::vector<std::string> got;
  grpc::Status st = FetchAll("s", 0, &got, /*require_complete=*/true);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("2 of 3 mappers"), std::string::npos) << st.error_message();
  got.clear();
  EXPECT_OK(FetchAll("s", 0, &got, /*require_complete=*/false));
  EXPECT_EQ(got.size(), 5u);
}

TEST_F(ServerTest, RequireCompleteWithoutAMapperCountIsRefusedNotIgnored) {
  ASSERT_OK(Create("open-ended", 1, 0));
  pb::PushResponse resp;
  ASSERT_OK(Push("open-ended", 1, 1, 1, 5, &resp));
  std::vector<std::string> got;
  grpc::Status st = FetchAll("open-ended", 0, &got, /*require_complete=*/true);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("num_mappers = 0"), std::string::npos) << st.error_message();
  got.clear();
  EXPECT_OK(FetchAll("open-ended", 0, &got));
  EXPECT_EQ(got.size(), 5u);
}

TEST_F(ServerTest, FetchZstdLevelsAreBounded) {
  ASSERT_OK(Create("z", 1, 1));
  pb::PushResponse resp;
  ASSERT_OK(Push("z", 0, 1, 1, 50, &resp));
  for (uint32_t level : {9u, 10u, 22u, 4000000000u}) {
    grpc::ClientContext ctx;
    pb::FetchRequest req;
    req.set_shuffle_id("z");
    req.set_order(pb::KEY);
    req.set_zstd_level(level);
    auto reader = stub_->Fetch(&ctx, req);
    pb::FetchResponse r;
    size_t frames = 0;
    while (reader->Read(&r)) ++frames;
    grpc::Status st = reader->Finish();
    if (level <= 9) {
      EXPECT_OK(st);
      EXPECT_GT(frames, 0u);
    } else {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << level;
      EXPECT_NE(st.error_message().find("out of range [1, 9]"), std::string::npos)
          << st.error_message();
    }
  }
}

// Mapper m's frames: `frames` frames of `n` records, keys drawn from a small range (so keys
// repeat within and across mappers), values "m<m>-<arrival>". Odd frames are sorted by the
// encoder, even ones are left unsorted.
std::vector<std::string> KeyedFrames(uint32_t m, int frames, int n) {
  std::vector<std::string> out;
  uint64_t x = 0x9e3779b97f4a7c15ULL * (m + 3);
  int arrival = 0;
  for (int f = 0; f < frames; ++f) {
    std::vector<std::string> keys, values;
    for (int i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      keys.push_back("key" + std::to_string(x % 97));
      values.push_back("m" + std::to_string(m) + "-" + std::to_string(arrival++));
    }
    std::vector<Record> records;
    for (int i = 0; i < n; ++i) records.push_back(Record{keys[i], values[i]});
    EncodeOptions opts;
    opts.sort_by_key = f % 2 == 1;
    FrameEncoder enc(opts);
    std::string frame;
    EXPECT_OK(enc.Encode(records, &frame));
    out.push_back(frame);
  }
  return out;
}

TEST_F(ServerTest, KeyOrderMergesEveryRunStably) {
  for (size_t fan_in : {size_t{64}, size_t{3}}) {
    RestartServer(256ull << 20, fan_in);
    const std::string id = "k" + std::to_string(fan_in);
    ASSERT_OK(Create(id, 1, 0));
    std::vector<std::pair<std::string, std::string>> expected;
    // Expected stream: every record, stable-sorted by key over (mapper, frame, position).
    std::vector<std::tuple<std::string, uint32_t, size_t, std::string>> rows;
    for (uint32_t m : {3u, 0u, 2u, 1u}) {  // pushed out of mapper order
      const auto frames = KeyedFrames(m, 5, 40);
      ASSERT_OK(PushFrames(id, m, frames, 5 * 40));
      // Re-derive (key, value) in stored order by decoding what we pushed.
      FrameDecoder dec;
      DecodedFrame frame;
      size_t seq = 0;
      for (const std::string& f : frames) {
        ASSERT_OK(dec.Decode(f, &frame));
        std::vector<size_t> idx(frame.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        std::stable_sort(idx.begin(), idx.end(),
                         [&](size_t a, size_t b) { return KeyLess(frame[a].key, frame[b].key); });
        for (size_t i : idx) {
          rows.emplace_back(std::string(frame[i].key), m, seq++, std::string(frame[i].value));
        }
      }
    }
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      const int c = CompareKeys(std::get<0>(a), std::get<0>(b));
      if (c != 0) return c < 0;
      if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) < std::get<1>(b);
      return std::get<2>(a) < std::get<2>(b);
    });
    for (const auto& r : rows) expected.emplace_back(std::get<0>(r), std::get<3>(r));
    std::vector<std::pair<std::string, std::string>> got;
    ASSERT_OK(FetchKeyOrder(id, &got));
    EXPECT_EQ(got, expected) << "fan-in " << fan_in;
  }
}

TEST_F(ServerTest, KeyOrderUsesTheRequestedLayoutAndChunkSize) {
  ASSERT_OK(Create("s", 1, 0));
  ASSERT_OK(PushFrames("s", 0, KeyedFrames(0, 3, 200), 600));
  std::vector<std::pair<std::string, std::string>> got;
  std::vector<FrameHeader> headers;
  ASSERT_TRUE(FetchKeyOrder("s", &got, &headers, pb::LAYOUT_OPAQUE, /*uncompressed=*/true,
                            /*chunk=*/2000)
                  .ok());
  EXPECT_EQ(got.size(), 600u);
  EXPECT_GT(headers.size(), 3u);  // ~14 bytes a record, 2000-byte chunks
  for (const FrameHeader& h : headers) {
    EXPECT_EQ(h.layout, Layout::kOpaque);
    EXPECT_EQ(h.compression, Compression::kNone);
    EXPECT_TRUE(h.sorted_by_key());
  }
  for (size_t i = 1; i < got.size(); ++i) EXPECT_FALSE(KeyLess(got[i].first, got[i - 1].first));
}

TEST_F(ServerTest, TenThousandRunsAreMergedWithinTheFanIn) {
  RestartServer(256ull << 20, /*fan_in=*/64);
  ASSERT_OK(Create("many", 1, 0));
  // One attempt of 10,000 one-record frames: 10,000 runs, 157 times the fan-in.
  std::vector<std::string> frames;
  for (int i = 0; i < 10000; ++i) {
    const std::string key = "k" + std::to_string((i * 7919) % 10000);
    const std::string value = std::to_string(i);
    FrameEncoder enc;
    std::string frame;
    ASSERT_OK(enc.Encode({Record{key, value}}, &frame));
    frames.push_back(std::move(frame));
  }
  ASSERT_OK(PushFrames("many", 0, frames, 10000));
  std::vector<std::pair<std::string, std::string>> got;
  ASSERT_OK(FetchKeyOrder("many", &got));
  ASSERT_EQ(got.size(), 10000u);
  for (size_t i = 1; i < got.size(); ++i) ASSERT_FALSE(KeyLess(got[i].first, got[i - 1].first));
}

TEST_F(ServerTest, KeyFetchesBeyondTheMergeLimitWaitTheirTurn) {
  RestartServer(256ull << 20, 64, kDefaultMaxUncompressedBytes, /*merges=*/1);
  for (int s = 0; s < 4; ++s) {
    const std::string id = "q" + std::to_string(s);
    ASSERT_OK(Create(id, 1, 0));
    ASSERT_OK(PushFrames(id, 0, KeyedFrames(0, 4, 300), 1200));
  }
  std::vector<std::thread> readers;
  std::atomic<int> ok{0};
  for (int s = 0; s < 4; ++s) {
    readers.emplace_back([this, s, &ok] {
      std::vector<std::pair<std::string, std::string>> got;
      if (FetchKeyOrder("q" + std::to_string(s), &got).ok() && got.size() == 1200) ++ok;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(ok.load(), 4);
}

TEST_F(ServerTest, FramesOverTheSizeCapAreRejected) {
  RestartServer(256ull << 20, 64, /*max_frame_bytes=*/4096);
  ASSERT_OK(Create("s", 1, 0));
  FrameEncoder enc;  // (the client's own cap is the default 64 MiB)
  std::string frame;
  ASSERT_OK(enc.Encode({Record{"k", std::string(10000, 'x')}}, &frame));
  grpc::Status st = PushFrames("s", 0, {frame}, 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("exceeds the cap of 4096"), std::string::npos)
      << st.error_message();
}

// An uncompressed OPAQUE frame of one record whose payload is exactly `payload` bytes.
std::string FrameWithPayload(size_t payload, char fill) {
  EncodeOptions opts;
  opts.layout = LayoutChoice::kOpaque;
  opts.compression = Compression::kNone;
  FrameEncoder enc(opts);
  std::string value(payload, fill), frame;
  for (;;) {  // the record's length prefix takes a few bytes: shrink the value by what is over
    frame.clear();
    EXPECT_OK(enc.Encode({Record{"k", value}}, &frame));
    const size_t got = frame.size() - kFrameHeaderSize;
    if (got <= payload) {
      EXPECT_EQ(got, payload);
      return frame;
    }
    value.resize(value.size() - (got - payload));
  }
}

// A frame whose payload is within 32 bytes of the cap is accepted and committed, though its
// block (frame header included) is then over the cap. Recovery must never refuse committed
// data (the shuffle's, other mappers' included) because of a limit that applies to new input:
// not at the next start, and not after the cap is lowered across a restart.
TEST_F(ServerTest, AFrameAtTheCapSurvivesRestartsAndALowerCap) {
  constexpr uint32_t kCap = 1 << 20;
  RestartServer(256ull << 20, 64, kCap);
  ASSERT_OK(Create("cap", 1, 3));
  const std::string big = FrameWithPayload(kCap - 8, 'x');
  ASSERT_GT(big.size(), kCap);  // the block that stores it is over the cap
  FrameDecoder dec;
  DecodedFrame decoded;
  ASSERT_OK(dec.Decode(big, &decoded));
  const size_t big_value = decoded[0].value.size();
  ASSERT_OK(PushFrames("cap", 0, {big}, 1));
  ASSERT_OK(PushFrames("cap", 1, {Frame(Rows(1, 0, 20))}, 20));
  const auto check = [&](const char* when) {
    grpc::Status st;
    const pb::ShuffleInfo info = Info("cap", &st);
    ASSERT_OK(st) << when;
    EXPECT_EQ(info.committed_mappers_size(), 2) << when;
    std::vector<std::string> got;
    ASSERT_OK(FetchAll("cap", 0, &got)) << when;
    EXPECT_EQ(got.size(), 21u) << when;
    std::vector<std::pair<std::string, std::string>> merged;
    ASSERT_OK(FetchKeyOrder("cap", &merged)) << when;
    ASSERT_EQ(merged.size(), 21u) << when;
    EXPECT_EQ(merged[0].first, "k") << when;  // sorts first
    EXPECT_TRUE(merged[0].second == std::string(big_value, 'x')) << when;
  };
  check("before a restart");
  RestartServer(256ull << 20, 64, kCap);
  check("after a restart");
  RestartServer(256ull << 20, 64, kCap / 16);  // the operator lowers the cap
  check("after a restart with a lower cap");
  // The lower cap applies to new input.
  EXPECT_THAT(PushFrames("cap", 2, {FrameWithPayload(kCap / 8, 'y')}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds the cap"));
}

}  // namespace
}  // namespace sluice
