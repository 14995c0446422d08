// COLUMNAR bit packing: which columns the encoder packs (hex strings, small alphabets, small
// ranges, few values, uniform ints) and which it leaves plain or gives up the dictionary for,
// every packed shape round-tripped, and packed columns validated by the decoder.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "codec/columnar.h"
#include "codec/columnar_internal.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "tests/codec/columnar_fixture.h"
#include "tests/codec/test_records.h"

namespace sluice {
namespace {

using columnar_test::Auto;
using columnar_test::ColumnarSize;
using columnar_test::F;
using columnar_test::I;
using columnar_test::Map;
using columnar_test::PayloadUnderTest;
using columnar_test::RandomText;
using columnar_test::S;
using testing::Batch;

TEST(ColumnarTest, MostlyDistinctStringsStayPlain) {
  Batch b;
  for (int i = 0; i < 3000; ++i) b.Add("k", Map({{"s", S("unique-" + std::to_string(i))}}));
  ColumnarSize(b);
}

TEST(ColumnarTest, HexStringsArePackedAndEverythingElseIsNot) {
  Batch hex, odd, upper, mixed;
  for (int i = 0; i < 200; ++i) {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", 0x9e3779b97f4a7c15ULL * (i + 1));
    hex.Add("k", Map({{"id", S(buf)}}));
    odd.Add("k", Map({{"id", S(std::string(buf) + (i == 150 ? "a" : ""))}}));
    std::string up = buf;
    if (i == 7) up[3] = 'F';
    upper.Add("k", Map({{"id", S(up)}}));
    mixed.Add("k", Map({{"id", S(i == 199 ? "not hex!" : buf)}}));
  }
  const size_t packed = ColumnarSize(hex);
  EXPECT_LT(packed, 200u * 11);  // 8 bytes per value, a length byte, the key
  // One odd length: not hex any more, but still 16 symbols used evenly: 4-bit codes.
  const size_t odd_size = ColumnarSize(odd);
  EXPECT_GT(odd_size, packed);
  EXPECT_LT(odd_size, packed + 40u);
  // A 17th symbol used once, or a few odd words: codes would need 5 bits, far above the
  // ~4 bits of entropy, so these stay plain.
  EXPECT_GT(ColumnarSize(upper), packed + 200u * 7);
  EXPECT_GT(ColumnarSize(mixed), packed + 200u * 7);
}

TEST(ColumnarTest, LongHexStringsTakeEveryDigitAndRefuseAnyOtherByte) {
  // Digits are converted 16 at a time where the CPU can: every digit and letter in every
  // position of a block, and one byte just outside the digits and letters (or uppercase) in
  // any position of a 40-digit value, which must keep the column out of hex.
  const std::string digits = "0123456789abcdef";
  // 64 distinct values of 40 digits (so no dictionary), the same for every batch.
  std::vector<std::string> values;
  uint64_t st = 5;
  for (int i = 0; i < 64; ++i) {
    std::string v(40, '0');
    for (size_t k = 0; k < v.size(); ++k) {
      st = st * 6364136223846793005ULL + 1442695040888963407ULL;
      v[k] = digits[st >> 60];
    }
    if (i == 0) v.replace(0, 16, digits);  // every digit in every lane of the first block
    if (i == 1) v.replace(24, 16, std::string(digits.rbegin(), digits.rend()));
    values.push_back(v);
  }
  Batch all;
  for (const std::string& v : values) all.Add("k", Map({{"id", S(v)}}));
  EXPECT_LT(ColumnarSize(all), 64u * 22 + 40);  // 20 bytes a value, a length byte
  for (const char wrong : {'/', ':', '`', 'g', 'A', 'F', '\xff', '\0'}) {
    for (size_t pos = 0; pos < 40; ++pos) {
      Batch b;
      for (int i = 0; i < 64; ++i) {
        std::string v = values[i];
        if (i == 9) v[pos] = wrong;
        b.Add("k", Map({{"id", S(v)}}));
      }
      EXPECT_GT(ColumnarSize(b), 64u * 22 + 40) << wrong << " at " << pos;  // round trip checked
    }
  }
}

TEST(ColumnarTest, ValuesMadeToCollideGiveUpTheDictionary) {
  // 200 eight-character values whose dictionary hashes share their top 14 bits (the table
  // indexes by the top 10 to 14 here), each ten times: a lookup would probe every entry
  // before them, so the encoder gives up the dictionary and stores the column without one.
  // The same shape with ordinary values keeps it.
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::vector<std::string> colliding, ordinary;
  uint64_t st = 99;
  while (colliding.size() < 200) {
    std::string v = RandomText(&st, alnum, 8);
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    const columnar_internal::ShortKey k = columnar_internal::KeyShort(p, 8);
    if (columnar_internal::DictHash(k.a, k.b, 8) >> 50 == 0) {
      colliding.push_back(v);
    } else if (ordinary.size() < 200) {
      ordinary.push_back(v);
    }
  }
  Batch attack, honest;
  for (int i = 0; i < 2000; ++i) {
    attack.Add("k", Map({{"s", S(colliding[i % 200])}}));
    honest.Add("k", Map({{"s", S(ordinary[i % 200])}}));
  }
  EXPECT_LT(ColumnarSize(honest), 2000u + 200u * 9 + 500);  // a code a record and 200 entries
  EXPECT_GT(ColumnarSize(attack), 2000u * 5);               // 8 characters at 6 bits or more
}

// Strings of random characters from a small alphabet (ids, tokens, base62 text) are stored as
// b-bit codes; strings an entropy coder would shrink further stay plain for zstd.
TEST(ColumnarTest, SmallAlphabetStringsAreBitPacked) {
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  uint64_t st = 1;
  Batch base62, short_values, base32, lower, digits, words;
  size_t chars = 0;
  for (int i = 0; i < 500; ++i) {
    const std::string v = RandomText(&st, alnum, 100 + i % 37);  // lengths not multiples of 8
    chars += v.size();
    base62.Add("k", Map({{"p", S(v)}}));
    short_values.Add("k", Map({{"p", S(RandomText(&st, alnum, i % 5))}}));  // some empty
    base32.Add("k", Map({{"p", S(RandomText(&st, "abcdefghijklmnopqrstuvwxyz234567", 40))}}));
    lower.Add("k", Map({{"p", S(RandomText(&st, "abcdefghijklmnopqrstuvwxyz", 40))}}));
    digits.Add("k", Map({{"p", S(RandomText(&st, "0123456789", 41))}}));  // odd: not hex
    words.Add(
        "k", Map({{"p", S(i % 2 ? "the quick brown fox jumps over the lazy dog " + std::to_string(i)
                                : "a lazy dog sleeps " + std::to_string(i * 7))}}));
  }
  const size_t packed62 = ColumnarSize(base62);
  EXPECT_LT(packed62, chars * 6 / 8 + 500u * 4);     // 6 bits a character, plus lengths
  EXPECT_LT(ColumnarSize(base32), 500u * (25 + 4));  // 5 bits
  ColumnarSize(short_values);                        // round trip (checked inside)
  // 26 symbols would take 5 bits for 4.7 of entropy, 10 symbols 4 bits for 3.3: left plain,
  // for zstd's entropy coder.
  EXPECT_GT(ColumnarSize(lower), 500u * 40);
  EXPECT_GT(ColumnarSize(digits), 500u * 41);
  ColumnarSize(words);
}

TEST(ColumnarTest, PackingHandlesEveryAlphabetShape) {
  // 6-bit alphabets take one of three packing paths: bytes grouped by high nibble (alnum),
  // a few byte ranges (base64 and base64url: '+' and '/' leave a gap in their block), or any
  // bytes at all (64 scattered ones). All must pack to 6 bits and round-trip.
  std::string scattered;
  for (int i = 0; i < 64; ++i) scattered.push_back(static_cast<char>(0x21 + 3 * i));
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  for (const std::string& alphabet : {alnum, alnum + "+/", alnum + "-_", scattered}) {
    uint64_t st = 11;
    Batch b;
    size_t chars = 0;
    for (int i = 0; i < 300; ++i) {
      const std::string v = RandomText(&st, alphabet, 7 + i % 90);
      chars += v.size();
      b.Add("k", Map({{"p", S(v)}}));
    }
    EXPECT_LT(ColumnarSize(b), chars * 6 / 8 + 300u * 4) << alphabet;
  }
}

TEST(ColumnarTest, LongDistinctValuesSkipTheDictionaryButRepeatsStillCompress) {
  // 300 distinct 100-character values cycling: the first 64 are all distinct and long, so no
  // dictionary is built, and zstd's match finder still stores each repeat as a reference.
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  uint64_t st = 17;
  std::vector<std::string> pool;
  for (int i = 0; i < 300; ++i) pool.push_back(RandomText(&st, alnum, 100));
  Batch b;
  for (int i = 0; i < 2000; ++i) b.Add(I(i % 50), Map({{"blob", S(pool[i % 300])}}));
  FrameEncoder enc(Auto());  // AUTO, zstd 3
  std::string frame;
  ASSERT_TRUE(enc.Encode(b.Records(), &frame).ok());
  EXPECT_LT(frame.size(), 300u * 100 * 6 / 8 + 2000u * 6);  // ~ the 300 values once, packed
  FrameDecoder dec;
  DecodedFrame out;
  ASSERT_TRUE(dec.Decode(frame, &out).ok());
  ASSERT_EQ(out.size(), b.size());
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(out[i].value, b.values[i]);
}

TEST(ColumnarTest, PackingTakesItsAlphabetFromTheWholeColumn) {
  // The first 16 KiB lack a byte that appears later: the alphabet is rebuilt from every value.
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  uint64_t st = 7;
  Batch b;
  size_t chars = 0;
  for (int i = 0; i < 400; ++i) {
    std::string v = RandomText(&st, alnum, 64);
    if (i == 399) v[63] = '-';
    chars += v.size();
    b.Add("k", Map({{"p", S(v)}}));
  }
  EXPECT_LT(ColumnarSize(b), chars * 6 / 8 + 400u * 3);
}

TEST(ColumnarTest, PackedColumnsAreValidated) {
  // 62 symbols in 6-bit codes; the alphabet is padded to 64 bytes so every code means a byte.
  // Values of 61 characters end in 2 padding bits, which must be zero. The column's codes are
  // the payload's last bytes; its alphabet starts 64 bytes before its lengths.
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  uint64_t st = 3;
  Batch b;
  for (int i = 0; i < 100; ++i) b.Add("k", Map({{"p", S(RandomText(&st, alnum, 61))}}));
  PayloadUnderTest t(b);
  const ByteBuffer& payload = t.payload;
  ASSERT_TRUE(t.Decode(payload.data(), payload.size(), 100).ok());
  // Padding bits set in the last value.
  ByteBuffer bad;
  bad.Append(payload.data(), payload.size());
  bad.data()[bad.size() - 1] |= 0xc0;
  absl::Status err = t.Decode(bad.data(), bad.size(), 100);
  EXPECT_FALSE(err.ok());
  EXPECT_NE(err.message().find("padding"), std::string::npos) << err;
  // An alphabet out of order: find it (64 increasing bytes after the bits byte 6).
  const size_t packed_bytes = 100 * 46;
  const size_t lens_bytes = 100 + 2;  // 100 one-byte lengths, total 6,100 as a 2-byte varint
  const size_t alphabet = payload.size() - packed_bytes - lens_bytes - 64;
  ASSERT_EQ(payload.data()[alphabet - 1], 6);
  ASSERT_EQ(payload.data()[alphabet - 2], 3);  // encoding byte: packed
  bad.Clear();
  bad.Append(payload.data(), payload.size());
  std::swap(bad.data()[alphabet + 5], bad.data()[alphabet + 6]);
  err = t.Decode(bad.data(), bad.size(), 100);
  EXPECT_FALSE(err.ok());
  EXPECT_NE(err.message().find("increasing order"), std::string::npos) << err;
}

TEST(ColumnarTest, SmallRangesAndFewValuesAreBitPacked) {
  // Ints within 32 of their minimum, bools, and codes of dictionaries up to 32 entries take
  // 1 to 5 bits a value; every count around a byte boundary, every base (wrapping included).
  // ColumnarSize checks each round trip byte for byte.
  // Bits for the numbers 0..k-1.
  const auto bits_for = [](uint64_t k) { return k <= 1 ? 1 : 64 - __builtin_clzll(k - 1); };
  uint64_t st = 11;
  auto next = [&st]() {
    st = st * 6364136223846793005ULL + 1442695040888963407ULL;
    return st >> 33;
  };
  for (const size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{1001}}) {
    for (const int64_t base :
         {int64_t{0}, int64_t{-7}, INT64_MIN, INT64_MAX - 31, int64_t{1'000'000'000'000}}) {
      for (const uint64_t range : {1, 2, 3, 5, 8, 17, 31, 32}) {
        Batch b;
        for (size_t i = 0; i < n; ++i) {
          const auto v = static_cast<int64_t>(static_cast<uint64_t>(base) + next() % range);
          b.Add("k", Map({{"v", I(v)}}));
        }
        EXPECT_LT(ColumnarSize(b), n * bits_for(range) / 8 + 64)
            << n << " " << base << " " << range;
      }
    }
    Batch bools;
    for (size_t i = 0; i < n; ++i) bools.Add("k", Map({{"b", next() % 3 == 0 ? "\xc3" : "\xc2"}}));
    EXPECT_LT(ColumnarSize(bools), n / 8 + 64) << n;
    for (const size_t d : {1, 2, 3, 5, 16, 17, 32}) {
      Batch codes;
      for (size_t i = 0; i < n; ++i) {
        codes.Add("k", Map({{"c", S("value-" + std::to_string(next() % d))}}));
      }
      EXPECT_LT(ColumnarSize(codes), n * bits_for(d) / 8 + d * 9 + 64) << n << " " << d;
    }
  }
  // 33 entries: one byte a code again (zstd's entropy coder gets them).
  Batch wide;
  for (int i = 0; i < 1001; ++i) wide.Add("k", Map({{"c", S("value-" + std::to_string(i % 33))}}));
  EXPECT_GT(ColumnarSize(wide), 1001u);
  // Decimal floats with a small range of mantissas are packed too.
  Batch ratings;
  for (int i = 0; i < 1001; ++i)
    ratings.Add("k", Map({{"r", F(static_cast<double>(15 + next() % 20) / 10)}}));
  EXPECT_LT(ColumnarSize(ratings), 1001u * 5 / 8 + 64);  // m in 15..34: 5 bits
}

TEST(ColumnarTest, UniformIntsArePackedAndSkewedOnesAreNot) {
  // Values spread evenly over their range (random ids) take exactly the bits of the range;
  // skewed ones (small counts with a long tail) stay varints, which zstd codes better. Every
  // base, wrapping included, and an outlier the sample may miss; round trips checked.
  uint64_t st = 17;
  auto next = [&st]() {
    st = st * 6364136223846793005ULL + 1442695040888963407ULL;
    return st >> 11;
  };
  for (const int64_t base : {int64_t{0}, int64_t{-500'000}, INT64_MIN, INT64_MAX - (1 << 20),
                             int64_t{1'700'000'000'000}}) {
    Batch uniform, outlier;
    for (int i = 0; i < 1000; ++i) {
      const auto v = static_cast<int64_t>(static_cast<uint64_t>(base) + next() % (1u << 20));
      uniform.Add("k", Map({{"id", I(v)}}));
      outlier.Add("k", Map({{"id", I(i == 777 ? static_cast<int64_t>(static_cast<uint64_t>(base) +
                                                                     (uint64_t{1} << 40))
                                              : v)}}));
    }
    EXPECT_LT(ColumnarSize(uniform), 1000u * 20 / 8 + 64) << base;  // 20 bits a value
    ColumnarSize(outlier);
  }
  Batch skewed;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t r = next();
    skewed.Add("k", Map({{"n", I(static_cast<int64_t>(r % 100 == 0 ? r % 5000 : r % 60))}}));
  }
  // Mostly one-byte varints: packing at 13 bits would be larger.
  EXPECT_LT(ColumnarSize(skewed), 1000u * 12 / 10 + 64);
}

}  // namespace
}  // namespace sluice
