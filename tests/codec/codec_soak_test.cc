// Codec soak: random batches of every shape through encoders and decoders reused across all of
// them, for SLUICE_SOAK_SECONDS (default 60). Labelled "soak": `bash deploy/dev.sh soak [SEC]`
// runs it; the default test run does not.
//
// Each round checks, on one random batch and encoding:
//  - the frame decodes to exactly the batch (sorted by key when asked), through a decoder that
//    has decoded every earlier frame and through a fresh one, and keys-only to the same keys;
//  - damage the checksum covers (one byte changed, or the frame cut short) is rejected or
//    decodes to exactly the batch — never to anything else;
//  - an uncompressed payload changed and re-sealed with a valid checksum (as an attacker
//    could) gets the same answer from the reused decoder as from a fresh one, keys-only
//    accepts exactly when the full decode does, and no decoder holds more than the cap's
//    worth of scratch afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "tests/codec/test_records.h"

namespace sluice {
namespace {

using testing::Batch;
using testing::Gen;

double SoakSeconds() {
  const char* s = std::getenv("SLUICE_SOAK_SECONDS");
  return s != nullptr ? std::atof(s) : 60.0;
}

// A record count: often right around the decoder's 256-record chunks.
size_t RandomCount(Gen& g) {
  switch (g.Below(4)) {
    case 0:
      return 1 + g.Below(40);
    case 1: {
      const size_t c = 256 * (1 + g.Below(8));
      return c - 1 + g.Below(3);
    }
    case 2:
      return 1 + g.Below(3000);
    default:
      return 1 + g.Below(600);
  }
}

// A batch of one of the shapes the encoder tells apart.
Batch RandomBatch(Gen& g, bool* msgpack_values) {
  *msgpack_values = true;
  const size_t n = RandomCount(g);
  switch (g.Below(5)) {
    case 0:
    case 1:
      return testing::ColumnarBatch(g, n, g.Below(13));
    case 2:
      return testing::SectionedBatch(g, n);
    case 3: {  // anything msgpack: nested, mixed, heterogeneous
      Batch b;
      for (size_t i = 0; i < n; ++i) {
        std::string v;
        g.AnyValue(&v, 3);
        b.Add(g.Bytes(12), std::move(v));
      }
      return b;
    }
    default: {  // opaque bytes
      *msgpack_values = false;
      Batch b;
      for (size_t i = 0; i < n; ++i) b.Add(g.Bytes(20), g.Bytes(g.Coin() ? 8 : 300));
      return b;
    }
  }
}

// The records a decode should give back: the batch, stably sorted by key when asked.
std::vector<Record> Expected(const Batch& b, bool sorted) {
  std::vector<Record> r = b.Records();
  if (sorted) {
    std::stable_sort(r.begin(), r.end(),
                     [](const Record& x, const Record& y) { return x.key < y.key; });
  }
  return r;
}

bool SameRecords(const DecodedFrame& got, const std::vector<Record>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i].key != want[i].key || got[i].value != want[i].value) return false;
  }
  return true;
}

// A digest of a decode's outcome, to compare two decoders' answers.
std::string Outcome(const absl::Status& st, const DecodedFrame& f, bool keys_only) {
  if (!st.ok()) return "error: " + std::string(st.message());
  std::string out = std::to_string(f.size()) + ":";
  for (size_t i = 0; i < f.size(); ++i) {
    out.append(f[i].key);
    out.push_back('\x01');
    if (!keys_only) out.append(f[i].value);
    out.push_back('\x02');
  }
  return out;
}

TEST(CodecSoak, RandomFramesRoundTripAndDamageNeverDecodesToAnythingElse) {
  const double seconds = SoakSeconds();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  // Encoders for a few option sets, each reused for every batch it gets.
  constexpr LayoutChoice kLayouts[] = {LayoutChoice::kAuto, LayoutChoice::kColumnar,
                                       LayoutChoice::kMsgpack, LayoutChoice::kOpaque};
  std::vector<std::unique_ptr<FrameEncoder>> encoders;
  std::vector<EncodeOptions> encoder_options;
  for (const LayoutChoice layout : kLayouts) {
    for (const bool zstd : {false, true}) {
      for (const bool sort : {false, true}) {
        EncodeOptions o;
        o.layout = layout;
        o.compression = zstd ? Compression::kZstd : Compression::kNone;
        o.zstd_level = 1 + static_cast<int>(encoders.size() % 5);
        o.sort_by_key = sort;
        o.plain_sections = encoders.size() % 3 != 0;
        encoder_options.push_back(o);
        encoders.push_back(std::make_unique<FrameEncoder>(o));
      }
    }
  }
  FrameDecoder reused;
  DecodeOptions keys_options;
  keys_options.keys_only = true;
  FrameDecoder reused_keys(keys_options);
  DecodedFrame out, fresh_out, keys_out;
  const size_t cap = FrameLimits().max_uncompressed_bytes;

  uint64_t rounds = 0, records = 0, damaged = 0, damaged_accepted = 0, forged = 0,
           forged_accepted = 0;
  Gen g(20261130);
  while (std::chrono::steady_clock::now() < deadline) {
    ++rounds;
    bool msgpack_values;
    const Batch b = RandomBatch(g, &msgpack_values);
    size_t e = g.Below(encoders.size());
    const LayoutChoice layout = encoder_options[e].layout;
    if (!msgpack_values && layout != LayoutChoice::kAuto && layout != LayoutChoice::kOpaque) {
      e = e % 4;  // AUTO: the first four option sets
    }
    const EncodeOptions& eo = encoder_options[e];
    std::string frame;
    const absl::Status est = encoders[e]->Encode(b.Records(), &frame);
    ASSERT_TRUE(est.ok()) << "round " << rounds << ": " << est;
    const std::vector<Record> want = Expected(b, eo.sort_by_key);
    records += want.size();

    // Clean: reused, fresh and keys-only decoders.
    absl::Status st = reused.Decode(frame, &out);
    ASSERT_TRUE(st.ok()) << "round " << rounds << ": " << st;
    ASSERT_TRUE(SameRecords(out, want)) << "round " << rounds;
    FrameDecoder fresh;
    ASSERT_TRUE(fresh.Decode(frame, &fresh_out).ok()) << "round " << rounds;
    ASSERT_TRUE(SameRecords(fresh_out, want)) << "round " << rounds;
    ASSERT_TRUE(reused_keys.Decode(frame, &keys_out).ok()) << "round " << rounds;
    ASSERT_EQ(keys_out.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(keys_out[i].key, want[i].key) << "round " << rounds << " record " << i;
    }

    // Damage the checksum covers: rejected, or exactly the batch.
    for (int k = 0; k < 4; ++k) {
      std::string bad = frame;
      if (g.Coin()) {
        bad.resize(g.Below(bad.size()));
      } else {
        bad[g.Below(bad.size())] ^= static_cast<char>(1 + g.Below(255));
      }
      ++damaged;
      if (reused.Decode(bad, &out).ok()) {
        ++damaged_accepted;
        ASSERT_TRUE(SameRecords(out, want)) << "round " << rounds << ": damage decoded wrong";
      }
    }

    // Forged: an uncompressed payload changed and re-sealed with a valid checksum.
    if (eo.compression == Compression::kNone && frame.size() > kFrameHeaderSize) {
      const absl::StatusOr<FrameHeader> parsed = ParseFrameHeader(
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size()));
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      const FrameHeader& h = *parsed;
      if (h.compression == Compression::kNone) {
        for (int k = 0; k < 4; ++k) {
          std::string payload = frame.substr(kFrameHeaderSize);
          const int edits = 1 + static_cast<int>(g.Below(3));
          for (int m = 0; m < edits && !payload.empty(); ++m) {
            payload[g.Below(payload.size())] = static_cast<char>(g.Coin() ? g.Below(256) : 0xff);
          }
          uint32_t count = h.record_count;
          if (g.Below(8) == 0) count += static_cast<uint32_t>(g.Below(5)) - 2;
          const std::string forged_frame =
              testing::Forge(h.layout, Compression::kNone, h.flags, count,
                             static_cast<uint32_t>(payload.size()), payload);
          ++forged;
          const absl::Status rs = reused.Decode(forged_frame, &out);
          FrameDecoder fresh2;
          const absl::Status fs = fresh2.Decode(forged_frame, &fresh_out);
          ASSERT_EQ(Outcome(rs, out, false), Outcome(fs, fresh_out, false))
              << "round " << rounds << ": a reused decoder answered differently";
          const absl::Status ks = reused_keys.Decode(forged_frame, &keys_out);
          ASSERT_EQ(rs.ok(), ks.ok()) << "round " << rounds << ": " << rs << " / " << ks;
          if (rs.ok()) {
            ++forged_accepted;
            ASSERT_EQ(Outcome(ks, keys_out, true), Outcome(rs, out, true)) << "round " << rounds;
          }
        }
      }
    }
    ASSERT_LE(reused.scratch_bytes(), 2 * cap) << "round " << rounds;
    ASSERT_LE(reused_keys.scratch_bytes(), 2 * cap) << "round " << rounds;
  }
  std::printf(
      "soak: %.0f s, %llu rounds, %llu records; %llu damaged frames (%llu decoded, all "
      "exactly); %llu forged payloads (%llu accepted), reused and fresh decoders agreeing\n",
      seconds, static_cast<unsigned long long>(rounds), static_cast<unsigned long long>(records),
      static_cast<unsigned long long>(damaged), static_cast<unsigned long long>(damaged_accepted),
      static_cast<unsigned long long>(forged), static_cast<unsigned long long>(forged_accepted));
  EXPECT_GT(rounds, 0u);
}

}  // namespace
}  // namespace sluice
