#include "cluster/shuffle_placement.h"

#include <algorithm>

namespace sluice {

std::vector<uint32_t> ShufflePlacement::ReplicasAt(uint32_t p, uint32_t e) const {
  std::vector<uint32_t> out = p < first_replicas.size() ? first_replicas[p] : replicas[p];
  for (uint32_t i = 0; i < e && i < epochs.size(); ++i) {
    for (const auto& [q, list] : epochs[i].changed) {
      if (q == p) out = list;
    }
  }
  return out;
}

uint32_t SegmentSlots(uint32_t num_partitions) {
  constexpr uint32_t kIds = 1u << 16;  // a stored block names its partition in 16 bits
  return num_partitions >= kIds ? 0 : std::min(kMaxSegments, kIds - num_partitions);
}

std::vector<uint32_t> ShufflePlacement::ChainOf(uint32_t p) const {
  std::vector<uint32_t> out{p};
  for (size_t k = 0; k < segments.size(); ++k) {
    if (segments[k].parent == p) out.push_back(num_partitions + static_cast<uint32_t>(k));
  }
  return out;
}

std::vector<std::vector<bool>> ShufflePlacement::HeldBy(const std::string& node_id) const {
  std::vector<std::vector<bool>> held(epoch() + 1, std::vector<bool>(total(), false));
  const auto it = std::find(nodes.begin(), nodes.end(), node_id);
  if (it == nodes.end()) return held;
  const auto self = static_cast<uint32_t>(it - nodes.begin());
  std::vector<std::vector<uint32_t>> at = first_replicas;
  for (uint32_t e = 0; e <= epoch(); ++e) {
    if (e > 0) {
      for (const auto& [q, list] : epochs[e - 1].changed) at[q] = list;
    }
    for (uint32_t q = 0; q < total() && q < at.size(); ++q) {
      held[e][q] = e >= BornAt(q) && std::find(at[q].begin(), at[q].end(), self) != at[q].end();
    }
  }
  return held;
}

bool ShufflePlacement::Removed(const std::string& node_id) const {
  for (const PlacementEpoch& e : epochs) {
    if (std::find(e.removed.begin(), e.removed.end(), node_id) != e.removed.end()) return true;
  }
  return false;
}

std::vector<std::pair<uint32_t, uint64_t>> ShufflePlacement::RevokedAfter(uint32_t after) const {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (size_t e = after; e < epochs.size(); ++e) {
    out.insert(out.end(), epochs[e].revoked.begin(), epochs[e].revoked.end());
  }
  return out;
}

bool ShufflePlacement::Holds(const std::string& node_id) const {
  const auto it = std::find(nodes.begin(), nodes.end(), node_id);
  if (it == nodes.end()) return false;
  const auto index = static_cast<uint32_t>(it - nodes.begin());
  for (const auto& r : replicas) {
    if (std::find(r.begin(), r.end(), index) != r.end()) return true;
  }
  return false;
}

uint32_t DefaultReplication(size_t servers) { return servers >= 2 ? 2 : 1; }

}  // namespace sluice
