#include "server/storage/shuffle_registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "server/storage/file_util.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

StoreOptions ShuffleRegistry::OptionsForLocked(const std::string& id) {
  StoreOptions o = options_;
  const absl::string_view tenant = TenantOf(id);
  if (!tenant.empty()) o.held_total = TenantBytesLocked(std::string(tenant));
  o.index_total = index_total_;
  return o;
}

std::shared_ptr<std::atomic<int64_t>> ShuffleRegistry::TenantBytesLocked(
    const std::string& tenant) {
  auto& total = tenant_bytes_[tenant];
  if (total == nullptr) total = std::make_shared<std::atomic<int64_t>>(0);
  return total;
}

std::shared_ptr<std::atomic<int64_t>> ShuffleRegistry::TenantBytes(const std::string& tenant) {
  // Its shuffles not opened since the start hold bytes too: they count once open.
  const std::string prefix = tenant + kTenantSeparator;
  std::set<std::string> tried;
  while (unopened_count_.load() > 0) {
    std::string id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = never_opened_.lower_bound(prefix);
           it != never_opened_.end() && absl::StartsWith(*it, prefix); ++it) {
        if (tried.count(*it) == 0) {
          id = *it;
          break;
        }
      }
    }
    if (id.empty()) break;
    tried.insert(id);
    (void)OpenListed(id);  // (no room to open it: its bytes are not counted)
  }
  std::unique_lock<std::mutex> lock(mu_);
  opened_cv_.wait(lock, [&] {  // (and those another call is opening)
    auto it = opening_.lower_bound(prefix);
    return it == opening_.end() || !absl::StartsWith(*it, prefix);
  });
  return TenantBytesLocked(tenant);
}

size_t ShuffleRegistry::CountWithPrefix(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto it = home_.lower_bound(prefix);
       it != home_.end() && absl::StartsWith(it->first, prefix); ++it) {
    ++n;
  }
  return n;
}

std::string ShuffleRegistry::ShuffleDirLocked(const std::string& id) const {
  auto it = home_.find(id);
  const size_t index = it == home_.end() ? 0 : it->second;
  return absl::StrCat(dirs_[index]->path, "/shuffles/", id);
}

namespace {

// Descriptors kept free for what is not a shuffle's: accepting connections, gRPC's own,
// temporary and merge files.
constexpr uint64_t kFdHeadroom = 64;

// RESOURCE_EXHAUSTED when fewer than `need` + the headroom descriptors are left, `open` being
// how many are open now. A store needs 3 while it is made or opened (its directory, its data
// file, its log) and keeps 2.
absl::Status CheckFdHeadroom(uint64_t open, uint64_t need, const std::string& what) {
  const uint64_t limit = file::OpenFilesLimit();
  if (open + need + kFdHeadroom <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": the server has ", open, " of its ", limit, " open files in use (its limit, less ",
      kFdHeadroom,
      " kept for connections); raise it, e.g. ulimit -n or LimitNOFILE, or delete shuffles"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShuffleRegistry>> ShuffleRegistry::Open(
    const std::vector<std::string>& data_dirs, const StoreOptions& options, Opening opening) {
  if (data_dirs.empty()) return absl::InvalidArgumentError("no data directory");
  std::unique_ptr<ShuffleRegistry> reg(new ShuffleRegistry(options));
  for (const std::string& path : data_dirs) {
    reg->dirs_.push_back(std::make_unique<Dir>());
    reg->dirs_.back()->path = path;
  }
  // (Counted once, then as stores open: a start with 10,000 shuffles must not list
  // /proc/self/fd 10,000 times.)
  reg->open_fds_ = file::OpenFdCount();
  size_t healthy = 0;
  for (size_t i = 0; i < reg->dirs_.size(); ++i) {
    const absl::Status st = reg->ListDir(i);
    if (st.ok()) {
      ++healthy;
      continue;
    }
    std::lock_guard<std::mutex> lock(reg->mu_);
    reg->FailDirLocked(i, st);
  }
  if (healthy == 0) {
    // For the operator starting the server: each directory named by its path.
    if (reg->dirs_.size() == 1) {
      const Dir& d = *reg->dirs_[0];
      return absl::Status(d.failed.code(), absl::StrCat(d.path, ": ", d.failed.message()));
    }
    std::string why;
    for (const auto& d : reg->dirs_) {
      absl::StrAppend(&why, why.empty() ? "" : "; ", d->path, ": ", d->failed.message());
    }
    return absl::UnavailableError(absl::StrCat("no data directory can be used: ", why));
  }
  if (opening == Opening::kAll) reg->OpenAllListed();
  return reg;
}

absl::Status ShuffleRegistry::ListDir(size_t index) {
  const std::string root = absl::StrCat(dirs_[index]->path, "/shuffles");
  // A directory that cannot be written (a read-only or failing disk) fails now, not at the
  // first commit of a job placed on it.
  absl::Status writable = file::MakeDirs(root, "shuffles");
  if (writable.ok()) writable = ProbeWrite(root);
  if (absl::IsResourceExhausted(writable)) {
    // Full, not failing: what it holds is served (a full disk must not keep committed data
    // from its readers until space is freed); its pushes and creates fail with
    // RESOURCE_EXHAUSTED until there is room again, as on a disk that fills while serving.
    spdlog::warn(
        "event=data_dir_full dir={} index={} error=\"{}\" note=\"its shuffles are read; it takes "
        "new data once space is freed\"",
        dirs_[index]->path, index + 1, std::string(writable.message()));
    writable = absl::OkStatus();
  }
  if (!writable.ok()) {
    ReserveIds(index, root, writable);
    return writable;
  }
  std::error_code ec;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    if (!entry.is_directory()) continue;
    const std::string id = entry.path().filename().string();
    if (id.rfind(".trash-", 0) == 0) {  // a delete that a crash interrupted: finish it
      (void)file::RemoveTree(entry.path().string());
      continue;
    }
    if (!ValidateShuffleId(id).ok()) continue;  // not ours (or a leftover temp directory)
    if (auto other = home_.find(id); other != home_.end()) {
      if (unopened_.erase(id) != 0) unopened_count_.fetch_sub(1);
      never_opened_.erase(id);
      Duplicate(id, other->second, index);
      continue;
    }
    home_[id] = index;
    // Its lifetime (--shuffle_ttl_s) counts from the start until it is opened.
    if (unopened_.emplace(id, Unopened{0, std::chrono::steady_clock::now()}).second) {
      unopened_count_.fetch_add(1);
      never_opened_.insert(id);
    }
  }
  if (ec) return file::ErrnoStatus(ec.value(), "list", "shuffles");
  return absl::OkStatus();
}

bool ShuffleRegistry::OpenNextListed() {
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Up to half the limits: the rest is room for what is asked for.
    if (never_opened_.empty() || shuffles_.size() >= max_open_ / 2 ||
        index_total_->load() >= static_cast<int64_t>(index_budget_ / 2)) {
      return false;
    }
    id = *never_opened_.begin();
  }
  // (A failed open makes it damaged; no room to open it leaves it, and the rest, for later.)
  return OpenListed(id).ok();
}

absl::StatusOr<std::shared_ptr<ShuffleStore>> ShuffleRegistry::OpenListed(const std::string& id) {
  if (unopened_count_.load() == 0) return nullptr;
  std::vector<std::shared_ptr<ShuffleStore>> closed;  // (let go of after the lock)
  std::unique_lock<std::mutex> lock(mu_);
  opened_cv_.wait(lock, [&] { return opening_.count(id) == 0; });
  auto entry = unopened_.find(id);
  if (entry == unopened_.end()) return nullptr;
  const Unopened was = entry->second;
  // (The limit is soft: with none idle enough to close, it opens all the same, up to its
  // overshoot, and the next CloseIdle brings the open ones back under the limit. The
  // descriptors are the hard limit.)
  SLUICE_RETURN_IF_ERROR(MakeRoomLocked(id, &closed));
  const absl::Status room = DescriptorRoomLocked(
      open_fds_, false, absl::StrCat("shuffle '", ShuffleName(id), "' cannot be opened now"),
      &closed);
  if (!room.ok()) return room;  // (it stays listed, for a later call)
  unopened_.erase(entry);
  const bool first_time = never_opened_.erase(id) != 0;
  opening_.insert(id);
  const size_t index = home_.at(id);
  const std::string dir = ShuffleDirLocked(id);
  const StoreOptions options = OptionsForLocked(id);
  lock.unlock();
  absl::StatusOr<std::unique_ptr<ShuffleStore>> store = ShuffleStore::Open(dir, Shown(id), options);
  DamagedShuffle damaged;
  if (!store.ok()) {
    damaged.params = ShuffleStore::ReadParams(dir, Shown(id)).value_or(ShuffleParams{id, 0, 0});
    damaged.params.shuffle_id = id;
    damaged.reason = store.status();
    spdlog::error("event=recovery_failed tenant={} shuffle={} dir={} error=\"{}\"", TenantField(id),
                  id, dirs_[index]->path, std::string(store.status().message()));
  }
  lock.lock();
  opening_.erase(id);
  unopened_count_.fetch_sub(1);
  opened_cv_.notify_all();
  if (!first_time && was.held != 0 && options.held_total != nullptr) {
    // Counted while it was closed; its open counted its bytes again.
    options.held_total->fetch_sub(was.held);
  }
  if (!store.ok()) {
    damaged_.emplace(id, std::move(damaged));
    return nullptr;
  }
  open_fds_ += (*store)->open_files();
  if (!first_time) (*store)->SetLastUsed(was.last_used);  // reopened: its lifetime goes on
  std::shared_ptr<ShuffleStore> opened(std::move(store).value());
  shuffles_.emplace(id, opened);
  return opened;
}

void ShuffleRegistry::set_open_limits(size_t max_open, uint64_t index_budget) {
  std::lock_guard<std::mutex> lock(mu_);
  max_open_ = std::max<size_t>(1, max_open);
  index_budget_ = index_budget;
}

size_t ShuffleRegistry::CloseIdle(std::chrono::steady_clock::time_point now) {
  std::vector<std::shared_ptr<ShuffleStore>> closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shuffles_.size() <= max_open_ &&
        index_total_->load() <= static_cast<int64_t>(index_budget_)) {
      return 0;
    }
    // Down to 15/16 of the limits, so that a server at its limit does not close one at a time.
    closed = CloseIdleLocked(max_open_ - max_open_ / 16, index_budget_ - index_budget_ / 16, now,
                             kMinIdle);
  }
  return closed.size();  // (their memory is freed here, outside the lock)
}

absl::Status ShuffleRegistry::MakeRoomLocked(const std::string& id,
                                             std::vector<std::shared_ptr<ShuffleStore>>* closed) {
  if (shuffles_.size() < max_open_) return absl::OkStatus();
  const size_t target = max_open_ - std::max<size_t>(1, max_open_ / 16);
  const auto now = std::chrono::steady_clock::now();
  *closed = CloseIdleLocked(target, index_budget_, now, kMinIdleToMakeRoom);
  const size_t hard = max_open_ + OvershootOf(max_open_);
  if (shuffles_.size() < hard) return absl::OkStatus();
  // At the overshoot: any shuffle nobody holds goes, however lately it was used (it opens again
  // when asked for), so that calls coming one after another cannot open shuffle after shuffle.
  for (auto& store : CloseIdleLocked(target, index_budget_, now, std::chrono::milliseconds(0))) {
    closed->push_back(std::move(store));
  }
  if (shuffles_.size() < hard) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("shuffle '", ShuffleName(id), "' cannot be opened now: all ", shuffles_.size(),
                   " open shuffles are in use (--max_open_shuffles=", max_open_, ", and ",
                   OvershootOf(max_open_), " more while those are in use); retry"));
}

absl::Status ShuffleRegistry::DescriptorRoomLocked(
    uint64_t open, bool closed_counted, const std::string& what,
    std::vector<std::shared_ptr<ShuffleStore>>* closed) {
  if (closed_counted) {
    for (const auto& store : *closed) open -= std::min<uint64_t>(open, store->open_files());
  }
  const uint64_t limit = file::OpenFilesLimit();
  // Short of descriptors (a small open-files limit, or --max_open_shuffles set past what it
  // holds): idle shuffles close as they would past the open limit, since they open again when
  // asked for, before a create or an open is refused. A few rounds at most: each closes what
  // the shortfall asks for, unless what it closed keeps fewer descriptors than thought.
  for (int round = 0; round < 4 && open + 3 + kFdHeadroom > limit && !shuffles_.empty(); ++round) {
    const uint64_t short_by = open + 3 + kFdHeadroom - limit;
    const size_t stores =
        static_cast<size_t>(std::min<uint64_t>((short_by + 1) / 2, shuffles_.size()));
    auto more = CloseIdleLocked(shuffles_.size() - stores, index_budget_,
                                std::chrono::steady_clock::now(), std::chrono::milliseconds(0));
    if (more.empty()) break;
    for (auto& store : more) {
      open -= std::min<uint64_t>(open, store->open_files());
      closed->push_back(std::move(store));
    }
  }
  return CheckFdHeadroom(open, 3, what);
}

std::vector<std::shared_ptr<ShuffleStore>> ShuffleRegistry::CloseIdleLocked(
    size_t max_open, uint64_t index_budget, std::chrono::steady_clock::time_point now,
    std::chrono::milliseconds min_idle) {
  // Idle: nobody holds it but this map (no push, fetch, scrub or call has it: none can take it
  // while mu_ is held), nothing it would lose in memory (a wedge, damage found), and neither
  // opened nor used in the last `min_idle` (a call that has just opened it takes it then).
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::string>> idle;
  for (const auto& [id, store] : shuffles_) {
    if (store.use_count() != 1 || store->writers() > 0 || store->wedged() ||
        now - store->opened_at() < min_idle || now - store->last_used() < min_idle ||
        !store->DamagedPartitions().empty()) {
      continue;
    }
    idle.emplace_back(store->last_used(), id);
  }
  std::sort(idle.begin(), idle.end());  // least recently used first
  std::vector<std::shared_ptr<ShuffleStore>> closed;
  for (const auto& [used, id] : idle) {
    if (shuffles_.size() <= max_open &&
        index_total_->load() <= static_cast<int64_t>(index_budget)) {
      break;
    }
    auto it = shuffles_.find(id);
    std::shared_ptr<ShuffleStore> store = std::move(it->second);
    shuffles_.erase(it);
    // Its bytes stay counted to its tenant while it is closed (a quota must not forget them).
    unopened_.emplace(id, Unopened{store->DetachHeld(), used});
    unopened_count_.fetch_add(1);
    open_fds_ -= std::min<uint64_t>(open_fds_, store->open_files());
    closed.push_back(std::move(store));
  }
  if (!closed.empty()) {
    spdlog::debug("event=shuffles_closed count={} open={} index_bytes={}", closed.size(),
                  shuffles_.size(), index_total_->load());
  }
  return closed;
}

absl::Status ShuffleRegistry::DeleteUnopened(std::unique_lock<std::mutex>& lock,
                                             const std::string& id) {
  auto u = unopened_.find(id);
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> trash, MoveToTrash(id));
  if (u->second.held != 0) {
    if (auto total = OptionsForLocked(id).held_total) total->fetch_sub(u->second.held);
  }
  unopened_.erase(u);
  never_opened_.erase(id);
  unopened_count_.fetch_sub(1);
  home_.erase(id);
  extra_homes_.erase(id);
  lock.unlock();
  for (const std::string& t : trash) {
    SLUICE_RETURN_IF_ERROR(file::RemoveTree(t, absl::StrCat(Shown(id), " (deleted)")));
  }
  return absl::OkStatus();
}

bool ShuffleRegistry::DeleteIfUnopenedSince(const std::string& id,
                                            std::chrono::steady_clock::time_point before) {
  std::unique_lock<std::mutex> lock(mu_);
  auto u = unopened_.find(id);
  if (u == unopened_.end() || opening_.count(id) != 0 || !(u->second.last_used < before)) {
    return false;
  }
  return DeleteUnopened(lock, id).ok();
}

std::vector<std::string> ShuffleRegistry::UnopenedIdleSince(
    std::chrono::steady_clock::time_point before) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, u] : unopened_) {
    if (u.last_used < before) out.push_back(id);
  }
  return out;
}

std::string ShuffleRegistry::Shown(const std::string& id) { return absl::StrCat("shuffles/", id); }

absl::Status ShuffleRegistry::NotFoundLocked(const std::string& id) const {
  std::string failed;
  for (size_t i = 0; i < dirs_.size(); ++i) {
    if (!dirs_[i]->failed.ok()) absl::StrAppend(&failed, failed.empty() ? "" : ", ", i + 1);
  }
  if (failed.empty()) {
    return absl::NotFoundError(absl::StrCat("shuffle '", ShuffleName(id), "' not found"));
  }
  return absl::NotFoundError(absl::StrCat(
      "shuffle '", ShuffleName(id), "' not found (data directory ", failed, " of ", dirs_.size(),
      " failed: shuffles on it are unavailable until it is repaired and the server restarted)"));
}

absl::Status ShuffleRegistry::ValidateParams(const ShuffleParams& params) {
  SLUICE_RETURN_IF_ERROR(ValidateShuffleId(params.shuffle_id));
  if (params.num_partitions == 0 || params.num_partitions > kMaxPartitions) {
    return absl::InvalidArgumentError(absl::StrCat("num_partitions must be 1 to ", kMaxPartitions,
                                                   ", not ", params.num_partitions));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShuffleRegistry::Create(const ShuffleParams& params) {
  SLUICE_RETURN_IF_ERROR(ValidateParams(params));
  SLUICE_RETURN_IF_ERROR(OpenListed(params.shuffle_id).status());
  // Counted before the lock: listing /proc/self/fd of a busy server takes milliseconds.
  const uint64_t open_fds = file::OpenFdCount();
  std::vector<std::shared_ptr<ShuffleStore>> closed;  // (let go of after the lock)
  std::unique_lock<std::mutex> lock(mu_);
  while (unopened_.count(params.shuffle_id) != 0 || opening_.count(params.shuffle_id) != 0) {
    lock.unlock();  // closed again meanwhile (idle): it exists, opened for the answer
    SLUICE_RETURN_IF_ERROR(OpenListed(params.shuffle_id).status());
    lock.lock();
  }
  if (auto d = damaged_.find(params.shuffle_id); d != damaged_.end()) {
    if (absl::IsUnavailable(d->second.reason)) {
      return absl::UnavailableError(absl::StrCat("shuffle '", ShuffleName(params.shuffle_id), "' ",
                                                 d->second.reason.message()));
    }
    return absl::AlreadyExistsError(
        absl::StrCat("shuffle '", ShuffleName(params.shuffle_id), "' exists but is damaged (",
                     d->second.reason.message(), "); delete it to reuse the id"));
  }
  auto it = shuffles_.find(params.shuffle_id);
  if (it != shuffles_.end()) {
    const ShuffleParams& have = it->second->params();
    if (have.num_partitions == params.num_partitions && have.num_mappers == params.num_mappers) {
      return false;
    }
    return absl::AlreadyExistsError(absl::StrCat("shuffle '", ShuffleName(params.shuffle_id),
                                                 "' already exists with ", have.num_partitions,
                                                 " partitions and ", have.num_mappers, " mappers"));
  }
  SLUICE_RETURN_IF_ERROR(MakeRoomLocked(params.shuffle_id, &closed));  // (as for an open)
  SLUICE_RETURN_IF_ERROR(DescriptorRoomLocked(
      open_fds, true,
      absl::StrCat("shuffle '", ShuffleName(params.shuffle_id), "' was not created"), &closed));
  // In the best data directory that works: one whose disk fails is marked failed (and
  // logged), and the next is tried; a full one is passed over.
  absl::Status last = absl::UnavailableError("every data directory has failed");
  for (size_t index : CreationOrderLocked()) {
    const std::string dir = absl::StrCat(dirs_[index]->path, "/shuffles/", params.shuffle_id);
    auto store = ShuffleStore::Create(dir, Shown(params.shuffle_id), params,
                                      OptionsForLocked(params.shuffle_id));
    if (store.ok()) {
      home_[params.shuffle_id] = index;
      shuffles_.emplace(params.shuffle_id, std::shared_ptr<ShuffleStore>(std::move(store).value()));
      return true;
    }
    // Nothing half-made stays behind (a directory a restart would find damaged).
    if (store.status().code() == absl::StatusCode::kAlreadyExists) return store.status();
    (void)file::RemoveTree(dir);
    last = store.status();
    if (!absl::IsResourceExhausted(last)) FailDirLocked(index, last);
  }
  return last;
}

absl::StatusOr<std::shared_ptr<ShuffleStore>> ShuffleRegistry::Get(const std::string& id) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  do {  // (again if another call opened it and it was closed as idle before this look)
    if (lock.owns_lock()) lock.unlock();
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<ShuffleStore> opened, OpenListed(id));
    if (opened != nullptr) return opened;  // (held from its open on)
    lock.lock();
  } while (unopened_.count(id) != 0);
  auto it = shuffles_.find(id);
  if (it != shuffles_.end()) return it->second;
  if (auto d = damaged_.find(id); d != damaged_.end()) {
    if (d->second.reason.code() != absl::StatusCode::kDataLoss &&
        d->second.reason.code() != absl::StatusCode::kNotFound) {
      return absl::UnavailableError(absl::StrCat("shuffle '", ShuffleName(id), "' is not open (",
                                                 d->second.reason.message(), ")"));
    }
    return absl::DataLossError(
        absl::StrCat("shuffle '", ShuffleName(id), "' is damaged and serves no data (",
                     d->second.reason.message(), "); DeleteShuffle removes it"));
  }
  return NotFoundLocked(id);
}

absl::StatusOr<std::shared_ptr<ShuffleStore>> ShuffleRegistry::GetForWriting(
    const std::string& id) {
  // (Held from its open on: not closed again before it is found below.)
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<ShuffleStore> opened, OpenListed(id));
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = shuffles_.find(id);
    if (it == shuffles_.end() && (unopened_.count(id) != 0 || opening_.count(id) != 0)) {
      lock.unlock();  // it was open, and closed as idle since: opened again
      SLUICE_ASSIGN_OR_RETURN(opened, OpenListed(id));
      lock.lock();
      continue;
    }
    if (it == shuffles_.end()) {
      lock.unlock();
      return Get(id);  // NOT_FOUND or DATA_LOSS
    }
    std::shared_ptr<ShuffleStore> store = it->second;
    if (!store->wedged()) {
      store->BeginWriter();  // under mu_: a reopen cannot start while it writes
      return store;
    }
    if (store->writers() > 0 || reopening_.count(id) != 0) {
      return store->WedgedError();
    }
    // Nobody writes to it: reopen it, outside the lock (it reads the whole shuffle back).
    reopening_.insert(id);
    const std::string dir = ShuffleDirLocked(id);
    const StoreOptions options = OptionsForLocked(id);
    lock.unlock();
    auto reopened = ShuffleStore::Open(dir, Shown(id), options, OpenCheck::kEveryByte);
    lock.lock();
    reopening_.erase(id);
    it = shuffles_.find(id);
    if (it == shuffles_.end() || it->second != store) continue;  // deleted or replaced meanwhile
    if (reopened.ok()) {
      spdlog::warn("event=shuffle_reopened tenant={} shuffle={} committed_mappers={}",
                   TenantField(id), id, (*reopened)->CommittedMappers().size());
      it->second = std::shared_ptr<ShuffleStore>(std::move(reopened).value());
      continue;  // and hand it out
    }
    spdlog::error("event=reopen_failed tenant={} shuffle={} error=\"{}\"", TenantField(id), id,
                  std::string(reopened.status().message()));
    if (reopened.status().code() == absl::StatusCode::kDataLoss) {
      DamagedShuffle damaged{store->params(), reopened.status()};
      shuffles_.erase(it);
      damaged_.emplace(id, std::move(damaged));
      continue;  // DATA_LOSS from Get
    }
    return absl::UnavailableError(absl::StrCat(
        "shuffle '", ShuffleName(id),
        "' stopped taking commits after a failed disk write, and re-verifying it "
        "failed too (",
        reopened.status().message(), "); it is retried with the next push, or restart the server"));
  }
}

std::optional<DamagedShuffle> ShuffleRegistry::FindDamaged(const std::string& id) {
  (void)OpenListed(id);  // (a shuffle that cannot be opened now is not known to be damaged)
  std::lock_guard<std::mutex> lock(mu_);
  auto d = damaged_.find(id);
  if (d == damaged_.end()) return std::nullopt;
  return d->second;
}

std::vector<DamagedShuffle> ShuffleRegistry::ListDamaged() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<DamagedShuffle> out;
  for (const auto& [id, d] : damaged_) out.push_back(d);
  return out;
}

absl::StatusOr<std::vector<std::string>> ShuffleRegistry::MoveToTrash(const std::string& id) {
  // One rename per copy makes the delete atomic: after a crash the shuffle is either there
  // whole or gone (its trash is removed at the next start), and the id is free at once.
  std::vector<size_t> homes;
  if (auto home = home_.find(id); home != home_.end()) homes.push_back(home->second);
  for (auto [it, end] = extra_homes_.equal_range(id); it != end; ++it) {
    homes.push_back(it->second);
  }
  if (homes.empty()) homes.push_back(0);
  for (size_t index : homes) {
    if (!dirs_[index]->failed.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "shuffle '", ShuffleName(id), "' is on data directory ", index + 1, " of ", dirs_.size(),
          ", which has failed: it cannot be deleted until the disk is repaired"));
    }
  }
  std::vector<std::string> trash;
  for (size_t index : homes) {
    const std::string root = absl::StrCat(dirs_[index]->path, "/shuffles");
    std::string to = absl::StrCat(root, "/.trash-", id, "-", ++trash_counter_);
    absl::Status st = file::Rename(absl::StrCat(root, "/", id), to, Shown(id));
    if (!st.ok()) {
      if (trash.empty()) return st;
      // A copy is gone already: the delete has happened; what is left is cleaned at a start.
      spdlog::error("event=delete_incomplete tenant={} shuffle={} error=\"{}\"", TenantField(id),
                    id, std::string(st.message()));
      continue;
    }
    trash.push_back(std::move(to));
    // Renamed: the delete is done; a failed directory sync only makes it less durable.
    if (st = file::SyncDir(root, "shuffles"); !st.ok()) {
      spdlog::warn("event=delete_sync_failed tenant={} shuffle={} error=\"{}\"", TenantField(id),
                   id, std::string(st.message()));
    }
  }
  return trash;
}

std::vector<std::string> ShuffleRegistry::Ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(home_.size());
  for (const auto& [id, home] : home_) {
    if (damaged_.count(id) == 0) out.push_back(id);
  }
  return out;
}

std::vector<std::string> ShuffleRegistry::UnopenedIds() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(unopened_.size());
  for (const auto& [id, u] : unopened_) out.push_back(id);
  return out;
}

std::vector<ShuffleRegistry::Listed> ShuffleRegistry::ListPage(const std::string& prefix,
                                                               const std::string& after,
                                                               size_t limit) const {
  std::vector<Listed> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = home_.upper_bound(std::max(after, prefix));
       it != home_.end() && out.size() < limit && absl::StartsWith(it->first, prefix); ++it) {
    const std::string& id = it->first;
    Listed l{id, nullptr, std::nullopt};
    if (auto open = shuffles_.find(id); open != shuffles_.end()) {
      l.store = open->second;
    } else if (auto d = damaged_.find(id); d != damaged_.end()) {
      l.damaged = d->second;
    } else if (unopened_.count(id) == 0 && opening_.count(id) == 0) {
      continue;  // (an id kept taken for a failed data directory: not a shuffle here)
    }
    out.push_back(std::move(l));
  }
  return out;
}

absl::StatusOr<ShuffleParams> ShuffleRegistry::ReadParams(const std::string& id) const {
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (home_.count(id) == 0) return NotFoundLocked(id);
    dir = ShuffleDirLocked(id);
  }
  return ShuffleStore::ReadParams(dir, Shown(id));
}

std::vector<std::shared_ptr<ShuffleStore>> ShuffleRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ShuffleStore>> out;
  for (const auto& [id, store] : shuffles_) out.push_back(store);
  return out;
}

void ShuffleRegistry::ForEachOpen(
    const std::function<void(const std::shared_ptr<ShuffleStore>&)>& fn) const {
  std::vector<std::weak_ptr<ShuffleStore>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open.reserve(shuffles_.size());
    for (const auto& [id, store] : shuffles_) open.push_back(store);
  }
  for (const auto& weak : open) {
    std::shared_ptr<ShuffleStore> store = weak.lock();
    if (store == nullptr) continue;
    {
      // Still open (not closed for room meanwhile, its last holder not yet let go of it); held
      // now, so it is not closed while `fn` has it.
      std::lock_guard<std::mutex> lock(mu_);
      auto it = shuffles_.find(store->params().shuffle_id);
      if (it == shuffles_.end() || it->second != store) continue;
    }
    fn(store);
  }
}

size_t ShuffleRegistry::open_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shuffles_.size();
}

absl::Status ShuffleRegistry::Delete(const std::string& id) {
  std::vector<std::string> trash;
  {
    std::unique_lock<std::mutex> lock(mu_);
    opened_cv_.wait(lock, [&] { return opening_.count(id) == 0; });
    if (unopened_.count(id) != 0) return DeleteUnopened(lock, id);  // (never opened for it)
    auto it = shuffles_.find(id);
    auto d = damaged_.find(id);
    if (it == shuffles_.end() && d == damaged_.end()) return NotFoundLocked(id);
    SLUICE_ASSIGN_OR_RETURN(trash, MoveToTrash(id));
    home_.erase(id);
    extra_homes_.erase(id);
    if (it != shuffles_.end()) {
      it->second->MarkDeleted();  // streams still holding it fail; their fds point into trash
      shuffles_.erase(it);
    } else {
      damaged_.erase(d);  // nothing holds a damaged shuffle's files
    }
  }
  for (const std::string& t : trash) {
    SLUICE_RETURN_IF_ERROR(file::RemoveTree(t, absl::StrCat(Shown(id), " (deleted)")));
  }
  return absl::OkStatus();
}

}  // namespace sluice
