#include "codec/varint.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace sluice {
namespace {

TEST(VarintTest, RoundTripsBoundaries) {
  std::vector<uint64_t> values = {0,          1,         127, 128, 16383, 16384, (1ull << 35) - 1,
                                  1ull << 35, UINT64_MAX};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) values.push_back(rng() >> (rng() % 64));
  for (uint64_t v : values) {
    uint8_t buf[kMaxVarintBytes];
    uint8_t* end = PutVarint(buf, v);
    ASSERT_EQ(static_cast<size_t>(end - buf), VarintLength(v)) << v;
    const uint8_t* p = buf;
    uint64_t out = 0;
    ASSERT_TRUE(GetVarint(&p, end, &out));
    EXPECT_EQ(out, v);
    EXPECT_EQ(p, end);
    // Every truncation fails.
    for (const uint8_t* cut = buf; cut < end; ++cut) {
      const uint8_t* q = buf;
      EXPECT_FALSE(GetVarint(&q, cut, &out)) << v;
    }
  }
}

TEST(VarintTest, RejectsOverlongAndOverflow) {
  const uint8_t overlong[] = {0x80, 0x00};
  const uint8_t* p = overlong;
  uint64_t v;
  EXPECT_FALSE(GetVarint(&p, overlong + 2, &v));
  const uint8_t too_big[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02};
  p = too_big;
  EXPECT_FALSE(GetVarint(&p, too_big + 10, &v));
  const uint8_t eleven[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
  p = eleven;
  EXPECT_FALSE(GetVarint(&p, eleven + 11, &v));
}

TEST(VarintTest, ZigZagRoundTrips) {
  for (int64_t v : {int64_t{0}, int64_t{-1}, int64_t{1}, INT64_MIN, INT64_MAX, int64_t{-64}}) {
    EXPECT_EQ(UnZigZag(ZigZag(v)), v);
  }
  EXPECT_EQ(ZigZag(-1), 1u);
  EXPECT_EQ(ZigZag(1), 2u);
}

}  // namespace
}  // namespace sluice
