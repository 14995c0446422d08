#include "server/rules/placement_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rpc/error_reason.h"
#include "server/rules/cluster_node_internal.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

using cluster_internal::IsEtcdDown;

std::shared_ptr<const PlacementCache::Holding> PlacementCache::Remember(
    const std::string& id, const ShufflePlacement& p, const std::string& node_id) {
  auto k = std::make_shared<Holding>();
  k->placement = p;
  k->read_at = membership_->clock().Now();
  k->partitions = p.slots();
  k->mappers = p.num_mappers;
  k->held = p.HeldBy(node_id);
  k->partition = k->held.back();
  k->partition.resize(p.slots(), false);
  k->any = std::find(k->partition.begin(), k->partition.end(), true) != k->partition.end();
  k->ever.assign(p.slots(), false);
  for (const std::vector<bool>& in_epoch : k->held) {
    for (uint32_t q = 0; q < p.total(); ++q) k->ever[q] = k->ever[q] || in_epoch[q];
  }
  std::vector<bool> holds(p.nodes.size(), false);
  for (size_t q = 0; q < p.replicas.size() && q < p.total(); ++q) {
    for (uint32_t i : p.replicas[q]) {
      if (i < p.nodes.size()) holds[i] = true;
    }
  }
  for (size_t i = 0; i < holds.size(); ++i) {
    if (holds[i]) k->holders.push_back(p.nodes[i]);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (p.split_bytes != 0) {
    Metered& m = meters_[id];
    if (m.meter == nullptr) m.meter = std::make_shared<SegmentMeter>(p.split_bytes, p.slots());
    m.meter->Known(p);
  }
  auto& slot = held_[id];
  // (Epochs and segments only go forward: a read racing a newer one does not take it back.)
  if (slot != nullptr &&
      (slot->placement.epoch() > p.epoch() ||
       (slot->placement.epoch() == p.epoch() && slot->placement.total() > p.total()))) {
    return slot;
  }
  slot = k;
  return k;
}

void PlacementCache::Forget(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(id);
    meters_.erase(id);
  }
  if (on_forget_) on_forget_(id);
}

absl::StatusOr<std::shared_ptr<const PlacementCache::Holding>> PlacementCache::Reread(
    const std::string& id) {
  const ClusterMembership::View c = membership_->view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
  SLUICE_ASSIGN_OR_RETURN(auto placed, membership_->Record(id, c.placements->Get(id)));
  if (!placed.has_value()) {
    Forget(id);
    return std::shared_ptr<const Holding>();
  }
  return Remember(id, *placed, c.node_id);
}

std::shared_ptr<const PlacementCache::Holding> PlacementCache::Remembered(
    const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(id);
  return it == held_.end() ? nullptr : it->second;
}

std::vector<std::pair<std::string, std::shared_ptr<const PlacementCache::Holding>>>
PlacementCache::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {held_.begin(), held_.end()};
}

std::set<std::string> PlacementCache::PlacedNodes() const {
  std::set<std::string> nodes;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, holding] : held_) {
    nodes.insert(holding->placement.nodes.begin(), holding->placement.nodes.end());
  }
  return nodes;
}

absl::StatusOr<std::shared_ptr<const PlacementCache::Holding>> PlacementCache::HoldingOf(
    const std::string& id) {
  if (!membership_->clustered()) return std::shared_ptr<const Holding>();
  if (auto holding = Remembered(id)) return holding;
  const ClusterMembership::View c = membership_->view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
  SLUICE_ASSIGN_OR_RETURN(auto placed, membership_->Record(id, c.placements->Get(id)));
  // Not remembered when unrecorded: it may be created later.
  if (!placed.has_value()) return std::shared_ptr<const Holding>();
  return Remember(id, *placed, c.node_id);
}

absl::Status PlacementCache::EnsureLocal(const std::string& id) {
  if (!membership_->clustered() || registry_->Get(id).ok() || registry_->FindDamaged(id)) {
    return absl::OkStatus();
  }
  const ClusterMembership::View c = membership_->view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Holding> holding, HoldingOf(id));
  if (holding == nullptr) return absl::OkStatus();  // the store's own NOT_FOUND says it
  if (!holding->any) {
    return WithReason(absl::FailedPreconditionError(
                          absl::StrCat("server ", c.node_id, " holds no partition of shuffle '",
                                       ShuffleName(id), "' (GetPlacement says which do)")),
                      ErrorReason::kNotKept);
  }
  auto created = registry_->Create(ShuffleParams{id, holding->partitions, holding->mappers});
  if (created.ok() && *created) {
    spdlog::info("event=create tenant={} shuffle={} partitions={} mappers={} from=etcd",
                 TenantField(id), id, holding->partitions, holding->mappers);
  }
  return created.status();
}

absl::Status PlacementCache::CheckKept(const Holding* holding, const std::string& id,
                                       uint32_t partition) const {
  // (A partition kept here in an earlier epoch only is still served, while whole: a repair
  // copies from it. Readers follow the newest epoch.)
  if (holding == nullptr || partition >= holding->partition.size() || holding->ever[partition]) {
    return absl::OkStatus();
  }
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat(
          "server ", membership_->self().node_id, " keeps no replica of partition ", partition,
          " of shuffle '", ShuffleName(id), "' (GetPlacement says which servers do)")),
      ErrorReason::kNotKept);
}

absl::Status PlacementCache::ReadUpTo(const std::string& id, uint32_t epoch) {
  if (!membership_->clustered() || epoch == 0) return absl::OkStatus();
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Holding> holding, HoldingOf(id));
  if (holding == nullptr || holding->placement.epoch() >= epoch) return absl::OkStatus();
  return Reread(id).status();
}

uint32_t PlacementCache::KnownEpoch(const std::string& id) const {
  std::shared_ptr<const Holding> holding = Remembered(id);
  return holding == nullptr ? 0 : holding->placement.epoch();
}

bool PlacementCache::KeepsEver(const std::string& id, uint32_t partition) const {
  std::shared_ptr<const Holding> holding = Remembered(id);
  if (holding == nullptr || partition >= holding->ever.size()) return true;
  return holding->ever[partition];
}

namespace {

// Whether some partition of `p` has no replica among `live` in its newest epoch.
bool Orphaned(const ShufflePlacement& p, const std::vector<NodeEntry>& live) {
  std::set<std::string> registered;
  for (const NodeEntry& n : live) registered.insert(n.node_id);
  for (size_t q = 0; q < p.replicas.size() && q < p.total(); ++q) {
    bool any = false;
    for (uint32_t i : p.replicas[q])
      any = any || (i < p.nodes.size() && registered.count(p.nodes[i]));
    if (!any) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<PlacementCache::Placement> PlacementCache::GetPlacement(const std::string& id,
                                                                       uint64_t known_revision) {
  Placement out;
  if (!membership_->clustered()) {  // on its own: every partition here
    SLUICE_ASSIGN_OR_RETURN(auto store, registry_->Get(id));
    out.partitions = store->params().num_partitions;
    out.mappers = store->params().num_mappers;
    const ClusterMembership::Self s = membership_->self();
    out.nodes.push_back(NodeEntry{s.node_id, s.address, s.started_unix_ms});
    out.replicas.assign(out.partitions, std::vector<uint32_t>{0});
    return out;
  }
  const ClusterMembership::View c = membership_->view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  const std::chrono::milliseconds quick_read = membership_->options().quick_read;
  // A placement changes only through etcd: one read before is the answer when etcd cannot give it
  // now (and etcd is then asked only briefly, or not at all while it is known to be down).
  std::shared_ptr<const Holding> holding = Remembered(id);
  if (known_revision != 0 && !membership_->etcd_down()) {
    // The caller holds a placement: its revision, not the record, tells whether it is current.
    auto now =
        c.placements->Revision(id, holding != nullptr ? quick_read : std::chrono::milliseconds(0));
    membership_->Note(now.status());
    if (now.ok() && *now == static_cast<int64_t>(known_revision)) {
      Placement same;
      same.clustered = true;
      same.revision = known_revision;
      same.unchanged = true;
      return same;
    }
  }
  ShufflePlacement placed;
  if (holding != nullptr && membership_->etcd_down()) {
    placed = holding->placement;
    out.age = std::max(membership_->Since(holding->read_at), std::chrono::milliseconds(1));
  } else {
    if (holding == nullptr) SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
    auto got =
        c.placements->Get(id, holding != nullptr ? quick_read : std::chrono::milliseconds(0));
    membership_->Note(got.status());
    if (got.ok() && !got->has_value()) {
      Forget(id);
      return absl::NotFoundError(
          absl::StrCat("shuffle '", ShuffleName(id), "' not found in the cluster"));
    }
    if (got.ok()) {
      placed = **got;
      // Remembered where this server keeps a part (its memory follows its shuffles), and where
      // a partition has no registered replica: its servers are then taken out by this one's
      // watch too (WatchMembers), though it holds nothing of it, so that a shuffle whose every
      // server is gone gets new ones (and, with the object tier, its data back).
      const std::shared_ptr<const Holding> fresh = Remember(id, placed, c.node_id);
      if (holding == nullptr && !fresh->any && !Orphaned(placed, membership_->LastMembers())) {
        Forget(id);
      }
    } else if (holding != nullptr && IsEtcdDown(got.status())) {
      placed = holding->placement;
      out.age = std::max(membership_->Since(holding->read_at), std::chrono::milliseconds(1));
    } else {
      return AboutShuffle(id, got.status());
    }
  }
  // (The last list, if etcd is down.)
  SLUICE_ASSIGN_OR_RETURN(const std::vector<NodeEntry> live, membership_->Nodes());
  out.clustered = true;
  out.partitions = placed.num_partitions;
  out.mappers = placed.num_mappers;
  out.replication = placed.replication;
  for (const std::string& node_id : placed.nodes) {
    NodeEntry e{node_id, "", 0};
    for (const NodeEntry& n : live) {  // its address now, if it is registered
      if (n.node_id == node_id) e = n;
    }
    out.nodes.push_back(std::move(e));
  }
  out.replicas.assign(placed.replicas.begin(), placed.replicas.begin() + placed.num_partitions);
  for (uint32_t q = placed.num_partitions; q < placed.total(); ++q) {
    out.segments.push_back(Placement::Segment{placed.ParentOf(q), placed.replicas[q]});
  }
  out.split_bytes = placed.split_bytes;
  out.epoch = placed.epoch();
  out.revision = static_cast<uint64_t>(std::max<int64_t>(placed.revision, 0));
  return out;
}

}  // namespace sluice
