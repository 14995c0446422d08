#include "server/rules/split_plan.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "codec/key_bounds.h"

namespace sluice {
namespace {

// A frame's bytes over its key positions: spread evenly over [a, b], or all at a when a == b.
struct Spread {
  uint64_t a, b;
  uint64_t bytes;
};

// The keys of a valid encoding, keeping only its first, its last and every stride-th between.
void ReadKeysKept(std::string_view encoded, uint64_t stride, std::vector<std::string_view>* keys) {
  ReadBoundKeys(encoded, keys);
  if (stride <= 1 || keys->size() <= 2) return;
  size_t kept = 1;
  for (size_t i = 1; i + 1 < keys->size(); ++i) {
    if (i % stride == 0) (*keys)[kept++] = (*keys)[i];
  }
  (*keys)[kept++] = keys->back();
  keys->resize(kept);
}

// The bytes at positions below each of `queries` (increasing): F(q).
std::vector<long double> BytesBelow(const std::vector<Spread>& spreads,
                                    const std::vector<uint64_t>& queries) {
  // Events by position: a span's start and end change the rate; a point adds once passed.
  struct Event {
    uint64_t at;
    long double rate;   // added to the rate from `at` on
    long double point;  // bytes at exactly `at`
  };
  std::vector<Event> events;
  events.reserve(2 * spreads.size());
  for (const Spread& s : spreads) {
    if (s.a == s.b) {
      events.push_back(Event{s.a, 0, static_cast<long double>(s.bytes)});
    } else {
      const long double r =
          static_cast<long double>(s.bytes) / (static_cast<long double>(s.b) - s.a);
      events.push_back(Event{s.a, r, 0});
      events.push_back(Event{s.b, -r, 0});
    }
  }
  std::sort(events.begin(), events.end(),
            [](const Event& x, const Event& y) { return x.at < y.at; });
  std::vector<long double> out(queries.size());
  long double below = 0, rate = 0;
  uint64_t at = 0;
  size_t e = 0;
  for (size_t q = 0; q < queries.size(); ++q) {
    // Every event before the query (a point at the query's position is not below it).
    for (; e < events.size() && events[e].at < queries[q]; ++e) {
      below += rate * (static_cast<long double>(events[e].at) - at) + events[e].point;
      at = events[e].at;
      rate = std::max<long double>(0, rate + events[e].rate);
    }
    out[q] = below + rate * (static_cast<long double>(queries[q]) - at);
  }
  return out;
}

}  // namespace

absl::StatusOr<SplitPlan> PlanSplits(const ShuffleStore::BlockSample& sample, uint32_t slices) {
  if (slices < 1 || slices > kMaxSplitSlices) {
    return absl::InvalidArgumentError(
        absl::StrCat("slices ", slices, " is out of range [1, ", kMaxSplitSlices, "]"));
  }
  SplitPlan plan;
  plan.bytes = sample.stats.bytes;
  plan.frames = sample.stats.frames;
  const uint64_t weight = sample.stride;  // each sampled frame stands for this many
  // A partition of very many frames plans from part of their samples: at most about
  // kMaxPlanKeys keys (every frame's least and greatest, and every stride-th sample).
  uint64_t named = 0;
  for (const BlockRef& b : sample.blocks) {
    named += b.bounds.empty() ? 0 : static_cast<uint8_t>(b.bounds[0]);
  }
  const uint64_t stride = std::max<uint64_t>(1, (named + kMaxPlanKeys - 1) / kMaxPlanKeys);
  // Every key the frames name, each frame's back to back (`begin`: where a frame's start, and
  // its bytes): they sample the partition's keys at even steps of bytes, so a key's rank among
  // them measures how far into the partition it is.
  uint64_t known = 0, unknown = 0;
  std::vector<std::string_view> keys, kept;
  std::vector<std::pair<size_t, uint64_t>> frames;  // (where its keys start in kept, bytes)
  for (const BlockRef& b : sample.blocks) {
    const uint64_t bytes = uint64_t{b.frame_size} * weight;
    ReadKeysKept(b.bounds, stride, &keys);
    if (keys.size() < 2) {
      plan.frames_without_bounds += static_cast<uint32_t>(
          std::min<uint64_t>(weight, UINT32_MAX - plan.frames_without_bounds));
      unknown += bytes;
      continue;
    }
    known += bytes;
    frames.emplace_back(kept.size(), bytes);
    kept.insert(kept.end(), keys.begin(), keys.end());
  }
  std::vector<std::string_view> all = kept;
  std::sort(all.begin(), all.end(), KeyLess);
  all.erase(std::unique(all.begin(), all.end()), all.end());
  const auto rank = [&all](std::string_view k) {
    return static_cast<uint64_t>(std::lower_bound(all.begin(), all.end(), k, KeyLess) -
                                 all.begin());
  };
  // Each frame's bytes, in equal shares between each two of its keys in order, evenly by rank.
  // Positions are 2 x rank (a key) and 2 x rank + 1 (just past it).
  std::vector<Spread> spreads;
  for (size_t f = 0; f < frames.size(); ++f) {
    const size_t first = frames[f].first;
    const size_t end = f + 1 < frames.size() ? frames[f + 1].first : kept.size();
    const uint64_t parts = end - first - 1, bytes = frames[f].second;
    for (uint64_t i = 0; i < parts; ++i) {
      // (The bytes split exactly: the first parts take the remainder.)
      const uint64_t share = bytes / parts + (i < bytes % parts ? 1 : 0);
      spreads.push_back(Spread{2 * rank(kept[first + i]), 2 * rank(kept[first + i + 1]), share});
    }
  }
  // The cuts are keys the frames named, or the key just past one (a key of many records then
  // ends a slice rather than starts one): for each slice's share of the known bytes, the one
  // whose bytes below come nearest it.
  std::vector<uint64_t> at;
  if (slices > 1 && known > 0) {
    at.reserve(2 * all.size());
    for (uint64_t r = 0; r < all.size(); ++r) {
      at.push_back(2 * r);
      at.push_back(2 * r + 1);
    }
  }
  const std::vector<long double> below = BytesBelow(spreads, at);
  std::vector<size_t> cuts;
  for (uint32_t j = 1; j < slices && !at.empty(); ++j) {
    const long double target = static_cast<long double>(known) * j / slices;
    size_t c =
        static_cast<size_t>(std::lower_bound(below.begin(), below.end(), target) - below.begin());
    if (c == below.size() || (c > 0 && target - below[c - 1] < below[c] - target)) --c;
    cuts.push_back(c);
  }
  // Each slice's bytes as estimated; no empty slice is planned.
  long double last = 0;
  for (size_t c : cuts) {
    if (below[c] <= last || below[c] >= static_cast<long double>(known)) continue;
    std::string key(all[c / 2]);
    if (c % 2 == 1) {
      // Just past a key: its successor. (A cut greatest key stands for longer keys: past it is
      // past all of them only at its full length, which a cut key never has; keep the key.)
      if (key.size() >= kMaxBoundKey) continue;
      key.push_back('\0');
    }
    if (!plan.keys.empty() && CompareKeys(key, plan.keys.back()) <= 0) continue;
    plan.keys.push_back(std::move(key));
    plan.slice_bytes.push_back(static_cast<uint64_t>(std::llround(below[c] - last)));
    last = below[c];
  }
  plan.slice_bytes.push_back(static_cast<uint64_t>(std::llround(known - last)));
  // Frames without bounds: evenly over the slices (the first ones take the remainder).
  for (size_t i = 0; i < plan.slice_bytes.size(); ++i) {
    plan.slice_bytes[i] +=
        unknown / plan.slice_bytes.size() + (i < unknown % plan.slice_bytes.size() ? 1 : 0);
  }
  return plan;
}

}  // namespace sluice
