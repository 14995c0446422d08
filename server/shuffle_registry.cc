#include "server/shuffle_registry.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "codec/status_macros.h"
#include "server/file_util.h"
#include "spdlog/spdlog.h"

namespace sluice {

absl::Status ShuffleRegistry::ValidateId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id[0] == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("shuffle id '", id, "' must be 1-128 characters and not start with '.'"));
  }
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("shuffle id '", id, "' may only use letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

std::string ShuffleRegistry::ShuffleDir(const std::string& id) const {
  return absl::StrCat(data_dir_, "/shuffles/", id);
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
    const std::string& data_dir, const StoreOptions& options,
    std::map<std::string, absl::Status>* failed) {
  std::unique_ptr<ShuffleRegistry> reg(new ShuffleRegistry(data_dir, options));
  const std::string root = absl::StrCat(data_dir, "/shuffles");
  SLUICE_RETURN_IF_ERROR(file::MakeDirs(root));
  std::error_code ec;
  uint64_t open_fds = file::OpenFdCount();
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    if (!entry.is_directory()) continue;
    const std::string id = entry.path().filename().string();
    if (id.rfind(".trash-", 0) == 0) {  // a delete that a crash interrupted: finish it
      (void)file::RemoveTree(entry.path().string());
      continue;
    }
    if (!ValidateId(id).ok()) continue;  // not ours (or a leftover temp directory)
    // A start must come up whatever the limit: past it, shuffles are left unopened (and say
    // so) rather than taking the descriptors connections need.
    // (Counted as stores open, not listed each time: a start with 10,000 shuffles must not
    // list /proc/self/fd 10,000 times.)
    const absl::Status room =
        CheckFdHeadroom(open_fds, 3, absl::StrCat("shuffle '", id, "' was not opened at start"));
    absl::StatusOr<std::unique_ptr<ShuffleStore>> store =
        room.ok() ? ShuffleStore::Open(entry.path().string(), options)
                  : absl::StatusOr<std::unique_ptr<ShuffleStore>>(room);
    if (store.ok()) open_fds += (*store)->open_files();
    if (!store.ok()) {
      DamagedShuffle damaged;
      damaged.params =
          ShuffleStore::ReadParams(entry.path().string()).value_or(ShuffleParams{id, 0, 0});
      damaged.params.shuffle_id = id;
      damaged.reason = reg->WithRelativePaths(store.status());
      if (failed != nullptr) (*failed)[id] = store.status();  // for the log: full paths
      reg->damaged_.emplace(id, std::move(damaged));
      continue;
    }
    reg->shuffles_.emplace(id, std::shared_ptr<ShuffleStore>(std::move(store).value()));
  }
  if (ec) return file::ErrnoStatus(ec.value(), "list", root);
  return reg;
}

absl::Status ShuffleRegistry::ValidateParams(const ShuffleParams& params) {
  SLUICE_RETURN_IF_ERROR(ValidateId(params.shuffle_id));
  if (params.num_partitions == 0 || params.num_partitions > kMaxPartitions) {
    return absl::InvalidArgumentError(absl::StrCat("num_partitions must be 1 to ", kMaxPartitions,
                                                   ", not ", params.num_partitions));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShuffleRegistry::Create(const ShuffleParams& params) {
  SLUICE_RETURN_IF_ERROR(ValidateParams(params));
  // Counted before the lock: listing /proc/self/fd of a busy server takes milliseconds.
  const uint64_t open_fds = file::OpenFdCount();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto d = damaged_.find(params.shuffle_id); d != damaged_.end()) {
    return absl::AlreadyExistsError(
        absl::StrCat("shuffle '", params.shuffle_id, "' exists but is damaged (",
                     d->second.reason.message(), "); delete it to reuse the id"));
  }
  auto it = shuffles_.find(params.shuffle_id);
  if (it != shuffles_.end()) {
    const ShuffleParams& have = it->second->params();
    if (have.num_partitions == params.num_partitions && have.num_mappers == params.num_mappers) {
      return false;
    }
    return absl::AlreadyExistsError(absl::StrCat("shuffle '", params.shuffle_id,
                                                 "' already exists with ", have.num_partitions,
                                                 " partitions and ", have.num_mappers, " mappers"));
  }
  SLUICE_RETURN_IF_ERROR(CheckFdHeadroom(
      open_fds, 3, absl::StrCat("shuffle '", params.shuffle_id, "' was not created")));
  const std::string dir = ShuffleDir(params.shuffle_id);
  auto store = ShuffleStore::Create(dir, params, options_);
  if (!store.ok()) {
    // Nothing half-made stays behind (a directory a restart would find damaged).
    if (store.status().code() != absl::StatusCode::kAlreadyExists) (void)file::RemoveTree(dir);
    return WithRelativePaths(store.status());
  }
  shuffles_.emplace(params.shuffle_id, std::shared_ptr<ShuffleStore>(std::move(store).value()));
  return true;
}

absl::StatusOr<std::shared_ptr<ShuffleStore>> ShuffleRegistry::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shuffles_.find(id);
  if (it != shuffles_.end()) return it->second;
  if (auto d = damaged_.find(id); d != damaged_.end()) {
    if (d->second.reason.code() != absl::StatusCode::kDataLoss &&
        d->second.reason.code() != absl::StatusCode::kNotFound) {
      return absl::UnavailableError(
          absl::StrCat("shuffle '", id, "' is not open (", d->second.reason.message(), ")"));
    }
    return absl::DataLossError(absl::StrCat("shuffle '", id, "' is damaged and serves no data (",
                                            d->second.reason.message(),
                                            "); DeleteShuffle removes it"));
  }
  return absl::NotFoundError(absl::StrCat("shuffle '", id, "' not found"));
}

absl::StatusOr<std::shared_ptr<ShuffleStore>> ShuffleRegistry::GetForWriting(
    const std::string& id) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = shuffles_.find(id);
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
      return WithRelativePaths(store->WedgedError());
    }
    // Nobody writes to it: reopen it, outside the lock (it reads the whole shuffle back).
    reopening_.insert(id);
    lock.unlock();
    auto reopened = ShuffleStore::Open(ShuffleDir(id), options_);
    lock.lock();
    reopening_.erase(id);
    it = shuffles_.find(id);
    if (it == shuffles_.end() || it->second != store) continue;  // deleted or replaced meanwhile
    if (reopened.ok()) {
      spdlog::warn("event=shuffle_reopened shuffle={} committed_mappers={}", id,
                   (*reopened)->CommittedMappers().size());
      it->second = std::shared_ptr<ShuffleStore>(std::move(reopened).value());
      continue;  // and hand it out
    }
    spdlog::error("event=reopen_failed shuffle={} error=\"{}\"", id,
                  std::string(reopened.status().message()));
    if (reopened.status().code() == absl::StatusCode::kDataLoss) {
      DamagedShuffle damaged{store->params(), WithRelativePaths(reopened.status())};
      shuffles_.erase(it);
      damaged_.emplace(id, std::move(damaged));
      continue;  // DATA_LOSS from Get
    }
    return absl::UnavailableError(
        absl::StrCat("shuffle '", id,
                     "' stopped taking commits after a failed disk write, and re-verifying it "
                     "failed too (",
                     WithRelativePaths(reopened.status()).message(),
                     "); it is retried with the next push, or restart the server"));
  }
}

std::optional<DamagedShuffle> ShuffleRegistry::FindDamaged(const std::string& id) const {
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

absl::Status ShuffleRegistry::WithRelativePaths(const absl::Status& st) const {
  const std::string prefix = data_dir_ + "/";
  return absl::Status(st.code(), absl::StrReplaceAll(st.message(), {{prefix, ""}}));
}

absl::StatusOr<std::string> ShuffleRegistry::MoveToTrash(const std::string& id) {
  // One durable rename makes the delete atomic: after a crash the shuffle is either there
  // whole or gone (its trash is removed at the next start), and the id is free at once.
  std::string trash = absl::StrCat(data_dir_, "/shuffles/.trash-", id, "-", ++trash_counter_);
  SLUICE_RETURN_IF_ERROR(file::Rename(ShuffleDir(id), trash));
  SLUICE_RETURN_IF_ERROR(file::SyncDir(absl::StrCat(data_dir_, "/shuffles")));
  return trash;
}

std::vector<std::shared_ptr<ShuffleStore>> ShuffleRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ShuffleStore>> out;
  for (const auto& [id, store] : shuffles_) out.push_back(store);
  return out;
}

absl::Status ShuffleRegistry::Delete(const std::string& id) {
  std::string trash;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = shuffles_.find(id);
    auto d = damaged_.find(id);
    if (it == shuffles_.end() && d == damaged_.end()) {
      return absl::NotFoundError(absl::StrCat("shuffle '", id, "' not found"));
    }
    SLUICE_ASSIGN_OR_RETURN(trash, MoveToTrash(id));
    if (it != shuffles_.end()) {
      it->second->MarkDeleted();  // streams still holding it fail; their fds point into trash
      shuffles_.erase(it);
    } else {
      damaged_.erase(d);  // nothing holds a damaged shuffle's files
    }
  }
  return file::RemoveTree(trash);
}

}  // namespace sluice
