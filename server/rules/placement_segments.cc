// PlacementCache's huge partitions (placement_cache.h; docs/cluster.md, "Huge partitions"): the
// meter of what each stored partition holds here, the split asked of the record when one comes
// near the size, and the record read again when a call names a segment made since.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "rpc/error_reason.h"
#include "server/rules/cluster_node_internal.h"
#include "server/rules/placement_cache.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

using cluster_internal::kSegmentReread;
using cluster_internal::UnknownSegment;

absl::Status PlacementCache::SegmentNotReadYet(const std::string& id, uint32_t partition) const {
  return WithReason(
      absl::UnavailableError(absl::StrCat("partition ", partition, " of shuffle '", ShuffleName(id),
                                          "' is a segment server ", membership_->self().node_id,
                                          " has not read of yet (its record was read ",
                                          kSegmentReread.count(), " ms ago or less); retry")),
      ErrorReason::kNotKept);
}

absl::StatusOr<std::shared_ptr<const std::vector<bool>>> PlacementCache::KeptNow(
    const std::string& id, uint32_t partition) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Holding> kept, HoldingOf(id));
  if (kept == nullptr) return std::shared_ptr<const std::vector<bool>>();
  // (A writer told of the segment by another server is refused only if this one read the
  // record in the last few milliseconds: UNAVAILABLE, retry. What callers can make it read is
  // one read of the record per kSegmentReread and shuffle.)
  if (UnknownSegment(kept->placement, partition) && !membership_->etcd_down()) {
    if (membership_->Since(kept->read_at) < kSegmentReread) return SegmentNotReadYet(id, partition);
    SLUICE_ASSIGN_OR_RETURN(kept, Reread(id));
    if (kept == nullptr) return std::shared_ptr<const std::vector<bool>>();
  }
  return std::shared_ptr<const std::vector<bool>>(kept, &kept->partition);
}

PlacementCache::Sizes PlacementCache::SizesOf(const std::string& id, uint32_t stored) const {
  std::shared_ptr<const Holding> kept = Remembered(id);
  if (kept == nullptr || kept->partitions != stored) return Sizes{stored, stored};
  return Sizes{kept->placement.num_partitions, kept->placement.total()};
}

std::shared_ptr<SegmentMeter> PlacementCache::Meter(const std::string& id) {
  std::shared_ptr<SegmentMeter> meter;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = meters_.find(id);
    if (it == meters_.end()) return nullptr;
    meter = it->second.meter;
    if (it->second.seeded) return meter;
  }
  // What is committed here counts (a restarted server goes on where it was).
  auto store = registry_->Get(id);
  if (!store.ok()) return meter;
  std::shared_ptr<const Holding> kept = Remembered(id);
  const uint32_t made = kept != nullptr ? kept->placement.total() : 0;
  for (uint32_t q = 0; q < made; ++q) {
    const uint64_t bytes = (*store)->Stats(q).bytes;
    if (bytes != 0 && meter->Add(q, bytes)) meter->Unask(q);  // (asked by the next push)
  }
  std::lock_guard<std::mutex> lock(mu_);
  meters_[id].seeded = true;
  return meter;
}

absl::Status PlacementCache::Split(const std::string& id, uint32_t full) {
  std::shared_ptr<SegmentMeter> meter = Meter(id);
  const ClusterMembership::View c = membership_->view();
  // The record with a segment after `full`, among the registered servers not leaving.
  auto next = [&]() -> absl::StatusOr<std::optional<ShufflePlacement>> {
    SLUICE_RETURN_IF_ERROR(c.Joined());
    SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
    SLUICE_ASSIGN_OR_RETURN(const std::vector<NodeEntry> nodes, membership_->Nodes());
    const std::vector<std::string> live =
        ClusterMembership::Staying(nodes, membership_->Leaving(/*read_now=*/false));
    return membership_->Record(id, c.placements->AddSegment(id, full, live));
  }();
  if (!next.ok()) {
    // Out of slots, or not splittable: never asked again; anything else: the next push asks.
    const bool final =
        absl::IsResourceExhausted(next.status()) || absl::IsFailedPrecondition(next.status());
    if (meter != nullptr && !final) meter->Unask(full);
    spdlog::warn("event=partition_split_failed tenant={} shuffle={} partition={} error=\"{}\"",
                 TenantField(id), id, full, std::string(next.status().message()));
    return next.status();
  }
  if (!next->has_value()) return absl::OkStatus();  // deleted meanwhile
  const ShufflePlacement& p = **next;
  Remember(id, p, c.node_id);
  const std::vector<uint32_t> chain = p.ChainOf(p.ParentOf(full));
  std::vector<std::string> on;
  for (uint32_t i : p.replicas[chain.back()]) on.push_back(p.nodes[i]);
  spdlog::info(
      "event=partition_split tenant={} shuffle={} partition={} full={} bytes_here={} "
      "segment={} segments={} on=\"{}\"",
      TenantField(id), id, p.ParentOf(full), full, meter != nullptr ? meter->Bytes(full) : 0,
      chain.back(), chain.size(), absl::StrJoin(on, ","));
  return absl::OkStatus();
}

}  // namespace sluice
