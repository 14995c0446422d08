// ClusterNode's membership half (cluster_node.h): who of the cluster is registered, whether etcd
// answers, the settle time after an outage, and servers gone past --dead_after_s (or being
// decommissioned) taken out of the placements of the shuffles this server knows.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codec/status_macros.h"
#include "rpc/error_reason.h"
#include "server/rules/cluster_node.h"
#include "server/rules/cluster_node_internal.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

using cluster_internal::Clock;
using cluster_internal::IsEtcdDown;
using cluster_internal::Since;

void ClusterNode::Note(const absl::Status& st) {
  if (st.ok()) {
    if (etcd_down_.exchange(false)) {
      spdlog::info("event=etcd_back");
      // Whoever was registered before the outage may have lost its lease with it, and
      // registers again within a third of its lease: until then, or the settle time has passed,
      // creates wait for it.
      // (A second outage within the settle time adds to those waited for: the list read
      // between the two may already have lost some to the first.)
      std::lock_guard<std::mutex> lock(mu_);
      absent_.clear();  // who is gone is measured afresh from a time etcd answers
      if (Since(etcd_back_at_) >= options_.settle) before_outage_.clear();
      for (const NodeEntry& n : members_) before_outage_.insert(n.node_id);
      etcd_back_at_ = Clock::now();
    }
    return;
  }
  if (!IsEtcdDown(st)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!etcd_down_.load()) etcd_down_at_ = Clock::now();
    etcd_error_ = std::string(st.message());
  }
  if (!etcd_down_.exchange(true)) {
    spdlog::warn("event=etcd_down error=\"{}\" note=\"serving the shuffles it has checked\"",
                 std::string(st.message()));
  }
}

absl::Status ClusterNode::EtcdUp() const {
  if (!etcd_down_.load()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  return WithReason(
      absl::UnavailableError(absl::StrCat(
          "etcd has not answered for ", Since(etcd_down_at_).count() / 1000, " s (", etcd_error_,
          "): this needs etcd, and the shuffles already written are still read; retry")),
      ErrorReason::kEtcdUnavailable);
}

void ClusterNode::Seen(const std::vector<NodeEntry>& nodes) {
  std::lock_guard<std::mutex> lock(mu_);
  members_ = nodes;
  members_at_ = Clock::now();
}

absl::Status ClusterNode::Settled(const std::vector<NodeEntry>& live) const {
  std::vector<std::string> missing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!before_outage_.empty() && Since(etcd_back_at_) < options_.settle) {
      for (const std::string& id : before_outage_) {
        const bool there = std::any_of(live.begin(), live.end(),
                                       [&](const NodeEntry& n) { return n.node_id == id; });
        if (!there) missing.push_back(id);
      }
    }
  }
  if (missing.empty() && !live.empty()) return absl::OkStatus();
  // (kSettling: every server reads the same list, so a client does not ask the next one.)
  if (live.empty()) {
    return WithReason(
        absl::UnavailableError(
            "no server is registered in the cluster now (etcd may have just expired every lease "
            "after a stall; the servers register again within a third of their lease): retry"),
        ErrorReason::kSettling);
  }
  return WithReason(
      absl::UnavailableError(absl::StrCat(
          "server", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
          missing.size() > 1 ? " were" : " was",
          " registered before etcd's outage and not yet again (etcd expires every lease after "
          "a stall; a server registers again within a third of its lease): a shuffle is not "
          "placed on fewer servers than the cluster had; retry")),
      ErrorReason::kSettling);
}

void ClusterNode::WatchMembers() {
  const View c = view();
  if (c.nodes == nullptr) return;
  absl::StatusOr<std::vector<NodeEntry>> nodes = c.nodes->Nodes(options_.quick_read);
  Note(nodes.status());
  if (!nodes.ok()) return;
  Seen(*nodes);
  // (A server that lost its own registration may be the one cut off: it judges no other.)
  if (!c.nodes->registered()) return;
  std::vector<std::string> leaving;
  if (auto l = c.placements->Decommissioning(); l.ok()) {
    leaving = *std::move(l);
    if (std::find(leaving.begin(), leaving.end(), c.node_id) != leaving.end()) {
      decommissioning_.store(true);  // (asked before a restart: it stays asked)
    }
    std::lock_guard<std::mutex> lock(mu_);
    leaving_ = leaving;
  }
  TrackAbsent(*nodes);
  RemoveDead(*nodes, leaving);
}

absl::Status ClusterNode::StartDecommission() {
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(EtcdUp());
  absl::Status st = c.placements->SetDecommissioning(c.node_id);
  Note(st);
  SLUICE_RETURN_IF_ERROR(st);
  if (!decommissioning_.exchange(true)) {
    spdlog::warn("event=decommission_started node={}", c.node_id);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(leaving_.begin(), leaving_.end(), c.node_id) == leaving_.end()) {
    leaving_.push_back(c.node_id);
  }
  return absl::OkStatus();
}

void ClusterNode::TrackAbsent(const std::vector<NodeEntry>& live) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, Clock::time_point> absent;
  for (const auto& [id, kept] : kept_) {
    for (const std::string& node_id : kept->placement.nodes) {
      if (absent.count(node_id) != 0) continue;
      const bool there = std::any_of(live.begin(), live.end(),
                                     [&](const NodeEntry& n) { return n.node_id == node_id; });
      if (there) continue;
      auto before = absent_.find(node_id);
      absent.emplace(node_id, before == absent_.end() ? now : before->second);
    }
  }
  absent_ = std::move(absent);
}

void ClusterNode::RemoveDead(const std::vector<NodeEntry>& live,
                             const std::vector<std::string>& leaving) {
  // Dead past --dead_after_s, or being decommissioned (alive: its data is a repair's source).
  std::vector<std::string> dead = leaving;
  std::vector<std::pair<std::string, std::vector<std::string>>> to_change;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [node_id, since] : absent_) {
      if (options_.dead_after.count() > 0 && Since(since) >= options_.dead_after) {
        dead.push_back(node_id);
      }
    }
    if (dead.empty()) return;
    for (const auto& [id, kept] : kept_) {
      std::vector<std::string> held;
      for (const std::string& d : dead) {
        if (std::find(kept->holders.begin(), kept->holders.end(), d) != kept->holders.end()) {
          held.push_back(d);
        }
      }
      if (!held.empty()) to_change.emplace_back(id, std::move(held));
    }
  }
  std::vector<std::string> live_ids;
  for (const NodeEntry& n : live) {
    if (std::find(leaving.begin(), leaving.end(), n.node_id) == leaving.end()) {
      live_ids.push_back(n.node_id);
    }
  }
  const View c = view();
  for (const auto& [id, removed] : to_change) {
    const std::shared_ptr<const Kept> before = Remembered(id);
    auto next = Record(id, c.placements->AddEpoch(id, removed, live_ids));
    if (!next.ok()) {
      spdlog::warn("event=placement_epoch_failed shuffle={} removed=\"{}\" error=\"{}\"", id,
                   absl::StrJoin(removed, ","), std::string(next.status().message()));
      continue;
    }
    if (!next->has_value()) {  // deleted meanwhile
      std::lock_guard<std::mutex> lock(mu_);
      kept_.erase(id);
      meters_.erase(id);
      revoked_applied_.erase(id);
      continue;
    }
    const ShufflePlacement& p = **next;
    Remember(id, p, c.node_id);
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
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [node_id, since] : absent_) {
    const auto absent = Since(since);
    // Dead as this server judged it, or as a placement it read says (another server may have
    // seen it go first).
    bool dead = options_.dead_after.count() > 0 && absent >= options_.dead_after;
    for (auto it = kept_.begin(); !dead && it != kept_.end(); ++it) {
      dead = it->second->placement.Removed(node_id);
    }
    out.push_back(Absent{node_id, absent, dead});
  }
  return out;
}

bool ClusterNode::registered() const {
  const View c = view();
  return c.nodes != nullptr && c.nodes->registered();
}

absl::StatusOr<std::vector<NodeEntry>> ClusterNode::Nodes() {
  if (!clustered_) {
    const Self s = self();
    return std::vector<NodeEntry>{NodeEntry{s.node_id, s.address, s.started_unix_ms}};
  }
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (etcd_down_.load() && !members_.empty()) return members_;  // the last list read
  }
  bool have_list;
  {
    std::lock_guard<std::mutex> lock(mu_);
    have_list = !members_.empty();
  }
  // Briefly when the last list can answer instead (a stall not yet found by WatchMembers).
  absl::StatusOr<std::vector<NodeEntry>> nodes =
      c.nodes->Nodes(have_list ? options_.quick_read : std::chrono::milliseconds(0));
  Note(nodes.status());
  if (nodes.ok()) {
    Seen(*nodes);
    return nodes;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (IsEtcdDown(nodes.status()) && !members_.empty()) return members_;
  return nodes.status();
}

}  // namespace sluice
