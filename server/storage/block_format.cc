#include "server/storage/block_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/endian.h"
#include "codec/frame_format.h"

namespace sluice {
namespace {

constexpr char kParamsMagic[4] = {'S', 'L', 'S', 'H'};
constexpr char kEvictedMagic[4] = {'S', 'L', 'E', 'V'};
constexpr uint8_t kEvictedVersion = 1;
constexpr char kBlockMagic[4] = {'S', 'L', 'B', 'K'};
// The layout SHUFFLE names: 3 since a shuffle's blocks live in one data file.
constexpr uint8_t kParamsVersion = 3;
// Version 2 blocks name their partition (bytes 5-6).
constexpr uint8_t kBlockVersion = 2;

uint32_t Check32(const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(PayloadChecksum(p, n));
}

}  // namespace

std::string EncodeParams(const ShuffleParams& p) {
  std::string s(kParamsMagic, 4);
  s.push_back(static_cast<char>(kParamsVersion));
  AppendLE32(&s, p.num_partitions);
  AppendLE32(&s, p.num_mappers);
  AppendLE32(&s, static_cast<uint32_t>(p.shuffle_id.size()));
  s += p.shuffle_id;
  AppendLE64(&s, PayloadChecksum(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  return s;
}

absl::StatusOr<ShuffleParams> DecodeParams(const std::string& s, const std::string& path) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  if (s.size() < 4 + 1 + 12 + 8 || std::memcmp(p, kParamsMagic, 4) != 0) {
    return bad("not a Sluice shuffle parameters file");
  }
  if (p[4] < kParamsVersion && p[4] >= 1) {
    return absl::DataLossError(
        absl::StrCat(path, " is of layout ", p[4],
                     ", written by a pre-release server; this server reads layout ", kParamsVersion,
                     " only: delete the shuffle (DeleteShuffle) and write it again"));
  }
  if (p[4] != kParamsVersion) return bad(absl::StrCat("unsupported version ", p[4]));
  const uint32_t id_len = LoadLE32(p + 13);
  if (s.size() != 17 + static_cast<size_t>(id_len) + 8) return bad("wrong size");
  if (LoadLE64(p + 17 + id_len) != PayloadChecksum(p, 17 + id_len)) return bad("bad checksum");
  ShuffleParams params;
  params.num_partitions = LoadLE32(p + 5);
  if (params.num_partitions == 0 || params.num_partitions > kMaxPartitions) {
    return bad(absl::StrCat("impossible partition count ", params.num_partitions));
  }
  params.num_mappers = LoadLE32(p + 9);
  params.shuffle_id.assign(s.data() + 17, id_len);
  return params;
}

std::string EncodeEvicted(const EvictedSummary& e) {
  std::string s(kEvictedMagic, 4);
  s.push_back(static_cast<char>(kEvictedVersion));
  AppendLE32(&s, static_cast<uint32_t>(e.partitions.size()));
  AppendLE32(&s, static_cast<uint32_t>(e.winners.size()));
  for (const auto& [m, attempt] : e.winners) {
    AppendLE32(&s, m);
    AppendLE64(&s, attempt);
  }
  for (const PartitionStats& p : e.partitions) {
    AppendLE64(&s, p.records);
    AppendLE64(&s, p.bytes);
    AppendLE32(&s, p.frames);
  }
  AppendLE64(&s, PayloadChecksum(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  return s;
}

absl::StatusOr<EvictedSummary> DecodeEvicted(const std::string& s, uint32_t partitions,
                                             const std::string& path) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  if (s.size() < 4 + 1 + 8 + 8 || std::memcmp(p, kEvictedMagic, 4) != 0) {
    return bad("not a Sluice evicted-shuffle file");
  }
  if (p[4] != kEvictedVersion) return bad(absl::StrCat("unsupported version ", p[4]));
  const uint32_t count = LoadLE32(p + 5), winners = LoadLE32(p + 9);
  if (count != partitions) {
    return bad(absl::StrCat("names ", count, " partitions, the shuffle has ", partitions));
  }
  const uint64_t want = 13 + uint64_t{winners} * 12 + uint64_t{count} * 20 + 8;
  if (s.size() != want) return bad("wrong size");
  if (LoadLE64(p + want - 8) != PayloadChecksum(p, want - 8)) return bad("bad checksum");
  EvictedSummary e;
  const uint8_t* at = p + 13;
  for (uint32_t i = 0; i < winners; ++i, at += 12) {
    if (!e.winners.emplace(LoadLE32(at), LoadLE64(at + 4)).second) return bad("a mapper twice");
  }
  e.partitions.resize(count);
  for (PartitionStats& ps : e.partitions) {
    ps.records = LoadLE64(at);
    ps.bytes = LoadLE64(at + 8);
    ps.frames = LoadLE32(at + 16);
    at += 20;
  }
  return e;
}

void WriteBlockHeader(uint32_t partition, uint32_t mapper, uint64_t attempt, uint32_t frame_size,
                      uint32_t records, uint8_t* h) {
  std::memset(h, 0, kBlockHeaderSize);
  std::memcpy(h, kBlockMagic, 4);
  h[4] = kBlockVersion;
  h[5] = static_cast<uint8_t>(partition & 0xff);
  h[6] = static_cast<uint8_t>(partition >> 8);
  StoreLE32(h + 8, mapper);
  StoreLE64(h + 12, attempt);
  StoreLE32(h + 20, frame_size);
  StoreLE32(h + 24, records);
  StoreLE32(h + 28, Check32(h, 28));
}

bool BlockHeaderMatches(const uint8_t* h, uint32_t mapper, uint64_t attempt, const BlockRef& b) {
  const uint32_t partition = h[5] | static_cast<uint32_t>(h[6]) << 8;
  return std::memcmp(h, kBlockMagic, 4) == 0 && h[4] == kBlockVersion &&
         LoadLE32(h + 28) == Check32(h, 28) && partition == b.partition && h[7] == 0 &&
         LoadLE32(h + 8) == mapper && LoadLE64(h + 12) == attempt &&
         LoadLE32(h + 20) == b.frame_size && LoadLE32(h + 24) == b.records;
}

}  // namespace sluice
