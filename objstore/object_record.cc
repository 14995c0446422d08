#include "objstore/object_record.h"

#include <xxhash.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codec/endian.h"
#include "nlohmann/json.hpp"
#include "objstore/s3_options.h"

namespace sluice {
namespace {

nlohmann::json RecordJson(const ObjectRecord& r) {
  return nlohmann::json{{"key", r.key},
                        {"size", r.size},
                        {"etag", r.etag},
                        {"by", r.by},
                        {"frames", r.frames},
                        {"winners", r.winners.count},
                        {"winners_xxh3", absl::StrFormat("%016x", r.winners.hash)}};
}

// The record `j` holds; else what is wrong with it, in words.
absl::StatusOr<ObjectRecord> RecordFromJson(const nlohmann::json& j) {
  const auto bad = [](const std::string& why) { return absl::DataLossError(why); };
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
  if (!j.contains("winners") || !j["winners"].is_number_unsigned() ||
      j["winners"].get<uint64_t>() > UINT32_MAX) {
    return bad("missing a valid 'winners' (their count)");
  }
  r.winners.count = j["winners"].get<uint32_t>();
  if (!j.contains("winners_xxh3") || !j["winners_xxh3"].is_string() ||
      j["winners_xxh3"].get<std::string>().size() != 16 ||
      !absl::SimpleHexAtoi(j["winners_xxh3"].get<std::string>(), &r.winners.hash)) {
    return bad("missing a valid 'winners_xxh3' (16 hex digits)");
  }
  return r;
}

absl::Status Prefixed(const absl::Status& st, absl::string_view what) {
  return absl::Status(st.code(), absl::StrCat(what, st.message()));
}

}  // namespace

WinnerSet::WinnerSet(const std::vector<std::pair<uint32_t, uint64_t>>& winners)
    : count(static_cast<uint32_t>(winners.size())) {
  std::string bytes;
  bytes.reserve(winners.size() * 12);
  for (const auto& [m, a] : winners) {
    AppendLE32(&bytes, m);
    AppendLE64(&bytes, a);
  }
  hash = XXH3_64bits(bytes.data(), bytes.size());
}

std::string EncodeObjectRecord(const ObjectRecord& r) { return RecordJson(r).dump(); }

absl::StatusOr<ObjectRecord> DecodeObjectRecord(const std::string& json) {
  absl::StatusOr<ObjectRecord> r =
      RecordFromJson(nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false));
  if (!r.ok()) return Prefixed(r.status(), "its object record in etcd is ");
  return r;
}

std::vector<uint32_t> ShuffleManifest::ChainOf(uint32_t p) const {
  std::vector<uint32_t> chain{p};
  for (uint32_t k = 0; k < segment_parents.size(); ++k) {
    if (segment_parents[k] == p) chain.push_back(partitions + k);
  }
  return chain;
}

std::string EncodeShuffleManifest(const ShuffleManifest& m) {
  nlohmann::json objects = nlohmann::json::array();
  for (const auto& [q, r] : m.objects) {
    nlohmann::json o = RecordJson(r);
    o["partition"] = q;
    objects.push_back(std::move(o));
  }
  return nlohmann::json{{"version", 1},
                        {"shuffle", m.shuffle_id},
                        {"partitions", m.partitions},
                        {"mappers", m.mappers},
                        {"segment_parents", m.segment_parents},
                        {"objects", objects}}
      .dump();
}

absl::StatusOr<ShuffleManifest> DecodeShuffleManifest(const std::string& json,
                                                      absl::string_view shuffle_id) {
  const std::string what =
      absl::StrCat("the object store's manifest of shuffle '", shuffle_id, "' is ");
  const auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(what, why));
  };
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return bad("not a JSON object");
  if (!j.contains("version") || j["version"] != 1) return bad("not of version 1");
  if (!j.contains("shuffle") || !j["shuffle"].is_string() ||
      j["shuffle"].get<std::string>() != shuffle_id) {
    return bad("of another shuffle");
  }
  for (const char* field : {"partitions", "mappers"}) {
    if (!j.contains(field) || !j[field].is_number_unsigned() ||
        j[field].get<uint64_t>() > UINT32_MAX) {
      return bad(absl::StrCat("missing a valid '", field, "'"));
    }
  }
  ShuffleManifest m;
  m.shuffle_id = std::string(shuffle_id);
  m.partitions = j["partitions"].get<uint32_t>();
  m.mappers = j["mappers"].get<uint32_t>();
  if (m.partitions == 0) return bad("of a shuffle with no partitions");
  if (!j.contains("segment_parents") || !j["segment_parents"].is_array() ||
      j["segment_parents"].size() > (uint64_t{UINT32_MAX} - m.partitions)) {
    return bad("missing valid 'segment_parents'");
  }
  for (const auto& p : j["segment_parents"]) {
    if (!p.is_number_unsigned() || p.get<uint64_t>() >= m.partitions) {
      return bad("naming a segment of a partition the shuffle does not have");
    }
    m.segment_parents.push_back(p.get<uint32_t>());
  }
  if (!j.contains("objects") || !j["objects"].is_array()) return bad("missing its objects");
  for (const auto& o : j["objects"]) {
    absl::StatusOr<ObjectRecord> r = RecordFromJson(o);
    if (!r.ok()) return bad(absl::StrCat("holding an object ", r.status().message()));
    if (!o.contains("partition") || !o["partition"].is_number_unsigned() ||
        o["partition"].get<uint64_t>() >= m.stored()) {
      return bad("holding an object of no partition of the shuffle");
    }
    const uint32_t q = o["partition"].get<uint32_t>();
    if (!objstore::ValidObjectKey(r->key) || r->winners.count != m.mappers) {
      return bad(absl::StrCat("holding an object of partition ", q,
                              " with an invalid key or not one winner per mapper"));
    }
    if (!m.objects.emplace(q, *std::move(r)).second) {
      return bad(absl::StrCat("holding two objects of partition ", q));
    }
  }
  if (m.objects.size() != m.stored()) {
    return bad(absl::StrCat("holding ", m.objects.size(), " objects for ", m.stored(),
                            " stored partitions"));
  }
  return m;
}

std::string ShuffleObjectsPrefix(absl::string_view shuffle_id) {
  return absl::StrCat(shuffle_id, "/");
}

std::string PartitionObjectKey(absl::string_view shuffle_id, uint32_t partition,
                               absl::string_view node, uint64_t nonce) {
  return absl::StrFormat("%s/p%u-%s-%016x", shuffle_id, partition, node, nonce);
}

std::string PartitionObjectUploader(absl::string_view key) {
  const size_t slash = key.rfind('/');
  if (slash == absl::string_view::npos || key.substr(slash, 2) != "/p") return "";
  const size_t first = key.find('-', slash);
  const size_t last = key.rfind('-');
  if (first == absl::string_view::npos || last <= first + 1) return "";
  return std::string(key.substr(first + 1, last - first - 1));
}

std::string ManifestKey(absl::string_view shuffle_id) {
  return absl::StrCat(shuffle_id, "/manifest.json");
}

}  // namespace sluice
