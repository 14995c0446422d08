// What ClusterNode's files share (cluster_node.cc: shuffles, epochs and serving;
// cluster_membership.cc: who is registered, etcd's health, taking the dead out;
// cluster_segments.cc: huge partitions' segments). Not for other users.
#ifndef SLUICE_SERVER_RULES_CLUSTER_NODE_INTERNAL_H_
#define SLUICE_SERVER_RULES_CLUSTER_NODE_INTERNAL_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "rpc/error_reason.h"
#include "server/rules/cluster_node.h"
#include "server/storage/shuffle_id.h"

namespace sluice {
namespace cluster_internal {

using Clock = std::chrono::steady_clock;

// An error of the cluster's record about shuffle `id`, saying which shuffle as its caller knows
// it (the record's own errors do not name it). etcd's unavailability speaks of etcd alone.
inline absl::Status AboutShuffle(const std::string& id, const absl::Status& st) {
  if (st.ok() || absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) return st;
  return absl::Status(st.code(), absl::StrCat("shuffle '", ShuffleName(id), "': ", st.message()));
}

inline bool IsEtcdDown(const absl::Status& st) {
  return ReasonOf(st) == ErrorReason::kEtcdUnavailable;
}

inline std::chrono::milliseconds Since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
}

// A stored partition id in a shuffle's segment slots that its record had not made when read.
inline bool UnknownSegment(const ShufflePlacement& p, uint32_t partition) {
  return partition >= p.total() && partition < p.slots();
}

// How often a call naming a segment the server has not read of may have it read the record
// again (a frame or fetch of a segment made since: at once, unless it was read this recently).
inline constexpr std::chrono::milliseconds kSegmentReread{10};

}  // namespace cluster_internal

template <typename T>
absl::StatusOr<T> ClusterNode::Record(const std::string& id, absl::StatusOr<T> r) {
  Note(r.status());
  if (r.ok()) return r;
  return cluster_internal::AboutShuffle(id, r.status());
}

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_CLUSTER_NODE_INTERNAL_H_
