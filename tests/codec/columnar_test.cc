// COLUMNAR eligibility: what the layout holds exactly, and each reason it falls back.
#include <gtest/gtest.h>

#include <string>

#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "tests/codec/test_records.h"

namespace sluice {
namespace {

using testing::Batch;
using testing::Gen;

std::string Map(std::initializer_list<std::pair<std::string, std::string>> fields) {
  std::string v;
  Gen::MapHeader(&v, static_cast<uint32_t>(fields.size()));
  for (const auto& [k, val] : fields) {
    Gen::Str(&v, k);
    v += val;
  }
  return v;
}
std::string I(int64_t x) {
  std::string o;
  Gen::Int(&o, x);
  return o;
}
std::string S(const std::string& s) {
  std::string o;
  Gen::Str(&o, s);
  return o;
}

// Encodes with AUTO, checks the round trip, returns (layout, fallback reason).
std::pair<Layout, std::string> Auto(const Batch& b) {
  FrameEncoder enc;
  std::string frame;
  EXPECT_TRUE(enc.Encode(b.Records(), &frame).ok());
  FrameDecoder dec;
  DecodedFrame out;
  EXPECT_TRUE(dec.Decode(frame, &out).ok());
  EXPECT_EQ(out.size(), b.size());
  for (size_t i = 0; i < b.size() && i < out.size(); ++i) {
    EXPECT_EQ(out[i].key, b.keys[i]);
    EXPECT_EQ(out[i].value, b.values[i]);
  }
  return {enc.last_layout(), enc.last_fallback_reason()};
}

TEST(ColumnarTest, UniformMapsAreColumnar) {
  Batch b;
  for (int i = 0; i < 100; ++i) {
    b.Add(I(i % 7), Map({{"id", I(i)}, {"name", S("n" + std::to_string(i % 3))}}));
  }
  EXPECT_EQ(Auto(b).first, Layout::kColumnar);
}

TEST(ColumnarTest, HeterogeneousMapsFallBackToMsgpack) {
  Batch b;
  b.Add("k", Map({{"a", I(1)}, {"b", I(2)}}));
  b.Add("k", Map({{"b", I(2)}, {"a", I(1)}}));  // same fields, other order
  auto [layout, why] = Auto(b);
  EXPECT_EQ(layout, Layout::kMsgpack);
  EXPECT_NE(why.find("record 1"), std::string::npos) << why;
  EXPECT_NE(why.find("shape"), std::string::npos) << why;
}

TEST(ColumnarTest, MixedTypesInAColumnFallBackNotCoerced) {
  Batch b;
  b.Add("k", Map({{"x", I(1)}}));
  std::string f;
  Gen::F64(&f, 0x3ff8000000000000ull);  // 1.5
  b.Add("k", Map({{"x", f}}));
  auto [layout, why] = Auto(b);
  EXPECT_EQ(layout, Layout::kMsgpack);
  EXPECT_NE(why.find("changes type from int to float64"), std::string::npos) << why;
}

TEST(ColumnarTest, NestedValuesFallBack) {
  Batch b;
  b.Add("k", Map({{"tags", std::string("\x92\x01\x02", 3)}}));
  auto [layout, why] = Auto(b);
  EXPECT_EQ(layout, Layout::kMsgpack);
  EXPECT_NE(why.find("nested"), std::string::npos) << why;
}

TEST(ColumnarTest, NonCanonicalEncodingsFallBackAndKeepTheirBytes) {
  Batch b;
  b.Add("k", Map({{"x", I(1)}}));
  b.Add("k", Map({{"x", std::string("\xcc\x05", 2)}}));  // 5 as uint8: valid, not canonical
  auto [layout, why] = Auto(b);
  EXPECT_EQ(layout, Layout::kMsgpack);
  EXPECT_NE(why.find("canonical"), std::string::npos) << why;
}

TEST(ColumnarTest, Uint64AboveInt64FallsBack) {
  Batch b;
  b.Add("k", Map({{"x", std::string("\xcf\xff\xff\xff\xff\xff\xff\xff\xff", 9)}}));
  EXPECT_EQ(Auto(b).first, Layout::kMsgpack);
}

TEST(ColumnarTest, ExtAndFrozensetLikeValuesFallBack) {
  // msgspec writes a frozenset as an array; an ext type stands for custom objects. Neither is
  // a scalar, so neither is coerced into a column.
  Batch b;
  b.Add("k", Map({{"s", std::string("\xd6\x01xxxx", 6)}}));
  EXPECT_EQ(Auto(b).first, Layout::kMsgpack);
}

TEST(ColumnarTest, NonMapValuesFallBack) {
  Batch b;
  b.Add("k", I(5));
  EXPECT_EQ(Auto(b).first, Layout::kMsgpack);
}

TEST(ColumnarTest, TrailingBytesAfterTheMapFallBackToOpaque) {
  Batch b;
  b.Add("k", Map({{"a", I(1)}}) + "\x01");
  auto [layout, why] = Auto(b);
  EXPECT_EQ(layout, Layout::kOpaque);  // not one msgpack object either
}

TEST(ColumnarTest, EmptyMapsAndAllNilColumns) {
  Batch b;
  for (int i = 0; i < 10; ++i) b.Add("", std::string("\x80", 1));
  EXPECT_EQ(Auto(b).first, Layout::kColumnar);
  Batch c;
  for (int i = 0; i < 10; ++i) c.Add("", Map({{"n", std::string("\xc0", 1)}}));
  EXPECT_EQ(Auto(c).first, Layout::kColumnar);
}

TEST(ColumnarTest, KeysThatAreNotOneScalarAreStoredRaw) {
  Batch b;
  b.Add(I(1), Map({{"a", I(1)}}));
  b.Add("raw key bytes", Map({{"a", I(2)}}));
  b.Add("", Map({{"a", I(3)}}));
  EXPECT_EQ(Auto(b).first, Layout::kColumnar);
}

TEST(ColumnarTest, WideAndLongNamesAndBigStrings) {
  Batch b;
  std::string v;
  Gen::MapHeader(&v, 40);
  for (int j = 0; j < 40; ++j) {
    Gen::Str(&v,
             std::string(j == 7 ? 300 : 3, static_cast<char>('a' + j % 26)) + std::to_string(j));
    Gen::Str(&v, std::string(j == 3 ? 70000 : 5, 'v'));
  }
  for (int i = 0; i < 3; ++i) b.Add(std::string(40, 'k'), v);
  EXPECT_EQ(Auto(b).first, Layout::kColumnar);
}

TEST(ColumnarTest, DeltaAndPlainIntColumnsRoundTripExtremes) {
  Batch b;
  const int64_t xs[] = {INT64_MIN, INT64_MAX, 0, -1, INT64_MAX, INT64_MIN, 5};
  for (int64_t x : xs) b.Add(I(x), Map({{"v", I(x)}, {"seq", I(1000000 + x % 3)}}));
  EXPECT_EQ(Auto(b).first, Layout::kColumnar);
}

}  // namespace
}  // namespace sluice
