#include "server/rules/cluster_membership.h"

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

using cluster_internal::IsEtcdDown;

absl::Status AboutShuffle(const std::string& id, const absl::Status& st) {
  if (st.ok() || absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) return st;
  return absl::Status(st.code(), absl::StrCat("shuffle '", ShuffleName(id), "': ", st.message()));
}

std::chrono::milliseconds ClusterMembership::Since(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock().Now() - t);
}

void ClusterMembership::SetSelf(Self self) {
  std::lock_guard<std::mutex> lock(mu_);
  self_ = std::move(self);
}

ClusterMembership::Self ClusterMembership::self() const {
  std::lock_guard<std::mutex> lock(mu_);
  return self_;
}

void ClusterMembership::Joined(const NodeDirectory* nodes, PlacementStore* placements) {
  std::lock_guard<std::mutex> lock(mu_);
  nodes_ = nodes;
  placements_ = placements;
}

absl::Status ClusterMembership::View::Joined() const {
  if (placements != nullptr) return absl::OkStatus();
  return WithReason(absl::UnavailableError("the server is still joining its cluster; retry"),
                    ErrorReason::kJoining);
}

ClusterMembership::View ClusterMembership::view() const {
  std::lock_guard<std::mutex> lock(mu_);
  return View{nodes_, placements_, self_.node_id};
}

bool ClusterMembership::joined() const { return view().placements != nullptr; }

bool ClusterMembership::registered() const {
  const View c = view();
  return c.nodes != nullptr && c.nodes->registered();
}

void ClusterMembership::Note(const absl::Status& st) {
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
      etcd_back_at_ = clock().Now();
    }
    return;
  }
  if (!IsEtcdDown(st)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!etcd_down_.load()) etcd_down_at_ = clock().Now();
    etcd_error_ = std::string(st.message());
  }
  if (!etcd_down_.exchange(true)) {
    spdlog::warn("event=etcd_down error=\"{}\" note=\"serving the shuffles it has checked\"",
                 std::string(st.message()));
  }
}

absl::Status ClusterMembership::EtcdUp() const {
  if (!etcd_down_.load()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  return WithReason(
      absl::UnavailableError(absl::StrCat(
          "etcd has not answered for ", Since(etcd_down_at_).count() / 1000, " s (", etcd_error_,
          "): this needs etcd, and the shuffles already written are still read; retry")),
      ErrorReason::kEtcdUnavailable);
}

void ClusterMembership::Seen(const std::vector<NodeEntry>& nodes) {
  std::lock_guard<std::mutex> lock(mu_);
  members_ = nodes;
  members_at_ = clock().Now();
}

std::vector<NodeEntry> ClusterMembership::LastMembers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return members_;
}

absl::Status ClusterMembership::Settled(const std::vector<NodeEntry>& live) const {
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

bool ClusterMembership::ReadMembers(Members* out) {
  const View c = view();
  if (c.nodes == nullptr) return false;
  absl::StatusOr<std::vector<NodeEntry>> nodes = c.nodes->Nodes(options_.quick_read);
  Note(nodes.status());
  if (!nodes.ok()) return false;
  Seen(*nodes);
  out->live = *std::move(nodes);
  // (A server that lost its own registration may be the one cut off: it judges no other.)
  out->judge = c.nodes->registered();
  if (!out->judge) return true;
  if (auto l = c.placements->Decommissioning(); l.ok()) {
    out->leaving = *std::move(l);
    if (std::find(out->leaving.begin(), out->leaving.end(), c.node_id) != out->leaving.end()) {
      decommissioning_.store(true);  // (asked before a restart: it stays asked)
    }
    std::lock_guard<std::mutex> lock(mu_);
    leaving_ = out->leaving;
  }
  return true;
}

std::vector<std::string> ClusterMembership::Leaving(bool read_now) {
  if (read_now) {
    const View c = view();
    if (c.placements != nullptr) {
      if (auto l = c.placements->Decommissioning(); l.ok()) return *std::move(l);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  return leaving_;
}

std::vector<std::string> ClusterMembership::Staying(const std::vector<NodeEntry>& nodes,
                                                    const std::vector<std::string>& leaving) {
  std::vector<std::string> ids;
  for (const NodeEntry& n : nodes) {
    if (std::find(leaving.begin(), leaving.end(), n.node_id) == leaving.end()) {
      ids.push_back(n.node_id);
    }
  }
  return ids;
}

absl::Status ClusterMembership::StartDecommission() {
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

void ClusterMembership::TrackAbsent(const std::vector<NodeEntry>& live,
                                    const std::set<std::string>& placed) {
  const Clock::time_point now = clock().Now();
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, Clock::time_point> absent;
  for (const std::string& node_id : placed) {
    const bool there = std::any_of(live.begin(), live.end(),
                                   [&](const NodeEntry& n) { return n.node_id == node_id; });
    if (there) continue;
    auto before = absent_.find(node_id);
    absent.emplace(node_id, before == absent_.end() ? now : before->second);
  }
  absent_ = std::move(absent);
}

std::map<std::string, Clock::time_point> ClusterMembership::Absent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return absent_;
}

absl::StatusOr<std::vector<NodeEntry>> ClusterMembership::Nodes() {
  if (!options_.clustered) {
    const Self s = self();
    return std::vector<NodeEntry>{NodeEntry{s.node_id, s.address, s.started_unix_ms}};
  }
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  bool have_list;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (etcd_down_.load() && !members_.empty()) return members_;  // the last list read
    have_list = !members_.empty();
  }
  // Briefly when the last list can answer instead (a stall not yet found by ReadMembers).
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
