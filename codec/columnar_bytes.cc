// COLUMNAR bytes columns stored value by value: plain, hex and packed, written and read back
// (columnar_bytes.h).
#include "codec/columnar_bytes.h"

#include <cmath>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"

namespace sluice::columnar_internal {
namespace {

// Small-alphabet packing (see SerializePacked): columns with fewer content bytes
// are left plain; the alphabet and entropy come from the first kPackSample bytes; packing is
// chosen when b bits a byte is within kPackSlackBits of those bytes' order-0 entropy.
constexpr uint64_t kMinPackedBytes = 512;
constexpr size_t kPackSample = 16384;
// PackBits prefetches the value this many ahead.
constexpr size_t kPackPrefetch = 4;
constexpr double kPackSlackBits = 0.15;
// Hex strings (trace ids, hashes, session ids) are stored as the bytes they spell: half the
// size, and no low-entropy text for zstd to wade through. Returns nullptr if any value is not
// lowercase hex of even length.
uint8_t* SerializeHex(const BytesValues& v, uint8_t* w, uint8_t** bulk) {
  const size_t n = v.n;
  const uint8_t* const* ptrs = v.ptrs;
  const uint32_t* lens = v.lens;
  if (v.type != ColumnType::kStr || v.total_len == 0) return nullptr;
  *w++ = kBytesHex;
  for (size_t i = 0; i < n; ++i) {
    if (lens[i] & 1) return nullptr;
    w = PutVarint(w, lens[i] / 2);
  }
  w = PutVarint(w, v.total_len / 2);
  *bulk = w;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* src = ptrs[i];
    uint8_t bad = 0;
    uint32_t k = 0;
#if defined(__SSE2__)
    for (; k + 16 <= lens[i]; k += 16) {  // 16 digits to 8 bytes at a time
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
      const __m128i d = _mm_sub_epi8(c, _mm_set1_epi8('0'));  // 0..9 for '0'..'9'
      const __m128i l = _mm_sub_epi8(c, _mm_set1_epi8('a'));  // 0..5 for 'a'..'f'
      const __m128i is_d = _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d);
      const __m128i is_l = _mm_cmpeq_epi8(_mm_min_epu8(l, _mm_set1_epi8(5)), l);
      if (_mm_movemask_epi8(_mm_or_si128(is_d, is_l)) != 0xffff) return nullptr;
      const __m128i nibble = _mm_or_si128(
          _mm_and_si128(is_d, d), _mm_andnot_si128(is_d, _mm_add_epi8(l, _mm_set1_epi8(10))));
      // Each 16-bit lane holds a digit pair, the high nibble in its low byte.
      const __m128i pairs =
          _mm_or_si128(_mm_slli_epi16(_mm_and_si128(nibble, _mm_set1_epi16(0x00ff)), 4),
                       _mm_srli_epi16(nibble, 8));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(w), _mm_packus_epi16(pairs, pairs));
      w += 8;
    }
#endif
    for (; k < lens[i]; k += 2) {
      const uint8_t hi = kHex.nibble[src[k]], lo = kHex.nibble[src[k + 1]];
      bad |= hi | lo;
      *w++ = static_cast<uint8_t>((hi << 4) | (lo & 0x0f));
    }
    if (bad & 0xf0) return nullptr;
  }
  return w;
}

// Every value as B-bit codes (code[] maps bytes to codes, 0xff for bytes it lacks, which
// set the high bits of *bad).
template <uint32_t B>
uint8_t* PackBits(const BytesValues& values, const uint8_t* code, uint8_t* bad, uint8_t* w) {
  const size_t n = values.n;
  const uint8_t* const* ptrs = values.ptrs;
  const uint32_t* lens = values.lens;
  uint8_t acc = 0;
  // 6-bit codes of an alphabet made of a few byte ranges go 16 at a time where the CPU can.
  bitpack::Ranges ranges;
  bitpack::NibbleTables nibbles;
  bool simd = B == 6 && bitpack::HaveSimd();
  bool by_nibble = simd;
  for (int h = 0; h < 16 && by_nibble; ++h) {
    nibbles.min[h] = 16;
    nibbles.max[h] = 0;
    nibbles.delta[h] = 0;
    for (int l = 0; l < 16; ++l) {
      const uint8_t cd = code[h * 16 + l];
      if (cd == 0xff) continue;
      if (nibbles.min[h] == 16) {
        nibbles.min[h] = static_cast<uint8_t>(l);
        nibbles.delta[h] = static_cast<uint8_t>(cd - (h * 16 + l));
      } else if (nibbles.max[h] != l - 1) {
        by_nibble = false;  // a gap inside the block
      }
      nibbles.max[h] = static_cast<uint8_t>(l);
    }
  }
  for (int c = 0; c < 256 && simd && !by_nibble; ++c) {
    if (code[c] == 0xff) continue;
    if (c > 0 && code[c - 1] != 0xff) {
      ++ranges.span[ranges.count - 1];
      continue;
    }
    if (ranges.count == 8) {
      simd = false;
      break;
    }
    ranges.lo[ranges.count] = static_cast<uint8_t>(c);
    ranges.span[ranges.count] = 1;
    ranges.base[ranges.count] = code[c];
    ++ranges.count;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* src = ptrs[i];
    const uint32_t len = lens[i];
    if (i + kPackPrefetch < n) {  // values far apart in memory (a sorted batch's) are cache misses
      const uint8_t* ahead = ptrs[i + kPackPrefetch];
      const uint32_t ahead_len = lens[i + kPackPrefetch];
      for (uint32_t at = 0; at < ahead_len && at < 256; at += 64) __builtin_prefetch(ahead + at);
    }
    uint32_t k = 0;
    if (simd && len >= 16) {
      const uint32_t groups = len / 16;
      const bool ok = by_nibble ? bitpack::Pack6(src, groups, nibbles, w)
                                : bitpack::Pack6(src, groups, ranges, w);
      if (!ok) acc |= 0xc0;  // a byte outside the alphabet
      w += size_t{groups} * 12;
      k = groups * 16;
    }
    for (; k + 8 <= len; k += 8) {
      uint64_t v = 0;
      for (uint32_t j = 0; j < 8; ++j) {
        const uint8_t c = code[src[k + j]];
        acc |= c;
        v |= uint64_t{c} << (B * j);
      }
      StoreLE64(w, v);  // B bytes count; the rest is slack the next write overwrites
      w += B;
    }
    if (k < len) {
      uint64_t v = 0;
      for (uint32_t j = 0; k + j < len; ++j) {
        const uint8_t c = code[src[k + j]];
        acc |= c;
        v |= uint64_t{c} << (B * j);
      }
      StoreLE64(w, v);
      w += ((len - k) * B + 7) / 8;
    }
  }
  *bad |= acc;
  return w;
}

// Strings drawn from a small alphabet used near-uniformly (random ids and tokens, base62 or
// base64 text) are stored as b-bit codes (b <= 6): within a few percent of what an entropy
// coder would make of them, and bytes that zstd crosses at memory speed instead of
// Huffman-coding them, on both sides. Every 8 codes fill exactly b bytes; each value starts
// on a byte. Returns nullptr when the column does not qualify.
uint8_t* SerializePacked(const BytesValues& v, uint8_t* w, uint8_t** bulk) {
  const size_t n = v.n;
  const uint8_t* const* ptrs = v.ptrs;
  const uint32_t* lens = v.lens;
  const uint64_t total_len = v.total_len;
  if (total_len < kMinPackedBytes) return nullptr;
  uint32_t hist[256] = {};
  size_t sampled = 0;
  for (size_t i = 0; i < n && sampled < kPackSample; ++i) {
    for (uint32_t k = 0; k < lens[i]; ++k) ++hist[ptrs[i][k]];
    sampled += lens[i];
  }
  uint8_t* const start = w;
  for (int attempt = 0; attempt < 2; ++attempt) {
    size_t d = 0;
    double entropy = 0;
    uint64_t counted = 0;
    for (int c = 0; c < 256; ++c) counted += hist[c];
    for (int c = 0; c < 256; ++c) {
      if (hist[c] == 0) continue;
      ++d;
      const double p = static_cast<double>(hist[c]) / static_cast<double>(counted);
      entropy -= p * std::log2(p);
    }
    if (d > (1u << kMaxPackedBits)) return nullptr;
    const uint8_t b = BitsFor(d);
    if (b > entropy + kPackSlackBits) return nullptr;
    // The alphabet has exactly 2^b bytes, so every code means a byte: the bytes in use,
    // plus the smallest unused ones, in increasing order.
    uint8_t code[256];
    size_t fill = (size_t{1} << b) - d;
    w = start;
    *w++ = kBytesPacked;
    *w++ = b;
    uint8_t next = 0;
    for (int c = 0; c < 256; ++c) {
      code[c] = 0xff;
      if (hist[c] == 0 && fill == 0) continue;
      if (hist[c] == 0) --fill;
      code[c] = next++;
      *w++ = static_cast<uint8_t>(c);
    }
    for (size_t i = 0; i < n; ++i) w = PutVarint(w, lens[i]);
    w = PutVarint(w, total_len);
    *bulk = w;
    uint8_t bad = 0;  // 0xff codes (bytes outside the alphabet) set the high bits
    switch (b) {
      case 6:
        w = PackBits<6>(v, code, &bad, w);
        break;
      case 5:
        w = PackBits<5>(v, code, &bad, w);
        break;
      case 4:
        w = PackBits<4>(v, code, &bad, w);
        break;
      case 3:
        w = PackBits<3>(v, code, &bad, w);
        break;
      case 2:
        w = PackBits<2>(v, code, &bad, w);
        break;
      default:
        w = PackBits<1>(v, code, &bad, w);
        break;
    }
    if ((bad & 0xc0) == 0) return w;
    if (sampled == total_len) return nullptr;  // the sample was the whole column
    // A byte the sample did not have: take the alphabet from the whole column, once.
    std::memset(hist, 0, sizeof(hist));
    for (size_t i = 0; i < n; ++i) {
      for (uint32_t k = 0; k < lens[i]; ++k) ++hist[ptrs[i][k]];
    }
  }
  return nullptr;
}

}  // namespace

uint8_t* SerializeBytes(const BytesValues& v, uint8_t* w, uint8_t** bulk) {
  if (uint8_t* end = SerializeHex(v, w, bulk); end != nullptr) return end;
  if (uint8_t* end = SerializePacked(v, w, bulk); end != nullptr) return end;
  *w++ = kBytesPlain;
  for (size_t i = 0; i < v.n; ++i) w = PutVarint(w, v.lens[i]);
  w = PutVarint(w, v.total_len);
  *bulk = w;
  for (size_t i = 0; i < v.n; ++i) {
    std::memcpy(w, v.ptrs[i], v.lens[i]);
    w += v.lens[i];
  }
  return w;
}

absl::Status ReadLengths(const uint8_t** pp, const uint8_t* end, uint64_t count,
                         absl::string_view name, ColumnType type, uint32_t hex_factor,
                         uint8_t packed_bits, BytesLengths* out) {
  const uint8_t* p = *pp;
  const auto avail = [&]() { return static_cast<size_t>(end - p); };
  if (count > avail()) return Corrupt(absl::StrCat("column '", name, "' is truncated"));
  const uint8_t* const lens_src = p;
  uint64_t sum = 0;         // contents
  uint64_t headers = 0;     // msgpack headers of the rebuilt values (entries, for a dictionary)
  uint64_t packed_len = 0;  // packed: bytes of codes
  for (size_t i = 0; i < count; ++i) {
    uint64_t len;
    if (!GetVarint(&p, end, &len) || len > 0xffffffffu) {
      return Corrupt(absl::StrCat("column '", name, "' has a bad length"));
    }
    sum += len;
    headers += BytesHeaderSize(type, hex_factor * len);
    if (packed_bits != 0) packed_len += (len * packed_bits + 7) / 8;
  }
  uint64_t blob_len;
  if (!GetVarint(&p, end, &blob_len) || blob_len != sum) {
    return Corrupt(absl::StrCat("column '", name, "' blob size does not match its lengths"));
  }
  if (packed_bits != 0) {
    // Value i takes ceil(lens[i] * bits / 8) bytes.
    if (packed_len > avail()) {
      return Corrupt(absl::StrCat("column '", name, "' packed codes are truncated"));
    }
    blob_len = packed_len;
  }
  if (blob_len > avail()) return Corrupt(absl::StrCat("column '", name, "' blob is truncated"));
  *out = BytesLengths{lens_src, sum, headers, p, p + blob_len};
  *pp = p + blob_len;
  return absl::OkStatus();
}

absl::Status ReadBytes(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                       ColumnType type, uint8_t encoding, Storage* storage, BytesReader* r,
                       uint64_t* rebuilt) {
  const uint8_t* p = *pp;
  const auto avail = [&]() { return static_cast<size_t>(end - p); };
  const bool packed = encoding == kBytesPacked;
  if (packed) {
    // bits (1..6), then the 2^bits alphabet bytes in increasing order.
    if (avail() < 1) return Corrupt(absl::StrCat("column '", name, "' packing is truncated"));
    const uint8_t bits = *p++;
    if (bits < 1 || bits > kMaxPackedBits) {
      return Corrupt(absl::StrCat("column '", name, "' has ", int{bits}, "-bit codes"));
    }
    const size_t d = size_t{1} << bits;
    if (avail() < d) return Corrupt(absl::StrCat("column '", name, "' alphabet is truncated"));
    for (size_t k = 0; k < d; ++k) {
      if (k > 0 && p[k] <= p[k - 1]) {
        return Corrupt(absl::StrCat("column '", name, "' alphabet is not in increasing order"));
      }
      r->symbols[k] = p[k];
    }
    r->bits = bits;
    p += d;
  }
  // One pass validates the lengths and sums what the column needs; they are read again a chunk
  // at a time while rebuilding.
  const uint32_t hex_factor = encoding == kBytesHex ? 2 : 1;
  BytesLengths lengths;
  if (auto st = ReadLengths(&p, end, n, name, type, hex_factor, packed ? r->bits : 0, &lengths);
      !st.ok()) {
    return st;
  }
  r->blob = lengths.blob;
  r->blob_end = lengths.blob_end;
  r->lens_src = lengths.lens;
  *storage = encoding == kBytesHex ? Storage::kBytesHex
             : packed              ? Storage::kBytesPacked
                                   : Storage::kBytesPlain;
  *rebuilt = hex_factor * lengths.sum + lengths.headers;
  *pp = p;
  return absl::OkStatus();
}

bool PackedPaddingIsZero(const BytesReader& r, size_t n) {
  const uint8_t* p = r.blob;
  const uint8_t* lp = r.lens_src;
  bool zero = true;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bits = GetValidatedVarint(&lp) * r.bits;
    if (!PaddingIsZero(p, bits)) zero = false;
    p += (bits + 7) / 8;
  }
  return zero;
}

}  // namespace sluice::columnar_internal
