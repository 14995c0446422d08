// ShuffleRegistry: the server's shuffles, by id, each backed by a ShuffleStore directory under
// <data_dir>/shuffles/ of one of the server's data directories (one per disk). On start it
// lists the shuffle directories it finds in each and opens (recovers) them all, or, with
// Opening::kLazy, none yet: a listed shuffle is opened when first asked for (Get and the other
// calls by id) or by OpenNextListed (the server's background opener). A data directory that cannot
// be opened or listed, or where creating a shuffle fails for a reason other than a full disk, is
// *failed*: logged, reported (DataDirs), given no new shuffles; the others serve on. One found
// full at start is not failed: its shuffles are opened and read, and its writes fail with
// RESOURCE_EXHAUSTED until space is freed (event=data_dir_full). New
// shuffles go to the healthy directory with the fewest partitions (ties: the most free space),
// skipping those past the disk high-water mark while any other is below it.
// A shuffle that fails recovery is kept as *damaged*: its files stay as they are, it is listed
// with the reason, its data calls fail with DATA_LOSS, its id stays taken, and Delete removes
// it. The others keep serving.
#ifndef SLUICE_SERVER_STORAGE_SHUFFLE_REGISTRY_H_
#define SLUICE_SERVER_STORAGE_SHUFFLE_REGISTRY_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/storage/shuffle_store.h"

namespace sluice {

/// A shuffle whose recovery failed at start.
struct DamagedShuffle {
  ShuffleParams params;  ///< shuffle_id always; the rest when its parameters could be read
  absl::Status reason;   ///< with paths relative to the data directory
};

class ShuffleRegistry {
 public:
  /// When the shuffles found at start are opened: all within Open, or on first use and by
  /// OpenNextListed.
  enum class Opening { kAll, kLazy };
  /// Opens the data directories (creating them if needed) and recovers every shuffle in them.
  /// A shuffle whose recovery fails is logged (event=recovery_failed, with its data directory)
  /// and kept as damaged. Fails only when no data directory can be used; `data_dirs` must not
  /// be empty.
  static absl::StatusOr<std::unique_ptr<ShuffleRegistry>> Open(
      const std::vector<std::string>& data_dirs, const StoreOptions& options,
      Opening opening = Opening::kAll);
  static absl::StatusOr<std::unique_ptr<ShuffleRegistry>> Open(const std::string& data_dir,
                                                               const StoreOptions& options,
                                                               Opening opening = Opening::kAll) {
    return Open(std::vector<std::string>{data_dir}, options, opening);
  }

  /// A data directory as the registry sees it.
  struct DataDir {
    std::string path;
    absl::Status failed;  ///< OK while it serves; the reason once failed
    size_t shuffles = 0;
    uint64_t partitions = 0;
    /// Its file system, as statvfs and stat saw it now (space_known false if they failed).
    bool space_known = false;
    uint64_t free_bytes = 0, total_bytes = 0;
    uint64_t device = 0;  ///< st_dev: directories on one file system share it
  };
  /// Each data directory's state, shuffles and space (the space read outside the lock).
  std::vector<DataDir> DataDirs() const;
  /// Where KEY merges spill: `tmp` of the first healthy data directory (emptied by the server
  /// at start).
  std::string TmpDir() const;
  /// New pushes to shuffle `id` stop while its data directory's file system is fuller than
  /// `mark` percent (0 or 100 = never): RESOURCE_EXHAUSTED naming the mark. statvfs at most
  /// every 250 ms per directory. A shuffle not held here: OK (its push fails on its own).
  absl::Status CheckRoom(const std::string& id, uint32_t mark) const;
  /// Whether `bytes` more written into shuffle `id`'s data directory keep its file system at
  /// most `mark` percent full (background work asks before it writes what it plans:
  /// RESOURCE_EXHAUSTED naming both when they would not).
  absl::Status CheckRoomFor(const std::string& id, uint64_t bytes, uint32_t mark) const;
  /// With the object tier: what CheckRoom calls when a shuffle's directory is past the mark,
  /// before it refuses (Evictor::MakeRoom): the refusal stands unless the directory is below the
  /// mark after it; its UNAVAILABLE (room is coming: retry) makes the refusal UNAVAILABLE, its
  /// other errors are named in it. Set before the server serves.
  void set_room_maker(std::function<absl::Status()> f) { room_maker_ = std::move(f); }
  /// The data directory (an index of DataDirs()) shuffle `id` lives in; SIZE_MAX if none.
  size_t HomeIndex(const std::string& id) const;
  /// The mark new shuffles' placement avoids (see above).
  void set_high_water_pct(uint32_t pct) { high_water_pct_ = pct; }

  /// Creates a shuffle, or returns created=false when one with the same parameters exists.
  absl::StatusOr<bool> Create(const ShuffleParams& params);
  /// NOT_FOUND for an unknown id, DATA_LOSS for a damaged shuffle. A shuffle listed at start
  /// and not opened yet is opened first (by this call, or it waits for the one opening it).
  absl::StatusOr<std::shared_ptr<ShuffleStore>> Get(const std::string& id);
  /// Get for a push attempt, counted as a writer of the store (call EndWriter on it when the
  /// attempt ends). A wedged store (a failed disk write stopped its commit log) that no push is
  /// writing to any more is reopened first: its log and committed blocks are re-verified and
  /// every byte no commit owns (the refused attempt's too) is reclaimed, as at a start. While
  /// pushes still write to it: UNAVAILABLE, retry. If re-verifying finds damage, the shuffle
  /// becomes damaged (DATA_LOSS).
  absl::StatusOr<std::shared_ptr<ShuffleStore>> GetForWriting(const std::string& id);
  /// The open shuffles (not those listed at start and not opened yet, nor those closed). Each
  /// one held counts as in use (it is not closed for room): a walk uses ForEachOpen.
  std::vector<std::shared_ptr<ShuffleStore>> List() const;
  /// Calls `fn` on each shuffle open when it is called and still open when its turn comes,
  /// holding only that one meanwhile (a background walk, preempted halfway, must not keep every
  /// store from being closed for room). Not under the registry's lock: `fn` may call it.
  void ForEachOpen(const std::function<void(const std::shared_ptr<ShuffleStore>&)>& fn) const;
  /// How many shuffles are open now.
  size_t open_count() const;
  /// Every shuffle's id, open or not (damaged ones apart), in order.
  std::vector<std::string> Ids() const;
  /// The shuffles not open now, in id order.
  std::vector<std::string> UnopenedIds() const;
  /// One shuffle of a listing page: open (`store`), damaged (`damaged`), or neither (not open
  /// now: listed at start, closed while idle, or being opened).
  struct Listed {
    std::string id;
    std::shared_ptr<ShuffleStore> store;
    std::optional<DamagedShuffle> damaged;
  };
  /// Up to `limit` shuffles with ids starting `prefix` and after `after`, in id order, each once
  /// and in the state it is in now: one look under the registry's lock, so that shuffles opening
  /// and closing meanwhile are neither missed nor listed twice (ListShuffles' pages).
  std::vector<Listed> ListPage(const std::string& prefix, const std::string& after,
                               size_t limit) const;
  /// A shuffle's parameters read from its SHUFFLE file, without opening it.
  absl::StatusOr<ShuffleParams> ReadParams(const std::string& id) const;
  std::optional<DamagedShuffle> FindDamaged(const std::string& id);
  /// Opens one shuffle listed at start and never opened since (the first by id); false when
  /// there is none left, or the open shuffles have reached half their limits
  /// (set_open_limits): the rest open when asked for.
  bool OpenNextListed();
  /// Opens the shuffles listed at start, as OpenNextListed.
  void OpenAllListed() {
    while (OpenNextListed()) {
    }
  }
  /// Shuffles not open now: listed at start and not opened yet, or closed while idle.
  size_t unopened() const { return unopened_count_.load(); }
  /// Those not open now whose last use (their listing at start, for those never opened) was
  /// before `before` (--shuffle_ttl_s: they expire too).
  std::vector<std::string> UnopenedIdleSince(std::chrono::steady_clock::time_point before) const;
  /// Deletes shuffle `id` if it is still not open and unused since before `before`; whether it
  /// did.
  bool DeleteIfUnopenedSince(const std::string& id, std::chrono::steady_clock::time_point before);

  /// How many shuffles may be open at once (each holds 2 descriptors and its index), and how
  /// much memory their indexes may take: past either, idle shuffles are closed, least recently
  /// used first (CloseIdle; and at once when a shuffle must open and the open ones are at their
  /// limit). A closed shuffle opens again, from its commit log, when it is next asked for.
  void set_open_limits(size_t max_open, uint64_t index_budget);
  /// Closes idle shuffles while either limit is passed (down to 15/16 of them). Idle: nothing
  /// holds it (no push, fetch, scrub or call in progress), no wedge, no damage found in it,
  /// neither opened nor used in the last kMinIdle. Returns how many it closed.
  size_t CloseIdle(std::chrono::steady_clock::time_point now);
  static constexpr std::chrono::milliseconds kMinIdle{2000};
  /// When a shuffle must open and the open ones are at their limit, those idle this long are
  /// closed for it.
  static constexpr std::chrono::milliseconds kMinIdleToMakeRoom{100};
  /// How far past the open limit shuffles stay open while those past it are in use (or were
  /// used in the last kMinIdleToMakeRoom): a quarter of the limit, at least 8.
  static size_t OvershootOf(size_t max_open) { return std::max<size_t>(max_open / 4, 8); }
  /// Memory the open shuffles' indexes take.
  uint64_t index_bytes() const { return static_cast<uint64_t>(index_total_->load()); }
  std::vector<DamagedShuffle> ListDamaged() const;
  /// Removes a shuffle, damaged or not.
  absl::Status Delete(const std::string& id);
  /// Lets an idle shuffle's data go (docs/object-store.md, "Disks as a cache"): its directory
  /// is replaced, atomically, by an evicted shuffle's (ShuffleStore::evicted()) that holds what
  /// its status reports and nothing else; its partitions are read back from their objects
  /// when asked for. The caller has made sure every partition held here is in the object store.
  /// The bytes it freed; 0 when it was not evicted: in use (held by a push, fetch or call), not
  /// open and not openable now, wedged or damaged, on more than one data directory, or an
  /// evicted shuffle holding nothing.
  absl::StatusOr<uint64_t> Evict(const std::string& id);
  /// Space each data directory keeps (a file, `evict-reserve`) for evictions on a disk full to
  /// its last block: an eviction that finds no room for its few files lets it go, and it is made
  /// again once there is room. Made by the first call (the Evictor's) and after each eviction.
  static constexpr uint64_t kEvictReserve = 1u << 20;
  void KeepEvictReserves();

  /// Bytes the tenant's shuffles hold here: each store adds the bytes of its blocks (committed,
  /// prepared and being pushed) as they change, and a push's admission reserves a large
  /// frame's size in it while the frame arrives. Made if needed. The tenant's shuffles not
  /// opened since the start are opened first (their bytes count once open).
  std::shared_ptr<std::atomic<int64_t>> TenantBytes(const std::string& tenant);
  /// Shuffles here whose ids start with `prefix` (a tenant's: "tenant~"), damaged ones
  /// included.
  size_t CountWithPrefix(const std::string& prefix) const;

  /// The id and the partition count within their limits (what Create checks first).
  static absl::Status ValidateParams(const ShuffleParams& params);

 private:
  struct Dir {
    std::string path;
    absl::Status failed;
    // How full its file system was when last looked at (parts per million), and when.
    mutable std::atomic<uint32_t> used_ppm{0};
    mutable std::atomic<int64_t> checked_ms{-1000000};
    mutable std::atomic<uint64_t> total_bytes{0};  // its file system's size, when last looked at
  };
  explicit ShuffleRegistry(StoreOptions options) : options_(options) {}
  // The eviction reserve of data directory `index`.
  std::string ReservePath(size_t index) const;
  // CheckRoom's refusal: `which` directory is `used_pct` full, past `mark`; `made`: what the
  // room maker said.
  static absl::Status PastMark(const std::string& which, double used_pct, uint32_t mark,
                               const absl::Status& made);
  std::function<absl::Status()> room_maker_;
  // Lists one data directory's shuffles (as unopened); an error fails the directory.
  absl::Status ListDir(size_t index);
  // Opens shuffle `id` if it is not open (listed at start, or closed while idle), or waits
  // while another call opens it. RESOURCE_EXHAUSTED or UNAVAILABLE (and it stays unopened) when
  // there is no room to open it; else the store this call opened (held: no other open closes
  // it before its caller has it), or null (it was open, is damaged now, or was not listed).
  absl::StatusOr<std::shared_ptr<ShuffleStore>> OpenListed(const std::string& id);
  // Under `lock` (of mu_), which it releases: deletes a shuffle that is not open.
  absl::Status DeleteUnopened(std::unique_lock<std::mutex>& lock, const std::string& id);
  // Under mu_: room for one more open shuffle `id`, when the open ones are at their limit: those
  // idle for kMinIdleToMakeRoom are closed (into *closed, let go of outside the lock); past the
  // limit's overshoot (OvershootOf) any that nobody holds. UNAVAILABLE when every open shuffle
  // is in use and the overshoot is reached.
  absl::Status MakeRoomLocked(const std::string& id,
                              std::vector<std::shared_ptr<ShuffleStore>>* closed);
  // Under mu_: descriptors for one more store (3 while it is made or opened), `open` being those
  // in use (`closed_counted`: counted before *closed were closed, so theirs are free now).
  // When short, idle shuffles nobody holds close (into *closed), least recently used first;
  // RESOURCE_EXHAUSTED, beginning with `what`, when that does not make room.
  absl::Status DescriptorRoomLocked(uint64_t open, bool closed_counted, const std::string& what,
                                    std::vector<std::shared_ptr<ShuffleStore>>* closed);
  // Under mu_: closes idle shuffles until at most `max_open` are open and their indexes take at
  // most `index_budget`; returns them (to be let go of outside the lock).
  std::vector<std::shared_ptr<ShuffleStore>> CloseIdleLocked(
      size_t max_open, uint64_t index_budget, std::chrono::steady_clock::time_point now,
      std::chrono::milliseconds min_idle);
  // Under mu_: the options of shuffle `id`'s store: its bytes counted to its tenant's total.
  StoreOptions OptionsForLocked(const std::string& id);
  std::shared_ptr<std::atomic<int64_t>> TenantBytesLocked(const std::string& tenant);
  // Under mu_: the shuffle's directory in its data directory.
  std::string ShuffleDirLocked(const std::string& id) const;
  // Under mu_: data directories to create a shuffle in, best first.
  std::vector<size_t> CreationOrderLocked() const;
  void FailDirLocked(size_t index, const absl::Status& why);
  // Parts per million of `dir`'s file system in use (cached 250 ms).
  uint32_t UsedPpm(const Dir& dir) const;
  // Renames the shuffle's directory (each copy's) away (the delete's atomic step); returns
  // where. UNAVAILABLE for a shuffle on a failed data directory.
  absl::StatusOr<std::vector<std::string>> MoveToTrash(const std::string& id);
  // A write, sync and remove of a probe file in `root`.
  static absl::Status ProbeWrite(const std::string& root);
  // Shuffle `id`'s directory as messages name it: relative to its data directory (clients see
  // messages, and are not told server paths).
  static std::string Shown(const std::string& id);
  // For a data directory that failed at start: its shuffles' ids, if it can be listed, are
  // kept taken (UNAVAILABLE) so that they are not created again elsewhere.
  void ReserveIds(size_t index, const std::string& root, const absl::Status& why);
  // Shuffle `id` found in data directories `first` and `second`: neither copy serves.
  void Duplicate(const std::string& id, size_t first, size_t second);
  // NOT_FOUND for `id`, saying which data directories failed (their shuffles are unknown).
  absl::Status NotFoundLocked(const std::string& id) const;

  const StoreOptions options_;
  std::atomic<uint32_t> high_water_pct_{0};
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Dir>> dirs_;  // fixed after Open; `failed` under mu_
  std::map<std::string, size_t> home_;      // id -> its data directory (shuffles and damaged)
  std::multimap<std::string, size_t> extra_homes_;  // more copies of an id (Duplicate)
  std::map<std::string, std::shared_ptr<ShuffleStore>> shuffles_;
  std::map<std::string, DamagedShuffle> damaged_;
  std::set<std::string> reopening_;  // wedged stores being reopened
  struct Unopened {
    int64_t held = 0;  // bytes it holds, still counted to its tenant (closed while idle)
    std::chrono::steady_clock::time_point last_used;
  };
  std::map<std::string, Unopened> unopened_;  // not open: listed at start, or closed
  std::set<std::string> never_opened_;        // of those, listed at start and not opened since
  size_t max_open_ = ~size_t{0};
  uint64_t index_budget_ = ~uint64_t{0};
  // The open stores' index bytes (each store adds its own).
  std::shared_ptr<std::atomic<int64_t>> index_total_ = std::make_shared<std::atomic<int64_t>>(0);
  std::set<std::string> opening_;  // being opened (OpenListed) outside the lock
  std::condition_variable opened_cv_;
  std::atomic<size_t> unopened_count_{0};  // unopened_ + opening_
  uint64_t open_fds_ = 0;  // descriptors in use, as counted at start plus the stores opened
  uint64_t trash_counter_ = 0;
  // Tenant -> the bytes its stores hold (they add to it themselves).
  std::map<std::string, std::shared_ptr<std::atomic<int64_t>>> tenant_bytes_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_STORAGE_SHUFFLE_REGISTRY_H_
