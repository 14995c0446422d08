#include "server/rules/cluster_node.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codec/status_macros.h"
#include "rpc/error_reason.h"
#include "server/rules/cluster_node_internal.h"
#include "server/rules/replica_check.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

using cluster_internal::AboutShuffle;
using cluster_internal::Clock;
using cluster_internal::IsEtcdDown;
using cluster_internal::kSegmentReread;
using cluster_internal::Since;
using cluster_internal::UnknownSegment;

void ClusterNode::SetSelf(Self self) {
  std::lock_guard<std::mutex> lock(mu_);
  self_ = std::move(self);
}

ClusterNode::Self ClusterNode::self() const {
  std::lock_guard<std::mutex> lock(mu_);
  return self_;
}

void ClusterNode::Joined(const NodeDirectory* nodes, PlacementStore* placements) {
  std::lock_guard<std::mutex> lock(mu_);
  nodes_ = nodes;
  placements_ = placements;
}

absl::Status ClusterNode::View::Joined() const {
  if (placements != nullptr) return absl::OkStatus();
  return WithReason(absl::UnavailableError("the server is still joining its cluster; retry"),
                    ErrorReason::kJoining);
}

ClusterNode::View ClusterNode::view() const {
  std::lock_guard<std::mutex> lock(mu_);
  return View{nodes_, placements_, self_.node_id};
}

bool ClusterNode::joined() const { return view().placements != nullptr; }

std::shared_ptr<const ClusterNode::Kept> ClusterNode::Remember(const std::string& id,
                                                               const ShufflePlacement& p,
                                                               const std::string& node_id) {
  auto k = std::make_shared<Kept>();
  k->placement = p;
  k->read_at = Clock::now();
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
  auto& slot = kept_[id];
  // (Epochs and segments only go forward: a read racing a newer one does not take it back.)
  if (slot != nullptr &&
      (slot->placement.epoch() > p.epoch() ||
       (slot->placement.epoch() == p.epoch() && slot->placement.total() > p.total()))) {
    return slot;
  }
  slot = k;
  return k;
}

absl::StatusOr<std::shared_ptr<const ClusterNode::Kept>> ClusterNode::Reread(
    const std::string& id) {
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(EtcdUp());
  SLUICE_ASSIGN_OR_RETURN(auto placed, Record(id, c.placements->Get(id)));
  if (!placed.has_value()) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_.erase(id);
    meters_.erase(id);
    revoked_applied_.erase(id);
    return std::shared_ptr<const Kept>();
  }
  return Remember(id, *placed, c.node_id);
}

std::shared_ptr<const ClusterNode::Kept> ClusterNode::Remembered(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kept_.find(id);
  return it == kept_.end() ? nullptr : it->second;
}

absl::StatusOr<std::shared_ptr<const ClusterNode::Kept>> ClusterNode::KeptPartitions(
    const std::string& id) {
  if (!clustered_) return std::shared_ptr<const Kept>();
  if (auto kept = Remembered(id)) return kept;
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(EtcdUp());
  SLUICE_ASSIGN_OR_RETURN(auto placed, Record(id, c.placements->Get(id)));
  // Not remembered when unrecorded: it may be created later.
  if (!placed.has_value()) return std::shared_ptr<const Kept>();
  return Remember(id, *placed, c.node_id);
}

absl::Status ClusterNode::EnsureLocal(const std::string& id) {
  if (!clustered_ || registry_->Get(id).ok() || registry_->FindDamaged(id)) {
    return absl::OkStatus();
  }
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Kept> kept, KeptPartitions(id));
  if (kept == nullptr) return absl::OkStatus();  // the store's own NOT_FOUND says it
  if (!kept->any) {
    return WithReason(absl::FailedPreconditionError(
                          absl::StrCat("server ", c.node_id, " holds no partition of shuffle '",
                                       ShuffleName(id), "' (GetPlacement says which do)")),
                      ErrorReason::kNotKept);
  }
  auto created = registry_->Create(ShuffleParams{id, kept->partitions, kept->mappers});
  if (created.ok() && *created) {
    spdlog::info("event=create tenant={} shuffle={} partitions={} mappers={} from=etcd",
                 TenantField(id), id, kept->partitions, kept->mappers);
  }
  return created.status();
}

absl::Status ClusterNode::CheckKept(const Kept* kept, const std::string& id,
                                    uint32_t partition) const {
  // (A partition kept here in an earlier epoch only is still served, while whole: a repair
  // copies from it. Readers follow the newest epoch.)
  if (kept == nullptr || partition >= kept->partition.size() || kept->ever[partition]) {
    return absl::OkStatus();
  }
  return WithReason(
      absl::FailedPreconditionError(
          absl::StrCat("server ", self().node_id, " keeps no replica of partition ", partition,
                       " of shuffle '", ShuffleName(id), "' (GetPlacement says which servers do)")),
      ErrorReason::kNotKept);
}

absl::Status ClusterNode::ReadUpTo(const std::string& id, uint32_t epoch) {
  if (!clustered_ || epoch == 0) return absl::OkStatus();
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Kept> kept, KeptPartitions(id));
  if (kept == nullptr || kept->placement.epoch() >= epoch) return absl::OkStatus();
  return Reread(id).status();
}

absl::StatusOr<std::shared_ptr<const std::vector<bool>>> ClusterNode::PrepareToPush(
    const std::string& id, uint32_t epoch) {
  SLUICE_RETURN_IF_ERROR(ReadUpTo(id, epoch));
  SLUICE_RETURN_IF_ERROR(EnsureLocal(id));
  SLUICE_RETURN_IF_ERROR(ApplyRevoked(id));  // (a revoked mapper may commit again)
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Kept> kept, KeptPartitions(id));
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
  SLUICE_RETURN_IF_ERROR(ReadUpTo(id, epoch));
  SLUICE_RETURN_IF_ERROR(EnsureLocal(id));
  if (partition.has_value()) {
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Kept> kept, KeptPartitions(id));
    absl::Status st = CheckKept(kept.get(), id, *partition);
    // A newer epoch may have given it this partition: read again (at most once a second; a
    // segment made since the last read, at once unless read a few milliseconds ago).
    const bool segment = kept != nullptr && UnknownSegment(kept->placement, *partition);
    const auto wait = segment ? kSegmentReread : std::chrono::milliseconds(1000);
    if (!st.ok() && Since(kept->read_at) >= wait && !etcd_down_.load()) {
      SLUICE_ASSIGN_OR_RETURN(kept, Reread(id));
      st = CheckKept(kept.get(), id, *partition);
    } else if (!st.ok() && segment && !etcd_down_.load()) {
      return SegmentNotReadYet(id, *partition);
    }
    SLUICE_RETURN_IF_ERROR(st);
  }
  SLUICE_RETURN_IF_ERROR(ResolvePending(id));
  if (!partition.has_value()) return absl::OkStatus();
  const uint32_t missing = MissingMappers(id, *partition);
  if (missing == 0) return absl::OkStatus();
  return WithReason(
      absl::UnavailableError(absl::StrCat(
          "server ", self().node_id, " lacks ", missing, " committed mapper",
          missing == 1 ? "" : "s", " of partition ", *partition, " of shuffle '", ShuffleName(id),
          "' (it took the partition over in a later placement epoch and is not repaired yet): "
          "read another replica")),
      ErrorReason::kIncomplete);
}

std::vector<uint32_t> ClusterNode::LackingMappers(const std::string& id, uint32_t partition) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint32_t> out;
  auto it = checked_.find(id);
  if (it == checked_.end()) return out;
  auto m = it->second.missing.find(partition);
  if (m == it->second.missing.end()) return out;
  for (const auto& [mapper, attempt] : m->second) out.push_back(mapper);  // (in mapper order)
  return out;
}

std::vector<uint32_t> ClusterNode::LostMappers(const std::string& id, uint32_t partition) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = checked_.find(id);
  if (it == checked_.end()) return {};
  auto m = it->second.lost.find(partition);
  if (m == it->second.lost.end()) return {};
  return std::vector<uint32_t>(m->second.begin(), m->second.end());
}

bool ClusterNode::MarkLost(const std::string& id, uint32_t partition, uint32_t mapper) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = checked_.find(id);
  if (it == checked_.end()) return false;
  // Only while it is still missing as last checked (a repairer's round may end after a newer
  // check: the mapper copied, or its decision revoked).
  auto missing = it->second.missing.find(partition);
  if (missing == it->second.missing.end() ||
      std::none_of(missing->second.begin(), missing->second.end(),
                   [mapper](const auto& m) { return m.first == mapper; })) {
    return false;
  }
  return it->second.lost[partition].insert(mapper).second;
}

uint64_t ClusterNode::LostTotal() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [id, checked] : checked_) {
    for (const auto& [partition, mappers] : checked.lost) n += mappers.size();
  }
  return n;
}

uint32_t ClusterNode::KnownEpoch(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kept_.find(id);
  return it == kept_.end() ? 0 : it->second->placement.epoch();
}

bool ClusterNode::KeepsEver(const std::string& id, uint32_t partition) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kept_.find(id);
  if (it == kept_.end() || partition >= it->second->ever.size()) return true;
  return it->second->ever[partition];
}

uint64_t ClusterNode::MissingTotal() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [id, checked] : checked_) {
    auto kept = kept_.find(id);
    for (const auto& [partition, mappers] : checked.missing) {
      // (Only what this server keeps now is repaired here.)
      if (kept == kept_.end() || partition >= kept->second->partition.size() ||
          kept->second->partition[partition]) {
        n += mappers.size();
      }
    }
  }
  return n;
}

void ClusterNode::Recheck(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = checked_.find(id); it != checked_.end()) it->second.stale = true;
}

std::vector<ClusterNode::RepairItem> ClusterNode::RepairBacklog() {
  if (!clustered_) return {};
  // Shuffles whose placement moved (only a later epoch gives a server partitions it lacks
  // mappers of), checked at their newest epoch.
  std::vector<std::string> to_check;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, kept] : kept_) {
      if (!kept->any || kept->placement.epoch() == 0) continue;
      auto checked = checked_.find(id);
      if (checked == checked_.end() || checked->second.stale ||
          checked->second.epoch != kept->placement.epoch()) {
        to_check.push_back(id);
      }
    }
  }
  for (const std::string& id : to_check) {
    if (etcd_down_.load()) break;
    if (absl::Status st = PrepareToServe(id, std::nullopt); !st.ok()) {
      spdlog::debug("event=repair_check_failed shuffle={} error=\"{}\"", id,
                    std::string(st.message()));
    }
  }
  std::vector<RepairItem> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, checked] : checked_) {
    if (checked.missing.empty()) continue;
    auto kept = kept_.find(id);
    if (kept == kept_.end()) continue;
    const ShufflePlacement& p = kept->second->placement;
    for (const auto& [partition, mappers] : checked.missing) {
      if (partition >= p.replicas.size() || !kept->second->partition[partition]) continue;
      RepairItem item{id, partition, mappers, {}};
      // The newest epoch's other replicas first, then those of earlier epochs still registered
      // (a server being decommissioned holds what it held).
      std::vector<uint32_t> from;
      for (uint32_t e = p.epoch() + 1; e-- > 0;) {
        for (uint32_t i : p.ReplicasAt(partition, e)) {
          if (std::find(from.begin(), from.end(), i) == from.end()) from.push_back(i);
        }
      }
      for (uint32_t i : from) {
        if (p.nodes[i] == self_.node_id) continue;
        const size_t before = item.sources.size();
        for (const NodeEntry& n : members_) {  // registered now
          if (n.node_id == p.nodes[i] && !n.address.empty()) item.sources.push_back(n.address);
        }
        if (item.sources.size() == before && !p.Removed(p.nodes[i])) ++item.unknown_holders;
      }
      out.push_back(std::move(item));
    }
  }
  return out;
}

absl::Status ClusterNode::ApplyRevoked(const std::string& id) {
  if (!clustered_) return absl::OkStatus();
  auto store = registry_->Get(id);
  if (!store.ok()) return absl::OkStatus();  // nothing here to hide (the caller's lookup says why)
  // (Read from the record when not remembered: a restarted server must not serve an attempt
  // revoked while it was down.)
  SLUICE_ASSIGN_OR_RETURN(const std::shared_ptr<const Kept> kept, KeptPartitions(id));
  if (kept == nullptr || kept->placement.epochs.empty()) return absl::OkStatus();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto done = revoked_applied_.find(id);
    if (done != revoked_applied_.end() && done->second >= kept->placement.epoch()) {
      return absl::OkStatus();
    }
  }
  std::vector<std::pair<uint32_t, uint64_t>> fresh;  // not applied here yet
  for (const auto& [mapper, attempt] : kept->placement.RevokedAfter(0)) {
    if (!(*store)->IsRevoked(mapper, attempt)) fresh.emplace_back(mapper, attempt);
  }
  if (!fresh.empty()) {
    size_t held = 0;
    for (const auto& [mapper, attempt] : fresh) {
      held += (*store)->CommittedAttempt(mapper) == std::optional<uint64_t>(attempt) ? 1 : 0;
    }
    if (absl::Status st = (*store)->RevokeAll(fresh); !st.ok()) {
      // This replica cannot hide the attempts (a log that predates revocations, a failed
      // write): it must not serve the shuffle as if it had; readers use another replica.
      spdlog::error("event=revoke_failed tenant={} shuffle={} decisions={} error=\"{}\"",
                    TenantField(id), id, fresh.size(), std::string(st.message()));
      if (absl::IsUnavailable(st)) return st;  // (a broken log: it reopens and retries)
      return absl::DataLossError(absl::StrCat("server ", self().node_id,
                                              " cannot apply the revocation of ", fresh.size(),
                                              " decisions of shuffle '", ShuffleName(id),
                                              "': ", st.message(), "; read another replica"));
    }
    spdlog::warn(
        "event=decisions_revoked tenant={} shuffle={} decisions={} held={} first_mapper={} "
        "first_attempt={}",
        TenantField(id), id, fresh.size(), held, fresh.front().first, fresh.front().second);
  }
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t& done = revoked_applied_[id];
  done = std::max(done, kept->placement.epoch());
  return absl::OkStatus();
}

absl::StatusOr<ClusterNode::Revoked> ClusterNode::RevokeMappers(
    const std::string& id, const std::vector<uint32_t>& mappers, uint32_t seen) {
  if (!clustered_) {
    return absl::FailedPreconditionError(
        "this server runs on its own (no --etcd): its decisions are its commits, and a partition "
        "is lost only with the server; revoking decisions is for clustered shuffles");
  }
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(EtcdUp());
  SLUICE_ASSIGN_OR_RETURN(auto revoked, Record(id, c.placements->Revoke(id, mappers, seen)));
  Revoked out;
  out.attempts = std::move(revoked.first);
  out.epoch = revoked.second.epoch();
  Remember(id, revoked.second, c.node_id);
  SLUICE_RETURN_IF_ERROR(ApplyRevoked(id));
  spdlog::warn("event=revoke tenant={} shuffle={} mappers=\"{}\" epoch={}", TenantField(id), id,
               absl::StrJoin(mappers, ","), out.epoch);
  return out;
}

absl::Status ClusterNode::ResolvePending(const std::string& id) {
  if (!clustered_) return absl::OkStatus();
  SLUICE_RETURN_IF_ERROR(ApplyRevoked(id));
  auto store = registry_->Get(id);
  if (!store.ok()) return absl::OkStatus();  // the caller's own lookup says why
  const std::vector<uint32_t> pending = (*store)->PendingMappers();
  std::optional<std::map<uint32_t, MapperDecision>> known;  // the decisions last read
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto checked = checked_.find(id);
    auto kept = kept_.find(id);
    if (pending.empty() && checked != checked_.end() &&
        (kept == kept_.end() || kept->second->placement.epoch() == checked->second.epoch)) {
      if (!checked->second.stale) return absl::OkStatus();
      // Only a repair changed it since: on a server of the newest epoch nothing waits for a
      // decision (every attempt of the epoch prepares here), so the decisions read then still
      // say all; checked again without etcd (a repair during an etcd outage leaves the shuffle
      // readable).
      if (kept != kept_.end() && kept->second->any) known = checked->second.decided;
    }
  }
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  std::map<uint32_t, MapperDecision> decided;
  if (known.has_value()) {
    decided = std::move(*known);
  } else {
    // (Attempts prepared here and not known decided: serving without the decisions could
    // leave out a mapper another server has committed.)
    SLUICE_RETURN_IF_ERROR(EtcdUp());
    SLUICE_ASSIGN_OR_RETURN(decided, Record(id, c.placements->Decisions(id)));
  }
  // A decision read just before a revocation this server has applied since is no decision.
  for (auto d = decided.begin(); d != decided.end();) {
    d = (*store)->IsRevoked(d->first, d->second.attempt) ? decided.erase(d) : std::next(d);
  }
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const Kept> kept, KeptPartitions(id));
  uint32_t newest = 0;
  for (const auto& [m, d] : decided) newest = std::max(newest, d.epoch);
  if (kept != nullptr && kept->placement.epoch() < newest) {
    SLUICE_ASSIGN_OR_RETURN(kept, Reread(id));
  }
  std::vector<std::pair<uint32_t, uint64_t>> winners;
  for (uint32_t m : pending) {
    auto d = decided.find(m);
    if (d == decided.end()) continue;  // not decided yet: stays invisible
    winners.emplace_back(m, d->second.attempt);
  }
  SLUICE_RETURN_IF_ERROR((*store)->ResolveAll(winners));
  // Every decided mapper is here now for what this server held when it was pushed, unless this
  // server lost what it had prepared: then it must not serve the shuffle as if it were whole.
  std::vector<uint32_t> born;  // (each stored partition's epoch: a segment's is its own)
  for (uint32_t q = 0; kept != nullptr && q < kept->placement.total(); ++q) {
    born.push_back(kept->placement.BornAt(q));
  }
  ReplicaCheck check = CheckReplicas(
      kept != nullptr ? kept->held : std::vector<std::vector<bool>>{}, decided, **store, born);
  const std::vector<uint32_t>& missing = check.lost;
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) {
      absl::StrAppend(&list, i == 0 ? "" : ", ", missing[i]);
    }
    if (missing.size() > 8) absl::StrAppend(&list, ", ...");
    spdlog::error("event=shuffle_incomplete tenant={} shuffle={} missing_mappers={} first=\"{}\"",
                  TenantField(id), id, missing.size(), list);
    return absl::DataLossError(absl::StrCat(
        "server ", c.node_id, " lacks ", missing.size(), " mappers of shuffle '", ShuffleName(id),
        "' that the cluster committed (", list,
        "): what it had prepared is gone (its data directory lost or replaced?); read another "
        "replica"));
  }
  Checked checked;
  checked.epoch = kept != nullptr ? kept->placement.epoch() : 0;
  checked.missing = std::move(check.missing);
  checked.decided = std::move(decided);
  std::lock_guard<std::mutex> lock(mu_);
  // (Found lost at this epoch and missing still: lost still, until the repairer looks again.)
  if (auto before = checked_.find(id);
      before != checked_.end() && before->second.epoch == checked.epoch) {
    checked.lost = StillLost(before->second.lost, checked.missing);
  }
  checked_[id] = std::move(checked);
  return absl::OkStatus();
}

absl::StatusOr<bool> ClusterNode::Create(const ShuffleParams& params, uint32_t replication) {
  if (!clustered_) {
    auto created = registry_->Create(params);
    if (created.ok() && *created) {
      spdlog::info("event=create tenant={} shuffle={} partitions={} mappers={}",
                   TenantField(params.shuffle_id), params.shuffle_id, params.num_partitions,
                   params.num_mappers);
    }
    return created;
  }
  SLUICE_RETURN_IF_ERROR(ShuffleRegistry::ValidateParams(params));
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(EtcdUp());
  absl::StatusOr<std::vector<NodeEntry>> nodes = c.nodes->Nodes();
  Note(nodes.status());
  if (!nodes.ok()) return nodes.status();
  // Never on fewer servers than were registered a moment ago (an etcd stall's expired leases).
  const absl::Status settled = Settled(*nodes);
  Seen(*nodes);
  SLUICE_RETURN_IF_ERROR(settled);
  // (A server being decommissioned takes nothing new: read now, not as last watched.)
  std::vector<std::string> leaving;
  if (auto l = c.placements->Decommissioning(); l.ok()) {
    leaving = *std::move(l);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    leaving = leaving_;
  }
  std::vector<std::string> ids;
  for (const NodeEntry& n : *nodes) {
    if (std::find(leaving.begin(), leaving.end(), n.node_id) == leaving.end()) {
      ids.push_back(n.node_id);
    }
  }
  // More replicas than servers registered now is the cluster's state, not the caller's mistake:
  // servers down or restarting come back (a replication over 3 is refused by the record).
  if (replication > ids.size() && replication <= 3) {
    return WithReason(
        absl::UnavailableError(absl::StrCat(
            "replication ", replication, " needs ", replication, " servers and ", ids.size(),
            ids.size() == 1 ? " is" : " are",
            " registered now (the others down or restarting?): retry once they are back, or "
            "ask for less")),
        ErrorReason::kSettling);
  }
  SLUICE_ASSIGN_OR_RETURN(
      PlacementStore::Created placed,
      Record(params.shuffle_id,
             c.placements->Create(params.shuffle_id, params.num_partitions, params.num_mappers,
                                  replication, ids, options_.split_bytes)));
  const ShufflePlacement& p = placed.placement;
  if (!placed.created &&
      (p.num_partitions != params.num_partitions || p.num_mappers != params.num_mappers ||
       (replication != 0 && replication != p.replication))) {
    return absl::AlreadyExistsError(absl::StrCat(
        "shuffle '", ShuffleName(params.shuffle_id), "' already exists with ", p.num_partitions,
        " partitions, ", p.num_mappers, " mappers and replication ", p.replication));
  }
  if (placed.created) {
    spdlog::info(
        "event=create tenant={} shuffle={} partitions={} mappers={} replication={} servers={}",
        TenantField(params.shuffle_id), params.shuffle_id, params.num_partitions,
        params.num_mappers, p.replication, ids.size());
  }
  if (Remember(params.shuffle_id, p, c.node_id)->any) {
    // (Its store takes the segment slots too: stored partition ids past the partitions.)
    SLUICE_RETURN_IF_ERROR(
        registry_->Create(ShuffleParams{params.shuffle_id, p.slots(), params.num_mappers})
            .status());
  }
  return placed.created;
}

absl::Status ClusterNode::Delete(const std::string& id) {
  bool recorded = false;
  if (clustered_) {  // its record first: no server makes its store again from it
    const View c = view();
    SLUICE_RETURN_IF_ERROR(c.Joined());
    SLUICE_RETURN_IF_ERROR(EtcdUp());
    SLUICE_ASSIGN_OR_RETURN(recorded, Record(id, c.placements->Delete(id)));
    std::lock_guard<std::mutex> lock(mu_);
    kept_.erase(id);
    meters_.erase(id);
    revoked_applied_.erase(id);
    checked_.erase(id);
  }
  absl::Status st = registry_->Delete(id);
  if (recorded && absl::IsNotFound(st)) st = absl::OkStatus();  // held elsewhere only
  if (st.ok()) spdlog::info("event=delete tenant={} shuffle={}", TenantField(id), id);
  return st;
}

absl::StatusOr<size_t> ClusterNode::CountForCreate(const std::string& prefix,
                                                   const std::string& id) {
  if (!clustered_) {
    if (registry_->Get(id).ok() || registry_->FindDamaged(id)) return 0;  // has it
    return registry_->CountWithPrefix(prefix);
  }
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(EtcdUp());
  SLUICE_ASSIGN_OR_RETURN(auto placed, Record(id, c.placements->Get(id)));
  if (placed.has_value()) return 0;
  return Record(id, c.placements->CountWithPrefix(prefix));
}

absl::StatusOr<uint64_t> ClusterNode::DecideMapper(const std::string& id, uint32_t mapper,
                                                   uint64_t attempt, uint32_t epoch) {
  SLUICE_RETURN_IF_ERROR(ReadUpTo(id, epoch));
  SLUICE_RETURN_IF_ERROR(EnsureLocal(id));
  SLUICE_RETURN_IF_ERROR(ApplyRevoked(id));
  SLUICE_ASSIGN_OR_RETURN(auto store, registry_->Get(id));
  if (auto committed = store->CommittedAttempt(mapper)) return *committed;  // decided before
  if (!store->IsPrepared(mapper, attempt)) {
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", attempt, " of mapper ", mapper, " of shuffle '", ShuffleName(id),
                     "' is not prepared on server ", self().node_id,
                     ": prepare it on every server of the shuffle first"));
  }
  uint64_t winner = attempt;  // on its own, the first attempt resolved here wins
  if (clustered_) {
    const View c = view();
    SLUICE_RETURN_IF_ERROR(c.Joined());
    SLUICE_RETURN_IF_ERROR(EtcdUp());
    SLUICE_ASSIGN_OR_RETURN(const MapperDecision decided,
                            Record(id, c.placements->DecideMapper(id, mapper, attempt, epoch)));
    winner = decided.attempt;
  }
  auto outcome = store->Resolve(mapper, winner);
  if (!outcome.ok()) {
    if (clustered_) {
      // Decided all the same: the other servers apply it; this one reports what it could not.
      spdlog::error("event=resolve_failed tenant={} shuffle={} mapper={} winner={} error=\"{}\"",
                    TenantField(id), id, mapper, winner, std::string(outcome.status().message()));
      return winner;
    }
    return outcome.status();
  }
  if (!clustered_ && *outcome == CommitOutcome::kDuplicate) {
    return store->CommittedAttempt(mapper).value_or(winner);
  }
  spdlog::info("event=decide tenant={} shuffle={} mapper={} attempt={} winner={}", TenantField(id),
               id, mapper, attempt, winner);
  return winner;
}

absl::StatusOr<ClusterNode::Placement> ClusterNode::GetPlacement(const std::string& id,
                                                                 uint64_t known_revision) {
  Placement out;
  if (!clustered_) {  // on its own: every partition here
    SLUICE_ASSIGN_OR_RETURN(auto store, registry_->Get(id));
    out.partitions = store->params().num_partitions;
    out.mappers = store->params().num_mappers;
    const Self s = self();
    out.nodes.push_back(NodeEntry{s.node_id, s.address, s.started_unix_ms});
    out.replicas.assign(out.partitions, std::vector<uint32_t>{0});
    return out;
  }
  const View c = view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  // A placement changes only through etcd: one read before is the answer when etcd cannot give it
  // now (and etcd is then asked only briefly, or not at all while it is known to be down).
  std::shared_ptr<const Kept> kept = Remembered(id);
  if (known_revision != 0 && !etcd_down_.load()) {
    // The caller holds a placement: its revision, not the record, tells whether it is current.
    auto now = c.placements->Revision(
        id, kept != nullptr ? options_.quick_read : std::chrono::milliseconds(0));
    Note(now.status());
    if (now.ok() && *now == static_cast<int64_t>(known_revision)) {
      Placement same;
      same.clustered = true;
      same.revision = known_revision;
      same.unchanged = true;
      return same;
    }
  }
  ShufflePlacement placed;
  if (kept != nullptr && etcd_down_.load()) {
    placed = kept->placement;
    out.age = std::max(Since(kept->read_at), std::chrono::milliseconds(1));
  } else {
    if (kept == nullptr) SLUICE_RETURN_IF_ERROR(EtcdUp());
    auto got =
        c.placements->Get(id, kept != nullptr ? options_.quick_read : std::chrono::milliseconds(0));
    Note(got.status());
    if (got.ok() && !got->has_value()) {
      std::lock_guard<std::mutex> lock(mu_);
      kept_.erase(id);
      meters_.erase(id);
      revoked_applied_.erase(id);
      return absl::NotFoundError(
          absl::StrCat("shuffle '", ShuffleName(id), "' not found in the cluster"));
    }
    if (got.ok()) {
      placed = **got;
      // Remembered where this server keeps a part (its memory follows its shuffles).
      const std::shared_ptr<const Kept> fresh = Remember(id, placed, c.node_id);
      if (kept == nullptr && !fresh->any) {
        std::lock_guard<std::mutex> lock(mu_);
        kept_.erase(id);
        meters_.erase(id);
        revoked_applied_.erase(id);
      }
    } else if (kept != nullptr && IsEtcdDown(got.status())) {
      placed = kept->placement;
      out.age = std::max(Since(kept->read_at), std::chrono::milliseconds(1));
    } else {
      return AboutShuffle(id, got.status());
    }
  }
  SLUICE_ASSIGN_OR_RETURN(const std::vector<NodeEntry> live, Nodes());  // (the last list, if down)
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
