#include "cluster/placement_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cluster/placement.h"
#include "nlohmann/json.hpp"

namespace sluice {

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
  return nlohmann::json{{"partitions", p.num_partitions},
                        {"mappers", p.num_mappers},
                        {"replication", p.replication},
                        {"nodes", p.nodes},
                        {"replicas", p.replicas}}
      .dump();
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
  return p;
}

absl::StatusOr<ShufflePlacement> NewPlacement(const std::string& shuffle_id,
                                              uint32_t num_partitions, uint32_t num_mappers,
                                              uint32_t replication,
                                              const std::vector<std::string>& nodes) {
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
  return p;
}

absl::StatusOr<PlacementStore::Created> EtcdPlacementStore::Create(
    const std::string& shuffle_id, uint32_t num_partitions, uint32_t num_mappers,
    uint32_t replication, const std::vector<std::string>& nodes) {
  // Recorded already (the usual case for a retried or concurrent create): no placing needed.
  auto existing = Get(shuffle_id);
  if (!existing.ok()) return existing.status();
  if (existing->has_value()) return Created{false, std::move(**existing)};
  auto placed = NewPlacement(shuffle_id, num_partitions, num_mappers, replication, nodes);
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
  return std::optional<ShufflePlacement>(std::move(p).value());
}

absl::StatusOr<uint64_t> EtcdPlacementStore::DecideMapper(const std::string& shuffle_id,
                                                          uint32_t mapper, uint64_t attempt) {
  // Only while the shuffle is recorded: a late decision of a deleted shuffle must not be left
  // for a new one of the same id to find.
  auto created = etcd_->CreateIfAbsent(absl::StrCat(MappersPrefix(shuffle_id), mapper),
                                       absl::StrCat(attempt), 0, Key(shuffle_id));
  if (absl::IsNotFound(created.status())) {
    return absl::NotFoundError("it is not recorded in the cluster (deleted?)");
  }
  if (!created.ok()) return created.status();
  uint64_t winner = 0;
  if (!absl::SimpleAtoi(absl::string_view(created->kv.value), &winner)) {
    return absl::DataLossError(absl::StrCat("etcd's decision for its mapper ", mapper,
                                            " is not an attempt id: '", created->kv.value, "'"));
  }
  return winner;
}

absl::StatusOr<std::map<uint32_t, uint64_t>> EtcdPlacementStore::Decisions(
    const std::string& shuffle_id) {
  const std::string prefix = MappersPrefix(shuffle_id);
  auto kvs = etcd_->GetPrefix(prefix);
  if (!kvs.ok()) return kvs.status();
  std::map<uint32_t, uint64_t> out;
  for (const EtcdKeyValue& kv : *kvs) {
    uint32_t mapper = 0;
    uint64_t attempt = 0;
    if (!absl::SimpleAtoi(absl::string_view(kv.key).substr(prefix.size()), &mapper) ||
        !absl::SimpleAtoi(absl::string_view(kv.value), &attempt)) {
      return absl::DataLossError(absl::StrCat("a decision of it in etcd is malformed: mapper '",
                                              kv.key.substr(prefix.size()), "' = '", kv.value,
                                              "'"));
    }
    out.emplace(mapper, attempt);
  }
  return out;
}

}  // namespace sluice
