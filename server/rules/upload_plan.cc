#include "server/rules/upload_plan.h"

namespace sluice {

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
    for (uint32_t i : placement.replicas[q]) {
      const std::string& node = placement.nodes[i];
      if (registered.count(node) == 0) continue;  // (gone: the next one takes over)
      if (node == self) out.push_back(q);
      break;
    }
  }
  return out;
}

}  // namespace sluice
