#include "server/rules/cluster_decisions.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "rpc/error_reason.h"
#include "server/rules/replica_check.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

std::vector<uint32_t> ClusterDecisions::LackingMappers(const std::string& id,
                                                       uint32_t partition) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint32_t> out;
  auto it = checked_.find(id);
  if (it == checked_.end()) return out;
  auto m = it->second.missing.find(partition);
  if (m == it->second.missing.end()) return out;
  for (const auto& [mapper, attempt] : m->second) out.push_back(mapper);  // (in mapper order)
  return out;
}

std::vector<std::pair<uint32_t, uint64_t>> ClusterDecisions::EvictedLacking(
    const std::string& id, uint32_t partition) const {
  if (!membership_->clustered()) {  // (its own winners: no decision is made elsewhere)
    auto store = registry_->Get(id);
    return store.ok() ? (*store)->EvictedLacking(partition)
                      : std::vector<std::pair<uint32_t, uint64_t>>{};
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = checked_.find(id);
  if (it == checked_.end()) return {};
  auto m = it->second.evicted.find(partition);
  return m == it->second.evicted.end() ? std::vector<std::pair<uint32_t, uint64_t>>{} : m->second;
}

std::vector<uint32_t> ClusterDecisions::LostMappers(const std::string& id,
                                                    uint32_t partition) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = checked_.find(id);
  if (it == checked_.end()) return {};
  auto m = it->second.lost.find(partition);
  if (m == it->second.lost.end()) return {};
  return std::vector<uint32_t>(m->second.begin(), m->second.end());
}

bool ClusterDecisions::MarkLost(const std::string& id, uint32_t partition, uint32_t mapper) {
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

uint64_t ClusterDecisions::LostTotal() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [id, checked] : checked_) {
    for (const auto& [partition, mappers] : checked.lost) n += mappers.size();
  }
  return n;
}

uint64_t ClusterDecisions::MissingTotal() const {
  const auto held = cache_->All();
  const std::map<std::string, std::shared_ptr<const PlacementCache::Holding>> holdings(held.begin(),
                                                                                       held.end());
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [id, checked] : checked_) {
    auto kept = holdings.find(id);
    for (const auto& [partition, mappers] : checked.missing) {
      // (Only what this server keeps now is repaired here.)
      if (kept == holdings.end() || partition >= kept->second->partition.size() ||
          kept->second->partition[partition]) {
        n += mappers.size();
      }
    }
  }
  return n;
}

void ClusterDecisions::Recheck(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = checked_.find(id); it != checked_.end()) it->second.stale = true;
}

std::vector<ClusterDecisions::RepairItem> ClusterDecisions::RepairBacklog() {
  if (!membership_->clustered()) return {};
  // Shuffles whose placement moved (only a later epoch gives a server partitions it lacks
  // mappers of), checked at their newest epoch.
  std::vector<std::string> to_check;
  {
    const auto held = cache_->All();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, kept] : held) {
      if (!kept->any || kept->placement.epoch() == 0) continue;
      auto checked = checked_.find(id);
      if (checked == checked_.end() || checked->second.stale ||
          checked->second.epoch != kept->placement.epoch()) {
        to_check.push_back(id);
      }
    }
  }
  for (const std::string& id : to_check) {
    if (membership_->etcd_down()) break;
    // (What serving it would check: its store here, and every decision applied.)
    absl::Status st = cache_->EnsureLocal(id);
    if (st.ok()) st = ResolvePending(id);
    if (!st.ok()) {
      spdlog::debug("event=repair_check_failed shuffle={} error=\"{}\"", id,
                    std::string(st.message()));
    }
  }
  std::vector<RepairItem> out;
  const auto held = cache_->All();
  const std::map<std::string, std::shared_ptr<const PlacementCache::Holding>> holdings(held.begin(),
                                                                                       held.end());
  const std::string self = membership_->self().node_id;
  const std::vector<NodeEntry> members = membership_->LastMembers();  // registered now
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, checked] : checked_) {
    if (checked.missing.empty()) continue;
    auto kept = holdings.find(id);
    if (kept == holdings.end()) continue;
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
        if (p.nodes[i] == self) continue;
        const size_t before = item.sources.size();
        for (const NodeEntry& n : members) {
          if (n.node_id == p.nodes[i] && !n.address.empty()) item.sources.push_back(n.address);
        }
        if (item.sources.size() == before && !p.Removed(p.nodes[i])) ++item.unknown_holders;
      }
      out.push_back(std::move(item));
    }
  }
  return out;
}

absl::Status ClusterDecisions::ApplyRevoked(const std::string& id) {
  if (!membership_->clustered()) return absl::OkStatus();
  auto store = registry_->Get(id);
  if (!store.ok()) return absl::OkStatus();  // nothing here to hide (the caller's lookup says why)
  // (Read from the record when not remembered: a restarted server must not serve an attempt
  // revoked while it was down.)
  SLUICE_ASSIGN_OR_RETURN(const std::shared_ptr<const PlacementCache::Holding> kept,
                          cache_->HoldingOf(id));
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
      return absl::DataLossError(absl::StrCat("server ", membership_->self().node_id,
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

absl::StatusOr<ClusterDecisions::Revoked> ClusterDecisions::RevokeMappers(
    const std::string& id, const std::vector<uint32_t>& mappers, uint32_t seen) {
  if (!membership_->clustered()) {
    return absl::FailedPreconditionError(
        "this server runs on its own (no --etcd): its decisions are its commits, and a partition "
        "is lost only with the server; revoking decisions is for clustered shuffles");
  }
  const ClusterMembership::View c = membership_->view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
  SLUICE_ASSIGN_OR_RETURN(auto revoked,
                          membership_->Record(id, c.placements->Revoke(id, mappers, seen)));
  Revoked out;
  out.attempts = std::move(revoked.first);
  out.epoch = revoked.second.epoch();
  cache_->Remember(id, revoked.second, c.node_id);
  SLUICE_RETURN_IF_ERROR(ApplyRevoked(id));
  spdlog::warn("event=revoke tenant={} shuffle={} mappers=\"{}\" epoch={}", TenantField(id), id,
               absl::StrJoin(mappers, ","), out.epoch);
  return out;
}

absl::Status ClusterDecisions::ResolvePending(const std::string& id) {
  if (!membership_->clustered()) return absl::OkStatus();
  SLUICE_RETURN_IF_ERROR(ApplyRevoked(id));
  auto store = registry_->Get(id);
  if (!store.ok()) return absl::OkStatus();  // the caller's own lookup says why
  const std::vector<uint32_t> pending = (*store)->PendingMappers();
  std::optional<std::map<uint32_t, MapperDecision>> known;  // the decisions last read
  {
    const std::shared_ptr<const PlacementCache::Holding> kept = cache_->Remembered(id);
    std::lock_guard<std::mutex> lock(mu_);
    auto checked = checked_.find(id);
    if (pending.empty() && checked != checked_.end() &&
        (kept == nullptr || kept->placement.epoch() == checked->second.epoch)) {
      const bool same = checked->second.instance == (*store)->instance();
      if (!checked->second.stale && same) return absl::OkStatus();
      // Only a repair changed it since: on a server of the newest epoch nothing waits for a
      // decision (every attempt of the epoch prepares here), so the decisions read then still
      // say all; checked again without etcd (a repair during an etcd outage leaves the shuffle
      // readable).
      if (kept != nullptr && kept->any) known = checked->second.decided;
    }
  }
  const ClusterMembership::View c = membership_->view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  std::map<uint32_t, MapperDecision> decided;
  if (known.has_value()) {
    decided = std::move(*known);
  } else {
    // (Attempts prepared here and not known decided: serving without the decisions could
    // leave out a mapper another server has committed.) Asked briefly: a reader has other
    // replicas, and in the first moments of an etcd outage, before the members read has found
    // it down, a full etcd deadline here held a reader 5 s.
    SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
    SLUICE_ASSIGN_OR_RETURN(
        decided,
        membership_->Record(id, c.placements->Decisions(id, membership_->options().quick_read)));
  }
  // A decision read just before a revocation this server has applied since is no decision.
  for (auto d = decided.begin(); d != decided.end();) {
    d = (*store)->IsRevoked(d->first, d->second.attempt) ? decided.erase(d) : std::next(d);
  }
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const PlacementCache::Holding> kept,
                          cache_->HoldingOf(id));
  uint32_t newest = 0;
  for (const auto& [m, d] : decided) newest = std::max(newest, d.epoch);
  if (kept != nullptr && kept->placement.epoch() < newest) {
    SLUICE_ASSIGN_OR_RETURN(kept, cache_->Reread(id));
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
  checked.instance = (*store)->instance();
  checked.missing = std::move(check.missing);
  checked.evicted = std::move(check.evicted);
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

absl::StatusOr<bool> ClusterDecisions::Create(const ShuffleParams& params, uint32_t replication) {
  if (!membership_->clustered()) {
    auto created = registry_->Create(params);
    if (created.ok() && *created) {
      spdlog::info("event=create tenant={} shuffle={} partitions={} mappers={}",
                   TenantField(params.shuffle_id), params.shuffle_id, params.num_partitions,
                   params.num_mappers);
    }
    return created;
  }
  SLUICE_RETURN_IF_ERROR(ShuffleRegistry::ValidateParams(params));
  const ClusterMembership::View c = membership_->view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
  absl::StatusOr<std::vector<NodeEntry>> nodes = c.nodes->Nodes();
  membership_->Note(nodes.status());
  if (!nodes.ok()) return nodes.status();
  // Never on fewer servers than were registered a moment ago (an etcd stall's expired leases).
  const absl::Status settled = membership_->Settled(*nodes);
  membership_->Seen(*nodes);
  SLUICE_RETURN_IF_ERROR(settled);
  // (A server being decommissioned takes nothing new: read now, not as last watched.)
  const std::vector<std::string> ids =
      ClusterMembership::Staying(*nodes, membership_->Leaving(/*read_now=*/true));
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
      membership_->Record(
          params.shuffle_id,
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
  if (cache_->Remember(params.shuffle_id, p, c.node_id)->any) {
    // (Its store takes the segment slots too: stored partition ids past the partitions.)
    SLUICE_RETURN_IF_ERROR(
        registry_->Create(ShuffleParams{params.shuffle_id, p.slots(), params.num_mappers})
            .status());
  }
  return placed.created;
}

absl::Status ClusterDecisions::Delete(const std::string& id) {
  bool recorded = false;
  if (membership_->clustered()) {  // its record first: no server makes its store again from it
    const ClusterMembership::View c = membership_->view();
    SLUICE_RETURN_IF_ERROR(c.Joined());
    SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
    SLUICE_ASSIGN_OR_RETURN(recorded, membership_->Record(id, c.placements->Delete(id)));
    cache_->Forget(id);  // (and the revocations applied of it, ForgetRevocations)
    std::lock_guard<std::mutex> lock(mu_);
    checked_.erase(id);
  }
  absl::Status st = registry_->Delete(id);
  if (recorded && absl::IsNotFound(st)) st = absl::OkStatus();  // held elsewhere only
  if (st.ok()) spdlog::info("event=delete tenant={} shuffle={}", TenantField(id), id);
  return st;
}

absl::StatusOr<size_t> ClusterDecisions::CountForCreate(const std::string& prefix,
                                                        const std::string& id) {
  if (!membership_->clustered()) {
    if (registry_->Get(id).ok() || registry_->FindDamaged(id)) return 0;  // has it
    return registry_->CountWithPrefix(prefix);
  }
  const ClusterMembership::View c = membership_->view();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
  SLUICE_ASSIGN_OR_RETURN(auto placed, membership_->Record(id, c.placements->Get(id)));
  if (placed.has_value()) return 0;
  return membership_->Record(id, c.placements->CountWithPrefix(prefix));
}

absl::StatusOr<uint64_t> ClusterDecisions::DecideMapper(const std::string& id, uint32_t mapper,
                                                        uint64_t attempt, uint32_t epoch) {
  SLUICE_RETURN_IF_ERROR(cache_->ReadUpTo(id, epoch));
  SLUICE_RETURN_IF_ERROR(cache_->EnsureLocal(id));
  SLUICE_RETURN_IF_ERROR(ApplyRevoked(id));
  SLUICE_ASSIGN_OR_RETURN(auto store, registry_->Get(id));
  if (auto committed = store->CommittedAttempt(mapper)) return *committed;  // decided before
  if (!store->IsPrepared(mapper, attempt)) {
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", attempt, " of mapper ", mapper, " of shuffle '", ShuffleName(id),
                     "' is not prepared on server ", membership_->self().node_id,
                     ": prepare it on every server of the shuffle first"));
  }
  uint64_t winner = attempt;  // on its own, the first attempt resolved here wins
  if (membership_->clustered()) {
    const ClusterMembership::View c = membership_->view();
    SLUICE_RETURN_IF_ERROR(c.Joined());
    SLUICE_RETURN_IF_ERROR(membership_->EtcdUp());
    SLUICE_ASSIGN_OR_RETURN(
        const MapperDecision decided,
        membership_->Record(id, c.placements->DecideMapper(id, mapper, attempt, epoch)));
    winner = decided.attempt;
  }
  auto outcome = store->Resolve(mapper, winner);
  if (!outcome.ok()) {
    if (membership_->clustered()) {
      // Decided all the same: the other servers apply it; this one reports what it could not.
      spdlog::error("event=resolve_failed tenant={} shuffle={} mapper={} winner={} error=\"{}\"",
                    TenantField(id), id, mapper, winner, std::string(outcome.status().message()));
      return winner;
    }
    return outcome.status();
  }
  if (!membership_->clustered() && *outcome == CommitOutcome::kDuplicate) {
    return store->CommittedAttempt(mapper).value_or(winner);
  }
  spdlog::info("event=decide tenant={} shuffle={} mapper={} attempt={} winner={}", TenantField(id),
               id, mapper, attempt, winner);
  return winner;
}

void ClusterDecisions::ForgetRevocations(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  revoked_applied_.erase(id);
}

}  // namespace sluice
