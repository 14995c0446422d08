#include "server/rules/evictor.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

double Evictor::UsedPct(const ShuffleRegistry::DataDir& d) {
  if (!d.space_known || d.total_bytes == 0) return 0;
  return 100.0 * static_cast<double>(d.total_bytes - std::min(d.free_bytes, d.total_bytes)) /
         static_cast<double>(d.total_bytes);
}

bool Evictor::Evictable(const std::string& id) {
  if (uploader_->IsSettled(id)) return true;
  // An evicted shuffle nothing was pushed to since: what it holds came from the store (known
  // at once after a restart, before the uploader's first round).
  absl::StatusOr<std::shared_ptr<ShuffleStore>> store = registry_->Get(id);
  if (!store.ok() || (*store)->evicted() == nullptr) return false;
  const std::set<uint32_t> back = (*store)->RepairedAnywhere();
  for (uint32_t m : (*store)->CommittedMappers()) {
    if (back.count(m) == 0) return false;
  }
  return true;
}

absl::Status Evictor::MakeRoom(size_t dir, uint64_t free_bytes) {
  const uint32_t mark = options_.evict_pct;
  if (mark == 0 || mark >= 100) return absl::OkStatus();
  std::lock_guard<std::mutex> room(room_mu_);
  std::vector<ShuffleRegistry::DataDir> dirs = registry_->DataDirs();
  // Past the mark (every second, and before a push is refused), or, for a read back, short of
  // the bytes it needs in its own directory (a disk fuller than the mark with room enough, say
  // one shared with other data, evicts nothing for it).
  const auto short_of_room = [&](size_t i) {
    return free_bytes == 0 ? UsedPct(dirs[i]) > mark : i == dir && dirs[i].free_bytes < free_bytes;
  };
  std::set<size_t> over;
  for (size_t i = 0; i < dirs.size(); ++i) {
    if (dirs[i].failed.ok() && short_of_room(i)) over.insert(i);
  }
  if (over.empty()) return absl::OkStatus();
  // Least recently used first (a shuffle not open now: before any open one).
  std::map<std::string, std::chrono::steady_clock::time_point> used;
  registry_->ForEachOpen([&used](const std::shared_ptr<ShuffleStore>& s) {
    used[s->params().shuffle_id] = s->last_used();
  });
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::string>> candidates;
  size_t waiting = 0;  // complete here, not in the store yet
  const auto now = std::chrono::steady_clock::now();
  for (const std::string& id : registry_->Ids()) {
    if (over.count(registry_->HomeIndex(id)) == 0) continue;
    auto u = used.find(id);
    // (One used a moment ago is being read: a reader between its read back and its fetch.)
    if (u != used.end() && now - u->second < kMinIdle) continue;
    if (!Evictable(id)) {
      if (u != used.end()) {
        auto store = registry_->Get(id);
        if (store.ok() && (*store)->complete() && (*store)->evicted() == nullptr) ++waiting;
      }
      continue;
    }
    candidates.emplace_back(u == used.end() ? std::chrono::steady_clock::time_point{} : u->second,
                            id);
  }
  std::sort(candidates.begin(), candidates.end());
  for (const auto& [at, id] : candidates) {
    if (stopping_.load() || over.empty()) break;
    const size_t home = registry_->HomeIndex(id);
    if (over.count(home) == 0) continue;
    absl::StatusOr<uint64_t> freed = registry_->Evict(id);
    if (!freed.ok()) {
      spdlog::warn("event=evict_failed tenant={} shuffle={} error=\"{}\"", TenantField(id), id,
                   freed.status().ToString());
      continue;
    }
    if (*freed == 0) continue;
    if (metrics_ != nullptr) {
      ServerMetrics::Add(metrics_->evicted_shuffles, 1);
      ServerMetrics::Add(metrics_->evicted_bytes, *freed);
    }
    dirs = registry_->DataDirs();
    if (home < dirs.size() && !short_of_room(home)) over.erase(home);
  }
  if (over.empty()) return absl::OkStatus();
  if (waiting > 0) {
    return absl::UnavailableError(
        absl::StrCat(waiting, " complete shuffle", waiting == 1 ? " is" : "s are",
                     " being uploaded to the object store and will be evicted once there: retry"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "nothing more can be evicted (--object_evict_pct=", mark,
      "%): the shuffles left here are being written, in use, or not in the object store"));
}

absl::Status Evictor::ReadBack(const std::string& id, uint32_t partition,
                               const std::vector<std::pair<uint32_t, uint64_t>>& lacking) {
  const std::pair<std::string, uint32_t> key(id, partition);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (reading_.count(key) != 0) {
      cv_.wait(lock, [&] { return reading_.count(key) == 0; });
      return absl::OkStatus();  // (the caller looks again at what is here)
    }
    reading_.insert(key);
  }
  const auto done = [&](absl::Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    reading_.erase(key);
    cv_.notify_all();
    return st;
  };
  absl::StatusOr<std::shared_ptr<ShuffleStore>> store = registry_->Get(id);
  if (!store.ok()) return done(store.status());
  absl::StatusOr<std::map<uint32_t, ObjectRecord>> records = objects_->Records(id);
  if (!records.ok()) {
    return done(absl::UnavailableError(
        absl::StrCat("partition ", partition, " of shuffle '", ShuffleName(id),
                     "' was evicted here and its object record could not be read (",
                     records.status().message(), "): retry, or read another replica")));
  }
  auto r = records->find(partition);
  if (r == records->end()) {
    return done(absl::UnavailableError(
        absl::StrCat("partition ", partition, " of shuffle '", ShuffleName(id),
                     "' was evicted here and has no object recorded: read another replica")));
  }
  // Room first, for what comes back and what the read backs under way still bring (this
  // shuffle, held meanwhile, is not evicted for it): the object and a margin, or it is not
  // begun.
  (*store)->Touch();  // (the most recently used: evicted last)
  const uint64_t size = r->second.size + (uint64_t{4} << 20);
  uint64_t need = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ += size;
    need = reserved_;
  }
  const auto unreserve = [&](absl::Status st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reserved_ -= size;
    }
    return done(std::move(st));
  };
  if (absl::Status room = MakeRoom(registry_->HomeIndex(id), need); !room.ok()) {
    return unreserve(absl::UnavailableError(
        absl::StrCat("partition ", partition, " of shuffle '", ShuffleName(id),
                     "' was evicted here and there is no room to read it back now (",
                     room.message(), "): retry, or read another replica")));
  }
  const std::map<uint32_t, uint64_t> want(lacking.begin(), lacking.end());
  const auto started = std::chrono::steady_clock::now();
  ObjectSource::Restored back = objects_->RestoreInto(
      **store, id, partition, r->second, want, [this](uint64_t) { return !stopping_.load(); });
  if (metrics_ != nullptr) {
    ServerMetrics::Add(metrics_->read_back_copies, back.mappers.size());
    ServerMetrics::Add(metrics_->read_back_bytes, back.bytes);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!back.status.ok()) {
    spdlog::warn("event=read_back_failed tenant={} shuffle={} partition={} object={} error=\"{}\"",
                 TenantField(id), id, partition, r->second.key, back.status.ToString());
    // (The store's and etcd's faults are worth a retry; a damaged object is DATA_LOSS.)
    return unreserve(absl::IsDataLoss(back.status) || absl::IsUnavailable(back.status)
                         ? back.status
                         : absl::UnavailableError(absl::StrCat(
                               "partition ", partition, " of shuffle '", ShuffleName(id),
                               "' could not be read back from the object store (",
                               back.status.message(), "): retry, or read another replica")));
  }
  spdlog::info(
      "event=read_back tenant={} shuffle={} partition={} mappers={} bytes={} seconds={:.3f}",
      TenantField(id), id, partition, back.mappers.size(), back.bytes, seconds);
  return unreserve(absl::OkStatus());
}

}  // namespace sluice
