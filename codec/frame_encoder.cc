#include "codec/frame_encoder.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/buffer.h"
#include "codec/columnar.h"
#include "codec/msgpack_scan.h"
#include "codec/varint.h"
#include "codec/zstd_pool.h"

namespace sluice {

namespace {
// Compression contexts and kZstdSections scratch.
struct FrameEncoderScratch {
  ZSTD_CCtx* cctx = zstd_pool::TakeCCtx();
  ZSTD_CCtx* plain_cctx = zstd_pool::TakeCCtx();  // plain sections: their own level and tables
  ByteBuffer entropy_part, plain_part, zscratch, table;
  FrameEncoderScratch() = default;
  FrameEncoderScratch(const FrameEncoderScratch&) = delete;
  FrameEncoderScratch& operator=(const FrameEncoderScratch&) = delete;
  ~FrameEncoderScratch() {
    zstd_pool::GiveCCtx(cctx);
    zstd_pool::GiveCCtx(plain_cctx);
  }
};
}  // namespace

struct FrameEncoder::State {
  FrameEncoderScratch z;
  ColumnarEncoder columnar;
  ByteBuffer payload;
  std::vector<Record> sorted;
  std::vector<Record> sort_scratch;
  int zstd_skips_left = 0;  // adaptive compression: frames still to store without trying zstd
};

FrameEncoder::FrameEncoder(EncodeOptions options)
    : options_(options), state_(std::make_unique<State>()) {}
FrameEncoder::~FrameEncoder() = default;

namespace {

bool IsSortedByKey(absl::Span<const Record> records) {
  for (size_t i = 1; i < records.size(); ++i) {
    if (KeyLess(records[i].key, records[i - 1].key)) return false;
  }
  return true;
}

// Checks that every value is exactly one msgpack object; on failure says which and why.
bool AllValuesMsgpack(absl::Span<const Record> records, std::string* why_not) {
  for (size_t i = 0; i < records.size(); ++i) {
    const auto* v = reinterpret_cast<const uint8_t*>(records[i].value.data());
    const uint8_t* end = v + records[i].value.size();
    mp::ScanError err;
    const uint8_t* q = mp::SkipObject(v, end, &err);
    if (q == nullptr) {
      *why_not =
          absl::StrCat("record ", i, ": value is not msgpack (", mp::ScanErrorName(err), ")");
      return false;
    }
    if (q != end) {
      *why_not =
          absl::StrCat("record ", i, ": value has ", end - q, " bytes after its msgpack object");
      return false;
    }
  }
  return true;
}

void WriteMsgpackRows(absl::Span<const Record> records, ByteBuffer* payload) {
  size_t bound = 0;
  for (const Record& r : records) bound += 5 + r.key.size() + r.value.size();
  uint8_t* const start = payload->Extend(bound);
  uint8_t* w = start;
  for (const Record& r : records) {
    w = mp::WriteBinHeader(w, static_cast<uint32_t>(r.key.size()));
    std::memcpy(w, r.key.data(), r.key.size());
    w += r.key.size();
    std::memcpy(w, r.value.data(), r.value.size());
    w += r.value.size();
  }
  payload->Resize(payload->size() - bound + static_cast<size_t>(w - start));
}

void WriteOpaqueRows(absl::Span<const Record> records, ByteBuffer* payload) {
  size_t bound = 0;
  for (const Record& r : records) bound += 2 * kMaxVarintBytes + r.key.size() + r.value.size();
  uint8_t* const start = payload->Extend(bound);
  uint8_t* w = start;
  for (const Record& r : records) {
    w = PutVarint(w, r.key.size());
    std::memcpy(w, r.key.data(), r.key.size());
    w += r.key.size();
    w = PutVarint(w, r.value.size());
    std::memcpy(w, r.value.data(), r.value.size());
    w += r.value.size();
  }
  payload->Resize(payload->size() - bound + static_cast<size_t>(w - start));
}

constexpr size_t kPlainProbeBytes = 64 << 10;
// An encoder drops its sections scratch after a frame that left more than this behind.
constexpr size_t kMaxRetainedSectionScratch = 16u << 20;

// Appends to *out the kZstdSections form of `payload` (docs/frame-format.md): the plain spans
// compressed together at kPlainSectionLevel, the rest together at `level`, each part stored
// raw instead when zstd does not shrink it. Returns the stored size, or 0 if zstd failed.
size_t WriteSections(const ByteBuffer& payload, absl::Span<const ColumnarEncoder::Span> plain,
                     int level, FrameEncoderScratch& s, std::string* out) {
  s.table.Clear();
  uint8_t* const entries = s.table.Extend((2 * plain.size() + 1) * kMaxVarintBytes);
  uint8_t* e = entries;
  size_t sections = 0;
  const uint8_t* data = payload.data();
  // Each part's bytes: a view into the payload while it is one range, else gathered.
  struct Part {
    ByteBuffer* buf;
    const uint8_t* first = nullptr;
    size_t first_len = 0;
    int ranges = 0;
    size_t size = 0;
    void Add(const uint8_t* p, size_t n) {
      if (ranges == 1) buf->Append(first, first_len);
      if (ranges == 0) {
        first = p;
        first_len = n;
      } else {
        buf->Append(p, n);
      }
      ++ranges;
      size += n;
    }
    const uint8_t* bytes() const { return ranges == 1 ? first : buf->data(); }
  };
  s.entropy_part.Clear();
  s.plain_part.Clear();
  Part parts[2] = {{&s.entropy_part}, {&s.plain_part}};
  uint32_t at = 0;
  auto add = [&](uint32_t off, uint32_t len, bool is_plain) {
    if (len == 0) return;
    e = PutVarint(e, (uint64_t{len} << 1) | (is_plain ? 1 : 0));
    ++sections;
    parts[is_plain ? 1 : 0].Add(data + off, len);
  };
  for (const ColumnarEncoder::Span& sp : plain) {
    add(at, sp.offset - at, false);
    add(sp.offset, sp.length, true);
    at = sp.offset + sp.length;
  }
  add(at, static_cast<uint32_t>(payload.size()) - at, false);
  const auto entries_size = static_cast<size_t>(e - entries);
  const Part& entropy = parts[0];
  const Part& plain_bytes = parts[1];

  // Entropy part: the frame's zstd level.
  uint8_t flags = 0;
  const uint8_t* entropy_bytes = entropy.bytes();
  size_t entropy_stored = entropy.size;
  if (entropy.size != 0) {
    const size_t bound = ZSTD_compressBound(entropy.size);
    s.zscratch.Resize(bound);
    const size_t r =
        ZSTD_compressCCtx(s.cctx, s.zscratch.data(), bound, entropy.bytes(), entropy.size, level);
    if (ZSTD_isError(r)) return 0;
    if (r < entropy.size) {
      flags |= kSectionsEntropyZstd;
      entropy_bytes = s.zscratch.data();
      entropy_stored = r;
    }
  }
  uint8_t head[1 + 2 * kMaxVarintBytes];
  uint8_t* h = head + 1;
  h = PutVarint(h, sections);
  const auto head1 = static_cast<size_t>(h - head);
  uint8_t tail[kMaxVarintBytes];
  const auto tail_size = static_cast<size_t>(PutVarint(tail, entropy_stored) - tail);
  const size_t prefix = head1 + entries_size + tail_size;

  // Plain part, straight into the output.
  const size_t start = out->size();
  const size_t plain_bound = ZSTD_compressBound(plain_bytes.size);
  out->resize(start + prefix + entropy_stored + plain_bound);
  auto* w = reinterpret_cast<uint8_t*>(out->data() + start);
  if (entropy_stored != 0) std::memcpy(w + prefix, entropy_bytes, entropy_stored);
  uint8_t* const plain_out = w + prefix + entropy_stored;
  size_t plain_stored = plain_bytes.size;
  // A large plain part is probed first: when zstd cannot shrink its first kPlainProbeBytes
  // by 1% (random ids, packed text: no repeats either), the rest is not worth its time.
  bool try_plain = true;
  if (plain_bytes.size > 2 * kPlainProbeBytes) {
    const size_t p = ZSTD_compressCCtx(s.plain_cctx, plain_out, plain_bound, plain_bytes.bytes(),
                                       kPlainProbeBytes, kPlainSectionLevel);
    try_plain = !ZSTD_isError(p) && p * 100 < kPlainProbeBytes * 99;
  }
  const size_t r =
      try_plain ? ZSTD_compressCCtx(s.plain_cctx, plain_out, plain_bound, plain_bytes.bytes(),
                                    plain_bytes.size, kPlainSectionLevel)
                : plain_bytes.size;
  if (ZSTD_isError(r)) {
    out->resize(start);
    return 0;
  }
  if (r < plain_bytes.size) {
    flags |= kSectionsPlainZstd;
    plain_stored = r;
  } else {
    std::memcpy(plain_out, plain_bytes.bytes(), plain_bytes.size);
  }
  head[0] = flags;
  std::memcpy(w, head, head1);
  std::memcpy(w + head1, entries, entries_size);
  std::memcpy(w + head1 + entries_size, tail, tail_size);
  const size_t total = prefix + entropy_stored + plain_stored;
  out->resize(start + total);
  return total;
}

}  // namespace

absl::Status FrameEncoder::Encode(absl::Span<const Record> records, std::string* out) {
  State& s = *state_;
  const FrameLimits& limits = options_.limits;
  last_fallback_reason_.clear();
  if (records.size() > limits.max_records) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", records.size(),
                                                   " records exceeds the frame limit of ",
                                                   limits.max_records, "; split it"));
  }
  uint64_t record_bytes = 0;
  for (const Record& r : records) record_bytes += r.key.size() + r.value.size();
  if (record_bytes > limits.max_uncompressed_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", record_bytes, " bytes exceeds the frame cap of ",
                     limits.max_uncompressed_bytes, " bytes; split it"));
  }

  bool sorted = IsSortedByKey(records);
  if (options_.sort_by_key && !sorted) {
    s.sorted.assign(records.begin(), records.end());
    StableSortByKey(absl::MakeSpan(s.sorted), &s.sort_scratch);
    records = absl::MakeConstSpan(s.sorted);
    sorted = true;
  }

  // --- Layout.
  s.payload.Clear();
  const LayoutChoice choice = options_.layout;
  bool decided = false;
  Layout layout = Layout::kOpaque;
  const bool try_columnar =
      choice == LayoutChoice::kColumnar ||
      (choice == LayoutChoice::kAuto && records.size() >= options_.min_columnar_records);
  if (try_columnar) {
    if (s.columnar.Encode(records, &s.payload, &last_fallback_reason_)) {
      layout = Layout::kColumnar;
      decided = true;
    }
  }
  if (!decided && choice != LayoutChoice::kOpaque) {
    std::string why_not;
    if (AllValuesMsgpack(records, &why_not)) {
      WriteMsgpackRows(records, &s.payload);
      layout = Layout::kMsgpack;
      decided = true;
    } else if (choice != LayoutChoice::kAuto) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout ", LayoutChoiceName(choice), " needs msgpack values: ", why_not));
    } else {
      if (!last_fallback_reason_.empty()) last_fallback_reason_ += "; ";
      last_fallback_reason_ += why_not;
    }
  }
  if (!decided) {
    WriteOpaqueRows(records, &s.payload);
    layout = Layout::kOpaque;
  }
  if (s.payload.size() > limits.max_uncompressed_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("encoded payload of ", s.payload.size(), " bytes exceeds the frame cap of ",
                     limits.max_uncompressed_bytes, " bytes; split the batch"));
  }

  // --- Compression, straight into the output.
  FrameHeader h;
  h.layout = layout;
  h.flags = sorted ? kFlagSortedByKey : 0;
  h.record_count = static_cast<uint32_t>(records.size());
  h.uncompressed_size = static_cast<uint32_t>(s.payload.size());
  const size_t frame_start = out->size();
  size_t stored = s.payload.size();
  h.compression = Compression::kNone;
  bool try_zstd = options_.compression != Compression::kNone && !s.payload.empty() &&
                  s.payload.size() >= options_.min_zstd_payload;
  if (try_zstd && s.zstd_skips_left > 0) {
    --s.zstd_skips_left;
    try_zstd = false;
  }
  // Sections when the layout marked enough plain bytes: they skip zstd's entropy stage.
  absl::Span<const ColumnarEncoder::Span> plain;
  if (try_zstd && layout == Layout::kColumnar && options_.plain_sections &&
      s.payload.size() >= kMinSectionedPayload) {
    plain = s.columnar.plain_spans();
    size_t plain_bytes = 0;
    for (const auto& sp : plain) plain_bytes += sp.length;
    if (plain_bytes < kMinPlainSectionBytes || plain.size() > kMaxPlainSpans) plain = {};
  }
  size_t zstd_stored = 0;  // what zstd made of the payload, if tried
  if (try_zstd && !plain.empty()) {
    out->resize(frame_start + kFrameHeaderSize);
    const size_t r = WriteSections(s.payload, plain, options_.zstd_level, s.z, out);
    if (r == 0) {
      out->resize(frame_start);
      return absl::InternalError("zstd compression failed");
    }
    zstd_stored = r;
    if (r < s.payload.size()) {
      h.compression = Compression::kZstdSections;
      stored = r;
    }
  } else if (try_zstd) {
    const size_t bound = ZSTD_compressBound(s.payload.size());
    out->resize(frame_start + kFrameHeaderSize + bound);
    const size_t r =
        ZSTD_compressCCtx(s.z.cctx, out->data() + frame_start + kFrameHeaderSize, bound,
                          s.payload.data(), s.payload.size(), options_.zstd_level);
    if (ZSTD_isError(r)) {
      out->resize(frame_start);
      return absl::InternalError(absl::StrCat("zstd compression failed: ", ZSTD_getErrorName(r)));
    }
    zstd_stored = r;
    if (r < s.payload.size()) {
      h.compression = Compression::kZstd;
      stored = r;
    }
  }
  if (try_zstd) {
    const double saved = 1.0 - static_cast<double>(std::min(zstd_stored, s.payload.size())) /
                                   static_cast<double>(s.payload.size());
    if (options_.min_zstd_saving > 0 && saved < options_.min_zstd_saving) {
      s.zstd_skips_left = options_.zstd_skip_frames;
    }
  }
  if (h.compression == Compression::kNone) {
    out->resize(frame_start + kFrameHeaderSize + stored);
    if (stored != 0) {
      std::memcpy(out->data() + frame_start + kFrameHeaderSize, s.payload.data(), stored);
    }
  } else {
    out->resize(frame_start + kFrameHeaderSize + stored);
  }
  auto* frame = reinterpret_cast<uint8_t*>(out->data() + frame_start);
  h.stored_size = static_cast<uint32_t>(stored);
  h.payload_checksum = PayloadChecksum(frame + kFrameHeaderSize, stored);
  WriteFrameHeader(h, frame);
  last_layout_ = layout;
  // Reuse the sections scratch, but do not keep a huge frame's worth of it for good.
  if (s.z.entropy_part.capacity() + s.z.plain_part.capacity() + s.z.zscratch.capacity() >
      kMaxRetainedSectionScratch) {
    s.z.entropy_part = ByteBuffer();
    s.z.plain_part = ByteBuffer();
    s.z.zscratch = ByteBuffer();
  }
  return absl::OkStatus();
}

}  // namespace sluice
