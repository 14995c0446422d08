// COLUMNAR dictionary columns: writing a dictionary and its codes, and reading them back
// (columnar_dict.h).
#include "codec/columnar_dict.h"

#include "absl/strings/str_cat.h"
#include "codec/varint.h"

namespace sluice::columnar_internal {
namespace {

// Checks a dictionary column's n codes and sums the bytes they rebuild. Entries are numbered in
// order of first appearance, so every code is at most the next new one and every entry is
// used: a dictionary has one valid spelling, and holds no entry that rebuilds nothing. (Out of
// line: inlined, it shifted the code of the integer columns' readers, ints3 reads 8% slower.)
ABSL_ATTRIBUTE_NOINLINE absl::Status CheckDictCodes(const DictReader& c, uint64_t count,
                                                    absl::string_view name, uint64_t* rebuilt) {
  uint64_t sum = 0;
  uint32_t next_new = 0;
  for (size_t i = 0; i < c.n; ++i) {
    const uint32_t code = c.Code(i);
    if (ABSL_PREDICT_FALSE(code >= next_new)) {
      if (code >= count) {
        return Corrupt(absl::StrCat("column '", name, "' has code ", code, " beyond its ", count,
                                    "-entry dictionary"));
      }
      if (code > next_new) {
        return Corrupt(absl::StrCat("column '", name, "' has code ", code, " at record ", i,
                                    " before code ", next_new,
                                    " was used (entries are numbered in order of first use)"));
      }
      ++next_new;
    }
    sum += c.entry_off[code + 1] - c.entry_off[code];
  }
  if (next_new != count) {
    return Corrupt(next_new + 1 == count
                       ? absl::StrCat("column '", name, "' never uses dictionary entry ", next_new,
                                      " of ", count)
                       : absl::StrCat("column '", name, "' never uses dictionary entries ",
                                      next_new, " to ", count - 1, " of ", count));
  }
  *rebuilt = sum;
  return absl::OkStatus();
}

// A dictionary column (*pp is past its encoding byte): the entry count, the entries' lengths
// and contents, then the codes.
}  // namespace

uint8_t* SerializeDict(const BytesValues& values, const DictBuilder& dict, uint8_t* w,
                       uint8_t** bulk) {
  const size_t n = values.n;
  const uint8_t* const* ptrs = values.ptrs;
  const uint32_t* lens = values.lens;
  const PodBuffer<uint32_t>& firsts = dict.firsts;
  const PodBuffer<uint32_t>& codes = dict.codes;
  *w++ = kBytesDict;
  const size_t d = firsts.size();
  w = PutVarint(w, d);
  for (size_t c = 0; c < d; ++c) w = PutVarint(w, lens[firsts[c]]);
  w = PutVarint(w, dict.len);
  for (size_t c = 0; c < d; ++c) {
    const uint32_t i = firsts[c];
    std::memcpy(w, ptrs[i], lens[i]);
    w += lens[i];
  }
  const uint8_t bits = DictBuilder::CodeBits(d);
  if (bits == 8) {
    *w++ = kCodeBytes;
    *bulk = w;
    for (size_t i = 0; i < n; ++i) w[i] = static_cast<uint8_t>(codes[i]);
    return w + n;
  }
  // Past 256 entries, codes are bit-packed at the width the dictionary needs (LSB first):
  // zstd's byte-wise entropy coder does little for codes that straddle bytes, and slowly
  // (2,000 names as two-byte codes: 1.35x at ~165 MB/s); packed they take ceil(log2 d) bits.
  // Up to 32 entries they are packed too, at 1 to 5 bits (see kMaxSmallPackedBits).
  *w++ = kCodePacked;
  *w++ = bits;
  *bulk = w;
  return PackFixedWidth(n, bits, w, [&codes](size_t i) { return codes[i]; });
}

absl::Status ReadDict(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                      ColumnType type, DictReader* c, uint64_t* dict_budget, uint64_t* rebuilt) {
  const uint8_t* p = *pp;
  const auto avail = [&]() { return static_cast<size_t>(end - p); };
  // The d entries' lengths, then the blob they measure, read again while building the entries.
  uint64_t count;
  if (!GetVarint(&p, end, &count) || count > n || (n > 0 && count == 0) || count > kMaxDict) {
    return Corrupt(absl::StrCat("column '", name, "' has a bad dictionary size"));
  }
  BytesLengths lengths;
  if (auto st =
          ReadLengths(&p, end, count, name, type, /*hex_factor=*/1, /*packed_bits=*/0, &lengths);
      !st.ok()) {
    return st;
  }
  // Codes.
  if (avail() < 1 || *p < kCodeBytes || *p > kCodePacked) {
    return Corrupt(absl::StrCat("column '", name, "' has an unknown code layout"));
  }
  c->code_width = *p++;
  size_t codes_size;
  if (c->code_width == kCodePacked) {
    // Exactly the width the dictionary needs (1 bit for a single entry).
    if (avail() < 1 || *p < 1 || *p > 16 || (*p > 1 && (uint64_t{1} << (*p - 1)) >= count) ||
        count > (uint64_t{1} << *p)) {
      return Corrupt(absl::StrCat("column '", name, "' has a bad code width for a ", count,
                                  "-entry dictionary"));
    }
    c->code_bits = *p++;
    codes_size = (uint64_t{n} * c->code_bits + 7) / 8;
  } else {
    codes_size = c->code_width == kCodeBytes ? n : 2 * uint64_t{n};
  }
  if (avail() < codes_size) {
    return Corrupt(absl::StrCat("column '", name, "' codes are truncated"));
  }
  if (c->code_width == kCodePacked && !PaddingIsZero(p, uint64_t{n} * c->code_bits)) {
    return Corrupt(absl::StrCat("column '", name, "' has nonzero padding after its codes"));
  }
  c->codes = p;
  c->codes_end = p + codes_size;
  c->n = n;
  p += codes_size;
  if (c->code_width == kCodePacked && c->code_bits <= 8) c->code_width = kCodePackedSmall;
  // Pre-encode the entries (contents plus headers), charged to the frame's dictionary budget,
  // then size the rebuilt column from the codes. Every entry must be used (checked below), so
  // honest entries never take more than the rows they rebuild; the budget refuses the others
  // before they are copied. The count + 1 offsets are bounded by the record count (count <= n),
  // like the record index.
  const uint64_t entries_size = lengths.sum + lengths.headers;
  if (entries_size > *dict_budget) {
    return absl::InvalidArgumentError(absl::StrCat(
        "COLUMNAR dictionary entries take more than the rows cap to hold (column '", name, "')"));
  }
  *dict_budget -= entries_size;
  c->entry_off.Resize(count + 1);
  c->entries.Reserve(entries_size + kSlack);
  c->entries.Resize(entries_size);
  uint8_t* w = c->entries.data();
  const uint8_t* src = lengths.blob;
  const uint8_t* lp = lengths.lens;
  for (size_t d = 0; d < count; ++d) {
    const auto len = static_cast<uint32_t>(GetValidatedVarint(&lp));
    c->entry_off[d] = static_cast<uint32_t>(w - c->entries.data());
    w = WriteBytesHeader(type, w, len);
    std::memcpy(w, src, len);
    w += len;
    src += len;
  }
  c->entry_off[count] = static_cast<uint32_t>(w - c->entries.data());
  if (auto st = CheckDictCodes(*c, count, name, rebuilt); !st.ok()) return st;
  *pp = p;
  return absl::OkStatus();
}

}  // namespace sluice::columnar_internal
