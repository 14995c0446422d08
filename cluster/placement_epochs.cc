#include "cluster/placement_epochs.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "cluster/placement.h"
#include "cluster/placement_codec.h"
#include "rpc/error_reason.h"

namespace sluice {
namespace {

// The record `next` would be fits in `limit` bytes; else `code` saying how many it would take,
// after `what`. Every change of a record is checked so (kMaxRecordBytes: what etcd takes), so
// that the size is refused here, naming it, and never by etcd's write.
absl::Status FitsRecord(const ShufflePlacement& next, size_t limit, absl::StatusCode code,
                        absl::string_view what) {
  const size_t bytes = EncodePlacement(next).size();
  if (bytes <= limit) return absl::OkStatus();
  return absl::Status(code, absl::StrCat("its placement record would take ", bytes, " bytes ", what,
                                         ", more than ", limit));
}

// NextEpoch, the record's size held to `limit` (`why` says whose limit it is).
absl::StatusOr<ShufflePlacement> NextEpochWithin(const ShufflePlacement& p,
                                                 const std::vector<std::string>& removed,
                                                 const std::vector<std::string>& live, size_t limit,
                                                 absl::string_view why);

}  // namespace

absl::StatusOr<Revocation> PlanRevocation(const ShufflePlacement& now,
                                          const std::map<uint32_t, MapperDecision>& decided,
                                          const std::vector<uint32_t>& mappers, uint32_t seen) {
  if (mappers.empty()) return absl::InvalidArgumentError("no mapper to revoke");
  std::vector<uint32_t> sorted = mappers;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError("a mapper is named twice");
  }
  if (now.num_mappers != 0 && sorted.back() >= now.num_mappers) {
    return absl::InvalidArgumentError(absl::StrCat("mapper ", sorted.back(), " is beyond the ",
                                                   now.num_mappers, " mappers of the shuffle"));
  }
  if (!now.revocable) {
    return absl::FailedPreconditionError(
        "it was created before revocations (its servers' commit logs may not take them): its "
        "decisions cannot be revoked; write it again under a new id");
  }
  Revocation out;
  if (seen > now.epoch()) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement epoch ", seen, " is newer than its newest, ", now.epoch()));
  }
  if (seen < now.epoch()) {
    // A repeat of a revocation made since `seen` revokes nothing new; anything else moved the
    // record under the caller, who reads the status again.
    const auto since = now.RevokedAfter(seen);
    for (uint32_t m : mappers) {
      // (The latest revocation of it, should it have been revoked more than once since.)
      auto it =
          std::find_if(since.rbegin(), since.rend(), [m](const auto& r) { return r.first == m; });
      if (it == since.rend()) {
        return WithReason(absl::AbortedError(absl::StrCat(
                              "its placement moved from epoch ", seen, " to ", now.epoch(),
                              " since the caller read it, without revoking mapper ", m,
                              ": read its status again and revoke at the newest epoch")),
                          ErrorReason::kPlacementChanged);
      }
      out.attempts.push_back(it->second);
    }
    return out;
  }
  if (now.epoch() >= kMaxPlacementEpochs) {
    return absl::FailedPreconditionError(
        absl::StrCat("its placement has ", kMaxPlacementEpochs,
                     " epochs, the most a record takes: no decision of it can be revoked any "
                     "more (write the shuffle again under a new id)"));
  }
  PlacementEpoch epoch;
  for (uint32_t m : mappers) {
    auto d = decided.find(m);
    if (d == decided.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("mapper ", m, " is not committed: there is no decision of it to revoke"));
    }
    out.attempts.push_back(d->second.attempt);
    epoch.revoked.emplace_back(m, d->second.attempt);
  }
  out.next = now;
  out.next->epochs.push_back(std::move(epoch));
  SLUICE_RETURN_IF_ERROR(FitsRecord(
      *out.next, kMaxRecordBytes, absl::StatusCode::kFailedPrecondition,
      "with this revocation, the most a record takes in etcd: revoke fewer mappers at once, or "
      "write the shuffle again under a new id"));
  return out;
}

absl::StatusOr<ShufflePlacement> NextEpoch(const ShufflePlacement& p,
                                           const std::vector<std::string>& removed,
                                           const std::vector<std::string>& live) {
  return NextEpochWithin(p, removed, live, kMaxRecordBytes,
                         "with another epoch, the most a record takes in etcd");
}

namespace {

absl::StatusOr<ShufflePlacement> NextEpochWithin(const ShufflePlacement& p,
                                                 const std::vector<std::string>& removed,
                                                 const std::vector<std::string>& live, size_t limit,
                                                 absl::string_view why) {
  bool held = false;
  for (const std::string& id : removed) held = held || p.Holds(id);
  if (!held) return p;
  if (p.epoch() >= kMaxPlacementEpochs) {
    return absl::UnavailableError(absl::StrCat("its placement has ", kMaxPlacementEpochs,
                                               " epochs, the most a record takes"));
  }
  std::vector<std::vector<std::string>> current(p.total());
  for (uint32_t q = 0; q < p.total(); ++q) {
    for (uint32_t i : p.replicas[q]) current[q].push_back(p.nodes[i]);
  }
  const std::vector<std::vector<std::string>> next =
      ReplaceReplicas(p.shuffle_id, current, removed, live, p.replication);
  ShufflePlacement out = p;
  PlacementEpoch epoch;
  for (const std::string& id : removed) {
    if (p.Holds(id)) epoch.removed.push_back(id);
  }
  for (uint32_t q = 0; q < p.total(); ++q) {
    if (next[q].empty()) {
      return absl::UnavailableError(absl::StrCat("no live server is left to hold partition ", q,
                                                 " (", absl::StrJoin(current[q], ", "), " gone)"));
    }
    if (next[q] == current[q]) continue;
    std::vector<uint32_t> list;
    for (const std::string& id : next[q]) {
      auto it = std::find(out.nodes.begin(), out.nodes.end(), id);
      if (it == out.nodes.end()) it = out.nodes.insert(out.nodes.end(), id);
      list.push_back(static_cast<uint32_t>(it - out.nodes.begin()));
    }
    out.replicas[q] = list;
    epoch.changed.emplace_back(q, std::move(list));
  }
  out.epochs.push_back(std::move(epoch));
  SLUICE_RETURN_IF_ERROR(FitsRecord(out, limit, absl::StatusCode::kUnavailable, why));
  return out;
}

}  // namespace

absl::StatusOr<ShufflePlacement> NewPlacement(const std::string& shuffle_id,
                                              uint32_t num_partitions, uint32_t num_mappers,
                                              uint32_t replication,
                                              const std::vector<std::string>& nodes,
                                              uint64_t split_bytes) {
  ShufflePlacement p;
  p.shuffle_id = shuffle_id;
  p.num_partitions = num_partitions;
  p.num_mappers = num_mappers;
  p.replication = replication != 0 ? replication : DefaultReplication(nodes.size());
  if (p.replication > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("replication ", p.replication, " is out of range [1, 3]"));
  }
  p.nodes = nodes;
  auto placed = PlaceReplicas(shuffle_id, num_partitions, nodes, p.replication);
  if (!placed.ok()) return placed.status();
  p.replicas = std::move(placed).value();
  p.first_replicas = p.replicas;
  p.revocable = true;
  if (split_bytes != 0 && SegmentSlots(num_partitions) != 0) {
    p.split_bytes = split_bytes;
    p.segment_slots = SegmentSlots(num_partitions);
  }
  return p;
}

absl::StatusOr<ShufflePlacement> NextSegment(const ShufflePlacement& p, uint32_t full,
                                             const std::vector<std::string>& live) {
  if (p.split_bytes == 0) {
    return absl::FailedPreconditionError("its partitions are not split (no split size recorded)");
  }
  if (full >= p.total()) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition ", full, " is out of range [0, ", p.total(), ")"));
  }
  const uint32_t parent = p.ParentOf(full);
  const std::vector<uint32_t> chain = p.ChainOf(parent);
  if (chain.back() != full) return p;  // split already: one decision for everyone
  if (p.segments.size() >= p.segment_slots) {
    return absl::ResourceExhaustedError(
        absl::StrCat("all its ", p.segment_slots, " segment slots are taken"));
  }
  const auto id = p.total();  // the new segment's
  // Candidates: live servers holding a replica of the newest epoch, with what they hold.
  std::vector<uint32_t> in_chain(p.nodes.size(), 0), load(p.nodes.size(), 0);
  std::vector<bool> holder(p.nodes.size(), false);
  for (uint32_t q = 0; q < p.total(); ++q) {
    for (uint32_t i : p.replicas[q]) {
      holder[i] = holder[i] || q < p.num_partitions;  // (every writer has a stream to it)
      ++load[i];
      if (p.ParentOf(q) == parent) ++in_chain[i];
    }
  }
  std::vector<uint32_t> candidates;
  for (uint32_t i = 0; i < p.nodes.size(); ++i) {
    if (holder[i] && std::find(live.begin(), live.end(), p.nodes[i]) != live.end()) {
      candidates.push_back(i);
    }
  }
  if (candidates.empty()) {
    return absl::UnavailableError("no live server of its placement can take a further segment");
  }
  std::sort(candidates.begin(), candidates.end(), [&](uint32_t a, uint32_t b) {
    if (in_chain[a] != in_chain[b]) return in_chain[a] < in_chain[b];
    if (load[a] != load[b]) return load[a] < load[b];
    return RendezvousScore(p.shuffle_id, id, p.nodes[a]) >
           RendezvousScore(p.shuffle_id, id, p.nodes[b]);
  });
  candidates.resize(std::min<size_t>(candidates.size(), p.replication));
  ShufflePlacement out = p;
  out.segments.push_back(PartitionSegment{parent, p.epoch()});
  out.replicas.push_back(candidates);
  out.first_replicas.push_back(candidates);
  SLUICE_RETURN_IF_ERROR(FitsRecord(out, kMaxRecordBytes, absl::StatusCode::kResourceExhausted,
                                    "with a further segment, the most a record takes in etcd"));
  return out;
}

absl::StatusOr<std::optional<ShufflePlacement>> PlanRevive(const ShufflePlacement& now,
                                                           uint32_t seen, const std::string& node,
                                                           const std::vector<std::string>& live) {
  if (seen > now.epoch()) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement epoch ", seen, " is past the shuffle's newest, ", now.epoch()));
  }
  if (seen < now.epoch() || !now.Holds(node)) return std::optional<ShufflePlacement>();
  const auto revives = std::count_if(now.epochs.begin(), now.epochs.end(),
                                     [](const PlacementEpoch& e) { return e.revived; });
  if (revives >= static_cast<long>(kMaxRevives)) {
    return absl::UnavailableError(
        absl::StrCat("the shuffle has had ", kMaxRevives, " revives, the most it takes: server ",
                     node, " is taken out of it once it has been unregistered for --dead_after_s"));
  }
  std::vector<std::string> others;
  for (const std::string& id : live) {
    if (id != node) others.push_back(id);
  }
  // (Revives stop short of what a record takes, so that the grace keeps room.)
  SLUICE_ASSIGN_OR_RETURN(
      ShufflePlacement next,
      NextEpochWithin(now, {node}, others, kReviveRecordBytes,
                      absl::StrCat("with a revive's epoch, where revives stop: server ", node,
                                   " is taken out of it once it has been unregistered for "
                                   "--dead_after_s")));
  next.epochs.back().revived = true;
  return std::optional<ShufflePlacement>(std::move(next));
}

}  // namespace sluice
