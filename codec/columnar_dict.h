// Internal to codec/: the COLUMNAR layout's dictionary-encoded bytes columns, writer and reader
// side by side. A dictionary column stores its distinct values once (entries numbered in order
// of first appearance) and a code per value: one byte a code for 33 to 256 entries, else
// bit-packed at the width the dictionary needs (docs/frame-format.md; the reader also accepts
// the two-byte layouts).
//
// The encoder builds a bytes column's dictionary while it parses the column (DictBuilder, with
// DictHashTable), and gives it up as soon as it cannot pay. The decoder validates the codes and
// pre-encodes every entry (msgpack header and content) once, so rebuilding a value is one copy.
// What runs per value is inline here.
#ifndef SLUICE_CODEC_COLUMNAR_DICT_H_
#define SLUICE_CODEC_COLUMNAR_DICT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "codec/buffer.h"
#include "codec/columnar.h"
#include "codec/columnar_bytes.h"
#include "codec/columnar_internal.h"
#include "codec/dict_hash_table.h"
#include "codec/endian.h"

// XXH3 inline: the encoder hashes every value over 16 bytes while its dictionary is on.
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

namespace sluice::columnar_internal {

// --- Writer

// Dictionary limits: past kDictProbe values a column whose values are more than half distinct
// stops building its dictionary; no dictionary grows past kMaxDict entries.
constexpr size_t kDictProbe = 1024;
// Long values (kDictLongValue bytes on average) whose first kDictEarlyProbe are all distinct
// stop the dictionary at once: hashing a thousand of them costs more than the dictionary could
// save, since zstd's match finder catches repeats of long values nearly as well. (Short values
// keep the full probe: a column cycling through a few hundred names must still get one.)
constexpr size_t kDictEarlyProbe = 64;
constexpr uint64_t kDictLongValue = 32;

// A bytes column's dictionary, built while the column is parsed: value i is added (Add, or
// LookupHot from a loop holding a Hot copy) right after the column stored its pointer and
// length, with the column's `ptrs` and running `total_len` passed in.
struct DictBuilder {
  bool active = false;         // false once the dictionary cannot pay: values are not added
  PodBuffer<uint32_t> codes;   // per value
  PodBuffer<uint32_t> firsts;  // per entry: index of its first value
  uint64_t len = 0;            // sum of the entries' lengths
  DictHashTable table;

  // A new, empty dictionary for a column of n values.
  void Start(size_t n) {
    codes.Resize(n);
    firsts.Clear();
    len = 0;
    active = n > 1;
    table.Clear();
  }

  size_t RetainedBytes() const {
    return codes.capacity() * 4 + firsts.capacity() * 4 + table.RetainedBytes();
  }

  // Finds or adds the value at index i (p, len). The hot path is a short value found in its
  // first slot; everything else is out of line, so the hot loop holds no call and keeps its
  // state in registers.
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Add(size_t i, const uint8_t* p, uint32_t value_len,
                                               const uint8_t* const* ptrs, uint64_t total_len) {
    if (ABSL_PREDICT_FALSE(value_len > 16)) {
      AddLong(i, p, value_len, ptrs, total_len);
      return;
    }
    const ShortKey k = KeyShort(p, value_len);
    const DictHashTable::Hot h = table.LoadHot();
    const size_t idx = DictHashTable::SlotOf(h, k.a, k.b, value_len);
    uint32_t code;
    if (ABSL_PREDICT_TRUE(DictHashTable::SlotHolds(h, idx, k, value_len, &code))) {
      codes[i] = code;
      return;
    }
    Probe(idx, i, nullptr, k.a, k.b, value_len, ptrs, total_len);
  }

  // A value over 16 bytes: its key words are a hash and its first 8 bytes, so a match is then
  // confirmed byte by byte.
  ABSL_ATTRIBUTE_NOINLINE void AddLong(size_t i, const uint8_t* p, uint32_t value_len,
                                       const uint8_t* const* ptrs, uint64_t total_len) {
    const uint64_t a = XXH3_64bits(p, value_len), b = LoadLE64(p);
    Probe(table.SlotOf(a, b, value_len), i, p, a, b, value_len, ptrs, total_len);
  }

  // Looks the value up from slot idx on, adding it when absent. `p` (the value's bytes) is
  // compared when the key words do not identify it (longer than 16 bytes), else null.
  ABSL_ATTRIBUTE_NOINLINE void Probe(size_t idx, size_t i, const uint8_t* p, uint64_t a, uint64_t b,
                                     uint32_t value_len, const uint8_t* const* ptrs,
                                     uint64_t total_len) {
    uint32_t code;
    const auto same_value = [&](uint32_t c) {
      return p == nullptr || std::memcmp(p, ptrs[firsts[c]], value_len) == 0;
    };
    switch (table.Find(&idx, a, b, value_len, same_value, &code)) {
      case DictHashTable::Found::kYes:
        codes[i] = code;
        return;
      case DictHashTable::Found::kNo:
        Insert(idx, i, a, b, value_len, total_len);
        return;
      case DictHashTable::Found::kGaveUp:
        active = false;  // values made to collide: no dictionary rather than quadratic work
        return;
    }
  }

  void Insert(size_t idx, size_t i, uint64_t a, uint64_t b, uint32_t value_len,
              uint64_t total_len) {
    const uint32_t code = table.Insert(idx, a, b, value_len);
    firsts.PushBack(static_cast<uint32_t>(i));
    len += value_len;
    codes[i] = code;
    if (code + 1 >= kMaxDict || (i >= kDictProbe && !Pays(i + 1, total_len)) ||
        (i + 1 == kDictEarlyProbe && code + 1 == kDictEarlyProbe &&
         len >= kDictLongValue * kDictEarlyProbe)) {
      active = false;  // too many distinct values: a dictionary would not pay
    } else {
      table.GrowIfLoaded();
    }
  }

  // Bits a dictionary code takes (SerializeDict): 8 (one byte each) for 33 to 256 entries,
  // else ceil(log2 d), bit-packed.
  static uint8_t CodeBits(size_t dict_size) {
    const uint8_t b = BitsFor(dict_size);
    return b <= kMaxSmallPackedBits || b > 8 ? b : 8;
  }

  // Whether, on the first `seen` values (of total_len bytes), dictionary + codes beat lengths +
  // contents by 10%.
  bool Pays(size_t seen, uint64_t total_len) const {
    const uint64_t entries = firsts.size();
    const uint64_t code_bytes = (seen * CodeBits(entries) + 7) / 8;
    const uint64_t dict_cost = len + entries + code_bytes;
    const uint64_t plain_cost = total_len + seen;
    return dict_cost * 10 < plain_cost * 9;
  }

  // Whether the column of n values (total_len bytes) is written with this dictionary.
  bool Use(size_t n, uint64_t total_len) const {
    return active && firsts.size() < n && Pays(n, total_len);
  }

  // The dictionary's codes and hash table, copied into a column loop's locals (see
  // DictHashTable::Hot). Only the slow paths change the dictionary, and LookupHot reloads the
  // locals after them.
  struct Hot {
    uint32_t* codes;
    DictHashTable::Hot table;
  };
  Hot LoadHot() { return Hot{codes.data(), table.LoadHot()}; }

  // Add for a value of up to 16 bytes with key words k, on a Hot copy; total_len already
  // counts the value. Returns whether the dictionary is still active.
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool LookupHot(Hot& h, size_t i, const ShortKey& k,
                                                     uint32_t value_len, const uint8_t* const* ptrs,
                                                     uint64_t total_len) {
    const size_t idx = DictHashTable::SlotOf(h.table, k.a, k.b, value_len);
    uint32_t code;
    if (ABSL_PREDICT_TRUE(DictHashTable::SlotHolds(h.table, idx, k, value_len, &code))) {
      h.codes[i] = code;
      return true;
    }
    Probe(idx, i, nullptr, k.a, k.b, value_len, ptrs, total_len);
    return Reload(h);
  }

  // Add for a longer value, on a Hot copy.
  bool LookupLongHot(Hot& h, size_t i, const uint8_t* p, uint32_t value_len,
                     const uint8_t* const* ptrs, uint64_t total_len) {
    AddLong(i, p, value_len, ptrs, total_len);
    return Reload(h);
  }

  bool Reload(Hot& h) {
    table.Reload(h.table);
    return active;
  }
};

// The most SerializeDict writes for a column of n values and its dictionary.
inline size_t MaxDictSize(size_t n, const DictBuilder& dict) {
  return 3 + 2 * kMaxVarintBytes + dict.firsts.size() * 5 + dict.len + n * 2;
}

// Writes the column (after its type byte) at w as its dictionary and codes; returns the end
// and sets *bulk to where the codes start.
uint8_t* SerializeDict(const BytesValues& values, const DictBuilder& dict, uint8_t* w,
                       uint8_t** bulk);

// --- Reader

// Internal code layout: kCodePacked with 1..8 bits (a code may end in the last byte).
constexpr uint8_t kCodePackedSmall = 0xff;

// A dictionary column as read: every entry pre-encoded (msgpack header + content), and the
// codes.
struct DictReader {
  ByteBuffer entries;
  PodBuffer<uint32_t> entry_off;  // d + 1 offsets into entries
  const uint8_t* codes = nullptr;
  const uint8_t* codes_end = nullptr;
  uint8_t code_width = 1;  // the payload's code layout, or kCodePackedSmall
  uint8_t code_bits = 0;   // kCodePacked
  size_t n = 0;

  ABSL_ATTRIBUTE_ALWAYS_INLINE uint32_t Code(size_t i) const {
    if (code_width == kCodeBytes) return codes[i];
    if (code_width == kCodePacked) {  // 9..16 bits at bit i * bits: within 2 or 3 bytes
      const size_t bit = i * code_bits;
      const uint8_t* q = codes + (bit >> 3);
      uint32_t v = q[0] | (uint32_t{q[1]} << 8);
      if (q + 2 < codes_end) v |= uint32_t{q[2]} << 16;
      return (v >> (bit & 7)) & ((1u << code_bits) - 1);
    }
    if (code_width == kCodePackedSmall) return SmallCode(i);
    if (code_width == kCode16) return codes[2 * i] | (uint32_t{codes[2 * i + 1]} << 8);
    return codes[i] | (uint32_t{codes[n + i]} << 8);  // kCodePlanes: low bytes, then high bytes
  }
  // 1..8 bits. Out of line, so that Code() inlines as small as before.
  ABSL_ATTRIBUTE_NOINLINE uint32_t SmallCode(size_t i) const {
    return static_cast<uint32_t>(BitsAt(codes, codes_end, uint64_t{i} * code_bits, code_bits));
  }

  size_t RetainedBytes() const { return entries.capacity() + entry_off.capacity() * 4; }
};

// Reads and validates a dictionary column of n values of type `type` (*pp is past its encoding
// byte) into *d, charging its pre-encoded entries to *dict_budget; moves *pp past it and sets
// *rebuilt to the bytes its values rebuild to.
absl::Status ReadDict(const uint8_t** pp, const uint8_t* end, size_t n, absl::string_view name,
                      ColumnType type, DictReader* d, uint64_t* dict_budget, uint64_t* rebuilt);

// --- Per value: record i's msgpack encoding at w (which has kSlack spare bytes); returns the
// end.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint8_t* WriteEntry(const DictReader& d, size_t i, uint8_t* w) {
  const uint32_t code = d.Code(i);
  const uint32_t off = d.entry_off[code];
  const uint8_t* e = d.entries.data();
  return CopySmall(w, e + off, e + d.entries.capacity(), d.entry_off[code + 1] - off);
}

}  // namespace sluice::columnar_internal

#endif  // SLUICE_CODEC_COLUMNAR_DICT_H_
