// Which stored partitions of a shuffle this server uploads to the object store now
// (docs/object-store.md, "Who uploads"), as a pure function of what it knows: the placement,
// the decisions, the records made, who is registered, and which partitions it holds whole.
//
// A partition is uploaded once its shuffle is complete (its mapper count known and every
// mapper decided), by the first server of its newest replicas that is registered (a take-over
// when that one is gone: the next), from a replica that is whole for it; not when a record
// stands for it already. Two servers that both think it theirs (membership seen at different
// moments) both upload, and the commit record keeps one: PlacementStore::RecordObject.
#ifndef SLUICE_SERVER_RULES_UPLOAD_PLAN_H_
#define SLUICE_SERVER_RULES_UPLOAD_PLAN_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cluster/object_record.h"
#include "cluster/shuffle_placement.h"

namespace sluice {

/// The first server of stored partition q's newest replicas that is registered (empty: none):
/// the one that uploads it (and, for partition 0, writes the shuffle's manifest).
std::string FirstRegistered(const ShufflePlacement& placement, uint32_t q,
                            const std::set<std::string>& registered);

/// The stored partitions (partitions and segments, ascending) `self` uploads now. `whole[q]`:
/// this server holds stored partition q, every decided mapper's data of it (a partition past
/// `whole`'s size is not whole). A record that no longer stands for its partition (revoked
/// since) does not count: the partition is uploaded again.
std::vector<uint32_t> PartitionsToUpload(const ShufflePlacement& placement,
                                         const std::map<uint32_t, MapperDecision>& decided,
                                         const std::map<uint32_t, ObjectRecord>& recorded,
                                         const std::string& self,
                                         const std::set<std::string>& registered,
                                         const std::vector<bool>& whole);

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_UPLOAD_PLAN_H_
