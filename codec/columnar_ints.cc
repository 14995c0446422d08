// COLUMNAR integer streams: choosing and writing an encoding, and reading one back
// (columnar_ints.h).
#include "codec/columnar_ints.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codec/msgpack_scan.h"

namespace sluice::columnar_internal {
namespace {

// Ints that look uniform over their range (SerializeInts) are packed at up to this many bits,
// judged on at least this many sampled values.
constexpr uint32_t kMaxUniformPackedBits = 32;
constexpr size_t kMinUniformSample = 64;

// Whether the `count` values get(0..count-1) fill the 16 equal parts of [lo, lo + range]
// evenly: none holds fewer than half its share.
template <typename Get>
bool LooksUniformBy(size_t count, Get get, int64_t lo, uint64_t range) {
  uint32_t parts[16] = {};
  for (size_t k = 0; k < count; ++k) {
    const uint64_t off = static_cast<uint64_t>(get(k)) - static_cast<uint64_t>(lo);
    ++parts[static_cast<size_t>((static_cast<unsigned __int128>(off) * 16) / (range + 1))];
  }
  for (const uint32_t c : parts) {
    if (c * 32 < count) return false;
  }
  return true;
}

// The same for the sampled values: every step-th of the n at v.
bool LooksUniform(const int64_t* v, size_t n, size_t step, int64_t lo, uint64_t range) {
  return LooksUniformBy((n + step - 1) / step, [v, step](size_t k) { return v[k * step]; }, lo,
                        range);
}

// The step from value i-1 to value i (mod 2^64).
inline int64_t StepAt(const int64_t* v, size_t i) {
  return static_cast<int64_t>(static_cast<uint64_t>(v[i]) - static_cast<uint64_t>(v[i - 1]));
}

// The bytes of a packed stream of n values: the encoding byte, the base, the bits byte and
// n b-bit offsets from the base, b enough for `range`.
uint64_t PackedSize(size_t n, int64_t base, uint64_t range) {
  return 2 + VarintLength(ZigZag(base)) + (n * BitsFor(range + 1) + 7) / 8;
}

// The same for a delta-packed stream: its first value, the smallest step `base`, then the
// n-1 steps' offsets from it.
uint64_t DeltaPackedSize(const int64_t* v, size_t n, int64_t base, uint64_t range) {
  return 2 + VarintLength(ZigZag(v[0])) + VarintLength(ZigZag(base)) +
         ((n - 1) * BitsFor(range + 1) + 7) / 8;
}

// What the choice of an encoding is made on: an even sample of at most 512 values, so that
// the column is only walked once more, to write it.
struct IntSample {
  size_t step;               // the sample is every step-th value
  size_t sampled;            // how many values that is
  size_t plain, delta;       // their bytes as plain and as delta varints
  int64_t lo, hi;            // their range
  int64_t step_lo, step_hi;  // the range of the steps at the sampled places from the second on
  uint64_t varint_bytes;     // the column's bytes as the smaller varints, estimated
};

IntSample Sample(const int64_t* v, size_t n) {
  IntSample s;
  s.step = n > 512 ? n / 512 : 1;
  s.plain = 0;
  s.delta = 0;
  s.lo = s.hi = v[0];
  s.step_lo = n >= 2 ? StepAt(v, 1) : 0;
  s.step_hi = s.step_lo;
  for (size_t i = 0; i < n; i += s.step) {
    s.plain += VarintLength(ZigZag(v[i]));
    const uint64_t prev = i == 0 ? 0 : static_cast<uint64_t>(v[i - 1]);
    s.delta += VarintLength(ZigZag(static_cast<int64_t>(static_cast<uint64_t>(v[i]) - prev)));
    s.lo = std::min(s.lo, v[i]);
    s.hi = std::max(s.hi, v[i]);
    if (i > 0) {
      s.step_lo = std::min(s.step_lo, StepAt(v, i));
      s.step_hi = std::max(s.step_hi, StepAt(v, i));
    }
  }
  s.sampled = (n + s.step - 1) / s.step;
  s.varint_bytes = std::min(s.plain, s.delta) * n / s.sampled;
  return s;
}

// Delta-packed: a column that rises (or falls) by steps within a narrow range (timestamps,
// counters with jitter), judged like packed values but on the steps (a small range, or steps
// spread evenly over theirs), and written when it is smaller than the varints and than packed
// values (`packed_size`, when values_packed; estimated on the sample); the whole column's step
// range decides the width, and the size is checked again with it against the varints'
// estimate. Returns the end, or null when the column is not written so (n >= 3).
uint8_t* SerializeDeltaPacked(const int64_t* v, size_t n, const IntSample& s, bool values_packed,
                              uint64_t packed_size, uint8_t* w) {
  int64_t step_lo = s.step_lo, step_hi = s.step_hi;
  const uint64_t step_range = static_cast<uint64_t>(step_hi) - static_cast<uint64_t>(step_lo);
  const size_t step_samples = (n - 1) / s.step;  // sampled places from the second value on
  const bool steps_small = step_range < (uint64_t{1} << kMaxSmallPackedBits);
  const bool steps_uniform =
      !steps_small && step_samples >= kMinUniformSample &&
      step_range < (uint64_t{1} << kMaxUniformPackedBits) &&
      LooksUniformBy(
          step_samples, [&](size_t k) { return StepAt(v, (k + 1) * s.step); }, step_lo, step_range);
  const uint64_t estimate = DeltaPackedSize(v, n, step_lo, step_range);
  if (!(steps_small || steps_uniform) || estimate >= s.varint_bytes ||
      (values_packed && estimate >= packed_size)) {
    return nullptr;
  }
  for (size_t i = 1; i < n; ++i) {
    step_lo = std::min(step_lo, StepAt(v, i));
    step_hi = std::max(step_hi, StepAt(v, i));
  }
  const uint64_t range = static_cast<uint64_t>(step_hi) - static_cast<uint64_t>(step_lo);
  if (range >= (uint64_t{1} << (steps_small ? kMaxSmallPackedBits : kMaxUniformPackedBits)) ||
      DeltaPackedSize(v, n, step_lo, range) >= s.varint_bytes) {
    return nullptr;
  }
  const uint8_t bits = BitsFor(range + 1);
  *w++ = kIntDeltaPacked;
  w = PutVarint(w, ZigZag(v[0]));
  w = PutVarint(w, ZigZag(step_lo));
  *w++ = bits;
  const auto base = static_cast<uint64_t>(step_lo);
  return PackFixedWidth(n - 1, bits, w, [v, base](size_t i) {
    return static_cast<uint32_t>(static_cast<uint64_t>(v[i + 1]) - static_cast<uint64_t>(v[i]) -
                                 base);
  });
}

// Packed values, chosen on the sample (values_packed): the whole column's range decides the
// width, and must still be within the limit (`small`: kMaxSmallPackedBits, else
// kMaxUniformPackedBits) and smaller than the varints. Returns the end, or null.
uint8_t* SerializePackedValues(const int64_t* v, size_t n, const IntSample& s, bool small,
                               uint8_t* w) {
  int64_t lo = s.lo, hi = s.hi;
  for (size_t i = 0; i < n; ++i) {
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
  }
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  if (range >= (uint64_t{1} << (small ? kMaxSmallPackedBits : kMaxUniformPackedBits)) ||
      PackedSize(n, lo, range) >= s.varint_bytes) {
    return nullptr;
  }
  const uint8_t bits = BitsFor(range + 1);
  *w++ = kIntPacked;
  w = PutVarint(w, ZigZag(lo));
  *w++ = bits;
  const auto base = static_cast<uint64_t>(lo);
  return PackFixedWidth(n, bits, w, [v, base](size_t i) {
    return static_cast<uint32_t>(static_cast<uint64_t>(v[i]) - base);
  });
}

uint8_t* SerializeVarints(const int64_t* v, size_t n, bool delta, uint8_t* w) {
  if (delta) {
    *w++ = kIntDelta;
    uint64_t prev = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto x = static_cast<uint64_t>(v[i]);
      w = PutVarint(w, ZigZag(static_cast<int64_t>(x - prev)));
      prev = x;
    }
  } else {
    *w++ = kIntPlain;
    for (size_t i = 0; i < n; ++i) w = PutVarint(w, ZigZag(v[i]));
  }
  return w;
}

}  // namespace

uint8_t* SerializeInts(const int64_t* v, size_t n, uint8_t* w, bool allow_step) {
  // An arithmetic sequence (row ids, sequence numbers) is stored as its first value and step.
  if (allow_step && n >= 2) {
    const uint64_t by = static_cast<uint64_t>(v[1]) - static_cast<uint64_t>(v[0]);
    uint64_t off = 0;
    for (size_t i = 2; i < n; ++i) {
      off |= (static_cast<uint64_t>(v[i]) - static_cast<uint64_t>(v[i - 1])) ^ by;
    }
    if (off == 0) {
      *w++ = kIntStep;
      w = PutVarint(w, ZigZag(v[0]));
      return PutVarint(w, ZigZag(static_cast<int64_t>(by)));
    }
  }
  const IntSample s = Sample(v, n);
  // Stored as b-bit offsets from the minimum, when that is smaller than the varints
  // (estimated): a small range (flags, ratings, small counts, enum-like ints) with
  // b <= kMaxSmallPackedBits, or values spread evenly over their range (random ids, hashes,
  // uniform draws), which no entropy coder stores in fewer than b bits. The sample rules most
  // columns out, the whole column decides.
  const uint64_t sample_range = static_cast<uint64_t>(s.hi) - static_cast<uint64_t>(s.lo);
  const bool small = sample_range < (uint64_t{1} << kMaxSmallPackedBits);
  const bool uniform = !small && s.sampled >= kMinUniformSample &&
                       sample_range < (uint64_t{1} << kMaxUniformPackedBits) &&
                       LooksUniform(v, n, s.step, s.lo, sample_range);
  const uint64_t packed_size = PackedSize(n, s.lo, sample_range);
  const bool values_packed = (small || uniform) && packed_size < s.varint_bytes;
  if (n >= 3) {
    if (uint8_t* end = SerializeDeltaPacked(v, n, s, values_packed, packed_size, w)) return end;
  }
  if (values_packed) {
    if (uint8_t* end = SerializePackedValues(v, n, s, small, w)) return end;
  }
  return SerializeVarints(v, n, s.delta < s.plain, w);
}

namespace {

// Validates n zigzag varints (running sums for delta) at p; returns the pointer past them, or
// null. With kSizes, adds the msgpack size of every value to *sizes.
template <bool kDelta, bool kSizes>
const uint8_t* CheckVarints(const uint8_t* p, const uint8_t* end, size_t n, uint64_t* sizes) {
  uint64_t prev = 0;
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t z;
    if (!GetVarint(&p, end, &z)) return nullptr;
    int64_t v = UnZigZag(z);
    if constexpr (kDelta) {
      prev += static_cast<uint64_t>(v);
      v = static_cast<int64_t>(prev);
    }
    if constexpr (kSizes) total += mp::IntSize(v);
  }
  if constexpr (kSizes) *sizes = total;
  return p;
}

// kIntStep: the first value and the step (zigzag varints).
absl::Status ReadStep(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                      IntReader* r, uint64_t* sizes) {
  const uint8_t* p = *pp;
  uint64_t first, by;
  if (!GetVarint(&p, end, &first) || !GetVarint(&p, end, &by)) {
    return Corrupt(absl::StrCat("column '", name, "' has a truncated integer sequence"));
  }
  r->encoding = IntReader::Encoding::kStep;
  r->first = static_cast<uint64_t>(UnZigZag(first));
  r->by = static_cast<uint64_t>(UnZigZag(by));
  if (sizes != nullptr) {  // one loop per encoding, so no value pays for the others' branches
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) total += mp::IntSize(r->Step(i));
    *sizes = total;
  }
  *pp = p;
  return absl::OkStatus();
}

// kIntPacked: the base (a zigzag varint), the bits byte, then n b-bit offsets.
absl::Status ReadPacked(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                        IntReader* r, uint64_t* sizes) {
  const uint8_t* p = *pp;
  uint64_t zbase;
  if (!GetVarint(&p, end, &zbase) || p >= end) {
    return Corrupt(absl::StrCat("column '", name, "' has a truncated packed integer header"));
  }
  const uint32_t bits = *p++;
  if (bits < 1 || bits > kMaxIntPackedBits) {
    return Corrupt(absl::StrCat("column '", name, "' has ", bits, "-bit packed integers"));
  }
  const uint64_t total_bits = uint64_t{n} * bits;  // n is bounded by the rows cap
  const uint64_t size = (total_bits + 7) / 8;
  if (static_cast<uint64_t>(end - p) < size) {
    return Corrupt(absl::StrCat("column '", name, "' packed integers are truncated"));
  }
  if (!PaddingIsZero(p, total_bits)) {
    return Corrupt(absl::StrCat("column '", name, "' has nonzero padding after its integers"));
  }
  r->encoding = IntReader::Encoding::kPacked;
  r->first = static_cast<uint64_t>(UnZigZag(zbase));
  r->bits = bits;
  r->data = p;
  r->data_end = p + size;
  if (sizes != nullptr) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) total += mp::IntSize(r->Packed(i));
    *sizes = total;
  }
  *pp = p + size;
  return absl::OkStatus();
}

// kIntDeltaPacked: the first value and the smallest step (zigzag varints), the bits byte,
// then n-1 b-bit step offsets.
absl::Status ReadDeltaPacked(const uint8_t** pp, const uint8_t* end, size_t n,
                             absl::string_view name, IntReader* r, uint64_t* sizes) {
  const uint8_t* p = *pp;
  uint64_t zfirst, zbase;
  if (!GetVarint(&p, end, &zfirst) || !GetVarint(&p, end, &zbase) || p >= end) {
    return Corrupt(absl::StrCat("column '", name, "' has a truncated delta-packed integer header"));
  }
  const uint32_t bits = *p++;
  if (bits < 1 || bits > kMaxIntPackedBits) {
    return Corrupt(absl::StrCat("column '", name, "' has ", bits, "-bit packed integer steps"));
  }
  const uint64_t steps = n > 0 ? n - 1 : 0;
  const uint64_t total_bits = steps * bits;  // n is bounded by the rows cap
  const uint64_t size = (total_bits + 7) / 8;
  if (static_cast<uint64_t>(end - p) < size) {
    return Corrupt(absl::StrCat("column '", name, "' packed integer steps are truncated"));
  }
  if (!PaddingIsZero(p, total_bits)) {
    return Corrupt(absl::StrCat("column '", name, "' has nonzero padding after its integer steps"));
  }
  r->encoding = IntReader::Encoding::kDeltaPacked;
  r->first = static_cast<uint64_t>(UnZigZag(zfirst));
  r->by = static_cast<uint64_t>(UnZigZag(zbase));
  r->bits = bits;
  r->data = p;
  r->data_end = p + size;
  if (sizes != nullptr) {  // the values' msgpack sizes, from a first pass over them
    uint64_t total = 0;
    uint64_t v = r->first;
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) v = r->NextDeltaPacked(v, i - 1);
      total += mp::IntSize(static_cast<int64_t>(v));
    }
    *sizes = total;
  }
  *pp = p + size;
  return absl::OkStatus();
}

// kIntPlain and kIntDelta: n zigzag varints (running sums for delta), validated here and
// decoded again a chunk at a time while rebuilding.
absl::Status ReadVarints(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                         bool delta, IntReader* r, uint64_t* sizes) {
  const uint8_t* p = *pp;
  if (static_cast<size_t>(end - p) < n) {  // at least one byte per value
    return Corrupt(absl::StrCat("column '", name, "' integers are truncated"));
  }
  r->encoding = delta ? IntReader::Encoding::kDeltaVarints : IntReader::Encoding::kVarints;
  r->data = p;
  if (sizes != nullptr) {
    p = delta ? CheckVarints<true, true>(p, end, n, sizes)
              : CheckVarints<false, true>(p, end, n, sizes);
  } else {
    p = delta ? CheckVarints<true, false>(p, end, n, nullptr)
              : CheckVarints<false, false>(p, end, n, nullptr);
  }
  if (p == nullptr) {
    return Corrupt(absl::StrCat("column '", name, "' has a truncated or over-long varint"));
  }
  r->data_end = p;
  *pp = p;
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadInts(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                      bool allow_step, IntReader* r, uint64_t* sizes) {
  const uint8_t* p = *pp;
  if (p >= end || *p > kIntDeltaPacked || (*p == kIntStep && !allow_step)) {
    return Corrupt(
        absl::StrCat("column '", name, "' has ",
                     p >= end ? "no integer encoding byte" : "an unknown integer encoding"));
  }
  const uint8_t encoding = *p++;
  absl::Status st;
  switch (encoding) {
    case kIntStep:
      st = ReadStep(&p, end, n, name, r, sizes);
      break;
    case kIntPacked:
      st = ReadPacked(&p, end, n, name, r, sizes);
      break;
    case kIntDeltaPacked:
      st = ReadDeltaPacked(&p, end, n, name, r, sizes);
      break;
    default:
      st = ReadVarints(&p, end, n, name, encoding == kIntDelta, r, sizes);
      break;
  }
  if (st.ok()) *pp = p;
  return st;
}

}  // namespace sluice::columnar_internal
