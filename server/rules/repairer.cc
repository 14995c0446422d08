#include "server/rules/repairer.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/frame_decoder.h"
#include "server/rules/frame_copy.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

uint64_t Repairer::Run() {
  uint64_t made = 0;
  const std::vector<ClusterDecisions::RepairItem> items = node_->decisions().RepairBacklog();
  PeerStates peers;       // what each source says of each shuffle, asked once a round
  ObjectRecords records;  // each shuffle's object records, read once a round (at the first need)
  uint64_t left = BytesLeft(items, &peers);
  if (metrics_ != nullptr) metrics_->repair_backlog_bytes.store(left);
  for (const ClusterDecisions::RepairItem& item : items) {
    if (stopping_.load()) break;
    auto store = registry_->Get(item.id);
    if (!store.ok()) continue;
    bool changed = false;
    std::vector<std::pair<uint32_t, uint64_t>> lost;  // no server holds them
    for (const auto& [mapper, attempt] : item.mappers) {
      if (stopping_.load()) break;
      absl::Status st = absl::UnavailableError("no other replica of it is registered now");
      uint64_t bytes = 0;
      std::string from;
      for (const std::string& source : item.sources) {
        from = source;
        st = CopyOne(**store, item, mapper, attempt, source, &bytes);
        if (st.ok() || absl::IsAlreadyExists(st)) break;
      }
      if (absl::IsAlreadyExists(st)) st = absl::OkStatus();  // (repaired meanwhile)
      if (!st.ok() && Lost(item, mapper, &peers)) {
        lost.emplace_back(mapper, attempt);  // (from the object store, if it holds it)
        continue;                            // the partition's other mappers may still be copied
      }
      if (!st.ok()) {
        spdlog::warn(
            "event=repair_failed tenant={} shuffle={} partition={} mapper={} error=\"{}\" "
            "note=\"tried again next round\"",
            TenantField(item.id), item.id, item.partition, mapper, std::string(st.message()));
        break;  // the next partition; this one next round
      }
      changed = true;
      ++made;
      left -= std::min(left, bytes);
      if (metrics_ != nullptr) {
        ServerMetrics::Add(metrics_->repair_bytes, bytes);
        ServerMetrics::Add(metrics_->repair_copies, 1);
        metrics_->repair_backlog_bytes.store(left);
      }
      spdlog::info("event=repaired tenant={} shuffle={} partition={} mapper={} bytes={} from={}",
                   TenantField(item.id), item.id, item.partition, mapper, bytes, from);
    }
    if (!lost.empty()) {
      uint64_t bytes = 0;
      const std::set<uint32_t> restored = objects_ != nullptr
                                              ? Restore(**store, item, lost, &records, &bytes)
                                              : std::set<uint32_t>{};
      for (const auto& [mapper, attempt] : lost) {
        if (restored.count(mapper) != 0) continue;
        if (node_->decisions().MarkLost(item.id, item.partition, mapper)) {
          spdlog::error(
              "event=replica_lost tenant={} shuffle={} partition={} mapper={} note=\"no "
              "registered server holds it{} and every other holder was taken out: only a new "
              "run of the mapper, in a new shuffle, brings its records back\"",
              TenantField(item.id), item.id, item.partition, mapper,
              objects_ != nullptr ? ", nor the object store," : "");
        }
      }
      if (!restored.empty()) {
        changed = true;
        made += restored.size();
        left -= std::min(left, bytes);
        if (metrics_ != nullptr) {
          ServerMetrics::Add(metrics_->repair_bytes, bytes);
          ServerMetrics::Add(metrics_->repair_copies, restored.size());
          ServerMetrics::Add(metrics_->restored_copies, restored.size());
          metrics_->repair_backlog_bytes.store(left);
        }
        spdlog::info(
            "event=restored tenant={} shuffle={} partition={} mappers={} bytes={} from=\"{}\"",
            TenantField(item.id), item.id, item.partition, restored.size(), bytes,
            objects_->name());
      }
    }
    if (changed) node_->decisions().Recheck(item.id);
  }
  if (metrics_ != nullptr) {
    metrics_->repair_backlog.store(node_->decisions().MissingTotal());
    metrics_->lost_mappers.store(node_->decisions().LostTotal());
  }
  return made;
}

const PeerPartition* Repairer::Ask(PeerStates* peers, const std::string& source,
                                   const ClusterDecisions::RepairItem& item) {
  auto key = std::make_pair(source, item.id);
  auto it = peers->find(key);
  if (it == peers->end()) it = peers->emplace(key, fetcher_->MissingOf(source, item.id)).first;
  if (!it->second.ok() || item.partition >= it->second->size()) return nullptr;
  return &(*it->second)[item.partition];
}

uint64_t Repairer::BytesLeft(const std::vector<ClusterDecisions::RepairItem>& items,
                             PeerStates* peers) {
  uint64_t left = 0;
  for (const ClusterDecisions::RepairItem& item : items) {
    auto store = registry_->Get(item.id);
    if (!store.ok()) continue;
    const uint64_t here = (*store)->Stats(item.partition).bytes;
    for (const std::string& source : item.sources) {
      const PeerPartition* there = Ask(peers, source, item);
      if (there == nullptr || !there->Whole()) continue;
      left += there->bytes > here ? there->bytes - here : 0;
      break;
    }
  }
  return left;
}

bool Repairer::Lost(const ClusterDecisions::RepairItem& item, uint32_t mapper, PeerStates* peers) {
  if (item.unknown_holders > 0) return false;
  for (const std::string& source : item.sources) {
    // (One that cannot say may hold it. An answer from the round's start serves: a source
    // that has copied the mapper since got it from a holder registered then, which said so.)
    const PeerPartition* there = Ask(peers, source, item);
    if (there == nullptr || there->Holds(mapper)) return false;
  }
  return true;
}

absl::Status Repairer::CopyOne(ShuffleStore& store, const ClusterDecisions::RepairItem& item,
                               uint32_t mapper, uint64_t attempt, const std::string& source,
                               uint64_t* bytes) {
  FrameCopy copy(&store, item.partition, mapper, attempt);
  absl::Status st = fetcher_->Fetch(source, item.id, item.partition, mapper, attempt,
                                    [&](absl::Span<const uint8_t> frame) -> absl::Status {
                                      if (!Pace(frame.size())) {
                                        return absl::CancelledError("the server is stopping");
                                      }
                                      return copy.Add(frame, source);
                                    });
  if (st.ok()) st = copy.Commit();
  if (!st.ok()) {
    copy.Discard();
    return st;
  }
  *bytes = copy.bytes();
  return absl::OkStatus();
}

std::set<uint32_t> Repairer::Restore(ShuffleStore& store, const ClusterDecisions::RepairItem& item,
                                     const std::vector<std::pair<uint32_t, uint64_t>>& lost,
                                     ObjectRecords* records, uint64_t* bytes) {
  std::set<uint32_t> done;
  auto it = records->find(item.id);
  if (it == records->end()) it = records->emplace(item.id, objects_->Records(item.id)).first;
  if (!it->second.ok()) {
    spdlog::warn("event=restore_failed tenant={} shuffle={} partition={} error=\"{}\"",
                 TenantField(item.id), item.id, item.partition,
                 std::string(it->second.status().message()));
    return done;
  }
  auto r = it->second->find(item.partition);
  if (r == it->second->end()) return done;  // (not uploaded)
  const ObjectRecord& record = r->second;
  // The lost mappers the object holds at their winning attempts (the object's footer says: one
  // uploaded before a revocation holds another attempt of a revoked mapper, not that one).
  const std::map<uint32_t, uint64_t> want(lost.begin(), lost.end());
  ObjectSource::Restored restored = objects_->RestoreInto(
      store, item.id, item.partition, record, want, [this](uint64_t bytes) { return Pace(bytes); });
  done = std::move(restored.mappers);
  *bytes += restored.bytes;
  const absl::Status& st = restored.status;
  if (!st.ok()) {
    spdlog::warn(
        "event=restore_failed tenant={} shuffle={} partition={} object={} error=\"{}\" "
        "note=\"tried again next round\"",
        TenantField(item.id), item.id, item.partition, record.key, std::string(st.message()));
  }
  return done;
}

absl::StatusOr<DecommissionState> CheckDecommission(ShuffleRegistry* registry, ClusterNode* node,
                                                    PeerFetcher* peers) {
  DecommissionState out;
  std::vector<std::string> ids = registry->UnopenedIds();
  registry->ForEachOpen([&ids](const std::shared_ptr<ShuffleStore>& store) {
    ids.push_back(store->params().shuffle_id);
  });
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  SLUICE_ASSIGN_OR_RETURN(const std::vector<NodeEntry> live, node->membership().Nodes());
  const std::string self = node->membership().self().node_id;
  const auto wait = [&out](std::string why) {
    if (out.waiting_for.empty()) out.waiting_for = std::move(why);
  };
  for (const std::string& id : ids) {
    SLUICE_ASSIGN_OR_RETURN(auto kept, node->placements().HoldingOf(id));
    if (kept == nullptr) continue;  // not recorded (deleted): nothing to keep
    const ShufflePlacement& p = kept->placement;
    if (kept->any) {
      ++out.shuffles_placed;
      wait(
          absl::StrCat("shuffle '", ShuffleName(id), "' to take this server out of its placement"));
      continue;
    }
    std::map<std::string, absl::StatusOr<std::vector<PeerPartition>>> missing;  // by node id
    for (uint32_t q = 0; q < p.total() && q < kept->ever.size(); ++q) {
      if (!kept->ever[q]) continue;
      uint32_t whole = 0;
      for (uint32_t i : p.replicas[q]) {
        const std::string& node_id = p.nodes[i];
        if (node_id == self) continue;
        auto at = std::find_if(live.begin(), live.end(),
                               [&](const NodeEntry& n) { return n.node_id == node_id; });
        if (at == live.end()) continue;
        auto it = missing.find(node_id);
        if (it == missing.end()) {
          it = missing.emplace(node_id, peers->MissingOf(at->address, id)).first;
        }
        if (it->second.ok() && q < it->second->size() && (*it->second)[q].Whole()) ++whole;
      }
      const uint32_t need = std::min<uint32_t>(p.replication, p.replicas[q].size());
      if (whole < need) {
        ++out.partitions_short;
        wait(absl::StrCat("partition ", q, " of shuffle '", ShuffleName(id), "' to have ", need,
                          " whole replicas elsewhere (", whole, " now)"));
      }
    }
  }
  out.done = out.shuffles_placed == 0 && out.partitions_short == 0;
  return out;
}

bool Repairer::Pace(uint64_t bytes) {
  const Clock::time_point now = Clock::now();
  // (An idle stretch is not made up in a burst: at most a second's worth at once.)
  if (!paced_ || next_ < now - std::chrono::seconds(1)) next_ = now - std::chrono::seconds(1);
  paced_ = true;
  next_ += std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / static_cast<double>(rate_)));
  while (Clock::now() < next_) {
    if (stopping_.load()) return false;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(next_ - Clock::now(), std::chrono::milliseconds(100)));
  }
  return !stopping_.load();
}

}  // namespace sluice
