// sluice-fill: writes committed shuffles into a data directory through the server's own storage
// code, with no server and no network (only the bytes on disk matter): what the start benchmarks
// start a server on (bench/restart_bench.sh, docs/benchmarks.md, "Start").
//
//   sluice-fill --data_dir D --shuffles N --partitions P --mappers M --frames F --frame_bytes B
//       [--log_version V] [--bounds 0]
//
// Shuffles s0..s<N-1>, each of P partitions and M mappers, every mapper F frames of B
// incompressible bytes to each partition, each mapper's attempt 1 committed. --log_version 3
// writes the logs servers before fast start read (to compare a start against such a server);
// --bounds 0 notes no key bounds, as before log version 7. Prints one JSON line.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/key_bounds.h"
#include "server/storage/shuffle_store.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

// --name value pairs.
struct Args {
  std::map<std::string, std::string> one;
  std::string Get(const std::string& k, const std::string& def = "") const {
    auto it = one.find(k);
    return it == one.end() ? def : it->second;
  }
  uint64_t Num(const std::string& k, uint64_t def) const {
    auto it = one.find(k);
    return it == one.end() ? def : std::strtoull(it->second.c_str(), nullptr, 10);
  }
};

bool ParseArgs(int argc, char** argv, Args* out) {
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc || std::string(argv[i]).rfind("--", 0) != 0) return false;
    out->one[std::string(argv[i]).substr(2)] = argv[i + 1];
  }
  return true;
}

// One frame of a single record whose value is `bytes` incompressible bytes, stored uncompressed.
std::string IncompressibleFrame(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string value(bytes, '\0');
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t x = rng();
    std::memcpy(&value[i], &x, 8);
  }
  EncodeOptions opts;
  opts.layout = LayoutChoice::kOpaque;
  opts.compression = Compression::kNone;
  FrameEncoder enc(opts);
  std::string frame;
  std::vector<Record> records{Record{"key", value}};
  if (!enc.Encode(records, &frame).ok()) std::abort();
  return frame;
}

int Fill(const Args& a) {
  const std::string dir = a.Get("data_dir");
  const uint64_t shuffles = a.Num("shuffles", 1), partitions = a.Num("partitions", 8),
                 mappers = a.Num("mappers", 8), frames = a.Num("frames", 1),
                 frame_bytes = a.Num("frame_bytes", 1 << 20);
  if (dir.empty() || partitions == 0 || partitions > kMaxPartitions || mappers == 0) {
    std::fprintf(stderr, "sluice-fill: --data_dir, --partitions 1..65536, --mappers >= 1\n");
    return 2;
  }
  StoreOptions options;
  options.fsync = false;  // (synced once at the end)
  options.log_version = static_cast<uint32_t>(a.Num("log_version", kLogVersion));
  const std::string frame = IncompressibleFrame(frame_bytes, 1);
  // Each frame's key bounds, as a push takes them (--bounds 0: none, as before log version 7).
  std::string bounds;
  if (a.Num("bounds", 1) != 0 && options.log_version >= kFirstBoundsLogVersion) {
    FrameDecoder decoder;
    DecodedFrame decoded;
    std::vector<std::string_view> keys;
    if (!decoder.Decode(frame, &decoded).ok()) std::abort();
    AppendFrameBounds(decoded, &bounds, &keys);
  }
  std::filesystem::create_directories(dir + "/shuffles");
  const auto began = Clock::now();
  uint64_t total = 0, count = 0;
  std::vector<ShuffleStore::FrameToAppend> batch;
  std::vector<BlockRef> blocks;
  for (uint64_t s = 0; s < shuffles; ++s) {
    const std::string id = absl::StrCat("s", s);
    auto store = ShuffleStore::Create(
        absl::StrCat(dir, "/shuffles/", id), "shuffles/" + id,
        ShuffleParams{id, static_cast<uint32_t>(partitions), static_cast<uint32_t>(mappers)},
        options);
    if (!store.ok()) {
      std::fprintf(stderr, "sluice-fill: %s\n", store.status().ToString().c_str());
      return 1;
    }
    for (uint32_t m = 0; m < mappers; ++m) {
      blocks.clear();
      // A message's worth at a time (as a push writes them): at most 4 MiB or 4,096 frames.
      for (uint32_t p = 0; p < partitions; ++p) {
        for (uint64_t f = 0; f < frames; ++f) {
          batch.push_back(
              {p, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size()),
               1, bounds});
          if (batch.size() >= 4096 || batch.size() * frame.size() >= (4u << 20)) {
            if (!(*store)->AppendAll(m, 1, batch, &blocks).ok()) return 1;
            batch.clear();
          }
        }
      }
      if (!batch.empty() && !(*store)->AppendAll(m, 1, batch, &blocks).ok()) return 1;
      batch.clear();
      if (!(*store)->Commit(m, 1, blocks).ok()) return 1;
      count += blocks.size();
      total += blocks.size() * (frame.size() + kBlockHeaderSize);
    }
  }
  ::sync();
  std::printf(
      "{\"filled\": %llu, \"frames\": %llu, \"bytes\": %llu, \"frame_bytes\": %zu, "
      "\"log_version\": %u, \"seconds\": %.1f}\n",
      static_cast<unsigned long long>(shuffles), static_cast<unsigned long long>(count),
      static_cast<unsigned long long>(total), frame.size(), options.log_version,
      std::chrono::duration<double>(Clock::now() - began).count());
  return 0;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  sluice::Args a;
  if (!sluice::ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: sluice-fill --data_dir D --shuffles N --partitions P --mappers M "
                 "--frames F --frame_bytes B [--log_version V] [--bounds 0]\n");
    return 2;
  }
  return sluice::Fill(a);
}
