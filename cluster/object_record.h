// Whether a partition's object record (objstore/object_record.h) stands for the partition now:
// its winners are the shuffle's decisions. A revocation makes a record stale; it is then not
// read, and the partition is uploaded again (docs/object-store.md, "The commit point").
#ifndef SLUICE_CLUSTER_OBJECT_RECORD_H_
#define SLUICE_CLUSTER_OBJECT_RECORD_H_

#include <cstdint>
#include <map>

#include "cluster/shuffle_placement.h"
#include "objstore/object_record.h"

namespace sluice {

/// Whether `r` stands for the shuffle's partition now: its winners are exactly the decided
/// mappers' winning attempts, and every mapper of the shuffle (`num_mappers`, when known) is
/// decided.
bool StandsFor(const ObjectRecord& r, const std::map<uint32_t, MapperDecision>& decided,
               uint32_t num_mappers);

}  // namespace sluice

#endif  // SLUICE_CLUSTER_OBJECT_RECORD_H_
