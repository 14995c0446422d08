// libFuzzer target for a partition object's trailer and footer (objstore/partition_object.h),
// bytes from an object store, which is not trusted.
//
// Input byte 0 picks the mode.
//   even: the rest is an object's bytes, read as a reader reads them (trailer, then footer).
//   odd:  bytes 1-2 are the frames' length L, the rest a footer body: the object is L bytes,
//         that body with its checksum, and a trailer that fits it, so mutations reach the
//         footer's structure behind its checksums.
// Whatever decodes must be sane (frames back to back up to the footer, each of a winner) and
// re-encode to the very bytes it came from.
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "codec/endian.h"
#include "objstore/partition_object.h"

namespace {

void Check(const std::string& object) {
  using namespace sluice::objstore;
  if (object.size() < kTrailerBytes) return;
  auto footer_size =
      FooterSize(absl::string_view(object).substr(object.size() - kTrailerBytes), object.size());
  if (!footer_size.ok()) return;
  const std::string footer =
      object.substr(object.size() - kTrailerBytes - *footer_size, *footer_size);
  // The id and partition the footer says it holds (so that a well-formed one gets past them).
  std::string id;
  uint32_t partition = 0;
  if (footer.size() >= 16) {
    partition = sluice::LoadLE32(reinterpret_cast<const uint8_t*>(footer.data()) + 8);
    const uint32_t len = sluice::LoadLE32(reinterpret_cast<const uint8_t*>(footer.data()) + 12);
    if (len <= footer.size() - 16) id = footer.substr(16, len);
  }
  auto f = DecodeFooter(footer, object.size(), id, partition);
  if (!f.ok()) return;
  uint64_t at = 0;
  for (const ObjectFrame& fr : f->frames) {
    if (fr.offset != at || fr.size == 0) __builtin_trap();
    at += fr.size;
  }
  if (at + *footer_size + kTrailerBytes != object.size()) __builtin_trap();
  if (EncodeFooter(*f) != object.substr(at)) __builtin_trap();  // (one encoding)
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if ((data[0] & 1) == 0) {
    Check(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
    return 0;
  }
  if (size < 3) return 0;
  const size_t frames = data[1] | (static_cast<size_t>(data[2]) << 8);
  std::string body(reinterpret_cast<const char*>(data + 3), size - 3);
  std::string object(frames, 'x');
  object += body;
  sluice::AppendLE64(&object, XXH3_64bits(body.data(), body.size()));
  std::string trailer;
  sluice::AppendLE64(&trailer, body.size() + 8);
  trailer += "SLPE";
  sluice::AppendLE32(&trailer, static_cast<uint32_t>(XXH3_64bits(trailer.data(), trailer.size())));
  Check(object + trailer);
  return 0;
}
