// Writes the fuzz seed corpus: small frames of every layout and compression, each in both
// fuzzer modes (see frame_decoder_fuzzer.cc). Usage: sluice-fuzz-corpus DIR
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "codec/frame_encoder.h"
#include "tests/codec/test_records.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  sluice::testing::Gen g(77);
  std::vector<std::pair<std::string, sluice::testing::Batch>> batches;
  batches.emplace_back("columnar", sluice::testing::ColumnarBatch(g, 5, 4));
  batches.emplace_back("columnar_rawkeys", sluice::testing::ColumnarBatch(g, 3, 2));
  sluice::testing::Batch mp, opaque;
  for (int i = 0; i < 4; ++i) {
    std::string v;
    g.AnyValue(&v, 2);
    mp.Add(g.Bytes(5), v);
    opaque.Add(g.Bytes(5), "\xc1" + g.Bytes(8));
  }
  // A string column of random base62 text: large enough to be stored as 6-bit codes.
  sluice::testing::Batch packed;
  for (int i = 0; i < 12; ++i) {
    std::string text(45 + i, 'a');  // 12 values, 606 characters
    for (char& c : text) {
      c = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[g.Below(62)];
    }
    std::string v;
    sluice::testing::Gen::MapHeader(&v, 1);
    sluice::testing::Gen::Str(&v, "token");
    sluice::testing::Gen::Str(&v, text);
    packed.Add(g.Bytes(3), v);
  }
  batches.emplace_back("columnar_packed", packed);
  // Sequential ids: an integer column stored as first value and step.
  sluice::testing::Batch sequence;
  for (int i = 0; i < 6; ++i) {
    std::string v;
    sluice::testing::Gen::MapHeader(&v, 2);
    sluice::testing::Gen::Str(&v, "id");
    sluice::testing::Gen::Int(&v, 1000 + 3 * i);
    sluice::testing::Gen::Str(&v, "s");
    sluice::testing::Gen::Str(&v, g.Bytes(4));
    sequence.Add(g.Bytes(2), v);
  }
  batches.emplace_back("columnar_sequence", sequence);
  // Random floats and ids: large enough for a ZSTD_SECTIONS frame (plain parts apart).
  batches.emplace_back("columnar_sections", sluice::testing::SectionedBatch(g, 320));
  batches.emplace_back("msgpack", mp);
  batches.emplace_back("opaque", opaque);
  // Bools, a small-range int, a small dictionary and a small-range decimal float: each stored
  // as 1 to 5 bits a value.
  sluice::testing::Batch small;
  for (int i = 0; i < 20; ++i) {
    std::string v;
    sluice::testing::Gen::MapHeader(&v, 4);
    sluice::testing::Gen::Str(&v, "flag");
    v += g.Coin() ? '\xc3' : '\xc2';
    sluice::testing::Gen::Str(&v, "qty");
    sluice::testing::Gen::Int(&v, 1 + static_cast<int64_t>(g.Below(6)));
    sluice::testing::Gen::Str(&v, "dev");
    sluice::testing::Gen::Str(&v, g.Coin() ? "ios" : (g.Coin() ? "web" : "tv"));
    sluice::testing::Gen::Str(&v, "r");
    const double r = static_cast<double>(10 + g.Below(20)) / 10;
    uint64_t bits;
    std::memcpy(&bits, &r, 8);
    sluice::testing::Gen::F64(&v, bits);
    small.Add(g.Bytes(2), v);
  }
  batches.emplace_back("columnar_smallpacked", small);
  // Ids drawn uniformly from 2^20 values: stored as 20-bit offsets from the minimum.
  sluice::testing::Batch uniform;
  for (int i = 0; i < 80; ++i) {
    std::string v;
    sluice::testing::Gen::MapHeader(&v, 1);
    sluice::testing::Gen::Str(&v, "user");
    sluice::testing::Gen::Int(&v, -300'000 + static_cast<int64_t>(g.Below(1 << 20)));
    uniform.Add(g.Bytes(2), v);
  }
  batches.emplace_back("columnar_uniform", uniform);
  // Timestamps rising by 1..20 ms and prices by 0..24 cents: stored as 5-bit steps.
  sluice::testing::Batch delta_packed;
  int64_t ts = 1'730'000'000'000, cents = 1999;
  for (int i = 0; i < 80; ++i) {
    ts += 1 + static_cast<int64_t>(g.Below(20));
    cents += static_cast<int64_t>(g.Below(25));
    std::string v;
    sluice::testing::Gen::MapHeader(&v, 2);
    sluice::testing::Gen::Str(&v, "ts");
    sluice::testing::Gen::Int(&v, ts);
    sluice::testing::Gen::Str(&v, "price");
    const double p = static_cast<double>(cents) / 100;
    uint64_t bits;
    std::memcpy(&bits, &p, 8);
    sluice::testing::Gen::F64(&v, bits);
    std::string key;  // ints in order: frames sorted by key keep the records' order
    sluice::testing::Gen::Int(&key, i);
    delta_packed.Add(key, v);
  }
  batches.emplace_back("columnar_deltapacked", delta_packed);
  int written = 0;
  for (const auto& [name, batch] : batches) {
    for (auto layout : {sluice::LayoutChoice::kOpaque, sluice::LayoutChoice::kMsgpack,
                        sluice::LayoutChoice::kColumnar}) {
      for (auto compression : {sluice::Compression::kNone, sluice::Compression::kZstd}) {
        sluice::EncodeOptions opts;
        opts.layout = layout;
        opts.compression = compression;
        opts.sort_by_key = (written % 3) == 0;
        sluice::FrameEncoder enc(opts);
        std::string frame;
        if (!enc.Encode(batch.Records(), &frame).ok()) continue;
        for (char mode : {'\x00', '\x01'}) {
          const std::string path =
              std::string(argv[1]) + "/" + name + "_" + sluice::LayoutChoiceName(layout) + "_" +
              sluice::CompressionName(compression) + "_" + (mode != 0 ? "resealed" : "raw");
          std::ofstream f(path, std::ios::binary);
          f.put(mode);
          f.write(frame.data(), static_cast<std::streamsize>(frame.size()));
          ++written;
        }
      }
    }
  }
  std::printf("wrote %d seed frames to %s\n", written, argv[1]);
  return 0;
}
