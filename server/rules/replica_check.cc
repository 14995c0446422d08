#include "server/rules/replica_check.h"

#include <algorithm>
#include <optional>
#include <set>

namespace sluice {

ReplicaCheck CheckReplicas(const std::vector<std::vector<bool>>& held_by_epoch,
                           const std::map<uint32_t, MapperDecision>& decided,
                           const ShuffleStore& store, const std::vector<uint32_t>& born) {
  const uint32_t partitions = store.params().num_partitions;
  const std::vector<std::vector<bool>> all_held(1, std::vector<bool>(partitions, true));
  const std::vector<std::vector<bool>>& held = held_by_epoch.empty() ? all_held : held_by_epoch;
  const auto epochs = static_cast<uint32_t>(held.size());
  const auto epoch_of = [&](const MapperDecision& d) { return std::min(d.epoch, epochs - 1); };
  const auto committed = [&](uint32_t m, const MapperDecision& d) {
    return store.CommittedAttempt(m) == std::optional<uint64_t>(d.attempt);
  };
  ReplicaCheck out;
  if (store.evicted() != nullptr) {
    // Here: restored by Repair (every partition its own), or committed by a push since the
    // eviction (then for the partitions it was pushed to, as anywhere).
    const std::set<uint32_t> repaired_any = store.RepairedAnywhere();
    for (uint32_t q = 0; q < partitions; ++q) {
      const uint32_t from = std::min(q < born.size() ? born[q] : 0, epochs);
      bool ever = false;
      for (uint32_t e = 0; e < epochs && !ever; ++e) ever = q < held[e].size() && held[e][q];
      if (!ever) continue;
      const std::vector<uint32_t> repaired = store.RepairedMappers(q);
      std::vector<std::pair<uint32_t, uint64_t>> lacking;
      for (const auto& [m, d] : decided) {
        if (epoch_of(d) < from) continue;
        const std::vector<bool>& in = held[epoch_of(d)];
        const bool pushed = repaired_any.count(m) == 0 && q < in.size() && in[q];
        if (committed(m, d) &&
            (pushed || std::binary_search(repaired.begin(), repaired.end(), m))) {
          continue;
        }
        lacking.emplace_back(m, d.attempt);
      }
      if (!lacking.empty()) out.evicted.emplace(q, std::move(lacking));
    }
    return out;
  }
  // Counted first (committed mappers by epoch), listed only where a partition lacks some.
  std::vector<uint64_t> committed_in(epochs, 0), decided_from(epochs + 1, 0);
  for (const auto& [m, d] : decided) {
    const uint32_t e = epoch_of(d);
    ++decided_from[e];
    if (committed(m, d)) {
      ++committed_in[e];
    } else if (std::find(held[e].begin(), held[e].end(), true) != held[e].end()) {
      out.lost.push_back(m);
    }
  }
  for (uint32_t e = epochs; e-- > 0;) decided_from[e] += decided_from[e + 1];  // (epoch e on)
  for (uint32_t q = 0; q < partitions; ++q) {
    // Winners of epochs before the partition was made have no data in it (a segment).
    const uint32_t from = std::min(q < born.size() ? born[q] : 0, epochs);
    bool ever = false;
    uint64_t here = 0;
    for (uint32_t e = 0; e < epochs; ++e) {
      if (q >= held[e].size() || !held[e][q]) continue;
      ever = true;
      here += committed_in[e];
    }
    if (!ever || here == decided_from[from]) continue;
    const std::vector<uint32_t> repaired = store.RepairedMappers(q);
    std::vector<std::pair<uint32_t, uint64_t>> lacking;
    for (const auto& [m, d] : decided) {
      if (epoch_of(d) < from) continue;
      const bool in_epoch = held[epoch_of(d)][q];
      if (committed(m, d) &&
          (in_epoch || std::binary_search(repaired.begin(), repaired.end(), m))) {
        continue;
      }
      lacking.emplace_back(m, d.attempt);
    }
    if (!lacking.empty()) out.missing.emplace(q, std::move(lacking));
  }
  return out;
}

std::map<uint32_t, std::set<uint32_t>> StillLost(
    const std::map<uint32_t, std::set<uint32_t>>& lost,
    const std::map<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>>& missing) {
  std::map<uint32_t, std::set<uint32_t>> out;
  for (const auto& [partition, mappers] : lost) {
    auto now = missing.find(partition);
    if (now == missing.end()) continue;
    for (const auto& [m, attempt] : now->second) {
      if (mappers.count(m) != 0) out[partition].insert(m);
    }
  }
  return out;
}

}  // namespace sluice
