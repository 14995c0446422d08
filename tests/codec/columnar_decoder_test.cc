// The COLUMNAR decoder on payloads written by hand and damaged ones: bit-packed and
// delta-packed columns validated, scratch that does not grow with the records claimed, varint
// columns a chunk at a time and every column kind across chunk boundaries, dictionaries within
// the cap and in order of first use, and a keys-only decode that accepts exactly what a full one
// does.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "codec/columnar.h"
#include "codec/columnar_internal.h"
#include "codec/frame_decoder.h"
#include "codec/varint.h"
#include "tests/codec/columnar_fixture.h"
#include "tests/codec/test_records.h"

namespace sluice {
namespace {

using columnar_test::ColumnarRoundTrip;
using columnar_test::ColumnarSize;
using columnar_test::F;
using columnar_test::I;
using columnar_test::Map;
using columnar_test::RandomText;
using columnar_test::S;
using testing::Batch;
using testing::Gen;

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
