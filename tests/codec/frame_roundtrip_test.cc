// Property tests: random batches round-trip byte-identically through every layout choice and
// compression, and AUTO picks the layout the batch's shape calls for.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>

#include "codec/bench_datasets.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/zstd_pool.h"
#include "tests/codec/test_records.h"

namespace sluice {
namespace {

using testing::Batch;
using testing::Gen;

void ExpectSameRecords(const DecodedFrame& got, const std::vector<Record>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].key, want[i].key) << "record " << i;
    ASSERT_EQ(got[i].value, want[i].value) << "record " << i;
  }
}

Layout EncodeDecode(const Batch& b, LayoutChoice choice, Compression c) {
  EncodeOptions opts;
  opts.layout = choice;
  opts.compression = c;
  FrameEncoder enc(opts);
  std::string frame;
  const auto records = b.Records();
  absl::Status st = enc.Encode(records, &frame);
  EXPECT_TRUE(st.ok()) << st;
  FrameDecoder dec;
  DecodedFrame out;
  st = dec.Decode(frame, &out);
  EXPECT_TRUE(st.ok()) << st;
  ExpectSameRecords(out, records);
  EXPECT_EQ(out.header().layout, enc.last_layout());
  return enc.last_layout();
}

class RoundTripTest : public ::testing::TestWithParam<std::tuple<LayoutChoice, Compression>> {};

TEST_P(RoundTripTest, ColumnarShapedBatches) {
  const auto [choice, compression] = GetParam();
  Gen g(100 + static_cast<int>(choice) * 7 + static_cast<int>(compression));
  for (int iter = 0; iter < 60; ++iter) {
    const Batch b = testing::ColumnarBatch(g, 1 + g.Below(300), g.Below(12));
    const Layout got = EncodeDecode(b, choice, compression);
    if (choice == LayoutChoice::kAuto || choice == LayoutChoice::kColumnar) {
      EXPECT_EQ(got, Layout::kColumnar);
    } else {
      EXPECT_EQ(got, static_cast<Layout>(choice));
    }
  }
}

TEST_P(RoundTripTest, ArbitraryMsgpackValues) {
  const auto [choice, compression] = GetParam();
  Gen g(200 + static_cast<int>(choice) * 7 + static_cast<int>(compression));
  for (int iter = 0; iter < 60; ++iter) {
    Batch b;
    const size_t n = 1 + g.Below(200);
    for (size_t i = 0; i < n; ++i) {
      std::string v;
      g.AnyValue(&v, 3);
      b.Add(g.Bytes(10), std::move(v));
    }
    const Layout got = EncodeDecode(b, choice, compression);
    if (choice == LayoutChoice::kOpaque) {
      EXPECT_EQ(got, Layout::kOpaque);
    } else {
      EXPECT_NE(got, Layout::kOpaque);
    }
  }
}

TEST(FrameRoundTripTest, OpaqueValuesUnderOpaqueAndAuto) {
  // (Explicit MSGPACK/COLUMNAR reject non-msgpack values: FrameEncoderTest below.)
  for (auto choice : {LayoutChoice::kOpaque, LayoutChoice::kAuto}) {
    for (auto compression : {Compression::kNone, Compression::kZstd}) {
      Gen g(300 + static_cast<int>(compression));
      for (int iter = 0; iter < 60; ++iter) {
        Batch b;
        const size_t n = g.Below(200);
        for (size_t i = 0; i < n; ++i) b.Add(g.Bytes(20), "\xc1" + g.Bytes(50));
        EXPECT_EQ(EncodeDecode(b, choice, compression), Layout::kOpaque);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllLayoutsAndCompressions, RoundTripTest,
    ::testing::Combine(::testing::Values(LayoutChoice::kOpaque, LayoutChoice::kMsgpack,
                                         LayoutChoice::kColumnar, LayoutChoice::kAuto),
                       ::testing::Values(Compression::kNone, Compression::kZstd)),
    [](const auto& info) {
      return std::string(LayoutChoiceName(std::get<0>(info.param))) + "_" +
             CompressionName(std::get<1>(info.param));
    });

// zstd contexts go back to a shared pool when an encoder or decoder ends, and the
// next one that takes a context encodes and decodes exactly as with a new one, whatever level
// and frames the context saw before (one given back twice, or still in use, would not); the
// pool keeps at most kMaxIdle of each kind.
TEST(FrameEncoderTest, PooledZstdContextsWorkAsNewOnes) {
  std::vector<Record> records;
  std::vector<std::string> keys, values;
  for (int i = 0; i < 2000; ++i) {
    keys.push_back("key-" + std::to_string(i % 97));
    values.push_back("value " + std::to_string(i * 7) + " of a compressible batch");
  }
  for (int i = 0; i < 2000; ++i) records.push_back(Record{keys[i], values[i]});
  auto encode = [&](int level) {
    EncodeOptions opts;
    opts.layout = LayoutChoice::kOpaque;
    opts.zstd_level = level;
    FrameEncoder enc(opts);
    std::string frame;
    EXPECT_TRUE(enc.Encode(records, &frame).ok());
    return frame;
  };
  const std::string first = encode(3);
  EXPECT_GE(zstd_pool::IdleCCtx(), 1u) << "an ended encoder's contexts are kept";
  EXPECT_NE(encode(19), first);  // another level, on a pooled context
  EXPECT_EQ(encode(3), first) << "a pooled context encoded differently";
  {
    FrameDecoder dec;
    DecodedFrame out;
    ASSERT_TRUE(dec.Decode(encode(19), &out).ok());
  }
  EXPECT_GE(zstd_pool::IdleDCtx(), 1u);
  FrameDecoder dec;  // on the pooled context
  DecodedFrame out;
  ASSERT_TRUE(dec.Decode(first, &out).ok());
  ExpectSameRecords(out, records);
  {
    std::vector<std::unique_ptr<FrameEncoder>> many;
    for (int i = 0; i < 20; ++i) many.push_back(std::make_unique<FrameEncoder>(EncodeOptions{}));
  }
  EXPECT_LE(zstd_pool::IdleCCtx(), zstd_pool::kMaxIdle);
}

TEST(FrameEncoderTest, EmptyBatchRoundTrips) {
  for (auto choice : {LayoutChoice::kOpaque, LayoutChoice::kMsgpack, LayoutChoice::kAuto}) {
    EXPECT_EQ(EncodeDecode(Batch{}, choice, Compression::kZstd),
              choice == LayoutChoice::kAuto ? Layout::kMsgpack : static_cast<Layout>(choice));
  }
}

TEST(FrameEncoderTest, ExplicitMsgpackRejectsNonMsgpackValuesNamingTheRecord) {
  Batch b;
  b.Add("k", "\x01");
  b.Add("k", "\xc1");
  EncodeOptions opts;
  opts.layout = LayoutChoice::kMsgpack;
  FrameEncoder enc(opts);
  std::string frame;
  absl::Status st = enc.Encode(b.Records(), &frame);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("record 1"), absl::string_view::npos) << st;
  EXPECT_TRUE(frame.empty());
}

TEST(FrameEncoderTest, SortByKeyIsStableAndFlagged) {
  Gen g(5);
  Batch b;
  for (int i = 0; i < 500; ++i)
    b.Add(std::string(1, static_cast<char>('a' + g.Below(5))), std::to_string(i));
  EncodeOptions opts;
  opts.sort_by_key = true;
  opts.layout = LayoutChoice::kOpaque;
  FrameEncoder enc(opts);
  std::string frame;
  ASSERT_TRUE(enc.Encode(b.Records(), &frame).ok());
  FrameDecoder dec;
  DecodedFrame out;
  ASSERT_TRUE(dec.Decode(frame, &out).ok());
  EXPECT_TRUE(out.header().sorted_by_key());
  auto want = b.Records();
  std::stable_sort(want.begin(), want.end(),
                   [](const Record& x, const Record& y) { return KeyLess(x.key, y.key); });
  ExpectSameRecords(out, want);
}

TEST(FrameEncoderTest, AlreadySortedBatchIsFlaggedUnsortedIsNot) {
  Batch sorted, unsorted;
  sorted.Add("a", "1");
  sorted.Add("ab", "2");
  sorted.Add("b", "3");
  unsorted.Add("b", "1");
  unsorted.Add("a", "2");
  EncodeOptions opts;
  opts.layout = LayoutChoice::kOpaque;
  FrameEncoder enc(opts);
  FrameDecoder dec;
  DecodedFrame out;
  std::string f1, f2;
  ASSERT_TRUE(enc.Encode(sorted.Records(), &f1).ok());
  ASSERT_TRUE(enc.Encode(unsorted.Records(), &f2).ok());
  ASSERT_TRUE(dec.Decode(f1, &out).ok());
  EXPECT_TRUE(out.header().sorted_by_key());
  ASSERT_TRUE(dec.Decode(f2, &out).ok());
  EXPECT_FALSE(out.header().sorted_by_key());
}

TEST(FrameEncoderTest, KeyOrderIsUnsignedBytewiseShorterFirst) {
  EXPECT_LT(CompareKeys("a", "ab"), 0);
  EXPECT_LT(CompareKeys("", "a"), 0);
  EXPECT_LT(CompareKeys(std::string("\x01", 1), std::string("\xff", 1)), 0);  // unsigned
  EXPECT_EQ(CompareKeys("abc", "abc"), 0);
  EXPECT_GT(CompareKeys("b", "abc"), 0);
}

TEST(FrameEncoderTest, OversizedBatchIsRejectedBeforeEncoding) {
  EncodeOptions opts;
  opts.limits.max_uncompressed_bytes = 1000;
  FrameEncoder enc(opts);
  Batch b;
  b.Add("k", std::string(2000, 'x'));
  std::string frame;
  absl::Status st = enc.Encode(b.Records(), &frame);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("exceeds the frame cap"), absl::string_view::npos) << st;
}

TEST(FrameEncoderTest, IncompressiblePayloadIsStoredUncompressed) {
  Gen g(9);
  Batch b;
  for (int i = 0; i < 50; ++i) b.Add(g.Bytes(8), "\xc1" + std::string(g.Bytes(200)));
  EncodeOptions opts;
  opts.layout = LayoutChoice::kOpaque;
  FrameEncoder enc(opts);
  std::string frame;
  ASSERT_TRUE(enc.Encode(b.Records(), &frame).ok());
  FrameDecoder dec;
  DecodedFrame out;
  ASSERT_TRUE(dec.Decode(frame, &out).ok());
  EXPECT_EQ(out.header().compression, Compression::kNone);
  ExpectSameRecords(out, b.Records());
}

TEST(FrameEncoderTest, EncodeAppendsSoFramesCanBeConcatenated) {
  Batch b1, b2;
  b1.Add("a", "\x01");
  b2.Add("b", "\x02");
  FrameEncoder enc;
  std::string both;
  ASSERT_TRUE(enc.Encode(b1.Records(), &both).ok());
  const size_t first = both.size();
  ASSERT_TRUE(enc.Encode(b2.Records(), &both).ok());
  auto span = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(both.data()), both.size());
  auto h = ParseFrameHeader(span);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->frame_size(), first);
  FrameDecoder dec;
  DecodedFrame out;
  ASSERT_TRUE(dec.Decode(span.subspan(first), &out).ok());
  EXPECT_EQ(out[0].key, "b");
}

TEST(FrameEncoderTest, BenchmarkDatasetsRoundTripAndAutoPicksColumnar) {
  for (const auto& d : bench::MakeSeedDatasets()) {
    const auto records = d.Records();
    for (auto choice : {LayoutChoice::kMsgpack, LayoutChoice::kColumnar, LayoutChoice::kAuto}) {
      EncodeOptions opts;
      opts.layout = choice;
      FrameEncoder enc(opts);
      std::string frame;
      ASSERT_TRUE(enc.Encode(records, &frame).ok()) << d.name;
      FrameDecoder dec;
      DecodedFrame out;
      ASSERT_TRUE(dec.Decode(frame, &out).ok()) << d.name;
      ExpectSameRecords(out, records);
      if (choice != LayoutChoice::kMsgpack) {
        EXPECT_EQ(enc.last_layout(), Layout::kColumnar)
            << d.name << ": " << enc.last_fallback_reason();
        // Sizes are deterministic: guard the column encodings against silent regressions
        // (figures of docs/benchmarks.md, plus 3%).
        const std::map<std::string, size_t> kMaxBytes = {{"ints3", 40553},
                                                         {"int_float_str", 49222},
                                                         {"wide10", 124487},
                                                         {"str3", 19437},
                                                         {"items", 659500}};
        EXPECT_LE(frame.size(), kMaxBytes.at(d.name)) << d.name;
      }
    }
  }
}

TEST(KeyOrderTest, StableSortByKeyMatchesStdStableSort) {
  // Keys of 0..20 bytes over a tiny alphabet with zero bytes: many share 8-byte prefixes,
  // many are equal, many are prefixes of others (zero-padded prefixes collide there).
  std::mt19937_64 rng(5);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::string> keys, values;
    const size_t n = 1 + rng() % (round % 2 ? 300 : 3000);  // both sort paths
    for (size_t i = 0; i < n; ++i) {
      std::string k(rng() % 21, '\0');
      for (char& c : k) c = "\0\1a\xff"[rng() % 4];
      keys.push_back(k);
      values.push_back(std::to_string(i));
    }
    std::vector<Record> records, expected;
    for (size_t i = 0; i < n; ++i) records.push_back(Record{keys[i], values[i]});
    expected = records;
    std::stable_sort(expected.begin(), expected.end(),
                     [](const Record& a, const Record& b) { return KeyLess(a.key, b.key); });
    std::vector<Record> scratch;
    StableSortByKey(absl::MakeSpan(records), &scratch);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(records[i].key, expected[i].key) << round << " " << i;
      ASSERT_EQ(records[i].value, expected[i].value) << round << " " << i;  // stability
    }
    for (size_t i = 0; i + 1 < n; ++i) {
      const int c = CompareKeysWithPrefix(records[i].key, KeyPrefix(records[i].key),
                                          records[i + 1].key, KeyPrefix(records[i + 1].key));
      ASSERT_EQ(c < 0, CompareKeys(records[i].key, records[i + 1].key) < 0);
      ASSERT_EQ(c == 0, records[i].key == records[i + 1].key);
    }
    for (int t = 0; t < 200; ++t) {  // and any pair, either way round
      const std::string& a = keys[rng() % n];
      const std::string& b = keys[rng() % n];
      const int want = CompareKeys(a, b);
      const int got = CompareKeysWithPrefix(a, KeyPrefix(a), b, KeyPrefix(b));
      ASSERT_EQ((want > 0) - (want < 0), (got > 0) - (got < 0));
    }
  }
}

TEST(FrameEncoderTest, ZstdIsSkippedForAWhileWhenItDoesNotPay) {
  std::mt19937_64 rng(9);
  auto batch = [&](bool compressible) {
    testing::Batch b;
    for (int i = 0; i < 50; ++i) {
      std::string v(200, 'x');
      if (!compressible) {
        for (char& c : v) c = static_cast<char>(rng());
      }
      b.Add("k" + std::to_string(i), v);
    }
    return b;
  };
  for (double min_saving : {0.05, 0.0}) {
    EncodeOptions opts;
    opts.layout = LayoutChoice::kOpaque;
    opts.min_zstd_saving = min_saving;
    opts.zstd_skip_frames = 7;
    FrameEncoder enc(opts);
    FrameDecoder dec;
    DecodedFrame out;
    std::vector<Compression> got;
    std::vector<testing::Batch> batches = {batch(false)};
    for (int i = 0; i < 8; ++i) batches.push_back(batch(true));
    for (const auto& b : batches) {
      std::string frame;
      ASSERT_TRUE(enc.Encode(b.Records(), &frame).ok());
      ASSERT_TRUE(dec.Decode(frame, &out).ok());
      ExpectSameRecords(out, b.Records());
      got.push_back(out.header().compression);
    }
    EXPECT_EQ(got[0], Compression::kNone);  // random bytes: zstd would not shrink them
    if (min_saving > 0) {
      // The next 7 frames are not even tried, compressible or not; the 8th is compressed.
      for (int i = 1; i <= 7; ++i) EXPECT_EQ(got[i], Compression::kNone) << i;
      EXPECT_EQ(got[8], Compression::kZstd);
    } else {
      for (int i = 1; i <= 8; ++i) EXPECT_EQ(got[i], Compression::kZstd) << i;
    }
  }
}

TEST(FrameDecoderTest, ScratchCanBeTrimmedAfterALargeFrame) {
  // A 4 MB COLUMNAR frame leaves its decompressed payload in the decoder's scratch; trimming
  // lets it go, and the decoder still decodes afterwards.
  testing::Batch big;
  for (int i = 0; i < 20000; ++i) {
    std::string v;
    testing::Gen::MapHeader(&v, 1);
    testing::Gen::Str(&v, "s");
    testing::Gen::Str(&v, std::string(200, static_cast<char>('a' + i % 26)) + std::to_string(i));
    big.Add("k" + std::to_string(i), v);
  }
  FrameEncoder enc;
  std::string frame;
  ASSERT_TRUE(enc.Encode(big.Records(), &frame).ok());
  FrameDecoder dec;
  DecodedFrame out;
  ASSERT_TRUE(dec.Decode(frame, &out).ok());
  EXPECT_GT(dec.scratch_bytes(), 2u << 20);
  dec.TrimScratch(1u << 20);
  EXPECT_LE(dec.scratch_bytes(), 1u << 20);
  ASSERT_TRUE(dec.Decode(frame, &out).ok());
  ExpectSameRecords(out, big.Records());
}

}  // namespace
}  // namespace sluice
