// Untrusted frames: every single-byte change and every truncation of small frames is either
// rejected or decodes to exactly the original records; forged frames (valid checksums over bad
// structure) are rejected with a message that names the problem.
#include <gtest/gtest.h>
#include <zstd.h>

#include <string>

#include "codec/endian.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "tests/codec/test_records.h"

namespace sluice {
namespace {

using testing::Batch;
using testing::Forge;
using testing::Gen;

std::vector<std::pair<std::string, Batch>> SmallBatches() {
  Gen g(11);
  std::vector<std::pair<std::string, Batch>> out;
  // Small on purpose: every byte of every frame is mutated.
  auto small_columnar = [&g](size_t n, size_t fields) {
    for (;;) {
      testing::Batch b = testing::ColumnarBatch(g, n, fields);
      size_t bytes = 0;
      for (size_t i = 0; i < b.size(); ++i) bytes += b.keys[i].size() + b.values[i].size();
      if (bytes < 400) return b;
    }
  };
  out.emplace_back("columnar", small_columnar(6, 3));
  out.emplace_back("columnar_wide", small_columnar(4, 6));
  Batch mp;
  for (int i = 0; i < 5; ++i) {
    std::string v;
    g.AnyValue(&v, 2);
    mp.Add(g.Bytes(4), v);
  }
  out.emplace_back("msgpack", mp);
  Batch opaque;
  for (int i = 0; i < 5; ++i) opaque.Add(g.Bytes(4), "\xc1" + g.Bytes(6));
  out.emplace_back("opaque", opaque);
  return out;
}

bool DecodesTo(FrameDecoder& dec, const std::string& frame, const std::vector<Record>& want) {
  DecodedFrame out;
  if (!dec.Decode(frame, &out).ok()) {
    EXPECT_EQ(out.size(), 0u);  // a failed decode leaves nothing behind
    return false;
  }
  if (out.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (out[i].key != want[i].key || out[i].value != want[i].value) return false;
  }
  return true;
}

TEST(FrameCorruptionTest, EveryByteChangeAndTruncationIsRejectedOrHarmless) {
  for (const auto& [name, batch] : SmallBatches()) {
    for (auto choice : {LayoutChoice::kOpaque, LayoutChoice::kMsgpack, LayoutChoice::kColumnar}) {
      if (name == "opaque" && choice != LayoutChoice::kOpaque) continue;
      for (auto compression : {Compression::kNone, Compression::kZstd}) {
        EncodeOptions opts;
        opts.layout = choice;
        opts.compression = compression;
        FrameEncoder enc(opts);
        std::string frame;
        const auto records = batch.Records();
        ASSERT_TRUE(enc.Encode(records, &frame).ok());
        FrameDecoder dec;
        ASSERT_TRUE(DecodesTo(dec, frame, records));
        size_t accepted_changes = 0;
        for (size_t pos = 0; pos < frame.size(); ++pos) {
          for (int delta : {0x01, 0x80, 0xff, 0x10}) {
            std::string bad = frame;
            bad[pos] = static_cast<char>(bad[pos] ^ delta);
            DecodedFrame out;
            if (dec.Decode(bad, &out).ok()) {
              ++accepted_changes;
              ASSERT_TRUE(DecodesTo(dec, bad, records))
                  << name << " " << LayoutChoiceName(choice) << " byte " << pos;
            }
          }
        }
        // Checksums cover every byte, so in practice nothing is accepted.
        EXPECT_EQ(accepted_changes, 0u) << name;
        for (size_t len = 0; len < frame.size(); ++len) {
          DecodedFrame out;
          ASSERT_FALSE(dec.Decode(frame.substr(0, len), &out).ok()) << name << " cut " << len;
        }
        DecodedFrame out;
        EXPECT_FALSE(dec.Decode(frame + "x", &out).ok());
      }
    }
  }
}

absl::Status DecodeStatus(const std::string& frame, DecodeOptions opts = {}) {
  FrameDecoder dec(opts);
  DecodedFrame out;
  return dec.Decode(frame, &out);
}

void ExpectRejected(const std::string& frame, absl::string_view words, DecodeOptions opts = {}) {
  absl::Status st = DecodeStatus(frame, opts);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(words), absl::string_view::npos) << st;
}

std::string OpaqueRow(const std::string& k, const std::string& v) {
  std::string o;
  o.push_back(static_cast<char>(k.size()));
  o += k;
  o.push_back(static_cast<char>(v.size()));
  o += v;
  return o;
}

TEST(FrameValidationTest, HeaderProblemsAreNamed) {
  const std::string ok = Forge(Layout::kOpaque, Compression::kNone, 0, 1, 4, OpaqueRow("a", "b"));
  ASSERT_TRUE(DecodeStatus(ok).ok());
  ExpectRejected(ok.substr(0, 10), "truncated");
  std::string bad_magic = ok;
  bad_magic[0] = 'X';
  ExpectRejected(bad_magic, "magic");
  std::string bad_version = ok;
  bad_version[4] = 9;
  ExpectRejected(bad_version, "version 9");
  std::string bad_header = ok;
  bad_header[8] = 2;  // record count changed without fixing the header checksum
  ExpectRejected(bad_header, "header checksum");
  std::string bad_payload = ok;
  bad_payload.back() ^= 1;
  ExpectRejected(bad_payload, "payload checksum");
  ExpectRejected(ok + "zz", "trailing");
}

TEST(FrameValidationTest, UnknownTagsAndFlagsAreNamed) {
  std::string f = Forge(Layout::kOpaque, Compression::kNone, 0, 1, 4, OpaqueRow("a", "b"));
  // Rewrite tag bytes and re-seal the header checksum.
  auto reseal = [](std::string s, size_t pos, uint8_t v) {
    s[pos] = static_cast<char>(v);
    auto* p = reinterpret_cast<uint8_t*>(s.data());
    FrameHeader h;
    h.layout = static_cast<Layout>(p[5]);
    h.compression = static_cast<Compression>(p[6]);
    h.flags = p[7];
    h.record_count = LoadLE32(p + 8);
    h.uncompressed_size = LoadLE32(p + 12);
    h.stored_size = LoadLE32(p + 16);
    h.payload_checksum = LoadLE64(p + 20);
    WriteFrameHeader(h, p);
    return s;
  };
  ExpectRejected(reseal(f, 5, 0x07), "unknown format tag 0x07");
  ExpectRejected(reseal(f, 6, 0x05), "unknown compression tag 0x05");
  ExpectRejected(reseal(f, 7, 0x80), "unknown frame flags 0x80");
}

TEST(FrameValidationTest, SizesOverTheCapAreRejectedBeforeAllocation) {
  DecodeOptions small;
  small.limits.max_uncompressed_bytes = 1024;
  ExpectRejected(Forge(Layout::kOpaque, Compression::kZstd, 0, 1, 1u << 30, "xx"),
                 "exceeds the cap", small);
  ExpectRejected(Forge(Layout::kOpaque, Compression::kNone, 0, 1, 2000, std::string(2000, 'a')),
                 "exceeds the cap", small);
  DecodeOptions few;
  few.limits.max_records = 10;
  ExpectRejected(Forge(Layout::kOpaque, Compression::kNone, 0, 11, 4, OpaqueRow("a", "b")),
                 "record count 11 exceeds the limit", few);
}

TEST(FrameValidationTest, ZstdBombIsRefused) {
  // 10 MiB of zeros compress to a few hundred bytes; the header claims 1 KiB.
  const std::string zeros(10u << 20, '\0');
  std::string z(ZSTD_compressBound(zeros.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), zeros.data(), zeros.size(), 3));
  ExpectRejected(Forge(Layout::kOpaque, Compression::kZstd, 0, 1, 1024, z), "expands to");
  // Same bomb without a content size in the zstd header: decompression stops at the cap.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  std::string z2(ZSTD_compressBound(zeros.size()), '\0');
  z2.resize(ZSTD_compress2(cctx, z2.data(), z2.size(), zeros.data(), zeros.size()));
  ZSTD_freeCCtx(cctx);
  ExpectRejected(Forge(Layout::kOpaque, Compression::kZstd, 0, 1, 1024, z2), "zstd");
  ExpectRejected(Forge(Layout::kOpaque, Compression::kZstd, 0, 1, 4, "not zstd"), "zstd");
}

TEST(FrameValidationTest, RecordCountMismatchesAreNamed) {
  const std::string rows = OpaqueRow("a", "b") + OpaqueRow("c", "d");
  ExpectRejected(Forge(Layout::kOpaque, Compression::kNone, 0, 1, 8, rows), "bytes after the 1");
  ExpectRejected(Forge(Layout::kOpaque, Compression::kNone, 0, 3, 8, rows), "record 2");
  ExpectRejected(Forge(Layout::kOpaque, Compression::kNone, 0, 1000, 8, rows), "impossible");
}

TEST(FrameValidationTest, MsgpackPayloadProblemsAreNamed) {
  const std::string good("\xc4\x01k\x01", 4);  // key bin "k", value 1
  ASSERT_TRUE(DecodeStatus(Forge(Layout::kMsgpack, Compression::kNone, 0, 1, 4, good)).ok());
  ExpectRejected(Forge(Layout::kMsgpack, Compression::kNone, 0, 1, 3, std::string("\x01k\x01", 3)),
                 "not a msgpack bin");
  ExpectRejected(
      Forge(Layout::kMsgpack, Compression::kNone, 0, 1, 4, std::string("\xc4\x01k\xc1", 4)),
      "reserved");
  ExpectRejected(
      Forge(Layout::kMsgpack, Compression::kNone, 0, 1, 4, std::string("\xc4\x01k\x92", 4)),
      "truncated");
}

TEST(FrameValidationTest, FalseSortedFlagIsCaught) {
  const std::string rows = OpaqueRow("b", "1") + OpaqueRow("a", "2");
  ExpectRejected(Forge(Layout::kOpaque, Compression::kNone, kFlagSortedByKey, 2, 8, rows),
                 "flagged sorted");
  DecodeOptions trusting;
  trusting.verify_sorted = false;
  EXPECT_TRUE(DecodeStatus(Forge(Layout::kOpaque, Compression::kNone, kFlagSortedByKey, 2, 8, rows),
                           trusting)
                  .ok());
}

TEST(FrameValidationTest, ForgedColumnarPayloadsNeverCrash) {
  // Mutate valid COLUMNAR payloads and re-seal them with correct checksums: the structural
  // checks alone must reject or decode them, within the cap.
  Gen g(21);
  DecodeOptions opts;
  opts.limits.max_uncompressed_bytes = 1 << 20;
  FrameDecoder dec(opts);
  for (int iter = 0; iter < 40; ++iter) {
    const Batch b = testing::ColumnarBatch(g, 1 + g.Below(20), g.Below(5));
    EncodeOptions eo;
    eo.layout = LayoutChoice::kColumnar;
    eo.compression = Compression::kNone;
    FrameEncoder enc(eo);
    std::string frame;
    ASSERT_TRUE(enc.Encode(b.Records(), &frame).ok());
    ASSERT_EQ(enc.last_layout(), Layout::kColumnar);
    const std::string payload = frame.substr(kFrameHeaderSize);
    // Every position of small payloads, a sample of large ones.
    const size_t step = payload.size() / 400 + 1;
    for (size_t pos = 0; pos < payload.size(); pos += step) {
      std::string bad = payload;
      bad[pos] = static_cast<char>(g.rng()());
      DecodedFrame out;
      (void)dec.Decode(
          Forge(Layout::kColumnar, Compression::kNone, 0, static_cast<uint32_t>(b.size()),
                static_cast<uint32_t>(bad.size()), bad),
          &out);
      for (const Record& r : out) {
        ASSERT_LE(r.key.size() + r.value.size(), opts.limits.max_uncompressed_bytes);
      }
    }
  }
}

TEST(FrameValidationTest, ColumnarRebuildOverTheCapIsRejected) {
  // One field with a 1000-byte name and 1000 nil values rebuilds to ~1 MB from ~1 KB.
  std::string payload;
  payload.push_back(1);                   // one field
  payload += std::string("\xe8\x07", 2);  // name length 1000 (varint)
  payload += std::string(1000, 'n');
  payload.push_back(0);  // key column: nil
  payload.push_back(0);  // field column: nil
  DecodeOptions opts;
  opts.limits.max_uncompressed_bytes = 100000;
  // Refused before any column is read: every record needs at least its 1,000-byte name.
  ExpectRejected(Forge(Layout::kColumnar, Compression::kNone, 0, 1000,
                       static_cast<uint32_t>(payload.size()), payload),
                 "cannot fit the rows cap", opts);

  // Short names, but every record refers to one 1,000-byte dictionary entry: refused once the
  // columns are read and the rebuilt size is known.
  std::string dict;
  dict.push_back(1);  // one field
  dict.push_back(1);  // name length 1
  dict.push_back('s');
  dict.push_back(0);                   // key column: nil
  dict.push_back(5);                   // field column: str
  dict.push_back(1);                   // dictionary
  dict.push_back(1);                   // one entry
  dict += std::string("\xe8\x07", 2);  // its length, 1000
  dict += std::string("\xe8\x07", 2);  // total 1000
  dict += std::string(1000, 'v');
  dict.push_back(1);  // one-byte codes
  dict += std::string(1000, '\0');
  ExpectRejected(Forge(Layout::kColumnar, Compression::kNone, 0, 1000,
                       static_cast<uint32_t>(dict.size()), dict),
                 "over the cap", opts);
  DecodeOptions roomy;
  roomy.limits.max_uncompressed_bytes = 2'000'000;
  EXPECT_TRUE(DecodeStatus(Forge(Layout::kColumnar, Compression::kNone, 0, 1000,
                                 static_cast<uint32_t>(dict.size()), dict),
                           roomy)
                  .ok());
}

}  // namespace
}  // namespace sluice
