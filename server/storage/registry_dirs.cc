// ShuffleRegistry's data directories (shuffle_registry.h): which one a new shuffle goes to
// (the emptiest healthy one), their space and high-water mark, a directory failing (it takes
// nothing new), ids kept taken for a directory that failed at start, and a shuffle found in two.
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
#include "server/storage/shuffle_registry.h"
#include "spdlog/spdlog.h"

namespace sluice {

absl::Status ShuffleRegistry::ProbeWrite(const std::string& root) {
  const std::string probe = absl::StrCat(root, "/.write-probe");
  const std::string shown = "shuffles/.write-probe";
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return file::ErrnoStatus(errno, "open", shown);
  const file::Fd owned(fd);
  const uint8_t byte = 0;
  SLUICE_RETURN_IF_ERROR(file::PwriteAll(fd, shown, 0, absl::MakeConstSpan(&byte, 1)));
  SLUICE_RETURN_IF_ERROR(file::SyncData(fd, shown));
  if (::unlink(probe.c_str()) != 0) return file::ErrnoStatus(errno, "remove", shown);
  return absl::OkStatus();
}

void ShuffleRegistry::ReserveIds(size_t index, const std::string& root, const absl::Status& why) {
  // Its shuffles cannot be opened, but their ids stay taken (if it can be listed at all): a
  // job must not create its shuffle again on another disk, only to find two copies once this
  // one is repaired.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string id = entry.path().filename().string();
    if (!entry.is_directory(ec) || !ValidateShuffleId(id).ok() || home_.count(id) != 0) continue;
    home_[id] = index;
    DamagedShuffle d;
    d.params = ShuffleParams{id, 0, 0};
    d.reason = absl::UnavailableError(absl::StrCat(
        "it is on data directory ", index + 1, " of ", dirs_.size(), ", which failed at start (",
        why.message(), "); repair the disk and restart the server"));
    damaged_.emplace(id, std::move(d));
  }
}

void ShuffleRegistry::Duplicate(const std::string& id, size_t first, size_t second) {
  // Two copies (directories moved by hand?): which one is right is not known, so neither
  // serves; both are kept as found, and a delete removes both.
  spdlog::error(
      "event=duplicate_shuffle tenant={} shuffle={} dirs={},{} error=\"the shuffle is in two "
      "data directories; move one copy away and restart, or delete the shuffle\"",
      TenantField(id), id, dirs_[first]->path, dirs_[second]->path);
  extra_homes_.emplace(id, second);
  if (auto it = shuffles_.find(id); it != shuffles_.end()) {
    DamagedShuffle d{it->second->params(), absl::OkStatus()};
    shuffles_.erase(it);
    damaged_.emplace(id, std::move(d));
  }
  auto& d = damaged_[id];
  if (d.params.num_partitions == 0) {  // (the first copy was listed, not opened)
    d.params =
        ShuffleStore::ReadParams(absl::StrCat(dirs_[first]->path, "/shuffles/", id), Shown(id))
            .value_or(ShuffleParams{});
  }
  d.params.shuffle_id = id;
  d.reason = absl::FailedPreconditionError(
      absl::StrCat("it is in data directories ", first + 1, " and ", second + 1,
                   "; move one copy away and restart the server, or delete the shuffle"));
}

void ShuffleRegistry::FailDirLocked(size_t index, const absl::Status& why) {
  Dir& d = *dirs_[index];
  if (!d.failed.ok()) return;
  d.failed = why.ok() ? absl::UnknownError("failed") : why;
  spdlog::error(
      "event=data_dir_failed dir={} index={} error=\"{}\" note=\"it takes no new shuffles until "
      "the "
      "server restarts; the other data directories serve on\"",
      d.path, index + 1, std::string(d.failed.message()));
}

std::vector<ShuffleRegistry::DataDir> ShuffleRegistry::DataDirs() const {
  std::vector<DataDir> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& d : dirs_) out.push_back(DataDir{d->path, d->failed});
    for (const auto& [id, index] : home_) {
      auto it = shuffles_.find(id);
      ++out[index].shuffles;
      if (it != shuffles_.end()) out[index].partitions += it->second->params().num_partitions;
    }
  }
  for (DataDir& d : out) {
    struct statvfs vfs {};
    struct stat st {};
    if (::statvfs(d.path.c_str(), &vfs) != 0 || ::stat(d.path.c_str(), &st) != 0) continue;
    d.space_known = true;
    d.free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    d.total_bytes = uint64_t{vfs.f_blocks} * vfs.f_frsize;
    d.device = static_cast<uint64_t>(st.st_dev);
  }
  return out;
}

std::string ShuffleRegistry::TmpDir() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& d : dirs_) {
    if (d->failed.ok()) return d->path + "/tmp";
  }
  return dirs_[0]->path + "/tmp";
}

uint32_t ShuffleRegistry::UsedPpm(const Dir& dir) const {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (now - dir.checked_ms.load() > 250) {
    struct statvfs vfs {};
    if (::statvfs(dir.path.c_str(), &vfs) == 0 && vfs.f_blocks > 0) {
      const double avail = static_cast<double>(vfs.f_bavail) / static_cast<double>(vfs.f_blocks);
      dir.used_ppm.store(static_cast<uint32_t>((1.0 - avail) * 1e6));
      dir.total_bytes.store(static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize);
      dir.checked_ms.store(now);
    }
  }
  return dir.used_ppm.load();
}

absl::Status ShuffleRegistry::CheckRoom(const std::string& id, uint32_t mark) const {
  if (mark == 0 || mark >= 100) return absl::OkStatus();
  size_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = home_.find(id);
    if (it == home_.end()) return absl::OkStatus();
    index = it->second;
  }
  double used_pct = UsedPpm(*dirs_[index]) / 1e4;
  if (used_pct <= mark) return absl::OkStatus();
  absl::Status made;  // (with the object tier: eviction first)
  if (room_maker_) {
    made = room_maker_();
    dirs_[index]->checked_ms.store(-1000000);  // (looked at again now)
    used_pct = UsedPpm(*dirs_[index]) / 1e4;
    if (used_pct <= mark) return absl::OkStatus();
  }
  const std::string which = dirs_.size() == 1
                                ? std::string("the data directory's")
                                : absl::StrCat("data directory ", index + 1, "'s (of ",
                                               dirs_.size(), ", where this shuffle lives)");
  return PastMark(which, used_pct, mark, made);
}

absl::Status ShuffleRegistry::PastMark(const std::string& which, double used_pct, uint32_t mark,
                                       const absl::Status& made) {
  const std::string full =
      absl::StrCat(which, " file system is ", static_cast<int>(used_pct * 10) / 10.0,
                   "% full, past the high-water mark of ", mark, "% (--disk_high_water_pct)");
  if (absl::IsUnavailable(made))
    return absl::UnavailableError(absl::StrCat(full, ": ", made.message()));
  if (!made.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(full, ": new pushes are refused until space is freed (", made.message(),
                     "); committed data is untouched"));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(full,
                   ": new pushes are refused until space is freed (delete finished shuffles); "
                   "committed data is untouched"));
}

size_t ShuffleRegistry::HomeIndex(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = home_.find(id);
  return it == home_.end() ? SIZE_MAX : it->second;
}

absl::Status ShuffleRegistry::CheckRoomFor(const std::string& id, uint64_t bytes,
                                           uint32_t mark) const {
  if (mark == 0 || mark >= 100) return absl::OkStatus();
  size_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = home_.find(id);
    if (it == home_.end()) return absl::OkStatus();
    index = it->second;
  }
  const Dir& dir = *dirs_[index];
  const double used_pct = UsedPpm(dir) / 1e4;
  const uint64_t total = dir.total_bytes.load();
  if (total == 0) return absl::OkStatus();  // (statvfs never answered: nothing to go by)
  const double after_pct =
      used_pct + 100.0 * static_cast<double>(bytes) / static_cast<double>(total);
  if (after_pct <= mark) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "no room on the disk for ", bytes, " bytes now: the data directory's file system is ",
      static_cast<int>(used_pct * 10) / 10.0, "% full and would be ",
      static_cast<int>(after_pct * 10) / 10.0, "%, past ", mark, "%"));
}

std::vector<size_t> ShuffleRegistry::CreationOrderLocked() const {
  struct Candidate {
    size_t index;
    bool past_mark;
    uint64_t partitions;
    uint32_t used_ppm;
  };
  std::vector<Candidate> c;
  for (size_t i = 0; i < dirs_.size(); ++i) {
    if (!dirs_[i]->failed.ok()) continue;
    const uint32_t used = dirs_.size() == 1 ? 0 : UsedPpm(*dirs_[i]);
    const uint32_t mark = high_water_pct_.load();
    c.push_back({i, mark > 0 && mark < 100 && used / 1e4 > mark, 0, used});
  }
  if (c.size() > 1) {
    for (const auto& [id, store] : shuffles_) {
      const size_t home = home_.at(id);
      for (Candidate& x : c) {
        if (x.index == home) x.partitions += store->params().num_partitions;
      }
    }
  }
  std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    if (a.past_mark != b.past_mark) return !a.past_mark;
    if (a.partitions != b.partitions) return a.partitions < b.partitions;
    return a.used_ppm < b.used_ppm;
  });
  std::vector<size_t> order;
  for (const Candidate& x : c) order.push_back(x.index);
  return order;
}

absl::StatusOr<uint64_t> ShuffleRegistry::Evict(const std::string& id) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<ShuffleStore> store, Get(id));
  std::vector<std::string> trash;
  std::shared_ptr<ShuffleStore> old;
  uint64_t freed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = shuffles_.find(id);
    // In use: the registry's and this call's are the only holders of an idle store.
    if (it == shuffles_.end() || it->second != store || store.use_count() > 2 || store->wedged() ||
        !store->DamagedPartitions().empty() || extra_homes_.count(id) != 0 ||
        home_.count(id) == 0 || !dirs_[home_.at(id)]->failed.ok()) {
      return 0;
    }
    for (uint32_t q = 0; q < store->params().num_partitions; ++q) freed += store->Stats(q).bytes;
    freed += store->merged_bytes();
    if (freed == 0 && store->evicted() != nullptr) return 0;
    // The evicted shuffle's directory is made beside it under a trash name (a crash leaves
    // nothing a start takes for a shuffle), then put in its place with two renames.
    const std::string root = absl::StrCat(dirs_[home_.at(id)]->path, "/shuffles");
    const std::string staged = absl::StrCat(root, "/.trash-evict-", id, "-", ++trash_counter_);
    const std::string dir = absl::StrCat(root, "/", id);
    const EvictedSummary summary = store->SummaryForEviction();
    {
      absl::StatusOr<std::unique_ptr<ShuffleStore>> made =
          ShuffleStore::Create(staged, Shown(id), store->params(), OptionsForLocked(id), &summary);
      if (!made.ok() && absl::IsResourceExhausted(made.status())) {
        // A disk full to the last block: the reserve makes room for the eviction's few files.
        (void)file::RemoveTree(staged);
        ::unlink(ReservePath(home_.at(id)).c_str());
        made = ShuffleStore::Create(staged, Shown(id), store->params(), OptionsForLocked(id),
                                    &summary);
      }
      if (!made.ok()) {
        (void)file::RemoveTree(staged);
        return made.status();
      }
    }  // (closed: opened again in its place)
    // A server without etcd keeps its record of the objects with the shuffle.
    if (absl::StatusOr<std::string> objects = store->ReadObjectsFile(); objects.ok()) {
      if (absl::Status st =
              file::WriteFileAtomically(staged, kObjectsFile, Bytes(*objects), Shown(id));
          !st.ok()) {
        (void)file::RemoveTree(staged);
        return st;
      }
    }
    SLUICE_ASSIGN_OR_RETURN(trash, MoveToTrash(id));
    if (absl::Status st = file::Rename(staged, dir, Shown(id)); !st.ok()) {
      (void)file::Rename(trash.front(), dir, Shown(id));  // (the shuffle as it was)
      (void)file::RemoveTree(staged);
      return st;
    }
    (void)file::SyncDir(root, "shuffles");
    absl::StatusOr<std::unique_ptr<ShuffleStore>> opened =
        ShuffleStore::Open(dir, Shown(id), OptionsForLocked(id));
    if (!opened.ok()) {
      // (Not expected: it was just made. The shuffle is then reported damaged, as at a start.)
      damaged_[id] = DamagedShuffle{store->params(), opened.status()};
      store->MarkDeleted();
      shuffles_.erase(it);
      old = std::move(store);
    } else {
      (*opened)->SetLastUsed(store->last_used());
      store->MarkDeleted();  // (nobody else holds it)
      old = std::move(it->second);
      it->second = std::shared_ptr<ShuffleStore>(std::move(opened).value());
    }
  }
  old.reset();
  store.reset();
  for (const std::string& t : trash) {
    SLUICE_RETURN_IF_ERROR(file::RemoveTree(t, absl::StrCat(Shown(id), " (evicted)")));
  }
  KeepEvictReserves();  // (made again, now that there is room)
  spdlog::info("event=evicted tenant={} shuffle={} bytes={}", TenantField(id), id, freed);
  return freed;
}

std::string ShuffleRegistry::ReservePath(size_t index) const {
  return absl::StrCat(dirs_[index]->path, "/evict-reserve");
}

void ShuffleRegistry::KeepEvictReserves() {
  std::vector<std::string> paths;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < dirs_.size(); ++i) {
      if (dirs_[i]->failed.ok()) paths.push_back(ReservePath(i));
    }
  }
  for (const std::string& path : paths) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 &&
        static_cast<uint64_t>(st.st_blocks) * 512 >= kEvictReserve) {
      continue;
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) continue;
    const bool made = ::posix_fallocate(fd, 0, static_cast<off_t>(kEvictReserve)) == 0;
    ::close(fd);
    if (!made) ::unlink(path.c_str());  // (no room for it now: the next eviction tries again)
  }
}

}  // namespace sluice
