// FrameDecoder validates one untrusted frame and exposes its records as views into a single
// decoded buffer (no copy per record).
//
// Every byte is checked: header magic, version and checksum; known tags and flags; sizes
// against FrameLimits (so no decoded buffer exceeds the cap, and a zstd bomb cannot expand
// past the declared size); the payload checksum; the layout's structure; the record count;
// and, for frames flagged sorted, the key order. (COLUMNAR holds no scratch per value
// beyond a chunk of 256 records, and dictionary entries within the cap:
// docs/frame-format.md.) Each failure is an INVALID_ARGUMENT (or DATA_LOSS for checksum
// mismatches) whose message names the problem.
//
//   sluice::FrameDecoder decoder;
//   sluice::DecodedFrame frame;
//   SLUICE_RETURN_IF_ERROR(decoder.Decode(bytes, &frame));
//   for (const sluice::Record& r : frame) Use(r.key, r.value);
#ifndef SLUICE_CODEC_FRAME_DECODER_H_
#define SLUICE_CODEC_FRAME_DECODER_H_

#include <cstdint>
#include <iterator>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/buffer.h"
#include "codec/columnar.h"
#include "codec/frame_format.h"

namespace sluice {

struct DecodeOptions {
  FrameLimits limits;
  /// Check that a frame flagged sorted really is in key order.
  bool verify_sorted = true;
  /// Validate every byte as usual but rebuild only the keys of COLUMNAR frames: their values
  /// come back empty. For callers that check frames and need only counts and keys (a server
  /// accepting pushed frames); other layouts decode as usual.
  bool keys_only = false;
};

/// The records of one decoded frame. Reusable: decoding into it again keeps its buffers.
/// Views stay valid until the next decode into the same object.
class DecodedFrame {
 public:
  class Iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Record;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = Record;

    Iterator(const DecodedFrame* f, size_t i) : f_(f), i_(i) {}
    Record operator*() const { return (*f_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const Iterator& o) const { return i_ == o.i_; }
    bool operator!=(const Iterator& o) const { return i_ != o.i_; }

   private:
    const DecodedFrame* f_;
    size_t i_;
  };

  const FrameHeader& header() const { return header_; }
  size_t size() const { return index_.size(); }
  bool empty() const { return index_.empty(); }
  Record operator[](size_t i) const {
    const RecordRef& r = index_[i];
    const char* b = reinterpret_cast<const char*>(base_);
    return Record{std::string_view(b + r.key_off, r.key_len),
                  std::string_view(b + r.value_off, r.value_len)};
  }
  Iterator begin() const { return Iterator(this, 0); }
  Iterator end() const { return Iterator(this, size()); }

  void Clear() {
    index_.Clear();
    base_ = nullptr;
    header_ = FrameHeader{};
  }
  /// Memory held for the records (Clear keeps it for the next decode).
  size_t memory_bytes() const {
    return payload_.capacity() + rows_.capacity() + index_.capacity() * sizeof(RecordRef);
  }

 private:
  friend class FrameDecoder;
  FrameHeader header_;
  ByteBuffer payload_;  // decompressed payload
  ByteBuffer rows_;     // rebuilt rows (COLUMNAR)
  PodBuffer<RecordRef> index_;
  const uint8_t* base_ = nullptr;
};

class FrameDecoder {
 public:
  explicit FrameDecoder(DecodeOptions options = {});
  ~FrameDecoder();
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;

  /// Scratch memory the decoder keeps between frames (not counting DecodedFrames).
  size_t scratch_bytes() const;
  /// Lets go of the scratch memory if it exceeds `keep` bytes (after an unusually large
  /// frame), so a long-lived decoder does not hold a cap's worth forever.
  void TrimScratch(size_t keep);

  /// Decodes `bytes`, which must hold exactly one frame, into `*out`. On error `*out` is
  /// left empty.
  [[nodiscard]] absl::Status Decode(absl::Span<const uint8_t> bytes, DecodedFrame* out);
  [[nodiscard]] absl::Status Decode(std::string_view bytes, DecodedFrame* out) {
    return Decode(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                  out);
  }

 private:
  absl::Status DecodeImpl(absl::Span<const uint8_t> bytes, DecodedFrame* out);
  absl::Status DecodeSections(const uint8_t* p, size_t stored_size, uint8_t* payload,
                              size_t payload_size);
  struct State;
  DecodeOptions options_;
  std::unique_ptr<State> state_;
};

}  // namespace sluice

#endif  // SLUICE_CODEC_FRAME_DECODER_H_
