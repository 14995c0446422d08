// Internal to codec/: the hash table the COLUMNAR encoder builds its dictionaries with (cf.
// arrow/util/hashing.h). It numbers the distinct values of one bytes column 0, 1, 2... in order
// of first appearance: those numbers are the dictionary codes.
//
// An entry is identified by two 64-bit key words and a length. For values of up to 16 bytes the
// words are KeyShort's, which identify the value exactly; for longer ones they are the caller's
// choice (the encoder takes a hash and the first 8 bytes) and the caller confirms a match byte
// by byte. The table holds 4-byte slots, (epoch << 16) | code, so it stays small; each entry's
// key words live in a dense array indexed by code. A slot whose epoch is not the current one is
// empty, so Clear() (a new column) costs nothing per slot. Linear probing; the load stays under
// 1/4, and a lookup that probes kMaxProbes slots gives up.
#ifndef SLUICE_CODEC_DICT_HASH_TABLE_H_
#define SLUICE_CODEC_DICT_HASH_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "codec/buffer.h"
#include "codec/endian.h"

namespace sluice::columnar_internal {

struct ShortKey {
  uint64_t a, b;
};

// Two words that, with the length, identify a span of up to 16 bytes exactly. For 4 to 16
// bytes they are four 4-byte windows at 0, min(4, len-4), min(8, len-4) and len-4: together
// they cover every byte, they never leave [p, p + len), and nothing branches on the exact
// length (a branch there mispredicts on real data, where lengths vary record to record).
inline ShortKey KeyShort(const uint8_t* p, uint32_t len) {
  if (ABSL_PREDICT_TRUE(len >= 4)) {
    const uint32_t last = len - 4;
    const uint32_t o1 = last < 4 ? last : 4;
    const uint32_t o2 = last < 8 ? last : 8;
    return {LoadLE32(p) | (uint64_t{LoadLE32(p + o1)} << 32),
            LoadLE32(p + o2) | (uint64_t{LoadLE32(p + last)} << 32)};
  }
  if (len > 0) return {p[0] | (uint64_t{p[len / 2]} << 8) | (uint64_t{p[len - 1]} << 16), 0};
  return {0, 0};
}

// The dictionary hash of a value's key words (KeyShort for up to 16 bytes); its top bits index
// the table.
inline uint64_t DictHash(uint64_t a, uint64_t b, uint32_t len) {
  return (a * 0x9e3779b97f4a7c15ULL) ^ (b * 0xc2b2ae3d27d4eb4fULL) ^
         (uint64_t{len} * 0x165667b19e3779f9ULL);
}

class DictHashTable {
 public:
  // A lookup that probes this many slots gives up. At the table's load (under 1/4) honest values
  // essentially never do; values crafted to share a hash (the server re-encodes its clients'
  // records) would otherwise cost a probe per entry each.
  static constexpr uint32_t kMaxProbes = 64;

  struct EntryKey {
    uint64_t a, b;
    uint32_t len, unused;
  };

  // The table's state, copied into a loop's locals: members would be reloaded after every store
  // the loop makes through a pointer (it may alias them, as far as the compiler knows); locals
  // stay in registers. Only inserting changes the table: Reload after it.
  struct Hot {
    const uint32_t* slots;
    const EntryKey* entries;
    uint32_t shift;
    uint32_t epoch;
  };
  Hot LoadHot() const { return Hot{slots_.data(), entries_.data(), shift_, epoch_}; }
  void Reload(Hot& h) const {
    h.slots = slots_.data();
    h.entries = entries_.data();
    h.shift = shift_;
  }

  // Forgets every entry, for a new column (the first call makes the table).
  void Clear() {
    entries_.Clear();
    if (slots_.empty()) ResizeSlots(1024);
    if (++epoch_ > 0xffff) {  // wrapped: forget every slot the slow way
      std::memset(slots_.data(), 0, slots_.size() * sizeof(uint32_t));
      epoch_ = 1;
    }
  }

  // Entries so far; the next one gets this code.
  size_t size() const { return entries_.size(); }
  const EntryKey& entry(uint32_t code) const { return entries_[code]; }

  // The slot a lookup of these key words starts at.
  static size_t SlotOf(const Hot& h, uint64_t a, uint64_t b, uint32_t len) {
    return DictHash(a, b, len) >> h.shift;
  }
  size_t SlotOf(uint64_t a, uint64_t b, uint32_t len) const {
    return DictHash(a, b, len) >> shift_;
  }

  // Whether slot idx holds the entry with key words k and length len (a lookup's first probe,
  // and nearly always its last); sets *code if so.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static bool SlotHolds(const Hot& h, size_t idx, const ShortKey& k,
                                                     uint32_t len, uint32_t* code) {
    const uint32_t slot = h.slots[idx];
    if (ABSL_PREDICT_TRUE((slot >> 16) == h.epoch)) {
      const uint32_t c = slot & 0xffff;
      const EntryKey& e = h.entries[c];
      if (ABSL_PREDICT_TRUE(e.a == k.a && e.b == k.b && e.len == len)) {
        *code = c;
        return true;
      }
    }
    return false;
  }

  enum class Found { kYes, kNo, kGaveUp };
  // Looks the key words up from slot *idx on. kYes: an entry has them and same_value(code)
  // confirms it, *code is set. kNo: *idx is the empty slot where they belong (see Insert).
  // kGaveUp: kMaxProbes slots held other entries.
  template <typename SameValue>
  Found Find(size_t* idx, uint64_t a, uint64_t b, uint32_t len, SameValue same_value,
             uint32_t* code) const {
    const size_t mask = slots_.size() - 1;
    size_t at = *idx;
    for (uint32_t probes = 1;; ++probes) {
      const uint32_t slot = slots_[at];
      if ((slot >> 16) != epoch_) {
        *idx = at;
        return Found::kNo;
      }
      const uint32_t c = slot & 0xffff;
      const EntryKey& e = entries_[c];
      if (e.a == a && e.b == b && e.len == len && same_value(c)) {
        *code = c;
        return Found::kYes;
      }
      if (probes == kMaxProbes) return Found::kGaveUp;
      at = (at + 1) & mask;
    }
  }

  // Adds an entry at the empty slot idx (from Find) and returns its code. Does not grow the
  // table: GrowIfLoaded does, when the caller keeps going.
  uint32_t Insert(size_t idx, uint64_t a, uint64_t b, uint32_t len) {
    const auto code = static_cast<uint32_t>(entries_.size());
    slots_[idx] = (epoch_ << 16) | code;
    entries_.PushBack(EntryKey{a, b, len, 0});
    return code;
  }

  // Keeps the load under 1/4: few probes.
  void GrowIfLoaded() {
    if (4 * entries_.size() > slots_.size()) Grow();
  }

  size_t RetainedBytes() const {
    return entries_.capacity() * sizeof(EntryKey) + slots_.capacity() * 4;
  }

 private:
  // A new, empty table of cap slots (epoch 0 is never current).
  void ResizeSlots(size_t cap) {
    slots_.Resize(cap);
    std::memset(slots_.data(), 0, cap * sizeof(uint32_t));
    shift_ = static_cast<uint32_t>(64 - __builtin_ctzll(cap));
    if (epoch_ == 0) epoch_ = 1;
  }

  void Grow() {
    ResizeSlots(slots_.size() * 2);
    const size_t mask = slots_.size() - 1;
    for (uint32_t code = 0; code < entries_.size(); ++code) {
      const EntryKey& e = entries_[code];
      size_t idx = SlotOf(e.a, e.b, e.len);
      while ((slots_[idx] >> 16) == epoch_) idx = (idx + 1) & mask;
      slots_[idx] = (epoch_ << 16) | code;
    }
  }

  PodBuffer<uint32_t> slots_;
  PodBuffer<EntryKey> entries_;
  uint32_t shift_ = 0;  // 64 - log2(slots)
  uint32_t epoch_ = 0;  // 1..65535
};

}  // namespace sluice::columnar_internal

#endif  // SLUICE_CODEC_DICT_HASH_TABLE_H_
