// COLUMNAR float and bool columns: writing and reading them (columnar_scalars.h).
#include "codec/columnar_scalars.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace sluice::columnar_internal {
namespace {

// If v == m / 10^e exactly (bit for bit, as the decoder will compute it), sets *m.
inline bool DecimalOf(double v, int e, int64_t* m) {
  const double p = kPow10[e];
  if (!(std::fabs(v) < 4503599627370496.0 / p)) return false;  // also rejects NaN and inf
  const double scaled = v * p;
  // Round to nearest with the 2^52 + 2^51 trick (|scaled| < 2^52 here).
  const double r = (scaled + 6755399441055744.0) - 6755399441055744.0;
  const auto mm = static_cast<int64_t>(r);
  if (DoubleBits(static_cast<double>(mm) / p) != DoubleBits(v)) return false;
  *m = mm;
  return true;
}

// Decimal floats (prices, rounded measurements): when every value is m / 10^e exactly for
// one e, the column is stored as the integers m, which compress far better than raw bits.
// The exponent comes from the first values; one miss anywhere keeps the column raw.
bool ToDecimals(const uint8_t* fixed, size_t n, PodBuffer<int64_t>* mantissas, int* exponent) {
  if (n == 0) return false;
  auto value = [fixed](size_t i) { return BitsDouble(LoadBE64(fixed + 8 * i)); };
  int e = 0;
  int64_t m;
  for (size_t i = 0; i < n && i < 16; ++i) {
    while (e <= kMaxDecimalExponent && !DecimalOf(value(i), e, &m)) ++e;
    if (e > kMaxDecimalExponent) return false;
  }
  mantissas->Resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (!DecimalOf(value(i), e, &(*mantissas)[i])) return false;
  }
  *exponent = e;
  return true;
}

// n bytes of 0 or 1 as n bits, least significant first; returns the end.
uint8_t* PackBools(const uint8_t* v, size_t n, uint8_t* w) {
  size_t i = 0;
  // Eight 0/1 bytes to one byte: the multiplier moves byte k's bit to bit 56 + k, and no two
  // partial products share a bit, so nothing carries.
  for (; i + 8 <= n; i += 8) {
    *w++ = static_cast<uint8_t>((LoadLE64(v + i) * 0x0102040810204080ULL) >> 56);
  }
  if (i < n) {
    uint8_t last = 0;
    for (size_t k = 0; i + k < n; ++k) last |= static_cast<uint8_t>(v[i + k] << k);
    *w++ = last;
  }
  return w;
}

}  // namespace

uint8_t* SerializeFloat64s(const uint8_t* fixed, size_t n, PodBuffer<int64_t>* mantissas,
                           uint8_t* w, uint8_t** bulk) {
  int e;
  if (ToDecimals(fixed, n, mantissas, &e)) {
    *w++ = kFloatDecimal;
    *w++ = static_cast<uint8_t>(e);
    *bulk = w + 1;
    return SerializeInts(mantissas->data(), n, w, /*allow_step=*/false);
  }
  *w++ = kFloatRaw;
  *bulk = w;
  std::memcpy(w, fixed, n * 8);
  return w + n * 8;
}

uint8_t* SerializeFloat32s(const uint8_t* fixed, size_t n, uint8_t* w, uint8_t** bulk) {
  *w++ = kFloatRaw;
  *bulk = w;
  std::memcpy(w, fixed, n * 4);
  return w + n * 4;
}

uint8_t* SerializeBools(const uint8_t* values, size_t n, uint8_t* w, uint8_t** bulk) {
  if (1 + (n + 7) / 8 >= n) {  // 1 or 2 values: a byte each (no encoding byte) is as small
    std::memcpy(w, values, n);
    return w + n;
  }
  *w++ = kBoolPacked;
  *bulk = w;
  return PackBools(values, n, w);
}

absl::Status ReadBools(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                       Storage* storage, const uint8_t** values, uint64_t* rebuilt) {
  const uint8_t* p = *pp;
  const auto avail = [&]() { return static_cast<size_t>(end - p); };
  *rebuilt = n;
  if (n > 0 && avail() > 0 && *p == kBoolPacked) {  // n bits; else n bytes of 0 or 1
    *storage = Storage::kBoolBits;
    ++p;
    const size_t size = (n + 7) / 8;
    if (avail() < size) return Corrupt(absl::StrCat("bool column '", name, "' is truncated"));
    if (!PaddingIsZero(p, n)) {
      return Corrupt(absl::StrCat("bool column '", name, "' has nonzero padding"));
    }
    *values = p;
    *pp = p + size;
    return absl::OkStatus();
  }
  *storage = Storage::kBool;
  if (avail() < n) return Corrupt(absl::StrCat("bool column '", name, "' is truncated"));
  for (size_t i = 0; i < n; ++i) {
    if (p[i] > 1) return Corrupt(absl::StrCat("bool column '", name, "' holds ", p[i]));
  }
  *values = p;
  *pp = p + n;
  return absl::OkStatus();
}

absl::Status ReadFloats(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                        ColumnType type, Storage* storage, const uint8_t** fixed, double* pow10,
                        IntReader* mantissas, uint64_t* rebuilt) {
  const uint8_t* p = *pp;
  const auto avail = [&]() { return static_cast<size_t>(end - p); };
  const size_t width = type == ColumnType::kFloat32 ? 4 : 8;
  *rebuilt = n * (width + 1);
  if (avail() < 1) {
    return Corrupt(absl::StrCat("float column '", name, "' has no encoding byte"));
  }
  if (*p > kFloatDecimal || (*p == kFloatDecimal && type != ColumnType::kFloat64)) {
    return Corrupt(absl::StrCat("float column '", name, "' has an unknown encoding"));
  }
  if (*p++ == kFloatDecimal) {
    if (avail() < 1 || *p > kMaxDecimalExponent) {
      return Corrupt(absl::StrCat("float column '", name, "' has a bad decimal exponent"));
    }
    *pow10 = kPow10[*p++];
    if (auto st = ReadInts(&p, end, n, name, /*allow_step=*/false, mantissas, nullptr); !st.ok()) {
      return st;
    }
    *storage = Storage::kFloat64Decimal;  // computed when written: nothing held a value
    *pp = p;
    return absl::OkStatus();
  }
  *storage = type == ColumnType::kFloat32 ? Storage::kFloat32 : Storage::kFloat64;
  if (avail() / width < n) {
    return Corrupt(absl::StrCat("float column '", name, "' is truncated"));
  }
  *fixed = p;
  *pp = p + n * width;
  return absl::OkStatus();
}

}  // namespace sluice::columnar_internal
