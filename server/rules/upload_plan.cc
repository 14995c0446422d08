#include "server/rules/upload_plan.h"

namespace sluice {

std::string FirstRegistered(const ShufflePlacement& p, uint32_t q,
                            const std::set<std::string>& registered) {
  if (q >= p.replicas.size()) return "";
  for (uint32_t i : p.replicas[q]) {
    if (registered.count(p.nodes[i]) != 0) return p.nodes[i];
  }
  return "";
}

std::vector<uint32_t> PartitionsToUpload(const ShufflePlacement& placement,
                                         const std::map<uint32_t, MapperDecision>& decided,
                                         const std::map<uint32_t, ObjectRecord>& recorded,
                                         const std::string& self,
                                         const std::set<std::string>& registered,
                                         const std::vector<bool>& whole) {
  std::vector<uint32_t> out;
  if (placement.num_mappers == 0 || decided.size() != placement.num_mappers) return out;
  for (uint32_t q = 0; q < placement.total() && q < placement.replicas.size(); ++q) {
    if (q >= whole.size() || !whole[q]) continue;
    auto r = recorded.find(q);
    if (r != recorded.end() && StandsFor(r->second, decided, placement.num_mappers)) continue;
    // (One gone: the next takes over.)
    if (FirstRegistered(placement, q, registered) == self) out.push_back(q);
  }
  return out;
}

}  // namespace sluice
