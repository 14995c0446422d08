// ZSTD_SECTIONS frames (docs/frame-format.md): plain byte ranges compressed apart from the rest.
// Round trips, when the encoder uses them, and every kind of forged damage to the section table
// and parts (valid checksums over bad structure) is rejected with a message, or harmless.
#include <gtest/gtest.h>
#include <zstd.h>

#include <set>
#include <string>

#include "codec/columnar.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/varint.h"
#include "tests/codec/test_records.h"

namespace sluice {
namespace {

using testing::Batch;
using testing::Gen;

std::string Encode(const Batch& b, EncodeOptions opts = {}) {
  opts.min_zstd_saving = 0;
  FrameEncoder enc(opts);
  std::string frame;
  EXPECT_TRUE(enc.Encode(b.Records(), &frame).ok());
  return frame;
}

FrameHeader Header(const std::string& frame) {
  auto h = ParseFrameHeader(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size()));
  EXPECT_TRUE(h.ok()) << h.status();
  return h.value_or(FrameHeader{});
}

bool DecodesTo(const std::string& frame, const Batch& want, absl::Status* st = nullptr) {
  FrameDecoder dec;
  DecodedFrame out;
  absl::Status s = dec.Decode(frame, &out);
  if (st != nullptr) *st = s;
  if (!s.ok()) return false;
  if (out.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (out[i].key != want.keys[i] || out[i].value != want.values[i]) return false;
  }
  return true;
}

// A frame's stored payload replaced, with a valid checksum, as an attacker could.
std::string Reseal(const std::string& frame, const std::string& stored) {
  const FrameHeader h = Header(frame);
  return testing::Forge(h.layout, h.compression, h.flags, h.record_count, h.uncompressed_size,
                        stored);
}

// The parsed layout of a ZSTD_SECTIONS stored payload.
struct Parsed {
  uint8_t flags = 0;
  std::vector<uint64_t> entries;  // (length << 1) | plain
  size_t table_end = 0;           // offset of the entropy size varint
  size_t entropy_at = 0;          // offset of the entropy part
  uint64_t entropy_stored = 0;
};

Parsed Parse(const std::string& stored) {
  Parsed p;
  const auto* b = reinterpret_cast<const uint8_t*>(stored.data());
  const uint8_t* q = b;
  const uint8_t* end = b + stored.size();
  p.flags = *q++;
  uint64_t count = 0;
  EXPECT_TRUE(GetVarint(&q, end, &count));
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t v = 0;
    EXPECT_TRUE(GetVarint(&q, end, &v));
    p.entries.push_back(v);
  }
  p.table_end = static_cast<size_t>(q - b);
  EXPECT_TRUE(GetVarint(&q, end, &p.entropy_stored));
  p.entropy_at = static_cast<size_t>(q - b);
  return p;
}

std::string Build(uint8_t flags, const std::vector<uint64_t>& entries, uint64_t entropy_stored,
                  const std::string& parts) {
  std::string s(1, static_cast<char>(flags));
  uint8_t buf[kMaxVarintBytes];
  s.append(reinterpret_cast<char*>(buf), PutVarint(buf, entries.size()) - buf);
  for (uint64_t e : entries) s.append(reinterpret_cast<char*>(buf), PutVarint(buf, e) - buf);
  s.append(reinterpret_cast<char*>(buf), PutVarint(buf, entropy_stored) - buf);
  return s + parts;
}

TEST(SectionsTest, PlainColumnsAreCompressedApartAndRoundTrip) {
  Gen g(5);
  const Batch b = testing::SectionedBatch(g, 2000);
  const std::string sectioned = Encode(b);
  const FrameHeader h = Header(sectioned);
  EXPECT_EQ(h.layout, Layout::kColumnar);
  EXPECT_EQ(h.compression, Compression::kZstdSections);
  EXPECT_TRUE(DecodesTo(sectioned, b));
  const std::string stored = sectioned.substr(kFrameHeaderSize);
  const Parsed p = Parse(stored);
  EXPECT_EQ(p.flags, kSectionsEntropyZstd);  // random floats and ids: the plain part stays raw
  EXPECT_GE(p.entries.size(), 2u);
  uint64_t plain = 0;
  for (uint64_t e : p.entries) plain += (e & 1) != 0 ? e >> 1 : 0;
  EXPECT_GT(plain, 2000u * 8);  // at least the floats' bytes

  // Without sections: one zstd frame, and not smaller by more than a little.
  EncodeOptions whole;
  whole.plain_sections = false;
  const std::string one = Encode(b, whole);
  EXPECT_EQ(Header(one).compression, Compression::kZstd);
  EXPECT_TRUE(DecodesTo(one, b));
  EXPECT_LT(sectioned.size(), one.size() * 105 / 100);
}

TEST(SectionsTest, KeysOnlyAndSortedFramesReadSectionsToo) {
  Gen g(9);
  const Batch b = testing::SectionedBatch(g, 3000);
  EncodeOptions sorted;
  sorted.sort_by_key = true;
  const std::string frame = Encode(b, sorted);
  ASSERT_EQ(Header(frame).compression, Compression::kZstdSections);
  DecodeOptions keys_only;
  keys_only.keys_only = true;
  FrameDecoder dec(keys_only);
  DecodedFrame out;
  ASSERT_TRUE(dec.Decode(frame, &out).ok());
  ASSERT_EQ(out.size(), b.size());
  std::multiset<std::string> want(b.keys.begin(), b.keys.end()), got;
  for (const Record& r : out) got.insert(std::string(r.key));
  EXPECT_EQ(got, want);
}

// Payloads under min_zstd_payload (1 KiB) are stored raw without trying zstd, whose fixed cost
// per frame (~6 us to compress and ~4 us to decompress 200 bytes) would make a wide shuffle's
// one-record frames cost many times their bytes; larger payloads are still compressed.
TEST(SectionsTest, SmallPayloadsAreStoredRawWithoutTryingZstd) {
  Batch one;
  std::string v;
  Gen::MapHeader(&v, 1);
  Gen::Str(&v, "text");
  Gen::Str(&v, std::string(300, 'a'));
  one.Add("k", v);
  EXPECT_EQ(Header(Encode(one)).compression, Compression::kNone);
  EncodeOptions always;
  always.min_zstd_payload = 0;
  EXPECT_EQ(Header(Encode(one, always)).compression, Compression::kZstd);
  Batch many;  // 2.4 KB of payload
  for (int i = 0; i < 8; ++i) {
    std::string w;
    Gen::MapHeader(&w, 1);
    Gen::Str(&w, "text");
    std::string text(300, ' ');
    for (size_t j = 0; j < text.size(); ++j) text[j] = static_cast<char>('a' + (j * j + i) % 26);
    Gen::Str(&w, text);
    many.Add("k" + std::to_string(i), w);
  }
  EXPECT_EQ(Header(Encode(many)).compression, Compression::kZstd)
      << Header(Encode(many)).uncompressed_size;
}

TEST(SectionsTest, OnlyLargeColumnarPayloadsWithPlainBytesUseSections) {
  Gen g(6);
  // Small: a single zstd frame.
  EXPECT_EQ(Header(Encode(testing::SectionedBatch(g, 40))).compression, Compression::kZstd);
  // MSGPACK layout: the layout marks no ranges.
  EncodeOptions mp;
  mp.layout = LayoutChoice::kMsgpack;
  const Batch big = testing::SectionedBatch(g, 2000);
  EXPECT_EQ(Header(Encode(big, mp)).compression, Compression::kZstd);
  // Compressible columns only: nothing plain.
  Batch text;
  for (int i = 0; i < 3000; ++i) {
    std::string v;
    Gen::MapHeader(&v, 2);
    Gen::Str(&v, "a");
    Gen::Int(&v, i);
    Gen::Str(&v, "b");
    Gen::Str(&v, i % 3 == 0 ? "red" : "blue");
    text.Add("k", v);
  }
  EncodeOptions always;  // (its COLUMNAR payload is under min_zstd_payload)
  always.min_zstd_payload = 0;
  EXPECT_EQ(Header(Encode(text, always)).compression, Compression::kZstd);
  // Asked for no compression: none.
  EncodeOptions none;
  none.compression = Compression::kNone;
  EXPECT_EQ(Header(Encode(big, none)).compression, Compression::kNone);
  // A plain part that compresses (random floats, but only 500 of them: repeats the fast level's
  // match finder still finds) is stored compressed, and says so.
  std::vector<uint64_t> floats;
  for (int i = 0; i < 500; ++i) floats.push_back((uint64_t{0x3ff} << 52) | (g.rng()() >> 12));
  Batch repeats;
  for (int i = 0; i < 4000; ++i) {
    std::string v;
    Gen::MapHeader(&v, 1);
    Gen::Str(&v, "x");
    Gen::F64(&v, floats[g.Below(floats.size())]);
    repeats.Add("k", v);
  }
  const std::string f = Encode(repeats);
  ASSERT_EQ(Header(f).compression, Compression::kZstdSections);
  EXPECT_NE(Parse(f.substr(kFrameHeaderSize)).flags & kSectionsPlainZstd, 0);
  EXPECT_LT(f.size(), 4000u * 8 / 2);
  EXPECT_TRUE(DecodesTo(f, repeats));
  // Past 128 KiB of plain bytes the encoder probes the first 64 KiB: repeats are still found,
  // and random bytes are stored raw without compressing the rest.
  Batch many_repeats, random;
  for (int i = 0; i < 24000; ++i) {
    std::string v;
    Gen::MapHeader(&v, 1);
    Gen::Str(&v, "x");
    Gen::F64(&v, floats[g.Below(floats.size())]);
    many_repeats.Add("k", v);
    v.clear();
    Gen::MapHeader(&v, 1);
    Gen::Str(&v, "x");
    Gen::F64(&v, (uint64_t{0x3ff} << 52) | (g.rng()() >> 12));
    random.Add("k", v);
  }
  const std::string repeated = Encode(many_repeats);
  ASSERT_EQ(Header(repeated).compression, Compression::kZstdSections);
  EXPECT_NE(Parse(repeated.substr(kFrameHeaderSize)).flags & kSectionsPlainZstd, 0);
  EXPECT_TRUE(DecodesTo(repeated, many_repeats));
  // (Nothing else in that frame compresses either: it is stored uncompressed.)
  const std::string raw = Encode(random);
  EXPECT_EQ(Header(raw).compression, Compression::kNone);
  EXPECT_TRUE(DecodesTo(raw, random));
}

TEST(SectionsTest, BothPartsCompressedRoundTripWhicheverIsLarger) {
  // Repeated random floats (a plain part zstd still shrinks) beside text (an entropy part):
  // the decoder decompresses the larger part in place and the other into scratch, then moves
  // every section into place. Both orders of size, and sections alternating many times.
  Gen g(12);
  std::vector<uint64_t> floats;
  for (int i = 0; i < 300; ++i) floats.push_back((uint64_t{0x3ff} << 52) | (g.rng()() >> 12));
  for (int text_words : {1, 12}) {
    Batch b;
    for (int i = 0; i < 3000; ++i) {
      std::string v, text;
      for (int w = 0; w < text_words; ++w) text += i % 7 == 0 ? "alpha " : "beta ";
      Gen::MapHeader(&v, 4);
      Gen::Str(&v, "x");
      Gen::F64(&v, floats[g.Below(floats.size())]);
      Gen::Str(&v, "t");
      Gen::Str(&v, text + std::to_string(g.Below(1000000)));  // distinct: no dictionary
      Gen::Str(&v, "y");
      Gen::F64(&v, floats[g.Below(floats.size())]);
      Gen::Str(&v, "n");
      Gen::Int(&v, static_cast<int64_t>(g.Below(3)));
      b.Add(g.Bytes(2), v);
    }
    const std::string f = Encode(b);
    ASSERT_EQ(Header(f).compression, Compression::kZstdSections) << text_words;
    const Parsed p = Parse(f.substr(kFrameHeaderSize));
    EXPECT_EQ(p.flags, kSectionsEntropyZstd | kSectionsPlainZstd) << text_words;
    EXPECT_GE(p.entries.size(), 4u);
    EXPECT_TRUE(DecodesTo(f, b)) << text_words;
    // The same decoder again, after a different frame: nothing left over from the last one.
    FrameDecoder dec;
    DecodedFrame out;
    ASSERT_TRUE(dec.Decode(Encode(testing::SectionedBatch(g, 1500)), &out).ok());
    ASSERT_TRUE(dec.Decode(f, &out).ok());
    ASSERT_EQ(out.size(), b.size());
    for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(out[i].value, b.values[i]);
  }
}

TEST(SectionsTest, PlainRangesAreJudgedOnEveryBytePosition) {
  auto plain_bytes = [](const Batch& b) {
    ColumnarEncoder enc;
    ByteBuffer payload;
    std::string why;
    EXPECT_TRUE(enc.Encode(b.Records(), &payload, &why)) << why;
    size_t total = 0;
    for (const auto& sp : enc.plain_spans()) total += sp.length;
    return total;
  };
  Gen g(13);
  // Random bytes: plain at every size from the 256-byte minimum up.
  for (int values : {26, 40, 60, 100, 600}) {
    Batch b;
    for (int i = 0; i < values; ++i) {
      std::string v, bytes(10, '\0');
      for (char& c : bytes) c = static_cast<char>(g.rng()());
      Gen::MapHeader(&v, 1);
      Gen::Str(&v, "b");
      Gen::Bin(&v, bytes);
      b.Add("k", v);
    }
    EXPECT_EQ(plain_bytes(b), values * 10u) << values;
  }
  // 11-byte values, one random byte and ten from a skewed few: not plain, whatever the
  // number of values (a sampling stride that divides 11 would see only the random byte).
  for (int values : {100, 1000, 5000}) {
    Batch b;
    for (int i = 0; i < values; ++i) {
      std::string v, bytes(11, 'a');
      bytes[0] = static_cast<char>(g.rng()());
      for (size_t k = 1; k < bytes.size(); ++k) bytes[k] = "aaaabbc"[g.Below(7)];
      Gen::MapHeader(&v, 1);
      Gen::Str(&v, "b");
      Gen::Bin(&v, bytes);
      b.Add("k", v);
    }
    EXPECT_EQ(plain_bytes(b), 0u) << values;
  }
}

TEST(SectionsTest, EverySectionsHeadByteChangeIsRejectedOrHarmless) {
  Gen g(7);
  const Batch b = testing::SectionedBatch(g, 600);
  const std::string frame = Encode(b);
  ASSERT_EQ(Header(frame).compression, Compression::kZstdSections);
  const std::string stored = frame.substr(kFrameHeaderSize);
  const Parsed p = Parse(stored);
  // Resealed (valid checksum): a change to the flags, the section table or the entropy size is
  // rejected or harmless. Inside the parts, zstd data carries no checksum of its own, so a
  // forger can make them decode to other bytes; those must still never crash the decoder.
  for (size_t pos = 0; pos < stored.size(); pos += pos < p.entropy_at + 24 ? 1 : 7) {
    for (int delta : {0x01, 0x02, 0x80, 0xff}) {
      std::string bad = stored;
      bad[pos] = static_cast<char>(bad[pos] ^ delta);
      absl::Status st;
      if (!DecodesTo(Reseal(frame, bad), b, &st) && pos < p.entropy_at) {
        ASSERT_FALSE(st.ok()) << "byte " << pos << " ^ " << delta << " decoded to other records";
      }
    }
  }
  // Not resealed: the frame checksum catches every change, anywhere.
  for (size_t pos = 0; pos < frame.size(); ++pos) {
    std::string bad = frame;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x10);
    ASSERT_FALSE(DecodesTo(bad, b)) << "byte " << pos;
  }
  for (size_t len = 0; len < stored.size(); len += len < p.entropy_at + 8 ? 1 : 13) {
    EXPECT_FALSE(DecodesTo(Reseal(frame, stored.substr(0, len)), b)) << "cut " << len;
  }
}

TEST(SectionsTest, ForgedTablesAreRejectedWithTheirProblem) {
  Gen g(8);
  const Batch b = testing::SectionedBatch(g, 600);
  const std::string frame = Encode(b);
  const std::string stored = frame.substr(kFrameHeaderSize);
  const Parsed p = Parse(stored);
  const std::string parts = stored.substr(p.entropy_at);
  auto expect = [&](const std::string& forged, absl::string_view words) {
    absl::Status st;
    EXPECT_FALSE(DecodesTo(Reseal(frame, forged), b, &st));
    EXPECT_NE(st.message().find(words), absl::string_view::npos) << st;
  };
  ASSERT_TRUE(DecodesTo(Reseal(frame, Build(p.flags, p.entries, p.entropy_stored, parts)), b));
  expect(Build(p.flags | 0x40, p.entries, p.entropy_stored, parts), "unknown flags");
  expect(Build(p.flags, {}, p.entropy_stored, parts), "0 sections");
  std::vector<uint64_t> longer = p.entries;
  longer.back() += 2;  // one byte more than the header declares
  expect(Build(p.flags, longer, p.entropy_stored, parts), "add up to");
  std::vector<uint64_t> zero = p.entries;
  zero.push_back(0);
  expect(Build(p.flags, zero, p.entropy_stored, parts), "has length 0");
  std::vector<uint64_t> swapped = p.entries;  // sections trade kinds: sizes no longer match
  for (uint64_t& e : swapped) e ^= 1;
  expect(Build(p.flags, swapped, p.entropy_stored, parts), "expected");
  expect(Build(p.flags, p.entries, parts.size() + 1, parts), "past the end");
  expect(Build(p.flags, p.entries, p.entropy_stored + 1, parts), "part");
  expect(Build(p.flags | kSectionsPlainZstd, p.entries, p.entropy_stored, parts), "plain part");
  expect(Build(p.flags & ~kSectionsEntropyZstd, p.entries, p.entropy_stored, parts),
         "raw entropy part");
  expect(std::string(), "no flags byte");
  std::string truncated_table(1, static_cast<char>(p.flags));
  truncated_table += '\x05';
  expect(truncated_table, "5 sections for");  // more entries than bytes left
  truncated_table += std::string("\x82\x01\x02\x02\x02", 5);
  expect(truncated_table, "section table truncated");
  // A part that is zstd but flagged with an empty size.
  std::vector<uint64_t> all_plain;
  uint64_t total = 0;
  for (uint64_t e : p.entries) total += e >> 1;
  all_plain.push_back((total << 1) | 1);
  expect(Build(kSectionsEntropyZstd, all_plain, 0, parts), "empty entropy part");
}

TEST(SectionsTest, LargeDictionariesBitPackTheirCodesAndValidateThem) {
  for (int wanted : {300, 600, 1000, 2000}) {
    Batch b;
    Gen g(static_cast<uint64_t>(wanted));
    const int n = wanted * 8;
    std::set<uint64_t> seen;
    for (int i = 0; i < n; ++i) {
      const uint64_t x = g.Below(wanted);
      seen.insert(x);
      std::string v;
      Gen::MapHeader(&v, 1);
      Gen::Str(&v, "name");
      Gen::Str(&v, "value number " + std::to_string(x));
      b.Add("k", v);
    }
    const auto distinct = static_cast<int>(seen.size());
    ASSERT_GT(distinct, 256);
    ColumnarEncoder enc;
    ByteBuffer payload;
    std::string why;
    ASSERT_TRUE(enc.Encode(b.Records(), &payload, &why)) << why;
    uint8_t bits = 1;
    while ((1 << bits) < distinct) ++bits;
    const size_t codes = (static_cast<size_t>(n) * bits + 7) / 8;
    // The field is the last column: its code layout byte, bits byte, then the codes.
    ASSERT_GT(payload.size(), codes + 2);
    const size_t bits_at = payload.size() - codes - 1;
    EXPECT_EQ(payload.data()[bits_at - 1], 4) << "packed code layout, " << distinct;
    EXPECT_EQ(payload.data()[bits_at], bits) << distinct;
    ColumnarDecoder dec;
    ByteBuffer rows;
    PodBuffer<RecordRef> index;
    auto decode = [&](const ByteBuffer& p) {
      return dec.Decode(p.data(), p.size(), static_cast<uint32_t>(n), 1u << 24, &rows, &index);
    };
    ASSERT_TRUE(decode(payload).ok());
    for (int i = 0; i < n; ++i) {
      const RecordRef& r = index[i];
      ASSERT_EQ(std::string(reinterpret_cast<const char*>(rows.data()) + r.value_off, r.value_len),
                b.values[i]);
    }
    auto mutated = [&](size_t at, uint8_t value) {
      ByteBuffer bad;
      bad.Append(payload.data(), payload.size());
      bad.data()[at] = value;
      return decode(bad);
    };
    for (uint8_t wrong : {uint8_t(bits - 1), uint8_t(bits + 1), uint8_t(8), uint8_t(17)}) {
      absl::Status st = mutated(bits_at, wrong);
      EXPECT_FALSE(st.ok()) << int{wrong};
      EXPECT_NE(st.message().find("code width"), std::string::npos) << st;
    }
    // A code past the dictionary: all ones in the first code.
    ByteBuffer bad;
    bad.Append(payload.data(), payload.size());
    bad.data()[bits_at + 1] = 0xff;
    bad.data()[bits_at + 2] |= static_cast<uint8_t>((1 << (bits - 8)) - 1);
    if ((1 << bits) - 1 >= distinct) {
      absl::Status st = decode(bad);
      EXPECT_FALSE(st.ok());
      EXPECT_NE(st.message().find("beyond"), std::string::npos) << st;
    }
    if ((static_cast<size_t>(n) * bits) % 8 != 0) {
      absl::Status st = mutated(payload.size() - 1, payload.data()[payload.size() - 1] | 0x80);
      EXPECT_FALSE(st.ok());
      EXPECT_NE(st.message().find("padding"), std::string::npos) << st;
    }
  }
}

}  // namespace
}  // namespace sluice
