#include "server/rules/cluster_node.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "rpc/error_reason.h"
#include "server/rules/cluster_node_internal.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

using cluster_internal::kSegmentReread;
using cluster_internal::UnknownSegment;

ClusterNode::ClusterNode(ShuffleRegistry* registry, Options options)
    : dead_after_(options.dead_after),
      revives_per_s_(options.revives_per_s),
      revive_tokens_(options.revives_per_s),
      membership_(ClusterMembership::Options{options.clustered, options.settle, options.quick_read,
                                             options.clock}),
      placements_(registry, &membership_),
      decisions_(registry, &membership_, &placements_,
                 ClusterDecisions::Options{options.split_bytes}) {
  placements_.OnForget([this](const std::string& id) { decisions_.ForgetRevocations(id); });
}

absl::StatusOr<std::shared_ptr<const std::vector<bool>>> ClusterNode::PrepareToPush(
    const std::string& id, uint32_t epoch) {
  SLUICE_RETURN_IF_ERROR(placements_.ReadUpTo(id, epoch));
  SLUICE_RETURN_IF_ERROR(placements_.EnsureLocal(id));
  SLUICE_RETURN_IF_ERROR(decisions_.ApplyRevoked(id));  // (a revoked mapper may commit again)
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const PlacementCache::Holding> kept,
                          placements_.HoldingOf(id));
  if (kept == nullptr) return std::shared_ptr<const std::vector<bool>>();
  if (kept->placement.epoch() != epoch) {
    return WithReason(
        absl::UnavailableError(absl::StrCat(
            "shuffle '", ShuffleName(id), "' is at placement epoch ", kept->placement.epoch(),
            " and this attempt was routed by epoch ", epoch,
            " (a server was taken out): read the placement again and retry the attempt")),
        ErrorReason::kPlacementChanged);
  }
  return std::shared_ptr<const std::vector<bool>>(kept, &kept->partition);
}

absl::Status ClusterNode::PrepareToServe(const std::string& id, std::optional<uint32_t> partition,
                                         uint32_t epoch) {
  SLUICE_RETURN_IF_ERROR(placements_.ReadUpTo(id, epoch));
  SLUICE_RETURN_IF_ERROR(placements_.EnsureLocal(id));
  if (partition.has_value()) {
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const PlacementCache::Holding> kept,
                            placements_.HoldingOf(id));
    absl::Status st = placements_.CheckKept(kept.get(), id, *partition);
    // A newer epoch may have given it this partition: read again (at most once a second; a
    // segment made since the last read, at once unless read a few milliseconds ago).
    const bool segment = kept != nullptr && UnknownSegment(kept->placement, *partition);
    const auto wait = segment ? kSegmentReread : std::chrono::milliseconds(1000);
    const bool etcd_down = membership_.etcd_down();
    if (!st.ok() && membership_.Since(kept->read_at) >= wait && !etcd_down) {
      SLUICE_ASSIGN_OR_RETURN(kept, placements_.Reread(id));
      st = placements_.CheckKept(kept.get(), id, *partition);
    } else if (!st.ok() && segment && !etcd_down) {
      return placements_.SegmentNotReadYet(id, *partition);
    }
    SLUICE_RETURN_IF_ERROR(st);
  }
  SLUICE_RETURN_IF_ERROR(decisions_.ResolvePending(id));
  if (!partition.has_value()) return absl::OkStatus();
  if (auto lacking = decisions_.EvictedLacking(id, *partition); !lacking.empty()) {
    if (!evicted_restore_) {
      return WithReason(absl::UnavailableError(
                            absl::StrCat("server ", membership_.self().node_id, " let partition ",
                                         *partition, " of shuffle '", ShuffleName(id),
                                         "' go (evicted) and has no object store to read "
                                         "it back from: read another replica")),
                        ErrorReason::kIncomplete);
    }
    SLUICE_RETURN_IF_ERROR(evicted_restore_(id, *partition, lacking));
    decisions_.Recheck(id);
    SLUICE_RETURN_IF_ERROR(decisions_.ResolvePending(id));
    if (const size_t left = decisions_.EvictedLacking(id, *partition).size(); left != 0) {
      return WithReason(absl::UnavailableError(absl::StrCat(
                            "server ", membership_.self().node_id, " read partition ", *partition,
                            " of shuffle '", ShuffleName(id), "' back from the object store, and ",
                            left, " mapper", left == 1 ? " is" : "s are",
                            " not here yet (another read of it failed meanwhile, or its object "
                            "does not hold them): retry, or read another replica")),
                        ErrorReason::kIncomplete);
    }
  }
  const uint32_t missing = decisions_.MissingMappers(id, *partition);
  if (missing == 0) return absl::OkStatus();
  return WithReason(
      absl::UnavailableError(absl::StrCat(
          "server ", membership_.self().node_id, " lacks ", missing, " committed mapper",
          missing == 1 ? "" : "s", " of partition ", *partition, " of shuffle '", ShuffleName(id),
          "' (it took the partition over in a later placement epoch and is not repaired yet): "
          "read another replica")),
      ErrorReason::kIncomplete);
}

std::optional<std::chrono::milliseconds> ClusterNode::TakeReviveToken() {
  std::lock_guard<std::mutex> lock(revive_mu_);
  const Clock::time_point now = membership_.clock().Now();
  if (revive_refilled_ != Clock::time_point{}) {
    const double elapsed = std::chrono::duration<double>(now - revive_refilled_).count();
    revive_tokens_ = std::min(revives_per_s_, revive_tokens_ + elapsed * revives_per_s_);
  }
  revive_refilled_ = now;
  if (revive_tokens_ >= 1) {
    revive_tokens_ -= 1;
    return std::nullopt;
  }
  if (revives_per_s_ <= 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(
      1 + static_cast<int64_t>((1 - revive_tokens_) / revives_per_s_ * 1000));
}

absl::StatusOr<ClusterNode::Revived> ClusterNode::Revive(const std::string& id, uint32_t seen,
                                                         const std::string& node) {
  if (!clustered()) {
    return absl::FailedPreconditionError(
        "this server is on its own: a shuffle has no placement epochs to revive");
  }
  const ClusterMembership::View c = membership_.view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  if (node == c.node_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("server ", node,
                     " is the one answering this call: a writer revives only a server it "
                     "cannot reach"));
  }
  // What this server remembers may answer it without etcd: an epoch past `seen` is newer still
  // in the record (revived already, by another writer or the grace).
  if (auto kept = placements_.Remembered(id); kept != nullptr && kept->placement.epoch() > seen) {
    return Revived{kept->placement.epoch(), false};
  }
  if (auto wait = TakeReviveToken(); wait.has_value()) {
    if (wait->count() == 0) {
      return absl::UnavailableError(
          absl::StrCat("this server makes no revives (--revives_per_s=0): server ", node,
                       " is taken out of shuffle '", ShuffleName(id), "' after --dead_after_s"));
    }
    return WithReason(absl::UnavailableError(
                          absl::StrCat("this server is making --revives_per_s=", revives_per_s_,
                                       " revives a second already: retry the revive of server ",
                                       node, " of shuffle '", ShuffleName(id), "' in a moment")),
                      ErrorReason::kNone, *wait);
  }
  // A server that drained to restart is waited for (it is back in about a second), for its
  // restart grace at most.
  auto restarting = membership_.Record(id, c.nodes->Restarting(node));
  if (!restarting.ok()) return restarting.status();
  if (*restarting) {
    return WithReason(absl::UnavailableError(absl::StrCat(
                          "server ", node, " of shuffle '", ShuffleName(id),
                          "' drained to restart and is not back yet: retry the attempt in a "
                          "moment (it is taken out if it is not back within its restart grace)")),
                      ErrorReason::kDraining, std::chrono::milliseconds(2000));
  }
  SLUICE_ASSIGN_OR_RETURN(const std::vector<NodeEntry> live, membership_.Nodes());
  const std::vector<std::string> staying =
      ClusterMembership::Staying(live, membership_.Leaving(/*read_now=*/false));
  auto r = membership_.Record(id, c.placements->Revive(id, seen, node, staying));
  if (!r.ok()) return r.status();
  const ShufflePlacement& p = r->first;
  placements_.Remember(id, p, c.node_id);
  if (r->second) {
    spdlog::warn(
        "event=revive tenant={} shuffle={} epoch={} removed={} changed_partitions={} seen={}",
        TenantField(id), id, p.epoch(), node, p.epochs.back().changed.size(), seen);
  }
  return Revived{p.epoch(), r->second};
}

void ClusterNode::WatchMembers() {
  ClusterMembership::Members members;
  if (!membership_.ReadMembers(&members) || !members.judge) return;
  membership_.TrackAbsent(members.live, placements_.PlacedNodes());
  RemoveDead(members);
}

void ClusterNode::RemoveDead(const ClusterMembership::Members& members) {
  // Dead past --dead_after_s, or being decommissioned (alive: its data is a repair's source).
  std::vector<std::string> dead = members.leaving;
  for (const auto& [node_id, since] : membership_.Absent()) {
    if (dead_after_.count() > 0 && membership_.Since(since) >= dead_after_) dead.push_back(node_id);
  }
  if (dead.empty()) return;
  std::vector<std::pair<std::string, std::vector<std::string>>> to_change;
  for (const auto& [id, kept] : placements_.All()) {
    std::vector<std::string> held;
    for (const std::string& d : dead) {
      if (std::find(kept->holders.begin(), kept->holders.end(), d) != kept->holders.end()) {
        held.push_back(d);
      }
    }
    if (!held.empty()) to_change.emplace_back(id, std::move(held));
  }
  const std::vector<std::string> live_ids =
      ClusterMembership::Staying(members.live, members.leaving);
  const ClusterMembership::View c = membership_.view();
  for (const auto& [id, removed] : to_change) {
    const std::shared_ptr<const PlacementCache::Holding> before = placements_.Remembered(id);
    auto next = membership_.Record(id, c.placements->AddEpoch(id, removed, live_ids));
    if (!next.ok()) {
      spdlog::warn("event=placement_epoch_failed shuffle={} removed=\"{}\" error=\"{}\"", id,
                   absl::StrJoin(removed, ","), std::string(next.status().message()));
      continue;
    }
    if (!next->has_value()) {  // deleted meanwhile
      placements_.Forget(id);
      continue;
    }
    const ShufflePlacement& p = **next;
    placements_.Remember(id, p, c.node_id);
    if (before == nullptr || p.epoch() > before->placement.epoch()) {
      spdlog::warn(
          "event=placement_epoch tenant={} shuffle={} epoch={} removed=\"{}\" "
          "changed_partitions={}",
          TenantField(id), id, p.epoch(), absl::StrJoin(p.epochs.back().removed, ","),
          p.epochs.back().changed.size());
    }
  }
}

std::vector<ClusterNode::Absent> ClusterNode::AbsentNodes() const {
  std::vector<Absent> out;
  const auto held = placements_.All();
  for (const auto& [node_id, since] : membership_.Absent()) {
    const auto absent = membership_.Since(since);
    // Dead as this server judged it, or as a placement it read says (another server may have
    // seen it go first).
    bool dead = dead_after_.count() > 0 && absent >= dead_after_;
    for (auto it = held.begin(); !dead && it != held.end(); ++it) {
      dead = it->second->placement.Removed(node_id);
    }
    out.push_back(Absent{node_id, absent, dead});
  }
  return out;
}

}  // namespace sluice
