#include "codec/frame_decoder.h"

#include <zstd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/msgpack_scan.h"
#include "codec/varint.h"
#include "codec/zstd_pool.h"

namespace sluice {

struct FrameDecoder::State {
  ZSTD_DCtx* dctx = zstd_pool::TakeDCtx();
  ColumnarDecoder columnar;
  // A COLUMNAR payload is only read while its rows are rebuilt: it goes here rather than into
  // the DecodedFrame, which then holds just the rows (a merge keeps one frame per run).
  ByteBuffer columnar_payload;
  ByteBuffer plain_part;         // kZstdSections: the smaller zstd part, decompressed
  PodBuffer<uint64_t> sections;  // kZstdSections: (length << 1) | plain
  State() = default;
  State(const State&) = delete;  // (it owns its context)
  State& operator=(const State&) = delete;
  ~State() { zstd_pool::GiveDCtx(dctx); }
};

FrameDecoder::FrameDecoder(DecodeOptions options)
    : options_(options), state_(std::make_unique<State>()) {
  // Frames are decoded in one shot into a buffer of the declared (capped) size, so zstd
  // allocates no window buffer whatever the frame claims.
}
FrameDecoder::~FrameDecoder() = default;

size_t FrameDecoder::scratch_bytes() const {
  return state_->columnar_payload.capacity() + state_->columnar.retained_bytes() +
         state_->plain_part.capacity() + state_->sections.capacity() * sizeof(uint64_t);
}

void FrameDecoder::TrimScratch(size_t keep) {
  if (scratch_bytes() > keep) state_ = std::make_unique<State>();
}

absl::Status FrameDecoder::Decode(absl::Span<const uint8_t> bytes, DecodedFrame* out) {
  absl::Status st = DecodeImpl(bytes, out);
  if (!st.ok()) out->Clear();
  return st;
}

namespace {

absl::Status RowError(Layout layout, size_t i, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("corrupt ", LayoutName(layout), " payload at record ", i, ": ", what));
}

absl::Status IndexOpaque(const uint8_t* p, const uint8_t* end, size_t n, RecordRef* refs) {
  const uint8_t* const base = p;
  for (size_t i = 0; i < n; ++i) {
    uint64_t klen, vlen;
    if (!GetVarint(&p, end, &klen) || klen > static_cast<uint64_t>(end - p)) {
      return RowError(Layout::kOpaque, i, "key truncated");
    }
    refs[i].key_off = static_cast<uint32_t>(p - base);
    refs[i].key_len = static_cast<uint32_t>(klen);
    p += klen;
    if (!GetVarint(&p, end, &vlen) || vlen > static_cast<uint64_t>(end - p)) {
      return RowError(Layout::kOpaque, i, "value truncated");
    }
    refs[i].value_off = static_cast<uint32_t>(p - base);
    refs[i].value_len = static_cast<uint32_t>(vlen);
    p += vlen;
  }
  if (p != end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OPAQUE payload has ", end - p, " bytes after the ", n, " records its header declares"));
  }
  return absl::OkStatus();
}

absl::Status IndexMsgpack(const uint8_t* p, const uint8_t* end, size_t n, RecordRef* refs) {
  const uint8_t* const base = p;
  for (size_t i = 0; i < n; ++i) {
    uint32_t klen;
    const uint8_t* k = nullptr;
    const size_t avail = static_cast<size_t>(end - p);
    if (avail >= 2 && p[0] == 0xc4) {
      klen = p[1];
      k = p + 2;
    } else if (avail >= 3 && p[0] == 0xc5) {
      klen = LoadBE16(p + 1);
      k = p + 3;
    } else if (avail >= 5 && p[0] == 0xc6) {
      klen = LoadBE32(p + 1);
      k = p + 5;
    } else if (avail >= 1 && p[0] >= 0xc4 && p[0] <= 0xc6) {
      return RowError(Layout::kMsgpack, i, "key's bin header is truncated");
    } else {
      return RowError(Layout::kMsgpack, i, "key is not a msgpack bin");
    }
    if (klen > static_cast<size_t>(end - k)) return RowError(Layout::kMsgpack, i, "key truncated");
    refs[i].key_off = static_cast<uint32_t>(k - base);
    refs[i].key_len = klen;
    p = k + klen;
    mp::ScanError err;
    const uint8_t* v_end = mp::SkipObject(p, end, &err);
    if (v_end == nullptr) return RowError(Layout::kMsgpack, i, mp::ScanErrorName(err));
    refs[i].value_off = static_cast<uint32_t>(p - base);
    refs[i].value_len = static_cast<uint32_t>(v_end - p);
    p = v_end;
  }
  if (p != end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MSGPACK payload has ", end - p, " bytes after the ", n, " records its header declares"));
  }
  return absl::OkStatus();
}

// Decompresses exactly one zstd frame [src, src + n) of exactly `size` bytes into dst.
absl::Status DecompressExact(ZSTD_DCtx* dctx, const uint8_t* src, size_t n, uint8_t* dst,
                             size_t size, absl::string_view what) {
  const size_t zframe = ZSTD_findFrameCompressedSize(src, n);
  if (ZSTD_isError(zframe) || zframe != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not exactly one zstd frame filling its stored size"));
  }
  const unsigned long long content = ZSTD_getFrameContentSize(src, n);
  if (content != ZSTD_CONTENTSIZE_UNKNOWN && content != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": zstd frame expands to ", content, " bytes but ", size, " expected"));
  }
  const size_t r = ZSTD_decompressDCtx(dctx, dst, size, src, n);
  if (ZSTD_isError(r)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": zstd decompression failed: ", ZSTD_getErrorName(r)));
  }
  if (r != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": zstd frame expands to ", r, " bytes but ", size, " expected"));
  }
  return absl::OkStatus();
}

absl::Status SectionsError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("corrupt ZSTD_SECTIONS payload: ", what));
}

}  // namespace

// kZstdSections: flags, section table, entropy part, plain part (docs/frame-format.md).
absl::Status FrameDecoder::DecodeSections(const uint8_t* p, size_t stored_size, uint8_t* payload,
                                          size_t payload_size) {
  State& s = *state_;
  const uint8_t* const end = p + stored_size;
  if (p >= end) return SectionsError("no flags byte");
  const uint8_t flags = *p++;
  if ((flags & ~(kSectionsEntropyZstd | kSectionsPlainZstd)) != 0) {
    return SectionsError(absl::StrCat("unknown flags 0x", absl::Hex(flags, absl::kZeroPad2)));
  }
  uint64_t count;
  if (!GetVarint(&p, end, &count)) return SectionsError("section count truncated");
  // (Each table entry takes at least a byte: the count must fit the bytes left before the
  // table is allocated.)
  if (count == 0 || count > kMaxSections || count > payload_size ||
      count > static_cast<uint64_t>(end - p)) {
    return SectionsError(absl::StrCat(count, " sections for ", payload_size, " payload bytes"));
  }
  s.sections.Resize(count);
  uint64_t sizes[2] = {0, 0};  // entropy, plain
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t v;
    if (!GetVarint(&p, end, &v)) return SectionsError("section table truncated");
    const uint64_t len = v >> 1;
    if (len == 0 || len > payload_size) {
      return SectionsError(absl::StrCat("section ", i, " has length ", len));
    }
    sizes[v & 1] += len;
    s.sections[i] = v;
  }
  if (sizes[0] + sizes[1] != payload_size) {
    return SectionsError(absl::StrCat("sections add up to ", sizes[0] + sizes[1],
                                      " bytes but the header declares ", payload_size));
  }
  uint64_t entropy_stored;
  if (!GetVarint(&p, end, &entropy_stored) || entropy_stored > static_cast<uint64_t>(end - p)) {
    return SectionsError("entropy part size truncated or past the end");
  }
  const uint8_t* const plain_src = p + entropy_stored;
  const auto plain_stored = static_cast<size_t>(end - plain_src);
  const size_t stored[2] = {static_cast<size_t>(entropy_stored), plain_stored};
  const bool zstd[2] = {(flags & kSectionsEntropyZstd) != 0, (flags & kSectionsPlainZstd) != 0};
  const uint8_t* srcs[2] = {p, plain_src};
  const char* names[2] = {"entropy part", "plain part"};
  for (int k = 0; k < 2; ++k) {
    if (!zstd[k] && stored[k] != sizes[k]) {
      return SectionsError(
          absl::StrCat("raw ", names[k], " stores ", stored[k], " bytes, ", sizes[k], " expected"));
    }
    if (zstd[k] && sizes[k] == 0) {
      return SectionsError(absl::StrCat("empty ", names[k], " flagged zstd"));
    }
  }
  // The larger zstd part is decompressed in place, at the start of the payload buffer; the
  // other, if zstd too, into scratch (so a decode never holds much more than the payload).
  // A raw part is read where it is stored.
  int in_place = -1;
  for (int k = 0; k < 2; ++k) {
    if (zstd[k] && (in_place < 0 || sizes[k] > sizes[in_place])) in_place = k;
  }
  const uint8_t* parts[2];
  for (int k = 0; k < 2; ++k) {
    if (!zstd[k]) {
      parts[k] = srcs[k];
      continue;
    }
    uint8_t* dst = payload;
    if (k != in_place) {
      s.plain_part.Resize(sizes[k]);
      dst = s.plain_part.data();
    }
    absl::Status st = DecompressExact(s.dctx, srcs[k], stored[k], dst, sizes[k], names[k]);
    if (!st.ok()) return SectionsError(st.message());
    parts[k] = dst;
  }
  // Sections into place, last first: the in-place part's sections only move right (each lands
  // at or after where it was decompressed, and past everything of it not yet moved).
  uint64_t at[2] = {sizes[0], sizes[1]};  // end of each part not yet consumed
  uint64_t w = payload_size;
  for (uint64_t i = count; i-- > 0;) {
    const uint64_t v = s.sections[i];
    const uint64_t len = v >> 1;
    const int k = static_cast<int>(v & 1);
    at[k] -= len;
    w -= len;
    if (k == in_place) {
      std::memmove(payload + w, payload + at[k], len);
    } else {
      std::memcpy(payload + w, parts[k] + at[k], len);
    }
  }
  return absl::OkStatus();
}

absl::Status FrameDecoder::DecodeImpl(absl::Span<const uint8_t> bytes, DecodedFrame* out) {
  State& s = *state_;
  const FrameLimits& limits = options_.limits;
  auto header_or = ParseFrameHeader(bytes, limits);
  if (!header_or.ok()) return header_or.status();
  const FrameHeader h = *header_or;
  if (bytes.size() < h.frame_size()) {
    return absl::InvalidArgumentError(absl::StrCat("frame truncated: header declares ",
                                                   h.stored_size, " payload bytes, ",
                                                   bytes.size() - kFrameHeaderSize, " present"));
  }
  if (bytes.size() > h.frame_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(bytes.size() - h.frame_size(), " trailing bytes after the frame"));
  }
  const uint8_t* stored = bytes.data() + kFrameHeaderSize;
  if (PayloadChecksum(stored, h.stored_size) != h.payload_checksum) {
    return absl::DataLossError("frame payload checksum mismatch: the payload is corrupt");
  }

  // --- Payload bytes, never more than the declared (capped) size.
  ByteBuffer& payload = h.layout == Layout::kColumnar ? s.columnar_payload : out->payload_;
  payload.Reserve(static_cast<size_t>(h.uncompressed_size) + kSlack);
  payload.Resize(h.uncompressed_size);
  if (h.compression == Compression::kNone) {
    if (h.stored_size != 0) std::memcpy(payload.data(), stored, h.stored_size);
  } else if (h.compression == Compression::kZstdSections) {
    absl::Status st = DecodeSections(stored, h.stored_size, payload.data(), h.uncompressed_size);
    if (!st.ok()) return st;
  } else {
    absl::Status st = DecompressExact(s.dctx, stored, h.stored_size, payload.data(),
                                      h.uncompressed_size, "zstd payload");
    if (!st.ok()) return st;
  }

  // --- Records.
  const size_t n = h.record_count;
  const uint8_t* p = payload.data();
  const uint8_t* end = p + payload.size();
  switch (h.layout) {
    case Layout::kOpaque:
    case Layout::kMsgpack: {
      // Every record takes at least two payload bytes; refuse impossible counts before
      // sizing the index.
      if (n > payload.size() / 2) {
        return absl::InvalidArgumentError(absl::StrCat("record count ", n, " is impossible for ",
                                                       payload.size(), " payload bytes"));
      }
      out->index_.Resize(n);
      absl::Status st = h.layout == Layout::kOpaque ? IndexOpaque(p, end, n, out->index_.data())
                                                    : IndexMsgpack(p, end, n, out->index_.data());
      if (!st.ok()) return st;
      out->base_ = payload.data();
      break;
    }
    case Layout::kColumnar: {
      absl::Status st =
          s.columnar.Decode(p, payload.size(), h.record_count, limits.max_uncompressed_bytes,
                            &out->rows_, &out->index_, options_.keys_only);
      if (!st.ok()) return st;
      out->base_ = out->rows_.data();
      break;
    }
  }
  out->header_ = h;

  if (h.sorted_by_key() && options_.verify_sorted) {
    for (size_t i = 1; i < n; ++i) {
      if (KeyLess((*out)[i].key, (*out)[i - 1].key)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "frame is flagged sorted but record ", i, "'s key orders before record ", i - 1, "'s"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice
