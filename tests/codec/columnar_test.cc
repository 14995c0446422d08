// COLUMNAR eligibility: what the layout holds exactly, and each reason it falls back.
#include "codec/columnar.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "codec/columnar_internal.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/varint.h"
#include "tests/codec/test_records.h"

namespace sluice {
namespace {

// AUTO as these tests mean it: COLUMNAR whenever the batch fits it, however few its records.
EncodeOptions Auto() {
  EncodeOptions o;
  o.min_columnar_records = 0;
  return o;
}

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
  FrameEncoder enc(Auto());
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

std::string F(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  std::string o;
  Gen::F64(&o, bits);
  return o;
}

// A COLUMNAR encoder without compression, and a decoder, kept across batches (the encoder's
// dictionary tables are reused from one batch to the next).
struct ColumnarRoundTrip {
  FrameEncoder enc{[] {
    EncodeOptions opts;
    opts.layout = LayoutChoice::kColumnar;
    opts.compression = Compression::kNone;
    return opts;
  }()};
  FrameDecoder dec;
  DecodedFrame out;
  std::string frame;

  // Encodes b, which must fit COLUMNAR; with `check`, decodes it and compares every record.
  // Returns the frame size.
  size_t Run(const Batch& b, bool check = true) {
    frame.clear();
    EXPECT_TRUE(enc.Encode(b.Records(), &frame).ok());
    EXPECT_EQ(enc.last_layout(), Layout::kColumnar) << enc.last_fallback_reason();
    if (!check) return frame.size();
    EXPECT_TRUE(dec.Decode(frame, &out).ok());
    EXPECT_EQ(out.size(), b.size());
    size_t wrong = 0;  // report the first few differences only
    for (size_t i = 0; i < b.size() && i < out.size() && wrong < 5; ++i) {
      if (out[i].key == b.keys[i] && out[i].value == b.values[i]) continue;
      ++wrong;
      ADD_FAILURE() << "record " << i << " differs (value " << out[i].value.size() << " bytes, "
                    << b.values[i].size() << " expected)";
    }
    return frame.size();
  }
};

// Encodes with COLUMNAR, checks the round trip and returns the frame size.
size_t ColumnarSize(const Batch& b) { return ColumnarRoundTrip().Run(b); }

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

// A batch's COLUMNAR payload, and a decoder for it (and for damaged copies of it).
struct PayloadUnderTest {
  ByteBuffer payload;
  ColumnarDecoder dec;
  ByteBuffer rows;
  PodBuffer<RecordRef> index;
  explicit PayloadUnderTest(const Batch& b) {
    ColumnarEncoder enc;
    std::string why;
    EXPECT_TRUE(enc.Encode(b.Records(), &payload, &why)) << why;
  }
  absl::Status Decode(const uint8_t* p, size_t size, uint32_t n) {
    return dec.Decode(p, size, n, 1u << 20, &rows, &index);
  }
};

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

std::string RandomText(uint64_t* state, const std::string& alphabet, size_t len) {
  std::string s(len, ' ');
  for (char& c : s) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    c = alphabet[(*state >> 33) % alphabet.size()];
  }
  return s;
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

// Appends v to b as a varint.
void AppendVarint(ByteBuffer* b, uint64_t v) {
  uint8_t* w = b->Extend(kMaxVarintBytes);
  b->Resize(static_cast<size_t>(PutVarint(w, v) - b->data()));
}

// Bytes [off, off + len) of decoded rows.
std::string_view RowBytes(const ByteBuffer& rows, uint32_t off, uint32_t len) {
  return std::string_view(reinterpret_cast<const char*>(rows.data()) + off, len);
}

// A COLUMNAR payload of one field "v" with nil keys; `column` is the field's column bytes.
ByteBuffer OneColumnPayload(std::initializer_list<uint8_t> column) {
  ByteBuffer p;
  for (const uint8_t b : {uint8_t{1}, uint8_t{1}, uint8_t{'v'}, uint8_t{0}}) p.PushBack(b);
  for (const uint8_t b : column) p.PushBack(b);
  return p;
}

// Decodes a one-column payload of n records; returns the values as one string, or the error.
std::string DecodeOneColumn(const ByteBuffer& payload, uint32_t n) {
  ColumnarDecoder dec;
  ByteBuffer rows;
  PodBuffer<RecordRef> index;
  const absl::Status st = dec.Decode(payload.data(), payload.size(), n, 1u << 20, &rows, &index);
  if (!st.ok()) return "error: " + std::string(st.message());
  std::string out;
  for (const RecordRef& r : index) {
    out.append(RowBytes(rows, r.value_off + 3, r.value_len - 3));
  }
  return out;  // each value without its map header and field name (0x81 0xa1 'v')
}

TEST(ColumnarTest, BitPackedColumnsAreValidated) {
  constexpr uint8_t kInt = 2, kBool = 1, kStr = 5;
  // Ints: base -2 (zigzag 3), 3 bits: 0x0105 holds 5, 0, 4 -> 3, -2, 2.
  EXPECT_EQ(DecodeOneColumn(OneColumnPayload({kInt, 3, 3, 3, 0x05, 0x01}), 3),
            std::string("\x03\xfe\x02"));
  for (const uint8_t bits : {0, 57, 200}) {
    EXPECT_NE(DecodeOneColumn(OneColumnPayload({kInt, 3, 3, bits, 0x05, 0x01}), 3)
                  .find("-bit packed integers"),
              std::string::npos)
        << int{bits};
  }
  EXPECT_NE(DecodeOneColumn(OneColumnPayload({kInt, 3, 3, 3, 0x05}), 3).find("truncated"),
            std::string::npos);
  EXPECT_NE(DecodeOneColumn(OneColumnPayload({kInt, 3, 3, 3}), 3).find("truncated"),
            std::string::npos);
  EXPECT_NE(DecodeOneColumn(OneColumnPayload({kInt, 3, 3, 3, 0x05, 0x03}), 3).find("padding"),
            std::string::npos);
  // 56 bits, the widest: the offset is read whole.
  EXPECT_EQ(DecodeOneColumn(
                OneColumnPayload({kInt, 3, 0, 56, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), 1),
            std::string("\xcf\x00\xff\xff\xff\xff\xff\xff\xff", 9));
  // Bools: packed bits 1,0,1 then zero padding; set padding, truncation; the byte-per-value
  // form of earlier versions still reads.
  EXPECT_EQ(DecodeOneColumn(OneColumnPayload({kBool, 2, 0x05}), 3), std::string("\xc3\xc2\xc3"));
  EXPECT_NE(DecodeOneColumn(OneColumnPayload({kBool, 2, 0x0d}), 3).find("padding"),
            std::string::npos);
  EXPECT_NE(DecodeOneColumn(OneColumnPayload({kBool, 2, 0x05}), 9).find("truncated"),
            std::string::npos);
  EXPECT_EQ(DecodeOneColumn(OneColumnPayload({kBool, 1, 0, 1}), 3), std::string("\xc3\xc2\xc3"));
  // Dictionary codes: 3 entries "a", "b", "c" need exactly 2 bits; codes 0, 1, 2.
  const auto dict3 = [](uint8_t bits, uint8_t codes) {
    return OneColumnPayload({kStr, 1, 3, 1, 1, 1, 3, 'a', 'b', 'c', 4, bits, codes});
  };
  EXPECT_EQ(DecodeOneColumn(dict3(2, 0x24), 3), std::string("\xa1"
                                                            "a\xa1"
                                                            "b\xa1"
                                                            "c"));
  for (const uint8_t bits : {0, 1, 3, 17}) {
    EXPECT_NE(DecodeOneColumn(dict3(bits, 0x24), 3).find("bad code width"), std::string::npos)
        << int{bits};
  }
  EXPECT_NE(DecodeOneColumn(dict3(2, 0x13), 3).find("beyond its 3-entry dictionary"),
            std::string::npos);  // code 3
  EXPECT_NE(DecodeOneColumn(dict3(2, 0x52), 3).find("padding"), std::string::npos);
}

TEST(ColumnarTest, ColumnsThatRiseByNarrowStepsStoreTheSteps) {
  // Timestamps that rise by 0..1,999 ms: 11 bits a step (~1,380 bytes for 1,000 records)
  // instead of 2-byte delta varints. Also falling, around the int64 wrap, as decimal float
  // mantissas (prices that rise by cents), and at batch sizes around the packer's groups.
  Gen g(21);
  for (const int n : {3, 4, 9, 17, 1000}) {
    Batch rising, falling, wrapping, cents;
    int64_t ts = 1'730'000'000'000, down = 5'000'000;
    uint64_t wrap = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - 3000;
    int64_t price = 100'00;
    for (int i = 0; i < n; ++i) {
      ts += static_cast<int64_t>(g.Below(2000));
      down -= static_cast<int64_t>(g.Below(2000));
      wrap += g.Below(7);
      price += static_cast<int64_t>(g.Below(100));
      rising.Add("", Map({{"ts", I(ts)}}));
      falling.Add("", Map({{"ts", I(down)}}));
      wrapping.Add("", Map({{"ts", I(static_cast<int64_t>(wrap))}}));
      cents.Add("", Map({{"p", F(static_cast<double>(price) / 100)}}));
    }
    // ColumnarSize checks each round trip byte for byte.
    const size_t r = ColumnarSize(rising), f = ColumnarSize(falling);
    ColumnarSize(wrapping);
    ColumnarSize(cents);
    if (n == 1000) {
      // 999 steps of 11 bits (1,374 bytes) and ~180 of frame header and empty keys; as 2-byte
      // delta varints, the column alone would take ~2,000.
      EXPECT_LT(r, 1600u);
      EXPECT_LT(f, 1600u);
      EXPECT_LT(ColumnarSize(cents), 1100u);  // 7 bits a step: 875 bytes
    }
  }
}

TEST(ColumnarTest, DeltaPackedColumnsAreValidated) {
  constexpr uint8_t kInt = 2, kDeltaPacked = 4;
  // First 10 (zigzag 20), steps of -1 + 0..3 (zigzag 1, 2 bits): 0b11'00'10 -> 10, 11, 10, 12.
  EXPECT_EQ(DecodeOneColumn(OneColumnPayload({kInt, kDeltaPacked, 20, 1, 2, 0x32}), 4),
            std::string("\x0a\x0b\x0a\x0c"));
  // One record: no steps at all.
  EXPECT_EQ(DecodeOneColumn(OneColumnPayload({kInt, kDeltaPacked, 20, 1, 2}), 1),
            std::string("\x0a"));
  for (const uint8_t bits : {0, 57, 200}) {
    EXPECT_NE(DecodeOneColumn(OneColumnPayload({kInt, kDeltaPacked, 20, 1, bits, 0x32}), 4)
                  .find("-bit packed integer steps"),
              std::string::npos)
        << int{bits};
  }
  EXPECT_NE(DecodeOneColumn(OneColumnPayload({kInt, kDeltaPacked, 20, 1, 2, 0x32}), 6)
                .find("steps are truncated"),
            std::string::npos);
  EXPECT_NE(DecodeOneColumn(OneColumnPayload({kInt, kDeltaPacked, 20, 1}), 4)
                .find("truncated delta-packed integer header"),
            std::string::npos);
  EXPECT_NE(DecodeOneColumn(OneColumnPayload({kInt, kDeltaPacked, 20, 1, 2, 0x72}), 4)
                .find("nonzero padding after its integer steps"),
            std::string::npos);
  EXPECT_NE(DecodeOneColumn(OneColumnPayload({kInt, 5, 20, 1, 2, 0x32}), 4)
                .find("unknown integer encoding"),
            std::string::npos);
  // Steps that wrap: first INT64_MAX, step base 1: the next value is INT64_MIN.
  EXPECT_EQ(
      DecodeOneColumn(OneColumnPayload({kInt, kDeltaPacked, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff,
                                        0xff, 0xff, 0xff, 0x01, 2, 1, 0x00}),
                      2),
      std::string("\xcf\x7f\xff\xff\xff\xff\xff\xff\xff\xd3\x80\x00\x00\x00\x00\x00\x00\x00", 18));
}

TEST(ColumnarTest, PackedColumnsClaimingMillionsOfRecordsHoldNoScratchPerValue) {
  // Seven decimal float64 columns of 1-bit packed mantissas: 4,000,000 records in 3.5 MB,
  // rebuilding to 288 MB. Refused at a 64 MiB cap, and the decoder computes such values when
  // it writes them, so reading the columns first held nothing per value (a review measured
  // 264 MB held here when decimals were computed up front).
  constexpr uint32_t n = 4'000'000;
  ByteBuffer payload;
  payload.PushBack(7);  // fields, all named ""
  for (int j = 0; j < 7; ++j) payload.PushBack(0);
  payload.PushBack(0);  // key column: nil
  for (int j = 0; j < 7; ++j) {
    for (const uint8_t b : {4, 1, 0, 3, 0, 1}) payload.PushBack(b);  // float64, decimal e=0,
    uint8_t* bits = payload.Extend(n / 8);                           // packed, base 0, 1 bit
    std::memset(bits, 0, n / 8);
  }
  ColumnarDecoder dec;
  ByteBuffer rows;
  PodBuffer<RecordRef> index;
  const absl::Status st = dec.Decode(payload.data(), payload.size(), n, 64u << 20, &rows, &index);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("over the cap"), std::string::npos) << st;
  EXPECT_LT(dec.retained_bytes(), 1u << 20);
  EXPECT_LT(rows.capacity(), 1u << 20);
}

// Varint columns (plain and delta ints, decimal mantissas, byte lengths) are decoded again a
// chunk of records at a time while rebuilding: what the decoder holds does not grow with them.
TEST(ColumnarTest, VarintColumnsHoldAChunkNotAValuePerRecord) {
  // 1,000,000 records of six plain int columns (value i % 64), one delta column (deltas 1, so
  // values 1..n cross every msgpack int size), and one plain str column (lengths i % 3, "x"s).
  constexpr uint32_t n = 1'000'000;
  using columnar_internal::kIntDelta;
  using columnar_internal::kIntPlain;
  ByteBuffer payload;
  payload.PushBack(8);  // fields, all named ""
  for (int j = 0; j < 8; ++j) payload.PushBack(0);
  payload.PushBack(0);  // key column: nil
  for (int j = 0; j < 6; ++j) {
    payload.PushBack(static_cast<uint8_t>(ColumnType::kInt));
    payload.PushBack(kIntPlain);
    uint8_t* w = payload.Extend(n);
    for (uint32_t i = 0; i < n; ++i) w[i] = static_cast<uint8_t>(ZigZag(i % 64));
  }
  payload.PushBack(static_cast<uint8_t>(ColumnType::kInt));
  payload.PushBack(kIntDelta);
  std::memset(payload.Extend(n), 2, n);  // zigzag(1)
  payload.PushBack(static_cast<uint8_t>(ColumnType::kStr));
  payload.PushBack(columnar_internal::kBytesPlain);
  uint64_t blob = 0;
  for (uint32_t i = 0; i < n; ++i) {
    payload.PushBack(static_cast<uint8_t>(i % 3));
    blob += i % 3;
  }
  AppendVarint(&payload, blob);
  std::memset(payload.Extend(blob), 'x', blob);

  ColumnarDecoder dec;
  ByteBuffer rows;
  PodBuffer<RecordRef> index;
  ASSERT_TRUE(dec.Decode(payload.data(), payload.size(), n, 64u << 20, &rows, &index).ok());
  ASSERT_EQ(index.size(), n);
  for (const uint32_t i : {0u, 1u, 127u, 128u, 255u, 256u, 257u, 65535u, 65536u, n - 1}) {
    std::string want;
    Gen::MapHeader(&want, 8);
    for (int j = 0; j < 6; ++j) want += S("") + I(i % 64);
    want += S("") + I(int64_t{i} + 1) + S("") + S(std::string(i % 3, 'x'));
    const RecordRef& r = index[i];
    EXPECT_EQ(RowBytes(rows, r.value_off, r.value_len), want) << i;
  }
  // Held: chunks of values, not the 8 bytes a value (56 MB) and 4 a length (4 MB) of before.
  EXPECT_LT(dec.retained_bytes(), 1u << 20);
  // Over a smaller cap the same columns are refused by their rebuilt size (~22 MB).
  const absl::Status st = dec.Decode(payload.data(), payload.size(), n, 20u << 20, &rows, &index);
  EXPECT_NE(st.message().find("over the cap"), std::string::npos) << st;
}

// Chunks of records rebuild exactly across their boundaries, for every kind of column and key,
// in full and keys-only decodes.
TEST(ColumnarTest, ChunkBoundariesRebuildEveryColumnKind) {
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  testing::Gen g(2026);
  ColumnarRoundTrip rt;
  ColumnarEncoder enc;
  ColumnarDecoder keys;
  ByteBuffer key_rows;
  PodBuffer<RecordRef> key_index;
  uint64_t st = 11;
  for (const size_t n : {1, 255, 256, 257, 511, 512, 513, 1300}) {
    std::vector<Batch> batches;
    for (int s = 0; s < 4; ++s) batches.push_back(testing::ColumnarBatch(g, n, 1 + (n + s) % 9));
    Batch fixed, raw_keys;
    for (size_t i = 0; i < n; ++i) {
      const auto x = static_cast<int64_t>(i);
      const std::string text = RandomText(&st, alnum, 5 + i % 11);  // packed, or plain
      // Keys and "delta" rise by steps in a narrow range: stored as packed steps, rebuilt a
      // chunk at a time from a running value (keys also in a keys-only decode).
      fixed.Add(I(x * 7 - 1000 + (x * 13) % 5),
                Map({{"delta", I(x * 1000 + x % 7)},
                     {"skewed", I((x * x * 2654435761) % 1000 - 500)},
                     {"unique", S("u" + std::to_string(x * 7919))},
                     {"text", S(text)},
                     {"hex", S(RandomText(&st, "0123456789abcdef", 2 * (i % 9)))},
                     {"price", F(static_cast<double>((x * 7919) % 200001 - 100000) / 100)}}));
      raw_keys.Add(RandomText(&st, alnum, i % 23), Map({{"t", S(text)}, {"n", I(x)}}));
    }
    batches.push_back(fixed);
    batches.push_back(raw_keys);
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const Batch& b = batches[bi];
      SCOPED_TRACE(::testing::Message() << "n " << n << " batch " << bi);
      rt.Run(b);
      // Keys only, from the same payload (the frame's header is what FrameDecoder skips).
      ByteBuffer payload;
      std::string why;
      ASSERT_TRUE(enc.Encode(b.Records(), &payload, &why)) << why;
      ASSERT_TRUE(keys.Decode(payload.data(), payload.size(), static_cast<uint32_t>(n), 64u << 20,
                              &key_rows, &key_index, /*keys_only=*/true)
                      .ok());
      ASSERT_EQ(key_index.size(), n);
      for (size_t i = 0; i < n; ++i) {
        const RecordRef& r = key_index[i];
        ASSERT_EQ(RowBytes(key_rows, r.key_off, r.key_len), b.keys[i]) << i;
      }
    }
  }
}

// Dictionaries are read into entries before the rebuilt size is known: together they may take
// at most the rows cap, and one may not have more entries than codes can name.
TEST(ColumnarTest, DictionariesBeyondTheCapOrTheCodeRangeAreRefused) {
  using columnar_internal::kBytesDict;
  // n records, one str field named "", a dictionary of `count` entries — the first empty, the
  // others `len` bytes of 'd' — and one-byte codes, all 0: rows of 4 bytes a record.
  const auto dict_payload = [](uint32_t n, uint32_t count, uint8_t len) {
    ByteBuffer p;
    for (const uint8_t b : {uint8_t{1}, uint8_t{0}, uint8_t{0}}) p.PushBack(b);
    p.PushBack(static_cast<uint8_t>(ColumnType::kStr));
    p.PushBack(kBytesDict);
    AppendVarint(&p, count);
    p.PushBack(0);
    std::memset(p.Extend(count - 1), len, count - 1);  // lengths
    const uint64_t blob = uint64_t{count - 1} * len;
    AppendVarint(&p, blob);
    std::memset(p.Extend(blob), 'd', blob);
    p.PushBack(columnar_internal::kCodeBytes);  // one byte a code (this decoder reads any d)
    std::memset(p.Extend(n), 0, n);
    return p;
  };
  ColumnarDecoder dec;
  ByteBuffer rows;
  PodBuffer<RecordRef> index;
  // 3,000 entries of 100 bytes, unused: 303 KB of entries for 12 KB of rows. Refused at 64 KiB
  // before anything is built for them; at 1 MiB they are built, and refused for being unused.
  ByteBuffer p = dict_payload(3000, 3000, 100);
  EXPECT_NE(dec.Decode(p.data(), p.size(), 3000, 1u << 20, &rows, &index)
                .message()
                .find("never uses dictionary entries 1 to 2999 of 3000"),
            std::string::npos);
  const absl::Status st = dec.Decode(p.data(), p.size(), 3000, 64u << 10, &rows, &index);
  EXPECT_NE(st.message().find("dictionary entries take more than the rows cap"), std::string::npos)
      << st;
  // More entries than 16-bit codes can name.
  p = dict_payload(70'000, 65'537, 0);
  EXPECT_NE(dec.Decode(p.data(), p.size(), 70'000, 64u << 20, &rows, &index)
                .message()
                .find("bad dictionary size"),
            std::string::npos);
}

// Dictionary entries are numbered in order of first use, and every entry is used: a dictionary
// has one spelling, so a frame cannot carry entries that rebuild nothing, in a field column or
// in the key column read alone.
TEST(ColumnarTest, DictionaryCodesNumberEntriesInOrderOfFirstUse) {
  constexpr uint8_t kStr = 5, kBytes = columnar_internal::kCodeBytes;
  // Field 'v': entries "a", "b", one byte a code.
  const auto two = [](std::initializer_list<uint8_t> codes) {
    ByteBuffer p = OneColumnPayload({kStr, 1, 2, 1, 1, 2, 'a', 'b', kBytes});
    for (const uint8_t c : codes) p.PushBack(c);
    return p;
  };
  EXPECT_EQ(DecodeOneColumn(two({0, 1, 0, 1}), 4), std::string("\xa1"
                                                               "a\xa1"
                                                               "b\xa1"
                                                               "a\xa1"
                                                               "b"));
  EXPECT_EQ(DecodeOneColumn(two({0, 0, 1}), 3), std::string("\xa1"
                                                            "a\xa1"
                                                            "a\xa1"
                                                            "b"));
  EXPECT_EQ(DecodeOneColumn(two({1, 0}), 2),
            "error: corrupt COLUMNAR payload: column 'v' has code 1 at record 0 before code 0 was "
            "used (entries are numbered in order of first use)");
  EXPECT_EQ(DecodeOneColumn(two({0, 0, 0}), 3),
            "error: corrupt COLUMNAR payload: column 'v' never uses dictionary entry 1 of 2");
  EXPECT_NE(DecodeOneColumn(two({0, 2}), 2).find("has code 2 beyond its 2-entry dictionary"),
            std::string::npos);

  // The key column, decoded alone: entries "k", "j" one byte a code, and a nil field.
  const auto keyed = [](std::initializer_list<uint8_t> codes) {
    ByteBuffer p;
    for (const uint8_t b : {uint8_t{1}, uint8_t{1}, uint8_t{'v'}}) p.PushBack(b);
    for (const uint8_t b : {kStr, uint8_t{1}, uint8_t{2}, uint8_t{1}, uint8_t{1}, uint8_t{2},
                            uint8_t{'k'}, uint8_t{'j'}, kBytes}) {
      p.PushBack(b);
    }
    for (const uint8_t c : codes) p.PushBack(c);
    p.PushBack(static_cast<uint8_t>(ColumnType::kNil));
    return p;
  };
  for (const bool keys_only : {false, true}) {
    ColumnarDecoder dec;
    ByteBuffer rows;
    PodBuffer<RecordRef> index;
    ByteBuffer p = keyed({0, 1, 1});
    ASSERT_TRUE(dec.Decode(p.data(), p.size(), 3, 1u << 20, &rows, &index, keys_only).ok());
    ASSERT_EQ(index.size(), 3u);
    EXPECT_EQ(RowBytes(rows, index[0].key_off, index[0].key_len), "\xa1k");
    EXPECT_EQ(RowBytes(rows, index[2].key_off, index[2].key_len), "\xa1j");
    const auto error = [&](std::initializer_list<uint8_t> codes) {
      const ByteBuffer bad = keyed(codes);
      return std::string(
          dec.Decode(bad.data(), bad.size(), 3, 1u << 20, &rows, &index, keys_only).message());
    };
    EXPECT_NE(error({1, 0, 1}).find("column '<key>' has code 1 at record 0 before code 0 was used"),
              std::string::npos)
        << keys_only;
    EXPECT_NE(error({0, 0, 0}).find("column '<key>' never uses dictionary entry 1 of 2"),
              std::string::npos)
        << keys_only;
  }
}

// What Sluice's encoder writes is never refused by the dictionary budget, even where its
// dictionaries' offsets outweigh the rows: 3 records of 200 fields holding "x", "y", "x" (200
// two-entry dictionaries) decode at a cap of exactly their rows.
TEST(ColumnarTest, TinyDictionariesDecodeAtACapOfTheirRows) {
  Batch b;
  for (int i = 0; i < 3; ++i) {
    std::string v;
    Gen::MapHeader(&v, 200);
    for (int j = 0; j < 200; ++j) {
      Gen::Str(&v, std::string(1, static_cast<char>('0' + j % 64)) + std::to_string(j / 64));
      Gen::Str(&v, i == 1 ? "y" : "x");
    }
    b.Add("", v);
  }
  ColumnarEncoder enc;
  ByteBuffer payload;
  std::string why;
  ASSERT_TRUE(enc.Encode(b.Records(), &payload, &why)) << why;
  ColumnarDecoder dec;
  ByteBuffer rows;
  PodBuffer<RecordRef> index;
  ASSERT_TRUE(dec.Decode(payload.data(), payload.size(), 3, 1u << 20, &rows, &index).ok());
  const auto exact = static_cast<uint32_t>(rows.size());
  ASSERT_TRUE(dec.Decode(payload.data(), payload.size(), 3, exact, &rows, &index).ok());
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(RowBytes(rows, index[i].value_off, index[i].value_len), b.values[i]);
  }
  EXPECT_FALSE(dec.Decode(payload.data(), payload.size(), 3, exact - 1, &rows, &index).ok());
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

// A server validates pushed frames rebuilding only their keys: that must accept exactly the
// payloads a full decode accepts, and give the same keys.
TEST(ColumnarTest, KeysOnlyDecodeAcceptsExactlyWhatFullDecodeAccepts) {
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::vector<Batch> batches;
  testing::Gen g(91);
  for (int i = 0; i < 12; ++i) batches.push_back(testing::ColumnarBatch(g, 30, 1 + i % 4));
  uint64_t st = 5;
  Batch packed_field, packed_key_ref, packed_raw_keys;
  for (int i = 0; i < 40; ++i) {
    const std::string text = RandomText(&st, alnum, 13 + i % 7);  // padding bits in use
    packed_field.Add(I(i % 9), Map({{"n", I(i)}, {"t", S(text)}}));
    packed_key_ref.Add(S(text), Map({{"n", I(i)}, {"t", S(text)}}));
    packed_raw_keys.Add(RandomText(&st, alnum, 21), Map({{"t", S(text)}}));
  }
  batches.push_back(packed_field);
  batches.push_back(packed_key_ref);
  batches.push_back(packed_raw_keys);
  ColumnarEncoder enc;
  ColumnarDecoder full, keys;
  ByteBuffer rows, key_rows;
  PodBuffer<RecordRef> index, key_index;
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    const Batch& b = batches[bi];
    ByteBuffer payload;
    std::string why;
    ASSERT_TRUE(enc.Encode(b.Records(), &payload, &why)) << bi << ": " << why;
    const auto n = static_cast<uint32_t>(b.size());
    uint32_t cap = 4096;  // small, so failed decodes do not keep fetching fresh memory
    for (size_t i = 0; i < n; ++i) cap += b.keys[i].size() + b.values[i].size();
    auto decode = [&](const ByteBuffer& p, bool keys_only) {
      return keys_only ? keys.Decode(p.data(), p.size(), n, cap, &key_rows, &key_index, true)
                       : full.Decode(p.data(), p.size(), n, cap, &rows, &index);
    };
    ASSERT_TRUE(decode(payload, false).ok()) << bi;
    ASSERT_TRUE(decode(payload, true).ok()) << bi;
    ASSERT_EQ(key_index.size(), n);
    for (size_t i = 0; i < n; ++i) {
      const RecordRef& r = key_index[i];
      EXPECT_EQ(RowBytes(key_rows, r.key_off, r.key_len), b.keys[i]) << bi << " " << i;
      EXPECT_EQ(r.value_len, 0u);
    }
    ByteBuffer bad;
    // Every byte of small payloads; about 2,000 spread over large ones (and their tails).
    const size_t step = payload.size() > 4096 ? payload.size() / 2048 : 1;
    for (size_t pos = 0; pos < payload.size(); pos += (pos + 64 >= payload.size() ? 1 : step)) {
      for (uint8_t flip : {0x01, 0x40, 0x80, 0xff}) {
        bad.Clear();
        bad.Append(payload.data(), payload.size());
        bad.data()[pos] ^= flip;
        const absl::Status a = decode(bad, false), k = decode(bad, true);
        ASSERT_EQ(a.ok(), k.ok()) << "batch " << bi << " byte " << pos << " ^ " << int{flip}
                                  << ": full " << a << ", keys only " << k;
      }
    }
  }
}

}  // namespace
}  // namespace sluice
