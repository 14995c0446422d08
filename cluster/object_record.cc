#include "cluster/object_record.h"

namespace sluice {

bool StandsFor(const ObjectRecord& r, const std::map<uint32_t, MapperDecision>& decided,
               uint32_t num_mappers) {
  if (r.winners.size() != decided.size()) return false;
  if (num_mappers != 0 && decided.size() != num_mappers) return false;
  auto d = decided.begin();
  for (const auto& [m, a] : r.winners) {
    if (d->first != m || d->second.attempt != a) return false;
    ++d;
  }
  return true;
}

}  // namespace sluice
