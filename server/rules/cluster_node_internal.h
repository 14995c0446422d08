// What the ClusterNode's parts share (cluster_membership.cc: who is registered and etcd's health;
// placement_cache.cc and placement_segments.cc: what this server holds and huge partitions'
// segments; cluster_decisions.cc: decisions, revocations and lost mappers; cluster_node.cc: the
// rules that need all three). Not for other users.
#ifndef SLUICE_SERVER_RULES_CLUSTER_NODE_INTERNAL_H_
#define SLUICE_SERVER_RULES_CLUSTER_NODE_INTERNAL_H_

#include <chrono>

#include "absl/status/status.h"
#include "cluster/placement_store.h"
#include "rpc/error_reason.h"

namespace sluice {
namespace cluster_internal {

inline bool IsEtcdDown(const absl::Status& st) {
  return ReasonOf(st) == ErrorReason::kEtcdUnavailable;
}

// A stored partition id in a shuffle's segment slots that its record had not made when read.
inline bool UnknownSegment(const ShufflePlacement& p, uint32_t partition) {
  return partition >= p.total() && partition < p.slots();
}

// How often a call naming a segment the server has not read of may have it read the record
// again (a frame or fetch of a segment made since: at once, unless it was read this recently).
inline constexpr std::chrono::milliseconds kSegmentReread{10};

}  // namespace cluster_internal
}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_CLUSTER_NODE_INTERNAL_H_
