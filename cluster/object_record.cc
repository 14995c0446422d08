#include "cluster/object_record.h"

#include <utility>
#include <vector>

namespace sluice {

bool StandsFor(const ObjectRecord& r, const std::map<uint32_t, MapperDecision>& decided,
               uint32_t num_mappers) {
  if (num_mappers != 0 && decided.size() != num_mappers) return false;
  if (r.winners.count != decided.size()) return false;
  std::vector<std::pair<uint32_t, uint64_t>> winners;
  winners.reserve(decided.size());
  for (const auto& [m, d] : decided) winners.emplace_back(m, d.attempt);
  return r.winners == WinnerSet(winners);
}

}  // namespace sluice
