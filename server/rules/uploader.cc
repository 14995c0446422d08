#include "server/rules/uploader.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "cluster/object_record.h"
#include "server/rules/upload_plan.h"
#include "server/storage/shuffle_id.h"
#include "server/tier/partition_upload.h"
#include "spdlog/spdlog.h"

namespace sluice {

Uploader::Uploader(ShuffleRegistry* registry, ClusterNode* node, objstore::S3Store* store,
                   Options options, ServerMetrics* metrics)
    : registry_(registry),
      node_(node),
      store_(store),
      options_(options),
      metrics_(metrics),
      nonce_(std::random_device{}()) {}

uint64_t Uploader::Run() {
  const bool alone = !node_->clustered();
  if (!alone && !node_->membership().joined()) return 0;
  uint64_t made = 0;
  std::set<std::string> held;
  for (const std::string& id : registry_->Ids()) {
    if (stopping_.load()) return made;
    held.insert(id);
    known_.insert(id);
    made += alone ? RunAlone(id) : RunShuffle(id);
  }
  SweepDeleted(held);
  return made;
}

uint64_t Uploader::RunAlone(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(settled_mu_);
    if (settled_.count(id) != 0) return 0;
  }
  absl::StatusOr<std::shared_ptr<ShuffleStore>> store = registry_->Get(id);
  if (!store.ok()) return 0;
  const auto settle = [&] {
    std::lock_guard<std::mutex> lock(settled_mu_);
    settled_[id] = Settled{};
  };
  if ((*store)->ReadObjectsFile().ok()) {  // (uploaded before a restart, or evicted)
    settle();
    return 0;
  }
  const ShuffleParams& params = (*store)->params();
  // (A shuffle of no known mapper count is never complete: it is not uploaded.)
  if (params.num_mappers == 0 || (*store)->evicted() != nullptr || !(*store)->complete()) {
    return 0;
  }
  std::vector<std::pair<uint32_t, uint64_t>> winners;
  for (uint32_t m : (*store)->CommittedMappers()) {
    if (auto a = (*store)->CommittedAttempt(m)) winners.emplace_back(m, *a);
  }
  if (winners.size() != params.num_mappers) return 0;
  std::string node_id = node_->membership().self().node_id;
  if (node_id.empty()) node_id = "server";
  ShuffleManifest m;
  m.shuffle_id = id;
  m.partitions = params.num_partitions;
  m.mappers = params.num_mappers;
  uint64_t made = 0;
  for (uint32_t q = 0; q < params.num_partitions; ++q) {
    if (stopping_.load()) return made;
    absl::StatusOr<ObjectRecord> up = UploadOne(**store, id, q, node_id, winners);
    if (!up.ok()) {  // (a failed upload leaves nothing: UploadPartition aborts it)
      for (const auto& [done, r] : m.objects) DeleteObject(id, r.key, "upload not finished");
      return made;
    }
    CountRecorded(*up);
    m.objects[q] = *std::move(up);
    ++made;
  }
  // The commit point: the OBJECTS file beside the shuffle (its store's manifest first, so that
  // a reader with no server finds what the server counts as uploaded).
  const std::string manifest = EncodeShuffleManifest(m);
  absl::Status st = store_->Put(ManifestKey(id), manifest);
  if (st.ok()) st = (*store)->WriteObjectsFile(manifest);
  if (!st.ok()) {
    spdlog::warn("event=manifest_failed shuffle={} error=\"{}\"", id, st.ToString());
    for (const auto& [q, r] : m.objects) DeleteObject(id, r.key, "not recorded");
    return 0;
  }
  if (metrics_ != nullptr) ServerMetrics::Add(metrics_->manifests_written, 1);
  spdlog::info("event=objects_recorded shuffle={} objects={}", id, m.objects.size());
  // Objects of an earlier round cut short (a crash between an upload and the record) go.
  if (auto listed = store_->List(ShuffleObjectsPrefix(id)); listed.ok()) {
    std::set<std::string> named = {ManifestKey(id)};
    for (const auto& [q, r] : m.objects) named.insert(r.key);
    for (const objstore::ObjectInfo& o : *listed) {
      if (named.count(o.key) == 0) DeleteObject(id, o.key, "not recorded");
    }
  }
  settle();
  return made;
}

uint64_t Uploader::RunShuffle(const std::string& id) {
  if (!node_->PrepareToServe(id, std::nullopt).ok()) return 0;
  const std::shared_ptr<const PlacementCache::Holding> holding = node_->placements().Remembered(id);
  if (holding == nullptr || !holding->any) return 0;
  const ShufflePlacement& p = holding->placement;
  // (A shuffle of no known mapper count is never complete: it is not uploaded.)
  if (p.num_mappers == 0) return 0;
  const Settled now{p.revision, p.epoch(), p.total()};
  std::optional<Settled> before;
  {
    std::lock_guard<std::mutex> lock(settled_mu_);
    if (auto settled = settled_.find(id); settled != settled_.end()) before = settled->second;
  }
  if (before == now && unsure_.count(id) == 0) return 0;
  const ClusterMembership::View view = node_->membership().view();
  if (view.placements == nullptr) return 0;
  absl::StatusOr<std::shared_ptr<ShuffleStore>> store = registry_->Get(id);
  if (!store.ok()) return 0;
  // Settled before and moved since (a revocation, an epoch), or every mapper committed here
  // (decisions are applied to every server of the epoch): etcd is asked, once; until then not.
  // (An evicted shuffle holds its mappers in the store: asked after a restart too.)
  const bool evicted = (*store)->evicted() != nullptr;
  const bool moved = before.has_value() && dropped_.count(id) == 0;
  if (!moved && !evicted && (*store)->CommittedMappers().size() < p.num_mappers) return 0;
  auto decided = view.placements->Decisions(id, options_.etcd_deadline);
  if (!decided.ok()) return 0;
  auto recorded = view.placements->Objects(id);
  if (!recorded.ok()) return 0;
  // A record that no longer stands once the placement moved has the manifest deleted at once,
  // before the mappers run again, so that a reader with no server finds none rather than
  // revoked attempts.
  const auto stale = [&](const auto& qr) { return !StandsFor(qr.second, *decided, p.num_mappers); };
  if (moved && std::any_of(recorded->begin(), recorded->end(), stale)) {
    if (!store_->Delete(ManifestKey(id)).ok()) return 0;  // (the next round again)
    dropped_.insert(id);
  }
  if (decided->size() != p.num_mappers ||
      (!evicted && (*store)->CommittedMappers().size() < p.num_mappers)) {
    return 0;
  }
  // Objects uploaded here whose record was not known: kept if recorded, else deleted.
  if (auto unsure = unsure_.find(id); unsure != unsure_.end()) {
    for (const auto& [q, key] : unsure->second) {
      auto r = recorded->find(q);
      if (r == recorded->end() || r->second.key != key) DeleteObject(id, key, "not recorded");
    }
    unsure_.erase(unsure);
  }
  std::set<std::string> registered;
  for (const NodeEntry& n : node_->membership().LastMembers()) registered.insert(n.node_id);
  std::vector<bool> whole(p.total(), false);
  for (uint32_t q = 0; q < p.total(); ++q) {
    whole[q] = q < holding->partition.size() && holding->partition[q] &&
               node_->decisions().LackingMappers(id, q).empty() &&
               node_->decisions().EvictedLacking(id, q).empty() &&
               (*store)->PartitionDamage(q).ok();
  }
  std::vector<std::pair<uint32_t, uint64_t>> winners;
  for (const auto& [m, d] : *decided) winners.emplace_back(m, d.attempt);
  uint64_t made = 0;
  for (uint32_t q : PartitionsToUpload(p, *decided, *recorded, view.node_id, registered, whole)) {
    if (stopping_.load()) return made;
    absl::StatusOr<ObjectRecord> up = UploadOne(**store, id, q, view.node_id, winners);
    if (!up.ok()) continue;
    const ObjectRecord& record = *up;
    const std::string& key = record.key;
    // A record there does not stand (else the plan would not give q): replace it.
    auto old = recorded->find(q);
    const std::optional<ObjectRecord> stale =
        old != recorded->end() ? std::optional<ObjectRecord>(old->second) : std::nullopt;
    auto r = view.placements->RecordObject(id, q, record, stale ? stale->revision : 0);
    if (!r.ok()) {
      if (absl::IsNotFound(r.status())) {
        DeleteObject(id, key, "shuffle deleted");
      } else {
        unsure_[id].emplace_back(q, key);  // (etcd did not answer: the next round reads)
      }
      continue;
    }
    (*recorded)[q] = r->first;
    if (!r->second) {
      DeleteObject(id, key, "another server's recorded");
      continue;
    }
    ++made;
    CountRecorded(record);
    spdlog::info("event=object_recorded shuffle={} partition={} key={} bytes={} frames={}", id, q,
                 key, record.size, record.frames);
    if (stale && stale->key != key) DeleteObject(id, stale->key, "stale");
  }
  // Settled once every stored partition's record stands; the uploader of partition 0 writes
  // the manifest first.
  for (uint32_t q = 0; q < p.total(); ++q) {
    auto r = recorded->find(q);
    if (r == recorded->end() || !StandsFor(r->second, *decided, p.num_mappers)) return made;
  }
  if (FirstRegistered(p, 0, registered) == view.node_id) {
    ShuffleManifest m;
    m.shuffle_id = id;
    m.partitions = p.num_partitions;
    m.mappers = p.num_mappers;
    for (const PartitionSegment& s : p.segments) m.segment_parents.push_back(s.parent);
    for (uint32_t q = 0; q < p.total(); ++q) m.objects[q] = recorded->at(q);
    if (absl::Status st = store_->Put(ManifestKey(id), EncodeShuffleManifest(m)); !st.ok()) {
      spdlog::warn("event=manifest_failed shuffle={} error=\"{}\"", id, st.ToString());
      return made;
    }
    if (metrics_ != nullptr) ServerMetrics::Add(metrics_->manifests_written, 1);
  }
  {
    std::lock_guard<std::mutex> lock(settled_mu_);
    settled_[id] = now;
  }
  dropped_.erase(id);
  return made;
}

absl::StatusOr<ObjectRecord> Uploader::UploadOne(
    const ShuffleStore& store, const std::string& id, uint32_t partition,
    const std::string& node_id, const std::vector<std::pair<uint32_t, uint64_t>>& winners) {
  const std::string key = PartitionObjectKey(id, partition, node_id, nonce_());
  absl::StatusOr<UploadedPartition> up =
      UploadPartition(store, id, partition, winners, store_, key, options_.upload);
  if (!up.ok()) {
    if (metrics_ != nullptr) ServerMetrics::Add(metrics_->object_upload_failures, 1);
    spdlog::warn("event=object_upload_failed shuffle={} partition={} error=\"{}\"", id, partition,
                 up.status().ToString());
    return up.status();
  }
  ObjectRecord r;
  r.key = key;
  r.size = up->object.size;
  r.etag = up->object.etag;
  r.by = node_id;
  r.frames = up->frames;
  r.winners = winners;
  return r;
}

void Uploader::CountRecorded(const ObjectRecord& r) {
  if (metrics_ == nullptr) return;
  ServerMetrics::Add(metrics_->objects_uploaded, 1);
  ServerMetrics::Add(metrics_->object_upload_bytes, r.size);
}

bool Uploader::IsSettled(const std::string& id) const {
  if (!node_->clustered()) {
    std::lock_guard<std::mutex> lock(settled_mu_);
    return settled_.count(id) != 0;
  }
  const std::shared_ptr<const PlacementCache::Holding> holding = node_->placements().Remembered(id);
  if (holding == nullptr) return false;
  const ShufflePlacement& p = holding->placement;
  std::lock_guard<std::mutex> lock(settled_mu_);
  auto it = settled_.find(id);
  return it != settled_.end() && it->second == Settled{p.revision, p.epoch(), p.total()};
}

void Uploader::DeleteObject(const std::string& id, const std::string& key, const char* why) {
  absl::Status st = store_->Delete(key);
  if (!st.ok()) {
    spdlog::warn("event=object_delete_failed shuffle={} key={} why=\"{}\" error=\"{}\"", id, key,
                 why, st.ToString());
    return;
  }
  if (metrics_ != nullptr) ServerMetrics::Add(metrics_->objects_deleted, 1);
}

void Uploader::SweepDeleted(const std::set<std::string>& held_now) {
  const ClusterMembership::View view = node_->membership().view();
  const bool alone = !node_->clustered();
  if (view.placements == nullptr && !alone) return;
  for (auto it = known_.begin(); it != known_.end();) {
    const std::string& id = *it;
    if (held_now.count(id) != 0 || stopping_.load()) {
      ++it;
      continue;
    }
    // Gone from here: swept only once etcd says the shuffle is not recorded (not moved away);
    // a server on its own: at once.
    if (!alone) {
      auto placed = view.placements->Get(id, options_.etcd_deadline);
      if (!placed.ok()) {
        ++it;
        continue;
      }
      if (placed->has_value()) {
        it = known_.erase(it);  // (recorded still: moved off this server)
        continue;
      }
    }
    const std::string prefix = ShuffleObjectsPrefix(id);
    // Uploads left open (a server killed in one) first, where the store lists them.
    if (auto open = store_->ListUploads(prefix); open.ok()) {
      for (const objstore::UploadInfo& u : *open) (void)store_->AbortUpload(u.key, u.upload_id);
    }
    auto objects = store_->List(prefix);
    if (!objects.ok()) {
      ++it;
      continue;
    }
    // Each server deletes its own uploads, a gone server's, and the manifest: not every object
    // by every server that held the shuffle.
    std::set<std::string> registered;
    for (const NodeEntry& n : node_->membership().LastMembers()) registered.insert(n.node_id);
    bool all = true;
    for (const objstore::ObjectInfo& o : *objects) {
      const std::string by = PartitionObjectUploader(o.key);
      if (!alone && !by.empty() && by != view.node_id && registered.count(by) != 0) continue;
      if (!store_->Delete(o.key).ok()) {
        all = false;
      } else if (metrics_ != nullptr) {
        ServerMetrics::Add(metrics_->objects_deleted, 1);
      }
    }
    if (!all) {
      ++it;
      continue;
    }
    spdlog::info("event=objects_swept shuffle={} objects={}", id, objects->size());
    {
      std::lock_guard<std::mutex> lock(settled_mu_);
      settled_.erase(id);
    }
    unsure_.erase(id);
    dropped_.erase(id);
    it = known_.erase(it);
  }
}

}  // namespace sluice
