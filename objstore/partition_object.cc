#include "objstore/partition_object.h"

#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codec/endian.h"

namespace sluice::objstore {
namespace {

constexpr char kFooterMagic[4] = {'S', 'L', 'P', 'O'};
constexpr char kTrailerMagic[4] = {'S', 'L', 'P', 'E'};
// Version 2 gives each frame its key bounds; version 1 (none) is read too.
constexpr uint8_t kVersion = 2;
constexpr size_t kFrameEntryBytes = 32;  // (version 2: and u16 bounds size, the bounds)
constexpr size_t kWinnerEntryBytes = 12;

// Reads little-endian values off the front of a view, remembering a short read.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  uint8_t Get8() {
    const absl::string_view b = Bytes(1);
    return b.empty() ? 0 : static_cast<uint8_t>(b[0]);
  }
  uint32_t Get32() {
    const absl::string_view b = Bytes(4);
    return b.empty() ? 0 : LoadLE32(reinterpret_cast<const uint8_t*>(b.data()));
  }
  uint64_t Get64() {
    const absl::string_view b = Bytes(8);
    return b.empty() ? 0 : LoadLE64(reinterpret_cast<const uint8_t*>(b.data()));
  }
  absl::string_view Bytes(size_t n) {
    if (in_.size() < n) {
      short_ = true;
      return {};
    }
    absl::string_view out = in_.substr(0, n);
    in_.remove_prefix(n);
    return out;
  }
  size_t left() const { return in_.size(); }
  bool short_read() const { return short_; }

 private:
  absl::string_view in_;
  bool short_ = false;
};

absl::Status Damaged(const std::string& why) {
  return absl::DataLossError(absl::StrCat("partition object: ", why));
}

}  // namespace

std::string EncodeFooter(const PartitionObjectFooter& f) {
  std::string out(kFooterMagic, 4);
  const bool v1 = f.version == 1;
  out.push_back(static_cast<char>(v1 ? 1 : kVersion));
  out.append(3, '\0');
  AppendLE32(&out, f.partition);
  AppendLE32(&out, static_cast<uint32_t>(f.shuffle_id.size()));
  out += f.shuffle_id;
  AppendLE32(&out, static_cast<uint32_t>(f.winners.size()));
  for (const auto& [mapper, attempt] : f.winners) {
    AppendLE32(&out, mapper);
    AppendLE64(&out, attempt);
  }
  AppendLE32(&out, static_cast<uint32_t>(f.frames.size()));
  for (const ObjectFrame& fr : f.frames) {
    AppendLE32(&out, fr.mapper);
    AppendLE64(&out, fr.attempt);
    AppendLE64(&out, fr.offset);
    AppendLE32(&out, fr.size);
    AppendLE32(&out, fr.records);
    AppendLE32(&out, fr.uncompressed);
    if (v1) continue;
    out.push_back(static_cast<char>(fr.bounds.size() & 0xff));
    out.push_back(static_cast<char>(fr.bounds.size() >> 8));
    out += fr.bounds;
  }
  AppendLE64(&out, XXH3_64bits(out.data(), out.size()));
  const uint64_t footer = out.size();
  std::string trailer;
  AppendLE64(&trailer, footer);
  trailer.append(kTrailerMagic, 4);
  AppendLE32(&trailer, static_cast<uint32_t>(XXH3_64bits(trailer.data(), trailer.size())));
  return out + trailer;
}

absl::StatusOr<uint64_t> FooterSize(absl::string_view trailer, uint64_t object_size) {
  if (trailer.size() != kTrailerBytes || object_size < kTrailerBytes) {
    return Damaged(absl::StrCat("an object of ", object_size, " bytes has no trailer"));
  }
  Reader r(trailer);
  const uint64_t footer = r.Get64();
  const absl::string_view magic = r.Bytes(4);
  const uint32_t check = r.Get32();
  if (magic != absl::string_view(kTrailerMagic, 4) ||
      check != static_cast<uint32_t>(XXH3_64bits(trailer.data(), 12))) {
    return Damaged("its trailer is not one (magic or checksum)");
  }
  if (footer < 4 + 4 + 4 + 4 + 4 + 4 + 8 || footer > kMaxFooterBytes ||
      footer > object_size - kTrailerBytes) {
    return Damaged(absl::StrCat("its trailer gives a footer of ", footer, " bytes in an object of ",
                                object_size));
  }
  return footer;
}

absl::StatusOr<PartitionObjectFooter> DecodeFooter(absl::string_view bytes, uint64_t object_size,
                                                   absl::string_view shuffle_id,
                                                   uint32_t partition) {
  if (bytes.size() < 8 || bytes.size() > kMaxFooterBytes ||
      object_size < bytes.size() + kTrailerBytes) {
    return Damaged("its footer does not fit the object");
  }
  if (Reader(bytes.substr(bytes.size() - 8)).Get64() !=
      XXH3_64bits(bytes.data(), bytes.size() - 8)) {
    return Damaged("its footer's checksum does not match");
  }
  Reader r(bytes.substr(0, bytes.size() - 8));
  if (r.Bytes(4) != absl::string_view(kFooterMagic, 4)) return Damaged("its footer is not one");
  const uint8_t version = r.Get8();
  if (version != 1 && version != kVersion) {
    return Damaged(absl::StrCat("its footer is of version ", version, ", not 1 or 2"));
  }
  if (r.Bytes(3) != absl::string_view("\0\0\0", 3)) {
    return Damaged("its footer's reserved bytes are not zero");
  }
  PartitionObjectFooter f;
  f.version = version;
  f.partition = r.Get32();
  const uint32_t id_len = r.Get32();
  f.shuffle_id = std::string(r.Bytes(id_len));
  if (r.short_read() || f.shuffle_id != shuffle_id || f.partition != partition) {
    return Damaged(absl::StrCat("it holds partition ", f.partition, " of shuffle '", f.shuffle_id,
                                "', not partition ", partition, " of '", shuffle_id, "'"));
  }
  const uint32_t winners = r.Get32();
  if (r.short_read() || uint64_t{winners} * kWinnerEntryBytes > r.left()) {
    return Damaged("its footer lists more winners than it holds");
  }
  for (uint32_t i = 0; i < winners; ++i) {
    const uint32_t mapper = r.Get32();
    const uint64_t attempt = r.Get64();
    if (!f.winners.empty() && mapper <= f.winners.back().first) {
      return Damaged("its winners are not in mapper order, once each");
    }
    f.winners.emplace_back(mapper, attempt);
  }
  const uint32_t frames = r.Get32();
  const uint64_t least = uint64_t{frames} * (kFrameEntryBytes + (version == 1 ? 0 : 2));
  if (r.short_read() || (version == 1 ? least != r.left() : least > r.left())) {
    return Damaged("its footer's frame list is not the size it says");
  }
  const uint64_t frames_end = object_size - kTrailerBytes - bytes.size();
  uint64_t at = 0;
  f.frames.reserve(frames);
  for (uint32_t i = 0; i < frames; ++i) {
    ObjectFrame fr;
    fr.mapper = r.Get32();
    fr.attempt = r.Get64();
    fr.offset = r.Get64();
    fr.size = r.Get32();
    fr.records = r.Get32();
    fr.uncompressed = r.Get32();
    if (version >= 2) {
      const uint8_t lo = r.Get8(), hi = r.Get8();
      const size_t n = lo | (size_t{hi} << 8);
      if (n > kMaxFrameBoundsBytes) {
        return Damaged(absl::StrCat("its frame ", i, " has key bounds of ", n, " bytes"));
      }
      fr.bounds = std::string(r.Bytes(n));
      if (r.short_read()) return Damaged("its footer's frame list is not the size it says");
    }
    if (fr.offset != at || fr.size == 0 || fr.offset + fr.size > frames_end) {
      return Damaged(absl::StrCat("its frame ", i, " is not where the frame before it ends"));
    }
    at = fr.offset + fr.size;
    auto w = std::lower_bound(
        f.winners.begin(), f.winners.end(), fr.mapper,
        [](const std::pair<uint32_t, uint64_t>& a, uint32_t m) { return a.first < m; });
    if (w == f.winners.end() || w->first != fr.mapper || w->second != fr.attempt) {
      return Damaged(absl::StrCat("its frame ", i, " is of mapper ", fr.mapper, " attempt ",
                                  fr.attempt, ", not a winner it lists"));
    }
    f.frames.push_back(fr);
  }
  if (r.left() != 0) return Damaged("its footer's frame list is not the size it says");
  if (at != frames_end) {
    return Damaged(absl::StrCat("its frames end at ", at, ", its footer starts at ", frames_end));
  }
  return f;
}

}  // namespace sluice::objstore
