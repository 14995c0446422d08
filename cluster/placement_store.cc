#include "cluster/placement_store.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "rpc/error_reason.h"

namespace sluice {

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

absl::StatusOr<std::pair<ShufflePlacement, bool>> EtcdPlacementStore::Revive(
    const std::string& shuffle_id, uint32_t seen, const std::string& node,
    const std::vector<std::string>& live) {
  // As AddEpoch, with PlanRevive's checks made on the record this write replaces: of writers
  // that race with the same report, one writes the epoch and the others find `seen` past.
  for (int round = 0; round < 8; ++round) {
    auto got = Get(shuffle_id);
    if (!got.ok()) return got.status();
    if (!got->has_value()) return absl::NotFoundError("it is not recorded in the cluster");
    ShufflePlacement& now = **got;
    auto next = PlanRevive(now, seen, node, live);
    if (!next.ok()) return next.status();
    if (!next->has_value()) return std::make_pair(std::move(now), false);
    auto put = etcd_->PutIfUnchanged(Key(shuffle_id), EncodePlacement(**next), now.revision,
                                     EpochKey(shuffle_id), absl::StrCat((*next)->epoch()));
    if (!put.ok()) return put.status();
    if (*put) return std::make_pair(std::move(**next), true);
  }
  return absl::UnavailableError("its placement record kept changing while a revive was decided");
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
    const std::string& shuffle_id, std::chrono::milliseconds deadline) {
  const std::string prefix = MappersPrefix(shuffle_id);
  auto kvs = etcd_->GetPrefix(prefix, deadline);
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

absl::StatusOr<std::pair<ObjectRecord, bool>> EtcdPlacementStore::RecordObject(
    const std::string& shuffle_id, uint32_t partition, const ObjectRecord& record, int64_t stale) {
  const std::string key = absl::StrCat(ObjectsPrefix(shuffle_id), partition);
  if (stale != 0) {
    // Replaces the stale record only if it is still the one (a record goes with its shuffle,
    // so a deleted shuffle's is gone and nothing is written).
    auto put = etcd_->PutIfUnchanged(key, EncodeObjectRecord(record), stale);
    if (!put.ok()) return put.status();
    if (!*put) {
      auto kv = etcd_->Get(key);
      if (!kv.ok()) return kv.status();
      if (!kv->has_value()) return absl::NotFoundError("it is not recorded in the cluster");
      auto now = DecodeObjectRecord((*kv)->value);
      if (!now.ok()) return now.status();
      now->revision = (*kv)->mod_revision;
      return std::make_pair(*std::move(now), false);
    }
    return std::make_pair(record, true);
  }
  // Only while the shuffle is recorded: a late upload of a deleted shuffle leaves no record.
  auto created = etcd_->CreateIfAbsent(key, EncodeObjectRecord(record), 0, Key(shuffle_id));
  if (absl::IsNotFound(created.status())) {
    return absl::NotFoundError("it is not recorded in the cluster (deleted?)");
  }
  if (!created.ok()) return created.status();
  if (created->created) return std::make_pair(record, true);
  auto recorded = DecodeObjectRecord(created->kv.value);
  if (!recorded.ok()) return recorded.status();
  recorded->revision = created->kv.mod_revision;
  return std::make_pair(*std::move(recorded), false);
}

absl::StatusOr<std::map<uint32_t, ObjectRecord>> EtcdPlacementStore::Objects(
    const std::string& shuffle_id) {
  const std::string prefix = ObjectsPrefix(shuffle_id);
  auto kvs = etcd_->GetPrefix(prefix);
  if (!kvs.ok()) return kvs.status();
  std::map<uint32_t, ObjectRecord> out;
  for (const EtcdKeyValue& kv : *kvs) {
    uint32_t partition = 0;
    if (!absl::SimpleAtoi(absl::string_view(kv.key).substr(prefix.size()), &partition)) {
      return absl::DataLossError(
          absl::StrCat("an object record in etcd has the key '", kv.key, "', not a partition's"));
    }
    auto r = DecodeObjectRecord(kv.value);
    if (!r.ok()) return r.status();
    r->revision = kv.mod_revision;
    out.emplace(partition, *std::move(r));
  }
  return out;
}

}  // namespace sluice
