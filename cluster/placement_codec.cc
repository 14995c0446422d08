#include "cluster/placement_codec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "codec/varint.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

// An epoch changing more partitions than this is written compactly ("moves"): a server of a
// version before it cannot read such a record (it finds no "changed" and says so), so small
// epochs keep the form every version reads.
constexpr size_t kCompactFrom = 256;

// codec/varint.h's LEB128 over a string and a view.
void AppendVarint(std::string* out, uint64_t v) {
  uint8_t buf[kMaxVarintBytes];
  out->append(reinterpret_cast<const char*>(buf), PutVarint(buf, v) - buf);
}

bool TakeVarint(absl::string_view* in, uint64_t* v) {
  const auto* start = reinterpret_cast<const uint8_t*>(in->data());
  const uint8_t* p = start;
  if (!GetVarint(&p, start + in->size(), v)) return false;
  in->remove_prefix(static_cast<size_t>(p - start));
  return true;
}

// `before` without the nodes in `removed`: what survives an epoch, in order.
std::vector<uint32_t> Survivors(const std::vector<uint32_t>& before,
                                const std::vector<uint32_t>& removed) {
  std::vector<uint32_t> out;
  for (uint32_t i : before) {
    if (std::find(removed.begin(), removed.end(), i) == removed.end()) out.push_back(i);
  }
  return out;
}

std::vector<uint32_t> IndexesOf(const ShufflePlacement& p, const std::vector<std::string>& ids) {
  std::vector<uint32_t> out;
  for (const std::string& id : ids) {
    auto it = std::find(p.nodes.begin(), p.nodes.end(), id);
    if (it != p.nodes.end()) out.push_back(static_cast<uint32_t>(it - p.nodes.begin()));
  }
  return out;
}

// An epoch's changes as JSON fields: "changed" ([partition, replicas] each), or, for a large
// epoch, "moves" (base64 of varints: per partition changed, in order, twice its distance from
// the one after the one before, plus 1 when the count of servers appended to its survivors
// follows (else they fill it up to the replication), and the appended servers' indexes: what
// NextEpoch makes) and "other" (changes of another shape, as "changed").
void EncodeChanges(const ShufflePlacement& p, const PlacementEpoch& e,
                   std::vector<std::vector<uint32_t>>* current, nlohmann::json* epoch) {
  const std::vector<uint32_t> removed = IndexesOf(p, e.removed);
  nlohmann::json explicit_changes = nlohmann::json::array();
  std::string moves;
  uint32_t next = 0;
  const bool compact = e.changed.size() > kCompactFrom;
  for (const auto& [q, list] : e.changed) {
    const std::vector<uint32_t> kept = Survivors((*current)[q], removed);
    const bool appended = compact && q >= next && list.size() >= kept.size() &&
                          std::equal(kept.begin(), kept.end(), list.begin());
    if (appended) {
      // (The count is left out when it fills the partition up to the replication: the usual.)
      const size_t count = list.size() - kept.size();
      const bool usual = kept.size() + count == p.replication;
      AppendVarint(&moves, 2 * static_cast<uint64_t>(q - next) + (usual ? 0 : 1));
      if (!usual) AppendVarint(&moves, count);
      for (size_t i = kept.size(); i < list.size(); ++i) AppendVarint(&moves, list[i]);
      next = q + 1;
    } else {
      explicit_changes.push_back(nlohmann::json{q, list});
    }
    (*current)[q] = list;
  }
  if (compact) {
    (*epoch)["moves"] = absl::Base64Escape(moves);
    if (!explicit_changes.empty()) (*epoch)["other"] = std::move(explicit_changes);
  } else {
    (*epoch)["changed"] = std::move(explicit_changes);
  }
}

}  // namespace

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
    std::vector<std::vector<uint32_t>> current = p.first_replicas;  // (as each epoch found them)
    for (const PlacementEpoch& e : p.epochs) {
      nlohmann::json epoch{{"removed", e.removed}};
      EncodeChanges(p, e, &current, &epoch);
      if (!e.revoked.empty()) {
        nlohmann::json revoked = nlohmann::json::array();
        for (const auto& [m, attempt] : e.revoked) revoked.push_back(nlohmann::json{m, attempt});
        epoch["revoked"] = std::move(revoked);
      }
      if (e.revived) epoch["revive"] = true;
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
    const bool compact = e.is_object() && e.contains("moves");
    if (!e.is_object() || !e.contains("removed") || !e["removed"].is_array() ||
        (compact ? !e["moves"].is_string() || e.contains("changed") ||
                       (e.contains("other") && !e["other"].is_array())
                 : !e.contains("changed") || !e["changed"].is_array())) {
      return bad("holding an epoch without its removed servers and changed partitions");
    }
    PlacementEpoch epoch;
    for (const auto& n : e["removed"]) {
      if (!n.is_string()) return bad("naming a removed node with something other than a string");
      epoch.removed.push_back(n.get<std::string>());
    }
    // (Each partition changes once an epoch, and from the lists the epoch before left.)
    std::vector<bool> seen(p.total(), false);
    const auto change = [&](uint32_t q, std::vector<uint32_t> list) {
      seen[q] = true;
      p.replicas[q] = list;
      epoch.changed.emplace_back(q, std::move(list));
    };
    const auto valid_list = [&](const std::vector<uint32_t>& list) {
      if (list.empty() || list.size() > p.replication) return false;
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i] >= p.nodes.size() ||
            std::find(list.begin(), list.begin() + i, list[i]) != list.begin() + i) {
          return false;
        }
      }
      return true;
    };
    const auto changeable = [&](uint64_t q) {
      return q < p.total() && p.BornAt(static_cast<uint32_t>(q)) < number &&
             !seen[static_cast<uint32_t>(q)];
    };
    if (compact) {
      std::string bytes;
      if (!absl::Base64Unescape(e["moves"].get<std::string>(), &bytes)) {
        return bad("holding an epoch's moves that are not base64");
      }
      const std::vector<uint32_t> removed = IndexesOf(p, epoch.removed);
      absl::string_view in = bytes;
      uint64_t next = 0;
      while (!in.empty()) {
        uint64_t word = 0, count = 0;
        if (!TakeVarint(&in, &word) || !changeable(next + word / 2) ||
            ((word & 1) != 0 && (!TakeVarint(&in, &count) || count > p.replication))) {
          return bad("holding an epoch's move that is not [partition, servers appended]");
        }
        const auto q = static_cast<uint32_t>(next + word / 2);
        std::vector<uint32_t> list = Survivors(p.replicas[q], removed);
        if ((word & 1) == 0) count = p.replication - std::min<size_t>(list.size(), p.replication);
        for (uint64_t i = 0; i < count; ++i) {
          uint64_t node = 0;
          if (!TakeVarint(&in, &node) || node >= p.nodes.size()) {
            return bad("holding an epoch's move naming a node not in its list");
          }
          list.push_back(static_cast<uint32_t>(node));
        }
        if (!valid_list(list)) {
          return bad("holding an epoch's move whose replicas name a node twice or are too many");
        }
        change(q, std::move(list));
        next = q + 1;
      }
    }
    static const nlohmann::json kNone = nlohmann::json::array();
    const nlohmann::json& listed =
        compact ? (e.contains("other") ? e["other"] : kNone) : e["changed"];
    for (const auto& c : listed) {
      if (!c.is_array() || c.size() != 2 || !c[0].is_number_unsigned() ||
          !changeable(c[0].get<uint64_t>()) || !c[1].is_array()) {
        return bad("holding an epoch's change that is not [partition, replicas]");
      }
      std::vector<uint32_t> list;
      for (const auto& i : c[1]) {
        if (!i.is_number_unsigned() || i.get<uint64_t>() > UINT32_MAX) {
          return bad("holding an epoch's replica list naming a node twice or not in its list");
        }
        list.push_back(i.get<uint32_t>());
      }
      if (!valid_list(list)) {
        return bad("holding an epoch's replica list naming a node twice or not in its list");
      }
      change(c[0].get<uint32_t>(), std::move(list));
    }
    std::sort(epoch.changed.begin(), epoch.changed.end());
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
    if (e.contains("revive")) {
      if (!e["revive"].is_boolean()) return bad("holding an epoch's revive mark not a boolean");
      epoch.revived = e["revive"].get<bool>();
    }
    p.epochs.push_back(std::move(epoch));
  }
  return p;
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

}  // namespace sluice
