#include "codec/key_bounds.h"

#include <algorithm>

#include "codec/endian.h"
#include "codec/frame_format.h"

namespace sluice {
namespace {

constexpr uint8_t kCut = 0x80;

std::string_view Cut(std::string_view k) { return k.substr(0, std::min(k.size(), kMaxBoundKey)); }

}  // namespace

void AppendKeyBounds(const std::vector<std::string_view>& keys, const HeavyKey& heavy,
                     std::string* out) {
  out->push_back(static_cast<char>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string_view k = Cut(keys[i]);
    const bool cut = i + 1 == keys.size() && keys[i].size() > kMaxBoundKey;
    out->push_back(static_cast<char>(k.size() | (cut ? kCut : 0)));
    out->append(k);
  }
  const std::string_view h = Cut(heavy.key);
  out->push_back(static_cast<char>(h.size() | (heavy.key.size() > kMaxBoundKey ? kCut : 0)));
  out->append(h);
  AppendLE32(out, heavy.records);
  AppendLE32(out, heavy.bytes);
}

namespace {

uint32_t Clamp32(uint64_t n) { return n > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(n); }

// The longest run of one key among n records in key order (records[i] gives each).
template <typename Records>
void LongestRun(const Records& records, size_t n, HeavyKey* best, uint64_t* best_records,
                uint64_t* best_bytes) {
  for (size_t i = 0; i < n;) {
    const std::string_view k = records[i].key;
    uint64_t count = 0, bytes = 0;
    for (; i < n && records[i].key == k; ++i) {
      ++count;
      bytes += k.size() + records[i].value.size();
    }
    if (count > *best_records) {
      best->key = k;
      *best_records = count;
      *best_bytes = bytes;
    }
  }
}

// The frame's key with the most records: a sorted frame's longest run of one key; an unsorted
// one's by a Misra-Gries pass for candidates, then their exact counts.
HeavyKey Heaviest(const DecodedFrame& frame) {
  const size_t n = frame.size();
  HeavyKey best;
  uint64_t best_records = 0, best_bytes = 0;
  if (frame.header().sorted_by_key()) {
    LongestRun(frame, n, &best, &best_records, &best_bytes);
  } else {
    constexpr size_t kCandidates = 4;
    std::string_view cand[kCandidates];
    uint64_t count[kCandidates] = {};
    for (size_t i = 0; i < n; ++i) {
      const std::string_view k = frame[i].key;
      size_t j = 0;
      for (; j < kCandidates; ++j) {
        if (count[j] > 0 && cand[j] == k) break;
      }
      if (j < kCandidates) {
        ++count[j];
        continue;
      }
      for (j = 0; j < kCandidates && count[j] > 0; ++j) {
      }
      if (j < kCandidates) {
        cand[j] = k;
        count[j] = 1;
        continue;
      }
      for (uint64_t& c : count) --c;
    }
    uint64_t records[kCandidates] = {}, bytes[kCandidates] = {};
    for (size_t i = 0; i < n; ++i) {
      const Record r = frame[i];
      for (size_t j = 0; j < kCandidates; ++j) {
        if (count[j] > 0 && cand[j] == r.key) {
          ++records[j];
          bytes[j] += r.key.size() + r.value.size();
          break;
        }
      }
    }
    for (size_t j = 0; j < kCandidates; ++j) {
      if (records[j] > best_records) {
        best.key = cand[j];
        best_records = records[j];
        best_bytes = bytes[j];
      }
    }
  }
  // A COLUMNAR frame validated keys-only (as pushes and repairs decode) has no value bytes to
  // count: the key's share of the frame's records instead.
  if (frame.header().layout == Layout::kColumnar && n > 0) {
    best_bytes = best_records * frame.header().uncompressed_size / n;
  }
  best.records = Clamp32(best_records);
  best.bytes = Clamp32(best_bytes);
  return best;
}

}  // namespace

void AppendSortedBounds(absl::Span<const Record> records, uint64_t uncompressed, std::string* out,
                        std::vector<std::string_view>* keys) {
  const size_t n = records.size();
  if (n == 0) return;
  const size_t samples = std::min<size_t>(
      {kMaxBoundSamples, static_cast<size_t>(uncompressed / kBoundSampleBytes), n});
  keys->clear();
  keys->push_back(records[0].key);
  for (size_t s = 1; s <= samples; ++s) keys->push_back(records[s * n / (samples + 1)].key);
  keys->push_back(records[n - 1].key);
  HeavyKey best;
  uint64_t best_records = 0, best_bytes = 0;
  LongestRun(records, n, &best, &best_records, &best_bytes);
  best.records = Clamp32(best_records);
  best.bytes = Clamp32(best_bytes);
  AppendKeyBounds(*keys, best, out);
}

void AppendFrameBounds(const DecodedFrame& frame, std::string* out,
                       std::vector<std::string_view>* keys) {
  const size_t n = frame.size();
  if (n == 0) return;
  const size_t samples =
      std::min<size_t>({kMaxBoundSamples, frame.header().uncompressed_size / kBoundSampleBytes, n});
  keys->clear();
  if (frame.header().sorted_by_key()) {
    keys->push_back(frame[0].key);
    for (size_t s = 1; s <= samples; ++s) keys->push_back(frame[s * n / (samples + 1)].key);
    keys->push_back(frame[n - 1].key);
  } else {
    // The least and greatest of every key; the samples are quantiles of keys taken at even
    // steps (at most 8 a sample), sorted.
    std::string_view lo = frame[0].key, hi = lo;
    for (size_t i = 1; i < n; ++i) {
      const std::string_view k = frame[i].key;
      if (CompareKeys(k, lo) < 0) lo = k;
      if (CompareKeys(k, hi) > 0) hi = k;
    }
    keys->push_back(lo);
    if (samples > 0) {
      const size_t taken = std::min(n, 8 * samples);
      for (size_t i = 0; i < taken; ++i) keys->push_back(frame[i * n / taken].key);
      std::sort(keys->begin() + 1, keys->end(), KeyLess);
      for (size_t s = 1; s <= samples; ++s) (*keys)[s] = (*keys)[1 + (s * taken) / (samples + 1)];
      keys->resize(1 + samples);
    }
    keys->push_back(hi);
  }
  AppendKeyBounds(*keys, Heaviest(frame), out);
}

size_t KeyBoundsSize(std::string_view b) {
  if (b.empty()) return 0;
  const size_t n = static_cast<uint8_t>(b[0]);
  if (n < 2 || n > 2 + kMaxBoundSamples) return 0;
  size_t at = 1;
  std::string_view last;
  for (size_t i = 0; i < n; ++i) {
    if (at >= b.size()) return 0;
    const auto h = static_cast<uint8_t>(b[at]);
    const size_t len = h & ~kCut;
    const bool cut = (h & kCut) != 0;
    if (len > kMaxBoundKey || b.size() - at - 1 < len) return 0;
    if (cut && (i + 1 != n || len != kMaxBoundKey)) return 0;
    const std::string_view k = b.substr(at + 1, len);
    // Increasing (a cut last key: the keys that start with it).
    if (i > 0 && CompareKeys(cut ? last.substr(0, std::min(last.size(), k.size())) : last, k) > 0) {
      return 0;
    }
    last = k;
    at += 1 + len;
  }
  // The heaviest key, its records and bytes.
  if (at >= b.size()) return 0;
  const auto h = static_cast<uint8_t>(b[at]);
  const size_t len = h & ~kCut;
  if (len > kMaxBoundKey || ((h & kCut) != 0 && len != kMaxBoundKey) ||
      b.size() - at - 1 < len + 8) {
    return 0;
  }
  return at + 1 + len + 8;
}

HeavyKey ReadHeavyKey(std::string_view b) {
  HeavyKey out;
  if (b.empty()) return out;
  const size_t n = static_cast<uint8_t>(b[0]);
  size_t at = 1;
  for (size_t i = 0; i < n; ++i) at += 1 + (static_cast<uint8_t>(b[at]) & ~kCut);
  const auto h = static_cast<uint8_t>(b[at]);
  out.key = b.substr(at + 1, h & ~kCut);
  out.cut = (h & kCut) != 0;
  const auto* p = reinterpret_cast<const uint8_t*>(b.data()) + at + 1 + out.key.size();
  out.records = LoadLE32(p);
  out.bytes = LoadLE32(p + 4);
  return out;
}

void ReadBoundKeys(std::string_view b, std::vector<std::string_view>* keys) {
  keys->clear();
  if (b.empty()) return;
  const size_t n = static_cast<uint8_t>(b[0]);
  size_t at = 1;
  for (size_t i = 0; i < n; ++i) {
    const auto h = static_cast<uint8_t>(b[at]);
    keys->push_back(b.substr(at + 1, h & ~kCut));
    at += 1 + (h & ~kCut);
  }
}

KeyBounds ReadKeyBounds(std::string_view b) {
  KeyBounds out;
  if (b.empty()) return out;
  const size_t lo = static_cast<uint8_t>(b[1]);
  out.lo = b.substr(2, lo);
  // The last key: walk past the others.
  const size_t n = static_cast<uint8_t>(b[0]);
  size_t at = 1;
  for (size_t i = 0; i + 1 < n; ++i) at += 1 + (static_cast<uint8_t>(b[at]) & ~kCut);
  const auto h = static_cast<uint8_t>(b[at]);
  out.hi = b.substr(at + 1, h & ~kCut);
  out.hi_cut = (h & kCut) != 0;
  out.known = true;
  return out;
}

bool FollowsInKeyOrder(std::string_view prev, std::string_view next) {
  const KeyBounds p = ReadKeyBounds(prev), n = ReadKeyBounds(next);
  if (!p.known || !n.known) return false;
  // A cut greatest key stands for every key starting with it: all of them before the next's
  // least (a cut least key is at most the key it stands for).
  if (p.hi_cut) return CompareKeys(p.hi, n.lo.substr(0, std::min(n.lo.size(), p.hi.size()))) < 0;
  return CompareKeys(p.hi, n.lo) <= 0;
}

bool MayHoldKeyIn(std::string_view encoded, std::string_view from,
                  const std::optional<std::string>& to) {
  const KeyBounds b = ReadKeyBounds(encoded);
  if (!b.known) return true;
  if (to.has_value() && CompareKeys(b.lo, *to) >= 0) return false;  // every key >= lo >= to
  // Some key >= from: hi >= from; a cut hi stands for the keys starting with it.
  const std::string_view f = b.hi_cut ? from.substr(0, std::min(from.size(), b.hi.size())) : from;
  return CompareKeys(b.hi, f) >= 0;
}

}  // namespace sluice
