// libFuzzer target for FrameDecoder, the decoder of untrusted bytes.
//
// Input byte 0 picks the mode; the rest is a frame.
//   even: decode the bytes as they are (header and payload checksums must hold).
//   odd:  first re-seal both checksums, so mutations reach the layout parsers behind them.
// Whatever decodes must re-encode (AUTO) and decode again to the same records.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "codec/endian.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"

namespace {

void Reseal(std::string* frame) {
  if (frame->size() < sluice::kFrameHeaderSize) return;
  auto* p = reinterpret_cast<uint8_t*>(frame->data());
  sluice::FrameHeader h;
  h.layout = static_cast<sluice::Layout>(p[5]);
  h.compression = static_cast<sluice::Compression>(p[6]);
  h.flags = p[7];
  h.record_count = sluice::LoadLE32(p + 8);
  h.uncompressed_size = sluice::LoadLE32(p + 12);
  h.stored_size = sluice::LoadLE32(p + 16);
  h.payload_checksum = sluice::PayloadChecksum(p + sluice::kFrameHeaderSize,
                                               frame->size() - sluice::kFrameHeaderSize);
  const uint8_t magic_and_version[5] = {p[0], p[1], p[2], p[3], p[4]};
  sluice::WriteFrameHeader(h, p);
  // Keep the fuzzer's magic and version bytes: those checks come before the checksum.
  for (int i = 0; i < 5; ++i) p[i] = magic_and_version[i];
  if (p[4] == sluice::kFrameVersion && std::memcmp(p, sluice::kFrameMagic, 4) == 0) {
    sluice::WriteFrameHeader(h, p);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static sluice::FrameLimits limits = [] {
    sluice::FrameLimits l;
    l.max_uncompressed_bytes = 4u << 20;
    l.max_records = 1u << 16;
    return l;
  }();
  static sluice::FrameDecoder* decoder = [] {
    sluice::DecodeOptions opts;
    opts.limits = limits;
    return new sluice::FrameDecoder(opts);
  }();
  static auto* decoded = new sluice::DecodedFrame;
  static sluice::FrameEncoder* encoder = [] {
    sluice::EncodeOptions opts;
    opts.limits = limits;  // a re-encoding over the decoder's caps is refused, not a bug
    return new sluice::FrameEncoder(opts);
  }();

  std::string frame(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) != 0) Reseal(&frame);
  if (!decoder->Decode(frame, decoded).ok()) return 0;

  std::vector<sluice::Record> records(decoded->begin(), decoded->end());
  std::vector<std::string> owned;  // views die with the next decode
  owned.reserve(records.size() * 2);
  for (auto& r : records) {
    owned.emplace_back(r.key);
    r.key = owned.back();
    owned.emplace_back(r.value);
    r.value = owned.back();
  }
  std::string again;
  if (!encoder->Encode(records, &again).ok()) return 0;  // e.g. over the encoder's own limits
  if (!decoder->Decode(again, decoded).ok()) std::abort();
  if (decoded->size() != records.size()) std::abort();
  for (size_t i = 0; i < records.size(); ++i) {
    if ((*decoded)[i].key != records[i].key || (*decoded)[i].value != records[i].value) {
      std::abort();
    }
  }
  return 0;
}
