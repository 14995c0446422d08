#include "codec/frame_format.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "absl/strings/str_cat.h"
#include "codec/endian.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace sluice {

const char* LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kOpaque:
      return "OPAQUE";
    case Layout::kMsgpack:
      return "MSGPACK";
    case Layout::kColumnar:
      return "COLUMNAR";
  }
  return "UNKNOWN";
}

const char* LayoutChoiceName(LayoutChoice choice) {
  if (choice == LayoutChoice::kAuto) return "AUTO";
  return LayoutName(static_cast<Layout>(choice));
}

const char* CompressionName(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return "NONE";
    case Compression::kZstd:
      return "ZSTD";
    case Compression::kZstdSections:
      return "ZSTD_SECTIONS";
  }
  return "UNKNOWN";
}

absl::StatusOr<LayoutChoice> ParseLayoutChoice(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "opaque") return LayoutChoice::kOpaque;
  if (lower == "msgpack") return LayoutChoice::kMsgpack;
  if (lower == "columnar") return LayoutChoice::kColumnar;
  if (lower == "auto") return LayoutChoice::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown layout '", lower, "' (expected opaque, msgpack, columnar or auto)"));
}

uint64_t PayloadChecksum(const uint8_t* data, size_t n) { return XXH3_64bits(data, n); }

PayloadHasher::PayloadHasher() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
PayloadHasher::~PayloadHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void PayloadHasher::Update(const uint8_t* data, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n);
}
uint64_t PayloadHasher::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

static uint32_t HeaderCheck(const uint8_t* header) {
  return static_cast<uint32_t>(XXH3_64bits(header, 28));
}

void WriteFrameHeader(const FrameHeader& h, uint8_t* out) {
  std::memcpy(out, kFrameMagic, 4);
  out[4] = kFrameVersion;
  out[5] = static_cast<uint8_t>(h.layout);
  out[6] = static_cast<uint8_t>(h.compression);
  out[7] = h.flags;
  StoreLE32(out + 8, h.record_count);
  StoreLE32(out + 12, h.uncompressed_size);
  StoreLE32(out + 16, h.stored_size);
  StoreLE64(out + 20, h.payload_checksum);
  StoreLE32(out + 28, HeaderCheck(out));
}

absl::StatusOr<FrameHeader> ParseFrameHeader(absl::Span<const uint8_t> bytes,
                                             const FrameLimits& limits) {
  if (bytes.size() < kFrameHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame truncated: ", bytes.size(), " bytes, the header alone needs ", kFrameHeaderSize));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kFrameMagic, 4) != 0) {
    return absl::InvalidArgumentError("not a Sluice frame: bad magic (expected \"SLCF\")");
  }
  if (p[4] != kFrameVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported frame version ", p[4], " (this build reads version ", kFrameVersion, ")"));
  }
  if (LoadLE32(p + 28) != HeaderCheck(p)) {
    return absl::DataLossError("frame header checksum mismatch: the header is corrupt");
  }
  FrameHeader h;
  if (p[5] > static_cast<uint8_t>(Layout::kColumnar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown format tag 0x", absl::Hex(p[5], absl::kZeroPad2)));
  }
  h.layout = static_cast<Layout>(p[5]);
  if (p[6] > static_cast<uint8_t>(Compression::kZstdSections)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown compression tag 0x", absl::Hex(p[6], absl::kZeroPad2)));
  }
  h.compression = static_cast<Compression>(p[6]);
  h.flags = p[7];
  if ((h.flags & ~kKnownFlags) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown frame flags 0x", absl::Hex(h.flags, absl::kZeroPad2)));
  }
  h.record_count = LoadLE32(p + 8);
  h.uncompressed_size = LoadLE32(p + 12);
  h.stored_size = LoadLE32(p + 16);
  h.payload_checksum = LoadLE64(p + 20);
  if (h.record_count > limits.max_records) {
    return absl::InvalidArgumentError(absl::StrCat("frame record count ", h.record_count,
                                                   " exceeds the limit of ", limits.max_records));
  }
  if (h.uncompressed_size > limits.max_uncompressed_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame uncompressed size ", h.uncompressed_size,
                                                   " bytes exceeds the cap of ",
                                                   limits.max_uncompressed_bytes, " bytes"));
  }
  if (h.compression == Compression::kNone && h.stored_size != h.uncompressed_size) {
    return absl::InvalidArgumentError(absl::StrCat("uncompressed frame stores ", h.stored_size,
                                                   " bytes but declares ", h.uncompressed_size));
  }
  if (h.stored_size > limits.max_uncompressed_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame stored size ", h.stored_size,
                                                   " bytes exceeds the cap of ",
                                                   limits.max_uncompressed_bytes, " bytes"));
  }
  return h;
}

namespace {
constexpr size_t kSortPrefetch = 8;
}  // namespace

void StableSortByKey(absl::Span<Record> records, std::vector<Record>* scratch) {
  struct Entry {
    uint64_t prefix;
    uint32_t len, index;
  };
  const size_t n = records.size();
  if (n < 2) return;
  std::vector<Entry> entries(n);
  bool sorted = true;
  uint64_t differ = 0;  // bits in which some prefix differs from the first
  for (size_t i = 0; i < n; ++i) {
    // The keys of a writer's batch are far apart in memory (each beside its value): ask for
    // the one a few records ahead while this one is read.
    if (i + kSortPrefetch < n) __builtin_prefetch(records[i + kSortPrefetch].key.data());
    entries[i] = Entry{KeyPrefix(records[i].key), static_cast<uint32_t>(records[i].key.size()),
                       static_cast<uint32_t>(i)};
    differ |= entries[i].prefix ^ entries[0].prefix;
    if (i > 0 && sorted) {
      sorted = CompareKeysWithPrefix(records[i - 1].key, entries[i - 1].prefix, records[i].key,
                                     entries[i].prefix) <= 0;
    }
  }
  if (sorted) return;
  // Full order on entries: prefix, then the whole key, then arrival (which makes it stable).
  auto less = [&records](const Entry& a, const Entry& b) {
    if (a.prefix != b.prefix) return a.prefix < b.prefix;
    if (a.len <= 8 && b.len <= 8) {
      return a.len != b.len ? a.len < b.len : a.index < b.index;
    }
    const int c = CompareKeys(records[a.index].key, records[b.index].key);
    return c != 0 ? c < 0 : a.index < b.index;
  };
  if (n < 256) {
    std::sort(entries.begin(), entries.end(), less);
  } else {
    // LSD radix sort on the prefix bytes that vary (stable, so arrival order survives)...
    std::vector<Entry> tmp(n);
    for (int byte = 0; byte < 8; ++byte) {
      const int shift = 8 * byte;
      if (((differ >> shift) & 0xff) == 0) continue;
      size_t count[257] = {};
      for (const Entry& e : entries) ++count[((e.prefix >> shift) & 0xff) + 1];
      for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
      for (const Entry& e : entries) tmp[count[(e.prefix >> shift) & 0xff]++] = e;
      entries.swap(tmp);
    }
    // ...then equal prefixes ordered by the rest of the key, where that can differ.
    for (size_t i = 0; i < n;) {
      size_t j = i + 1;
      bool rest_differs = entries[i].len > 8;
      while (j < n && entries[j].prefix == entries[i].prefix) {
        rest_differs |= entries[j].len != entries[i].len || entries[j].len > 8;
        ++j;
      }
      if (rest_differs) std::sort(entries.begin() + i, entries.begin() + j, less);
      i = j;
    }
  }
  scratch->assign(records.begin(), records.end());
  for (size_t i = 0; i < n; ++i) records[i] = (*scratch)[entries[i].index];
}

}  // namespace sluice
