// COLUMNAR eligibility: what the layout holds exactly, and each reason it falls back. And the
// encoder's shapes: integer sequences, dictionaries, str columns between the fast loop and the
// general one, decimal floats, keys copied from a field. (Bit packing:
// columnar_packing_test.cc; the decoder's checks and chunks: columnar_decoder_test.cc.)
#include "codec/columnar.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "codec/columnar_internal.h"
#include "codec/frame_encoder.h"
#include "codec/frame_format.h"
#include "codec/varint.h"
#include "tests/codec/columnar_fixture.h"
#include "tests/codec/test_records.h"

namespace sluice {
namespace {

using columnar_test::Auto;
using columnar_test::ColumnarRoundTrip;
using columnar_test::ColumnarSize;
using columnar_test::F;
using columnar_test::I;
using columnar_test::Map;
using columnar_test::PayloadUnderTest;
using columnar_test::S;
using testing::Batch;
using testing::Gen;

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

TEST(ColumnarTest, IntegerSequencesAreStoredAsFirstAndStep) {
  // Row ids and sequence numbers cost two varints whatever the row count; wrapping steps and
  // constant columns included. ColumnarSize checks every round trip byte for byte.
  struct Seq {
    int64_t first;
    int64_t step;
  };
  for (const Seq q : {Seq{0, 1}, Seq{1'700'000'000, 7}, Seq{100, -3}, Seq{42, 0},
                      Seq{INT64_MAX - 3, 1}, Seq{INT64_MIN, INT64_MAX}, Seq{-5, -1}}) {
    Batch b;
    uint64_t v = static_cast<uint64_t>(q.first);
    for (int i = 0; i < 3000; ++i) {
      b.Add("k", Map({{"id", I(static_cast<int64_t>(v))}}));
      v += static_cast<uint64_t>(q.step);
    }
    // The keys ("k", the int 107 each time) are a sequence too: the whole frame is a header,
    // the field name and four varints.
    EXPECT_LT(ColumnarSize(b), 100u) << q.first << " step " << q.step;
  }
  // One value off the sequence, anywhere: no longer a sequence (stored value by value, or as
  // steps of a few bits when the two odd steps are small), still exact.
  for (int off : {0, 1, 1500, 2999}) {
    Batch b;
    for (int i = 0; i < 3000; ++i) b.Add("k", Map({{"id", I(i == off ? -7 : i)}}));
    EXPECT_GT(ColumnarSize(b), 1000u) << off;
  }
}

TEST(ColumnarTest, IntegerSequencesAreValidated) {
  Batch b;
  for (int i = 0; i < 100; ++i) b.Add(I(i), Map({{"id", I(1000 + 2 * i)}, {"f", "\xc0"}}));
  PayloadUnderTest t(b);
  const ByteBuffer& payload = t.payload;
  ASSERT_TRUE(t.Decode(payload.data(), payload.size(), 100).ok());
  // Truncated inside the sequence's varints: the id column is "int, step, 2 varints" just
  // before the last (nil) column's single type byte.
  for (size_t cut = 1; cut <= 4; ++cut) {
    EXPECT_FALSE(t.Decode(payload.data(), payload.size() - 1 - cut, 100).ok()) << cut;
  }
  // The same few bytes claiming more records than the rows cap can hold are refused before
  // any work per record.
  absl::Status st = t.Decode(payload.data(), payload.size(), 4'000'000);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot fit the rows cap"), std::string::npos) << st;
}

TEST(ColumnarTest, RepeatedStringsUseADictionary) {
  Batch few, many;
  for (int i = 0; i < 2000; ++i) {
    few.Add("k", Map({{"city", S(i % 3 == 0 ? "Amsterdam" : "Rotterdam")}}));
    many.Add("k", Map({{"city", S("city number " + std::to_string(i % 700))}}));  // 2-byte codes
  }
  // Two distinct values: one byte per record plus the dictionary, far below the ~10 bytes of
  // each plain value.
  EXPECT_LT(ColumnarSize(few), 2000u * 3);  // (the repeated key "k" takes a byte a record too)
  EXPECT_LT(ColumnarSize(many), 2000u * 4 + 700u * 16);
}

TEST(ColumnarTest, DictionaryKeepsGrowingWhileItPays) {
  // New values keep arriving after the first 1,024 records; the dictionary stays because its
  // entries are long and reused.
  Gen g(8);
  Batch b;
  for (int i = 0; i < 6000; ++i) {
    b.Add("", Map({{"s", S("a fairly long repeated value #" + std::to_string(g.Below(1500)))}}));
  }
  EXPECT_LT(ColumnarSize(b), 1500u * 40 + 6000u * 3);  // plain would be ~6000 * 35
}

TEST(ColumnarTest, KeyThatDiffersFromItsFieldInAnyOneByteIsKeptExactly) {
  // The key-reference check must compare every byte, for every length.
  for (size_t len = 0; len <= 40; ++len) {
    std::string id(len, 'a');
    for (size_t k = 0; k < len; ++k) id[k] = static_cast<char>('a' + k % 26);
    const std::string encoded = S(id);
    for (size_t pos = 0; pos < encoded.size(); ++pos) {
      Batch b;
      b.Add(encoded, Map({{"id", encoded}}));
      std::string other = encoded;
      other[pos] = static_cast<char>(other[pos] ^ 0x20);
      b.Add(other, Map({{"id", encoded}}));
      Auto(b);  // checks the round trip byte for byte
    }
  }
}

TEST(ColumnarTest, DictionaryStaysCorrectAcrossManyBatchesOnOneEncoder) {
  // The encoder's dictionary table is reused batch after batch (an epoch marks live slots);
  // run past the 65,535-batch wrap of that epoch and keep checking the round trip, with values
  // of both key forms (up to 16 bytes and longer).
  ColumnarRoundTrip rt;
  for (int batch = 0; batch < 65540; ++batch) {
    Batch b;
    const std::string x = S("a value longer than sixteen bytes #" + std::to_string(batch));
    const std::string y = S("y" + std::to_string(batch % 7));
    b.Add("", Map({{"s", x}}));
    b.Add("", Map({{"s", y}}));
    b.Add("", Map({{"s", x}}));
    // Check a sample, and every batch around the wrap.
    rt.Run(b, /*check=*/batch % 1000 == 0 || batch >= 65530);
    if (::testing::Test::HasFailure()) FAIL() << "batch " << batch;
  }
}

TEST(ColumnarTest, DictionaryKeysOfEveryEncodedSizeAndPlace) {
  // Dictionary keys take one form up to 16 bytes and another above, read with loads that must
  // stay inside the record: every length around 16, str and bin, as the only field (records
  // shorter than 16 bytes), as the last field of a long record, and with a field after it.
  // One encoder runs every batch, so slots a batch filled must not answer for the next one,
  // whose values differ.
  ColumnarRoundTrip rt;
  for (int shape = 0; shape < 3; ++shape) {
    for (const bool bin : {false, true}) {
      for (int round = 0; round < 3; ++round) {
        Batch b;
        for (int i = 0; i < 630; ++i) {
          // 21 lengths (0..20) x 3 letters x 2 last bytes: 126 values, each 5 times; values
          // that differ only in their last byte must get different codes.
          std::string s(static_cast<size_t>((i + round) % 21),
                        static_cast<char>('a' + (i / 21) % 3 + round));
          if (!s.empty()) s.back() = (i / 63) % 2 == 0 ? 'x' : 'y';
          std::string v;
          if (bin) {
            Gen::Bin(&v, s);
          } else {
            Gen::Str(&v, s);
          }
          if (shape == 0) {
            b.Add("", Map({{"s", v}}));
          } else if (shape == 1) {
            b.Add("", Map({{"pad", S(std::string(20, 'p'))}, {"s", v}}));
          } else {
            b.Add("", Map({{"s", v}, {"n", I(i)}}));
          }
        }
        // A dictionary: 126 entries and a byte a record; plain, this column alone is ~6,900 bytes.
        EXPECT_LT(rt.Run(b), 630u * 6) << shape << bin << round;
        if (::testing::Test::HasFailure()) FAIL() << shape << bin << round;
      }
    }
  }
}

TEST(ColumnarTest, DictionaryTableGrowsAndIsClearedBetweenBatches) {
  // Thousands of distinct short values (the table grows several times within a batch), then
  // batches of a few values that reuse some of them, on one encoder.
  ColumnarRoundTrip rt;
  for (int batch = 0; batch < 6; ++batch) {
    const int distinct = batch % 2 == 0 ? 5000 : 7;
    Batch b;
    for (int i = 0; i < 20000; ++i) {
      b.Add("", Map({{"w", S("w" + std::to_string((i * 7919 + batch) % distinct))}}));
    }
    rt.Run(b);
    if (::testing::Test::HasFailure()) FAIL() << "batch " << batch;
  }
}

// Whether an uncompressed COLUMNAR frame stores its keys as a reference to a field: the
// payload's field names, then the key column's type byte (docs/frame-format.md).
bool KeyColumnIsAReference(const std::string& frame) {
  const auto* p = reinterpret_cast<const uint8_t*>(frame.data()) + kFrameHeaderSize;
  const auto* end = reinterpret_cast<const uint8_t*>(frame.data()) + frame.size();
  uint64_t fields, len;
  if (!GetVarint(&p, end, &fields)) return false;
  for (uint64_t j = 0; j < fields; ++j) {
    if (!GetVarint(&p, end, &len) || static_cast<uint64_t>(end - p) < len) return false;
    p += len;
  }
  return p < end && *p == static_cast<uint8_t>(ColumnType::kKeyRef);
}

TEST(ColumnarTest, StrColumnsHandOffBetweenTheFastLoopAndTheGeneralOne) {
  // A str column with a field prefix of 4 to 16 bytes runs a loop of its own for values of up
  // to 255 bytes and hands each other record to the general loop (a column of such records
  // entirely). Mixed in: values of 17 to 31 bytes (the long dictionary key), str8 and str16
  // values, a dictionary that turns off mid-batch, and a key that is a copy of the field. Every
  // prefix length class, the field last or not; the key column must stay a reference while
  // every key matches, and every round trip is exact.
  ColumnarRoundTrip rt;
  auto value = [](int i, bool all_long) {
    if (all_long || i % 211 == 0) return S(std::string(300, 'X') + std::to_string(i % 4));
    if (i % 131 == 0) return S(std::string(40, 'L') + std::to_string(i % 3));  // str8
    if (i % 97 == 0) return S(std::string(20, 'm') + std::to_string(i % 5));   // 17..31 bytes
    if (i >= 1500) return S("d" + std::to_string(i));  // distinct: the dictionary stops paying
    return S("v" + std::to_string(i % 37));
  };
  for (const std::string name : {"s", "abc", "abcdefghi", "abcdefghijklmnopqrstu"}) {
    for (const bool last : {false, true}) {
      for (const bool all_long : {false, true}) {
        Batch matching, differing;
        for (int i = 0; i < 3000; ++i) {
          const std::string v = value(i, all_long);
          const std::string m =
              last ? Map({{"n", I(i)}, {name, v}}) : Map({{name, v}, {"n", I(i)}});
          matching.Add(v, m);
          differing.Add(i == 2999 ? v + "!" : v, m);
        }
        rt.Run(matching);
        EXPECT_TRUE(KeyColumnIsAReference(rt.frame)) << name << last << all_long;
        rt.Run(differing);
        EXPECT_FALSE(KeyColumnIsAReference(rt.frame)) << name << last << all_long;
        if (::testing::Test::HasFailure()) FAIL() << name << " last=" << last;
      }
    }
  }
}

TEST(ColumnarTest, StrColumnsReportTheRecordThatDoesNotFitFromTheFastLoop) {
  // The fast str loop stops at a record that does not fit and the general loop names it, deep
  // in a block and after records of every kind.
  auto batch = [](int bad, int how) {
    Batch b;
    for (int i = 0; i < 1200; ++i) {
      std::string v = i % 50 == 0 ? S(std::string(40, 'x')) : S("v" + std::to_string(i % 9));
      if (i == bad && how == 2) v = I(7);
      b.Add("", Map({{"n", I(i)}, {i == bad && how == 1 ? "cityx" : "city", v}}) +
                    (i == bad && how == 0 ? std::string("\xc0") : std::string()));
    }
    return b;
  };
  for (const int bad : {1, 300, 777, 1199}) {
    FrameEncoder enc(Auto());  // AUTO: falls back and says why
    const std::string at = "record " + std::to_string(bad) + ": ";
    const std::string want[] = {at + "value has bytes after the map like record 0's",
                                at + "map shape differs from record 0 at field 1 ('city')",
                                at + "field 'city' changes type from str to int"};
    for (int how = 0; how < 3; ++how) {
      std::string frame;
      ASSERT_TRUE(enc.Encode(batch(bad, how).Records(), &frame).ok());
      EXPECT_NE(enc.last_layout(), Layout::kColumnar);
      // (The reason goes on with why MSGPACK does not fit either, when it does not.)
      EXPECT_EQ(enc.last_fallback_reason().substr(0, want[how].size()), want[how])
          << enc.last_fallback_reason();
    }
  }
}

TEST(ColumnarTest, IntFloatAndBoolColumnsReportTheRecordThatDoesNotFitFromTheFastLoop) {
  // The same for the int, float64 and bool loops: a value of another type, a non-canonical
  // int, a truncated float, and trailing bytes, each deep in a batch of good records.
  const std::string t = "\xc3", f = "\xc2";
  for (const int bad : {1, 300, 777, 1199}) {
    const std::string at = "record " + std::to_string(bad) + ": ";
    struct Case {
      const char* field;
      std::string value;
      std::string want;
    };
    const Case cases[] = {
        {"count", S("7"), at + "field 'count' changes type from int to str"},
        {"count", std::string("\xcc\x05"),
         at + "field 'count' is truncated, out of int64 range or not canonically encoded"},
        {"price", I(3), at + "field 'price' changes type from float64 to int"},
        {"member", I(1), at + "field 'member' changes type from bool to int"},
        {"trail", "", at + "value has bytes after the map like record 0's"},
    };
    for (const Case& c : cases) {
      Batch b;
      for (int i = 0; i < 1200; ++i) {
        const bool here = i == bad;
        const std::string field = c.field;
        b.Add("", Map({{"count", here && field == "count" ? c.value : I(i * 3)},
                       {"price", here && field == "price" ? c.value : F(i + 0.25)},
                       {"member", here && field == "member" ? c.value : (i % 3 ? t : f)}}) +
                      (here && field == "trail" ? std::string("\xc0") : std::string()));
      }
      FrameEncoder enc(Auto());
      std::string frame;
      ASSERT_TRUE(enc.Encode(b.Records(), &frame).ok());
      EXPECT_NE(enc.last_layout(), Layout::kColumnar);
      EXPECT_EQ(enc.last_fallback_reason().substr(0, c.want.size()), c.want)
          << enc.last_fallback_reason();
    }
  }
}

TEST(ColumnarTest, DecimalFloatsRoundTripBitExactly) {
  Batch prices;
  for (int i = 0; i < 1000; ++i) prices.Add("k", Map({{"p", F((i * 37 % 100000) / 100.0)}}));
  EXPECT_LT(ColumnarSize(prices), 1000u * 4);  // integers, not 8-byte floats
  // Values that are not m / 10^e for one small e keep the column raw, and still round-trip.
  for (double odd : {-0.0, 1.0 / 3.0, 1e300, -1e-300, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN(), 4503599627370497.0}) {
    Batch b = prices;
    b.Add("k", Map({{"p", F(odd)}}));
    EXPECT_GT(ColumnarSize(b), 1001u * 8);
  }
  Batch scales;
  for (int i = 0; i < 100; ++i) scales.Add("k", Map({{"p", F(i / 1e9)}}));
  ColumnarSize(scales);
}

TEST(ColumnarTest, KeysCopiedFromAFieldAreStoredOnce) {
  Batch ref, almost;
  for (int i = 0; i < 1000; ++i) {
    const std::string user = S("user" + std::to_string(i % 50));
    ref.Add(user, Map({{"n", I(i)}, {"user", user}}));
    almost.Add(i == 999 ? S("someone else") : user, Map({{"n", I(i)}, {"user", user}}));
  }
  EXPECT_LT(ColumnarSize(ref), ColumnarSize(almost));
}

}  // namespace
}  // namespace sluice
