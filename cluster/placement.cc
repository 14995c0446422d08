#include "cluster/placement.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"

namespace sluice {

uint64_t RendezvousScore(std::string_view shuffle_id, uint32_t partition, std::string_view node) {
  // Length-prefixed, so that ("ab", "c") and ("a", "bc") hash apart.
  std::string buf;
  buf.reserve(shuffle_id.size() + node.size() + 12);
  const auto put32 = [&buf](uint32_t v) {
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<char>(v >> (8 * i)));
  };
  put32(static_cast<uint32_t>(shuffle_id.size()));
  buf.append(shuffle_id);
  put32(partition);
  put32(static_cast<uint32_t>(node.size()));
  buf.append(node);
  return XXH3_64bits(buf.data(), buf.size());
}

absl::StatusOr<std::vector<std::vector<uint32_t>>> PlaceReplicas(
    std::string_view shuffle_id, uint32_t partitions, absl::Span<const std::string> nodes,
    uint32_t replicas) {
  if (nodes.empty()) return absl::InvalidArgumentError("no servers to place partitions on");
  if (std::set<std::string>(nodes.begin(), nodes.end()).size() != nodes.size()) {
    return absl::InvalidArgumentError("two servers have the same node id");
  }
  if (replicas < 1 || replicas > nodes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("replication ", replicas, " needs 1 to ",
                                                   nodes.size(), " servers (there are ",
                                                   nodes.size(), ")"));
  }
  const uint64_t n = nodes.size();
  const uint64_t cap = (uint64_t{partitions} * replicas + n - 1) / n;  // replicas a node takes
  const uint64_t floor = uint64_t{partitions} * replicas / n;          // at most, and at least
  std::vector<uint64_t> load(n, 0), primaries(n, 0);
  std::vector<std::vector<uint32_t>> out(partitions);
  std::vector<uint32_t> order(n);
  std::vector<uint64_t> score(n);
  for (uint32_t p = 0; p < partitions; ++p) {
    for (uint32_t i = 0; i < n; ++i) score[i] = RendezvousScore(shuffle_id, p, nodes[i]);
    std::iota(order.begin(), order.end(), 0u);
    // Best first; equal scores (practically never) by node id, so every caller agrees.
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return score[a] != score[b] ? score[a] > score[b] : nodes[a] < nodes[b];
    });
    std::vector<uint32_t>& chosen = out[p];
    // As the partitions run out, a node still below the fair share (floor) or with room up
    // to the cap as large as the partitions left (this one included) must take this one: a
    // partition uses a node once, so later ones could not make it up. Then the best with room;
    // should even those be too few for R distinct nodes, the best of the rest (a node over
    // the cap beats two replicas on one node).
    const uint64_t left = partitions - p;
    const auto take = [&](auto&& eligible) {
      for (uint32_t i : order) {
        if (chosen.size() == replicas) return;
        if (eligible(i) && std::find(chosen.begin(), chosen.end(), i) == chosen.end()) {
          chosen.push_back(i);
        }
      }
    };
    take([&](uint32_t i) { return load[i] < floor && floor - load[i] >= left; });
    take([&](uint32_t i) { return load[i] <= cap && cap - load[i] >= left; });
    take([&](uint32_t i) { return load[i] < cap; });
    take([](uint32_t) { return true; });
    std::vector<uint32_t> rank(n);
    for (uint32_t r = 0; r < n; ++r) rank[order[r]] = r;
    std::sort(chosen.begin(), chosen.end(),
              [&](uint32_t a, uint32_t b) { return rank[a] < rank[b]; });
    // Reads go to the primary: of the chosen, the one primary of the fewest partitions so far
    // leads (the best scoring of those), so that primaries spread as evenly as replicas do;
    // the rest follow by score.
    size_t lead = 0;
    for (size_t c = 1; c < chosen.size(); ++c) {
      if (primaries[chosen[c]] < primaries[chosen[lead]]) lead = c;
    }
    std::rotate(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(lead),
                chosen.begin() + static_cast<std::ptrdiff_t>(lead) + 1);
    ++primaries[chosen[0]];
    for (uint32_t i : chosen) ++load[i];
  }
  return out;
}

std::vector<std::vector<std::string>> ReplaceReplicas(
    std::string_view shuffle_id, const std::vector<std::vector<std::string>>& current,
    const std::vector<std::string>& removed, const std::vector<std::string>& live,
    uint32_t replication) {
  const auto gone = [&](const std::string& id) {
    return std::find(removed.begin(), removed.end(), id) != removed.end();
  };
  std::vector<std::string> candidates;
  for (const std::string& id : live) {
    if (!gone(id) && std::find(candidates.begin(), candidates.end(), id) == candidates.end()) {
      candidates.push_back(id);
    }
  }
  std::sort(candidates.begin(), candidates.end());
  std::map<std::string, uint64_t> load;
  std::vector<std::vector<std::string>> out(current.size());
  for (size_t p = 0; p < current.size(); ++p) {
    for (const std::string& id : current[p]) {
      if (gone(id)) continue;
      out[p].push_back(id);
      ++load[id];
    }
  }
  for (size_t p = 0; p < current.size(); ++p) {
    std::vector<std::string>& kept = out[p];
    while (kept.size() < replication) {
      const std::string* best = nullptr;
      uint64_t best_score = 0;
      for (const std::string& id : candidates) {
        if (std::find(kept.begin(), kept.end(), id) != kept.end()) continue;
        const uint64_t score = RendezvousScore(shuffle_id, static_cast<uint32_t>(p), id);
        if (best == nullptr || load[id] < load[*best] ||
            (load[id] == load[*best] && score > best_score)) {
          best = &id;
          best_score = score;
        }
      }
      if (best == nullptr) break;
      kept.push_back(*best);
      ++load[*best];
    }
  }
  return out;
}

}  // namespace sluice
