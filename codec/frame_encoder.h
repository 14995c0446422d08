// FrameEncoder turns a batch of records into one Sluice frame.
//
// The layout is chosen per frame: AUTO (the default) uses COLUMNAR when the batch's values are
// msgpack maps of one shape, else MSGPACK when every value is one msgpack object, else OPAQUE.
// Every fallback is lossless and its reason is kept (last_fallback_reason()). Compression is
// zstd (level 3 by default); when zstd would not shrink the payload the frame is stored
// uncompressed, and the header says so. An encoder reuses its buffers and zstd context, so
// keep one per thread.
//
//   sluice::FrameEncoder encoder;                 // AUTO, zstd level 3
//   std::string frame;
//   SLUICE_RETURN_IF_ERROR(encoder.Encode(records, &frame));
#ifndef SLUICE_CODEC_FRAME_ENCODER_H_
#define SLUICE_CODEC_FRAME_ENCODER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/frame_format.h"

namespace sluice {

inline constexpr size_t kMinSectionedPayload = 4096;
inline constexpr size_t kMinPlainSectionBytes = 1024;
inline constexpr size_t kMaxPlainSpans = 4096;

struct EncodeOptions {
  /// Layout to use. AUTO picks per frame; COLUMNAR falls back to MSGPACK when the batch does
  /// not fit it; MSGPACK and COLUMNAR reject values that are not msgpack; OPAQUE takes anything.
  LayoutChoice layout = LayoutChoice::kAuto;
  Compression compression = Compression::kZstd;
  int zstd_level = 3;
  /// Adaptive compression: when zstd saved less than this fraction of a frame's payload, the
  /// encoder stores its next `zstd_skip_frames` frames uncompressed, then tries zstd again
  /// (data that zstd cannot shrink, e.g. packed random ids, is not worth its time; a stream
  /// whose data turns compressible is compressed again within that many frames). 0 = try zstd
  /// on every frame (a frame is still stored uncompressed when zstd would not shrink it).
  double min_zstd_saving = 0.05;
  int zstd_skip_frames = 7;
  /// Payloads smaller than this are stored uncompressed without trying zstd: its fixed cost
  /// per frame (tables set up to compress, and built again to decompress: ~6 us and ~4 us on a
  /// 200-byte frame) is many times what a few hundred bytes cost to send or store, and a wide
  /// shuffle is mostly such frames. 0 = try every payload.
  size_t min_zstd_payload = 1024;
  /// AUTO leaves batches of fewer records than this to MSGPACK: COLUMNAR's shape detection and
  /// per-column headers cost more than they save on a few records (a wide shuffle's frames are
  /// mostly such). 0 = COLUMNAR whenever the batch fits it.
  size_t min_columnar_records = 4;
  /// COLUMNAR frames: byte ranges the layout finds too close to random for an entropy coder
  /// (random ids, float mantissas, dense codes) are compressed apart from the rest, at a fast
  /// zstd level without literal entropy coding, and the frame is stored as kZstdSections: much
  /// faster for such data, a few percent larger at most. Only for payloads of at least
  /// kMinSectionedPayload bytes with at least kMinPlainSectionBytes of plain ranges.
  bool plain_sections = true;
  /// Sort the records by key (stable) before encoding. Either way, the frame is flagged
  /// sorted whenever its records are in key order.
  bool sort_by_key = false;
  /// The encoder refuses batches a default decoder would refuse.
  FrameLimits limits;
};

class FrameEncoder {
 public:
  explicit FrameEncoder(EncodeOptions options = {});
  ~FrameEncoder();
  FrameEncoder(const FrameEncoder&) = delete;
  FrameEncoder& operator=(const FrameEncoder&) = delete;

  /// Appends one frame holding `records` to `*out`. Fails with INVALID_ARGUMENT when the batch
  /// is over the limits, or values are not msgpack for an explicit MSGPACK/COLUMNAR layout.
  [[nodiscard]] absl::Status Encode(absl::Span<const Record> records, std::string* out);

  /// The layout of the last frame encoded, and why AUTO/COLUMNAR fell back (empty if not).
  Layout last_layout() const { return last_layout_; }
  const std::string& last_fallback_reason() const { return last_fallback_reason_; }

 private:
  struct State;
  EncodeOptions options_;
  Layout last_layout_ = Layout::kOpaque;
  std::string last_fallback_reason_;
  std::unique_ptr<State> state_;
};

}  // namespace sluice

#endif  // SLUICE_CODEC_FRAME_ENCODER_H_
