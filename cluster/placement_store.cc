#include "cluster/placement_store.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/placement.h"
#include "nlohmann/json.hpp"
#include "rpc/error_reason.h"

namespace sluice {

std::vector<uint32_t> ShufflePlacement::ReplicasAt(uint32_t p, uint32_t e) const {
  std::vector<uint32_t> out = p < first_replicas.size() ? first_replicas[p] : replicas[p];
  for (uint32_t i = 0; i < e && i < epochs.size(); ++i) {
    for (const auto& [q, list] : epochs[i].changed) {
      if (q == p) out = list;
    }
  }
  return out;
}

uint32_t SegmentSlots(uint32_t num_partitions) {
  constexpr uint32_t kIds = 1u << 16;  // a stored block names its partition in 16 bits
  return num_partitions >= kIds ? 0 : std::min(kMaxSegments, kIds - num_partitions);
}

std::vector<uint32_t> ShufflePlacement::ChainOf(uint32_t p) const {
  std::vector<uint32_t> out{p};
  for (size_t k = 0; k < segments.size(); ++k) {
    if (segments[k].parent == p) out.push_back(num_partitions + static_cast<uint32_t>(k));
  }
  return out;
}

std::vector<std::vector<bool>> ShufflePlacement::HeldBy(const std::string& node_id) const {
  std::vector<std::vector<bool>> held(epoch() + 1, std::vector<bool>(total(), false));
  const auto it = std::find(nodes.begin(), nodes.end(), node_id);
  if (it == nodes.end()) return held;
  const auto self = static_cast<uint32_t>(it - nodes.begin());
  std::vector<std::vector<uint32_t>> at = first_replicas;
  for (uint32_t e = 0; e <= epoch(); ++e) {
    if (e > 0) {
      for (const auto& [q, list] : epochs[e - 1].changed) at[q] = list;
    }
    for (uint32_t q = 0; q < total() && q < at.size(); ++q) {
      held[e][q] = e >= BornAt(q) && std::find(at[q].begin(), at[q].end(), self) != at[q].end();
    }
  }
  return held;
}

bool ShufflePlacement::Removed(const std::string& node_id) const {
  for (const PlacementEpoch& e : epochs) {
    if (std::find(e.removed.begin(), e.removed.end(), node_id) != e.removed.end()) return true;
  }
  return false;
}

std::vector<std::pair<uint32_t, uint64_t>> ShufflePlacement::RevokedAfter(uint32_t after) const {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (size_t e = after; e < epochs.size(); ++e) {
    out.insert(out.end(), epochs[e].revoked.begin(), epochs[e].revoked.end());
  }
  return out;
}

bool ShufflePlacement::Holds(const std::string& node_id) const {
  const auto it = std::find(nodes.begin(), nodes.end(), node_id);
  if (it == nodes.end()) return false;
  const auto index = static_cast<uint32_t>(it - nodes.begin());
  for (const auto& r : replicas) {
    if (std::find(r.begin(), r.end(), index) != r.end()) return true;
  }
  return false;
}

uint32_t DefaultReplication(size_t servers) { return servers >= 2 ? 2 : 1; }

std::string EncodePlacement(const ShufflePlacement& p) {
  nlohmann::json j{
      {"partitions", p.num_partitions},
      {"mappers", p.num_mappers},
      {"replication", p.replication},
      {"nodes", p.nodes},
      {"replicas", std::vector<std::vector<uint32_t>>(
                       p.first_replicas.begin(), p.first_replicas.begin() + p.num_partitions)}};
  if (p.revocable) j["revocable"] = true;
  if (p.split_bytes != 0) {
    j["split_bytes"] = p.split_bytes;
    j["segment_slots"] = p.segment_slots;
    nlohmann::json segments = nlohmann::json::array();
    for (size_t k = 0; k < p.segments.size(); ++k) {
      segments.push_back(nlohmann::json{p.segments[k].parent, p.segments[k].born,
                                        p.first_replicas[p.num_partitions + k]});
    }
    j["segments"] = std::move(segments);
  }
  if (!p.epochs.empty()) {
    nlohmann::json epochs = nlohmann::json::array();
    for (const PlacementEpoch& e : p.epochs) {
      nlohmann::json changed = nlohmann::json::array();
      for (const auto& [q, list] : e.changed) changed.push_back(nlohmann::json{q, list});
      nlohmann::json epoch{{"removed", e.removed}, {"changed", changed}};
      if (!e.revoked.empty()) {
        nlohmann::json revoked = nlohmann::json::array();
        for (const auto& [m, attempt] : e.revoked) revoked.push_back(nlohmann::json{m, attempt});
        epoch["revoked"] = std::move(revoked);
      }
      epochs.push_back(std::move(epoch));
    }
    j["epochs"] = std::move(epochs);
  }
  return j.dump();
}

absl::StatusOr<ShufflePlacement> DecodePlacement(const std::string& shuffle_id,
                                                 const std::string& json) {
  const auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("its placement record in etcd is ", why));
  };
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return bad("not a JSON object");
  for (const char* field : {"partitions", "mappers", "replication"}) {
    if (!j.contains(field) || !j[field].is_number_unsigned() ||
        j[field].get<uint64_t>() > 1u << 30) {
      return bad(absl::StrCat("missing a valid '", field, "'"));
    }
  }
  ShufflePlacement p;
  p.shuffle_id = shuffle_id;
  p.num_partitions = j["partitions"].get<uint32_t>();
  p.num_mappers = j["mappers"].get<uint32_t>();
  p.replication = j["replication"].get<uint32_t>();
  if (!j.contains("nodes") || !j["nodes"].is_array() || !j.contains("replicas") ||
      !j["replicas"].is_array() || j["replicas"].size() != p.num_partitions) {
    return bad("missing its nodes, or not one replica list per partition");
  }
  if (p.replication < 1 || p.replication > 3 || j["nodes"].size() < p.replication) {
    return bad(absl::StrCat("holding replication ", p.replication, " over ", j["nodes"].size(),
                            " servers"));
  }
  for (const auto& n : j["nodes"]) {
    if (!n.is_string()) return bad("naming a node with something other than a string");
    p.nodes.push_back(n.get<std::string>());
  }
  for (const auto& r : j["replicas"]) {
    if (!r.is_array() || r.size() != p.replication) return bad("holding a wrong replica list");
    std::vector<uint32_t> list;
    for (const auto& i : r) {
      if (!i.is_number_unsigned() || i.get<uint64_t>() >= p.nodes.size()) {
        return bad("naming a node that is not in its list");
      }
      if (std::find(list.begin(), list.end(), i.get<uint32_t>()) != list.end()) {
        return bad("placing a partition twice on one node");
      }
      list.push_back(i.get<uint32_t>());
    }
    p.replicas.push_back(std::move(list));
  }
  if (j.contains("revocable")) {
    if (!j["revocable"].is_boolean()) return bad("holding a revocable that is not a boolean");
    p.revocable = j["revocable"].get<bool>();
  }
  if (j.contains("split_bytes")) {
    if (!j["split_bytes"].is_number_unsigned() || j["split_bytes"].get<uint64_t>() == 0 ||
        !j.contains("segment_slots") || !j["segment_slots"].is_number_unsigned() ||
        j["segment_slots"].get<uint64_t>() > SegmentSlots(p.num_partitions) ||
        !j.contains("segments") || !j["segments"].is_array() ||
        j["segments"].size() > j["segment_slots"].get<uint64_t>()) {
      return bad("holding a split size without its segment slots and segments");
    }
    p.split_bytes = j["split_bytes"].get<uint64_t>();
    p.segment_slots = j["segment_slots"].get<uint32_t>();
    const size_t epochs = j.contains("epochs") && j["epochs"].is_array() ? j["epochs"].size() : 0;
    uint32_t last_born = 0;
    for (const auto& g : j["segments"]) {
      if (!g.is_array() || g.size() != 3 || !g[0].is_number_unsigned() ||
          g[0].get<uint64_t>() >= p.num_partitions || !g[1].is_number_unsigned() ||
          g[1].get<uint64_t>() > epochs || g[1].get<uint32_t>() < last_born || !g[2].is_array() ||
          g[2].empty() || g[2].size() > p.replication) {
        return bad("holding a segment that is not [partition, epoch, replicas] in order");
      }
      std::vector<uint32_t> list;
      for (const auto& i : g[2]) {
        if (!i.is_number_unsigned() || i.get<uint64_t>() >= p.nodes.size() ||
            std::find(list.begin(), list.end(), i.get<uint32_t>()) != list.end()) {
          return bad("holding a segment's replica list naming a node twice or not in its list");
        }
        list.push_back(i.get<uint32_t>());
      }
      last_born = g[1].get<uint32_t>();
      p.segments.push_back(PartitionSegment{g[0].get<uint32_t>(), last_born});
      p.replicas.push_back(std::move(list));
    }
  }
  p.first_replicas = p.replicas;
  if (!j.contains("epochs")) return p;
  const nlohmann::json& epochs = j["epochs"];
  if (!epochs.is_array() || epochs.size() > kMaxPlacementEpochs) {
    return bad("holding epochs that are not a list of at most 64");
  }
  for (const auto& e : epochs) {
    const auto number = static_cast<uint32_t>(p.epochs.size() + 1);  // this epoch's
    if (!e.is_object() || !e.contains("removed") || !e["removed"].is_array() ||
        !e.contains("changed") || !e["changed"].is_array()) {
      return bad("holding an epoch without its removed servers and changed partitions");
    }
    PlacementEpoch epoch;
    for (const auto& n : e["removed"]) {
      if (!n.is_string()) return bad("naming a removed node with something other than a string");
      epoch.removed.push_back(n.get<std::string>());
    }
    for (const auto& c : e["changed"]) {
      if (!c.is_array() || c.size() != 2 || !c[0].is_number_unsigned() ||
          c[0].get<uint64_t>() >= p.total() || p.BornAt(c[0].get<uint32_t>()) >= number ||
          !c[1].is_array() || c[1].empty() || c[1].size() > p.replication) {
        return bad("holding an epoch's change that is not [partition, replicas]");
      }
      std::vector<uint32_t> list;
      for (const auto& i : c[1]) {
        if (!i.is_number_unsigned() || i.get<uint64_t>() >= p.nodes.size() ||
            std::find(list.begin(), list.end(), i.get<uint32_t>()) != list.end()) {
          return bad("holding an epoch's replica list naming a node twice or not in its list");
        }
        list.push_back(i.get<uint32_t>());
      }
      const uint32_t q = c[0].get<uint32_t>();
      p.replicas[q] = list;
      epoch.changed.emplace_back(q, std::move(list));
    }
    if (e.contains("revoked")) {
      if (!e["revoked"].is_array()) return bad("holding an epoch's revoked decisions not a list");
      for (const auto& r : e["revoked"]) {
        if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() ||
            !r[1].is_number_unsigned() || r[0].get<uint64_t>() > UINT32_MAX ||
            (p.num_mappers != 0 && r[0].get<uint64_t>() >= p.num_mappers)) {
          return bad("holding a revoked decision that is not [mapper, attempt]");
        }
        epoch.revoked.emplace_back(r[0].get<uint32_t>(), r[1].get<uint64_t>());
      }
    }
    p.epochs.push_back(std::move(epoch));
  }
  return p;
}

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
  return out;
}

absl::StatusOr<ShufflePlacement> NextEpoch(const ShufflePlacement& p,
                                           const std::vector<std::string>& removed,
                                           const std::vector<std::string>& live) {
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
  return out;
}

std::string EncodeDecision(const MapperDecision& d) {
  if (d.epoch == 0) return absl::StrCat(d.attempt);
  return absl::StrCat(d.attempt, "@", d.epoch);
}

std::optional<MapperDecision> DecodeDecision(std::string_view text) {
  const absl::string_view value(text.data(), text.size());
  MapperDecision d;
  const size_t at = value.find('@');
  if (!absl::SimpleAtoi(value.substr(0, at), &d.attempt)) return std::nullopt;
  if (at != absl::string_view::npos &&
      (!absl::SimpleAtoi(value.substr(at + 1), &d.epoch) || d.epoch == 0)) {
    return std::nullopt;
  }
  return d;
}

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
  return out;
}

absl::StatusOr<PlacementStore::Created> EtcdPlacementStore::Create(
    const std::string& shuffle_id, uint32_t num_partitions, uint32_t num_mappers,
    uint32_t replication, const std::vector<std::string>& nodes, uint64_t split_bytes) {
  // Recorded already (the usual case for a retried or concurrent create): no placing needed.
  auto existing = Get(shuffle_id);
  if (!existing.ok()) return existing.status();
  if (existing->has_value()) return Created{false, std::move(**existing)};
  auto placed =
      NewPlacement(shuffle_id, num_partitions, num_mappers, replication, nodes, split_bytes);
  if (!placed.ok()) return placed.status();
  ShufflePlacement& p = *placed;
  // The record and its index entry, together.
  auto created =
      etcd_->CreateIfAbsent(Key(shuffle_id), EncodePlacement(p), 0, {}, IndexKey(shuffle_id));
  if (!created.ok()) return created.status();
  if (created->created) return Created{true, std::move(p)};
  // Another server placed it in between: theirs is the one.
  auto theirs = DecodePlacement(shuffle_id, created->kv.value);
  if (!theirs.ok()) return theirs.status();
  return Created{false, std::move(theirs).value()};
}

absl::StatusOr<bool> EtcdPlacementStore::Delete(const std::string& shuffle_id) {
  // Together: a decision never outlives its record, nor a record its decisions.
  // (Not "<id>x": the slash.) The index entry with them.
  return etcd_->DeleteWithChildren(Key(shuffle_id), IndexKey(shuffle_id));
}

absl::StatusOr<size_t> EtcdPlacementStore::CountWithPrefix(const std::string& id_prefix) {
  auto entries = etcd_->GetPrefix(IndexKey(id_prefix));
  if (!entries.ok()) return entries.status();
  return entries->size();
}

absl::StatusOr<std::optional<ShufflePlacement>> EtcdPlacementStore::Get(
    const std::string& shuffle_id, std::chrono::milliseconds deadline) {
  auto kv = etcd_->Get(Key(shuffle_id), deadline);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::optional<ShufflePlacement>();
  auto p = DecodePlacement(shuffle_id, (*kv)->value);
  if (!p.ok()) return p.status();
  p->revision = (*kv)->mod_revision;
  return std::optional<ShufflePlacement>(std::move(p).value());
}

absl::StatusOr<int64_t> EtcdPlacementStore::Revision(const std::string& shuffle_id,
                                                     std::chrono::milliseconds deadline) {
  return etcd_->ModRevision(Key(shuffle_id), deadline);
}

absl::Status EtcdPlacementStore::SetDecommissioning(const std::string& node_id) {
  return etcd_->Put(DecommissionPrefix() + node_id, "");
}

absl::StatusOr<std::vector<std::string>> EtcdPlacementStore::Decommissioning() {
  auto kvs = etcd_->GetPrefix(DecommissionPrefix(), std::chrono::milliseconds(1000));
  if (!kvs.ok()) return kvs.status();
  std::vector<std::string> out;
  for (const EtcdKeyValue& kv : *kvs) out.push_back(kv.key.substr(DecommissionPrefix().size()));
  return out;
}

absl::StatusOr<std::optional<ShufflePlacement>> EtcdPlacementStore::AddEpoch(
    const std::string& shuffle_id, const std::vector<std::string>& removed,
    const std::vector<std::string>& live) {
  // Read, change, write if unchanged since: of servers that race, one writes the epoch and the
  // others find it there (their next read holds none of `removed`).
  for (int round = 0; round < 8; ++round) {
    auto got = Get(shuffle_id);
    if (!got.ok() || !got->has_value()) return got;
    const ShufflePlacement& now = **got;
    auto next = NextEpoch(now, removed, live);
    if (!next.ok()) return next.status();
    if (next->epoch() == now.epoch()) return got;
    auto put = etcd_->PutIfUnchanged(Key(shuffle_id), EncodePlacement(*next), now.revision,
                                     EpochKey(shuffle_id), absl::StrCat(next->epoch()));
    if (!put.ok()) return put.status();
    if (*put) return std::optional<ShufflePlacement>(std::move(next).value());
  }
  return absl::UnavailableError("its placement record kept changing while an epoch was added");
}

absl::StatusOr<std::optional<ShufflePlacement>> EtcdPlacementStore::AddSegment(
    const std::string& shuffle_id, uint32_t full, const std::vector<std::string>& live) {
  // As AddEpoch: read, change, write if unchanged since; the epoch key stays (no attempt in
  // flight is refused for it).
  for (int round = 0; round < 8; ++round) {
    auto got = Get(shuffle_id);
    if (!got.ok() || !got->has_value()) return got;
    const ShufflePlacement& now = **got;
    auto next = NextSegment(now, full, live);
    if (!next.ok()) return next.status();
    if (next->total() == now.total()) return got;
    auto put = etcd_->PutIfUnchanged(Key(shuffle_id), EncodePlacement(*next), now.revision);
    if (!put.ok()) return put.status();
    if (*put) return std::optional<ShufflePlacement>(std::move(next).value());
  }
  return absl::UnavailableError("its placement record kept changing while a segment was added");
}

absl::StatusOr<std::pair<std::vector<uint64_t>, ShufflePlacement>> EtcdPlacementStore::Revoke(
    const std::string& shuffle_id, const std::vector<uint32_t>& mappers, uint32_t seen) {
  // Read, plan, write if unchanged since: the record's revision, and no decision made or changed
  // since they were read (a decision is made only while the epoch key holds the record's newest
  // epoch, but one may land between the two reads and this write).
  const std::string prefix = MappersPrefix(shuffle_id);
  for (int round = 0; round < 8; ++round) {
    auto got = Get(shuffle_id);
    if (!got.ok()) return got.status();
    if (!got->has_value()) return absl::NotFoundError("it is not recorded in the cluster");
    int64_t read_at = 0;
    auto kvs = etcd_->GetPrefix(prefix, std::chrono::milliseconds(0), &read_at);
    if (!kvs.ok()) return kvs.status();
    auto decided = ParseDecisions(prefix, *kvs);
    if (!decided.ok()) return decided.status();
    ShufflePlacement& now = **got;
    auto plan = PlanRevocation(now, *decided, mappers, seen);
    if (!plan.ok()) return plan.status();
    if (!plan->next.has_value()) return std::make_pair(plan->attempts, std::move(now));
    // The revoked decisions' keys, as ranges of keys adjacent in etcd's order (every mapper of a
    // lost partition is usually one range): a transaction takes at most 128 operations.
    const std::set<uint32_t> gone(mappers.begin(), mappers.end());
    std::vector<std::pair<std::string, std::string>> ranges;
    bool open = false;
    for (const EtcdKeyValue& kv : *kvs) {
      uint32_t m = 0;
      const bool revoked =
          absl::SimpleAtoi(absl::string_view(kv.key).substr(prefix.size()), &m) && gone.count(m);
      if (!revoked) {
        open = false;
        continue;
      }
      std::string end = kv.key + '\0';  // (the key's immediate successor)
      if (open) {
        ranges.back().second = std::move(end);
      } else {
        ranges.emplace_back(kv.key, std::move(end));
        open = true;
      }
    }
    if (ranges.size() > kMaxRevokeRanges) {
      return absl::FailedPreconditionError(
          absl::StrCat("the ", mappers.size(), " decisions to revoke lie in ", ranges.size(),
                       " separate ranges of etcd's keys, more than one transaction takes (",
                       kMaxRevokeRanges, "): revoke them in parts"));
    }
    const EtcdRangeGuard unchanged{prefix, read_at};
    auto put = etcd_->PutIfUnchanged(Key(shuffle_id), EncodePlacement(*plan->next), now.revision,
                                     EpochKey(shuffle_id), absl::StrCat(plan->next->epoch()),
                                     ranges, &unchanged);
    if (!put.ok()) return put.status();
    if (*put) return std::make_pair(plan->attempts, std::move(*plan->next));
  }
  return absl::UnavailableError("its placement record kept changing while decisions were revoked");
}

absl::StatusOr<MapperDecision> EtcdPlacementStore::DecideMapper(const std::string& shuffle_id,
                                                                uint32_t mapper, uint64_t attempt,
                                                                uint32_t epoch) {
  // Only while the shuffle is recorded: a late decision of a deleted shuffle must not be left
  // for a new one of the same id to find. And only in the newest epoch: an attempt pushed to
  // an older one's servers would leave its data where the newest epoch's replicas do not look.
  const EtcdValueGuard newest{EpochKey(shuffle_id), epoch == 0 ? "" : absl::StrCat(epoch)};
  auto created =
      etcd_->CreateIfAbsent(absl::StrCat(MappersPrefix(shuffle_id), mapper),
                            EncodeDecision({attempt, epoch}), 0, Key(shuffle_id), {}, &newest);
  if (absl::IsNotFound(created.status())) {
    return absl::NotFoundError("it is not recorded in the cluster (deleted?)");
  }
  if (!created.ok()) return created.status();
  if (created->guard_value_now.has_value()) {
    if (created->guard_value_now->empty()) {  // the epoch key goes only with its record
      return absl::NotFoundError("it is not recorded in the cluster (deleted?)");
    }
    return WithReason(
        absl::UnavailableError(absl::StrCat(
            "its placement moved to epoch ", *created->guard_value_now,
            " (a server taken out) after attempt ", attempt, " of mapper ", mapper,
            " was pushed in epoch ", epoch, ": retry the attempt, it is routed afresh")),
        ErrorReason::kPlacementChanged);
  }
  auto winner = DecodeDecision(created->kv.value);
  if (!winner.has_value()) {
    return absl::DataLossError(absl::StrCat("etcd's decision for its mapper ", mapper,
                                            " is not an attempt id: '", created->kv.value, "'"));
  }
  return *winner;
}

absl::StatusOr<std::map<uint32_t, MapperDecision>> EtcdPlacementStore::Decisions(
    const std::string& shuffle_id) {
  const std::string prefix = MappersPrefix(shuffle_id);
  auto kvs = etcd_->GetPrefix(prefix);
  if (!kvs.ok()) return kvs.status();
  return ParseDecisions(prefix, *kvs);
}

absl::StatusOr<std::map<uint32_t, MapperDecision>> EtcdPlacementStore::ParseDecisions(
    const std::string& prefix, const std::vector<EtcdKeyValue>& kvs) {
  std::map<uint32_t, MapperDecision> out;
  for (const EtcdKeyValue& kv : kvs) {
    uint32_t mapper = 0;
    const std::optional<MapperDecision> attempt = DecodeDecision(kv.value);
    if (!absl::SimpleAtoi(absl::string_view(kv.key).substr(prefix.size()), &mapper) ||
        !attempt.has_value()) {
      return absl::DataLossError(absl::StrCat("a decision of it in etcd is malformed: mapper '",
                                              kv.key.substr(prefix.size()), "' = '", kv.value,
                                              "'"));
    }
    out.emplace(mapper, *attempt);
  }
  return out;
}

}  // namespace sluice
