#include "cluster/object_record.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sluice {

std::string EncodeObjectRecord(const ObjectRecord& r) {
  nlohmann::json winners = nlohmann::json::array();
  for (const auto& [m, a] : r.winners) winners.push_back(nlohmann::json{m, a});
  return nlohmann::json{{"key", r.key}, {"size", r.size},     {"etag", r.etag},
                        {"by", r.by},   {"frames", r.frames}, {"winners", winners}}
      .dump();
}

absl::StatusOr<ObjectRecord> DecodeObjectRecord(const std::string& json) {
  const auto bad = [](const std::string& why) {
    return absl::DataLossError(absl::StrCat("its object record in etcd is ", why));
  };
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return bad("not a JSON object");
  for (const char* field : {"key", "etag", "by"}) {
    if (!j.contains(field) || !j[field].is_string()) {
      return bad(absl::StrCat("missing a valid '", field, "'"));
    }
  }
  for (const char* field : {"size", "frames"}) {
    if (!j.contains(field) || !j[field].is_number_unsigned()) {
      return bad(absl::StrCat("missing a valid '", field, "'"));
    }
  }
  ObjectRecord r;
  r.key = j["key"].get<std::string>();
  r.etag = j["etag"].get<std::string>();
  r.by = j["by"].get<std::string>();
  r.size = j["size"].get<uint64_t>();
  if (j["frames"].get<uint64_t>() > UINT32_MAX || r.key.empty()) {
    return bad("holding a frame count or a key out of range");
  }
  r.frames = j["frames"].get<uint32_t>();
  if (!j.contains("winners") || !j["winners"].is_array()) return bad("missing its winners");
  for (const auto& w : j["winners"]) {
    if (!w.is_array() || w.size() != 2 || !w[0].is_number_unsigned() ||
        !w[1].is_number_unsigned() || w[0].get<uint64_t>() > UINT32_MAX ||
        (!r.winners.empty() && w[0].get<uint32_t>() <= r.winners.back().first)) {
      return bad("holding winners that are not [mapper, attempt] in mapper order");
    }
    r.winners.emplace_back(w[0].get<uint32_t>(), w[1].get<uint64_t>());
  }
  return r;
}

bool StandsFor(const ObjectRecord& r, const std::map<uint32_t, MapperDecision>& decided,
               uint32_t num_mappers) {
  if (r.winners.size() != decided.size()) return false;
  if (num_mappers != 0 && decided.size() != num_mappers) return false;
  auto d = decided.begin();
  for (const auto& [m, a] : r.winners) {
    if (d->first != m || d->second.attempt != a) return false;
    ++d;
  }
  return true;
}

}  // namespace sluice
