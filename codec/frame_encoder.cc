#include "codec/frame_encoder.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/buffer.h"
#include "codec/columnar.h"
#include "codec/msgpack_scan.h"
#include "codec/varint.h"

namespace sluice {

struct FrameEncoder::State {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ColumnarEncoder columnar;
  ByteBuffer payload;
  std::vector<Record> sorted;
  std::vector<Record> sort_scratch;
  int zstd_skips_left = 0;  // adaptive compression: frames still to store without trying zstd
  ~State() { ZSTD_freeCCtx(cctx); }
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
  if (choice == LayoutChoice::kAuto || choice == LayoutChoice::kColumnar) {
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
  bool try_zstd = options_.compression == Compression::kZstd && !s.payload.empty();
  if (try_zstd && s.zstd_skips_left > 0) {
    --s.zstd_skips_left;
    try_zstd = false;
  }
  if (try_zstd) {
    const size_t bound = ZSTD_compressBound(s.payload.size());
    out->resize(frame_start + kFrameHeaderSize + bound);
    const size_t r = ZSTD_compressCCtx(s.cctx, out->data() + frame_start + kFrameHeaderSize, bound,
                                       s.payload.data(), s.payload.size(), options_.zstd_level);
    if (ZSTD_isError(r)) {
      out->resize(frame_start);
      return absl::InternalError(absl::StrCat("zstd compression failed: ", ZSTD_getErrorName(r)));
    }
    if (r < s.payload.size()) {
      h.compression = Compression::kZstd;
      stored = r;
    }
    const double saved = 1.0 - static_cast<double>(std::min(r, s.payload.size())) /
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
  return absl::OkStatus();
}

}  // namespace sluice
