// FetchStream: the policy of one fetch stream, apart from any transport. The gRPC reactor
// (server/service/fetch_reactor.cc) converts the request, and does what the answers say: run
// work on the fetch or merge pool, write the chunk built (watching its reader's stall deadline
// and, for a KEY fetch, when to look at parking its merge), finish, or cancel the call. Tests
// drive the same session with a fake clock and a fake host (tests/server/fetch_stream_test.cc).
//
//   auto stream = FetchStream::Make(spec, options, call, deps, &host, &chunk);
//   Do((*stream)->Start());                       // kWork: set up on a pool
//   ... on that pool:        Do(stream->Work());   // kWrite (the chunk), kFinish, or a wait
//   ... once a write is done: Do(stream->Written(ok));
//   ... at the stall deadline: Do(stream->Expired());   // kCancel
//   ... at a park check:      next = stream->ParkCheck();
//
// What it decides (docs/api.md, "Fetch"; docs/operations.md, "Memory"):
//   - Admission: the stream's slots (StreamAdmission), taken by Make; a KEY fetch's merge slot
//     before it merges; a merge not started yet waits its turn while the budget is full.
//   - Setup: the cluster's part (ClusterNode::PrepareToServe) and the partition's read
//     (FetchSession), on the merge pool for a KEY fetch, else on the fetch pool.
//   - Memory: an UNORDERED fetch reads its next stored frame once the budget has room for it
//     and the transport's copy of it (room that leaves a share for other tenants); a merge
//     charges the budget as it goes. A chunk is charged until its reader takes it.
//   - Deadlines: a reader takes each chunk within --fetch_stall_timeout_s or the call is
//     cancelled. A KEY fetch whose reader stalls gives its merge slot and memory up (parks)
//     after --merge_park_after_s while another fetch waits for a slot, after kOverSharePark
//     when its tenant holds more than its share of slots and a tenant under its share waits;
//     it merges again from where it was (skipping what it sent, over the same mappers) once
//     its reader reads.
//   - The caller's credentials again, at most once per StreamTimeouts::caller_recheck as
//     chunks go; the counters and the first chunk's report (the mappers read, the range).
//
// Threads: one step is out at a time (the transport does what it says before calling again);
// Work runs on the pool a kWork names; a wait's next step comes through Host::Resume on a pool.
// Expired and ParkCheck come on the watchdog's thread while a write is out: the transport
// serialises ParkCheck with StopParking.
#ifndef SLUICE_SERVER_RULES_FETCH_STREAM_H_
#define SLUICE_SERVER_RULES_FETCH_STREAM_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/rules/fetch_session.h"
#include "server/rules/stream_deps.h"
#include "server/rules/stream_phase.h"
#include "server/runtime/clock.h"
#include "server/security/call_context.h"

namespace sluice {

/// What a fetch asks beyond the read itself.
struct FetchStreamOptions {
  bool report_mappers = false;   ///< the first chunk carries the mappers read, and attempts
  uint32_t placement_epoch = 0;  ///< the epoch the reader routes by (0: not said)
};

class FetchStream {
 public:
  /// A stalled KEY fetch parks sooner than --merge_park_after_s when its tenant holds more than
  /// its share of merge slots while a tenant under its share waits for one.
  static constexpr std::chrono::milliseconds kOverSharePark{200};
  /// How often a stalled KEY fetch looks again at whether to park.
  static constexpr std::chrono::milliseconds kParkRecheck{100};

  enum class Pool {
    kFetch,  ///< the worker pool (setup, UNORDERED reads)
    kMerge,  ///< the merge pool (KEY fetches' setup and merges, which can run long)
  };

  /// What the transport does next.
  struct Step {
    enum class Do {
      kNothing,  ///< nothing now: a wait's step comes through Host::Resume, or none is due
      kWork,     ///< run Work() on `pool`
      kWrite,    ///< write the chunk (with the end of the stream when `last`); call Expired()
                 ///< if its reader has not taken it by `deadline`; ParkCheck() at `park_check`
                 ///< when set
      kFinish,   ///< end the stream with `status`
      kCancel,   ///< cancel the call (its reader stalled): the write out completes as failed
    };
    Step() = default;
    explicit Step(Do what) : what(what) {}
    Do what = Do::kNothing;
    Pool pool = Pool::kFetch;
    Clock::time_point deadline{};
    std::optional<Clock::time_point> park_check;
    bool last = false;
    absl::Status status;
  };

  /// What the chunk written carries besides its frame (with the first chunk only).
  struct Report {
    bool key_range = false;                           ///< it read a key range
    const std::vector<uint32_t>* mappers = nullptr;   ///< the mappers read (report_mappers)
    const std::vector<uint64_t>* attempts = nullptr;  ///< and their attempts
  };

  /// What the session asks of its transport.
  class Host {
   public:
    virtual ~Host() = default;
    /// A step decided after a wait (for the budget, for a merge slot), on a pool.
    virtual void Resume(Step step) = 0;
    /// The caller's credentials again (OK while they still name the tenant and role the stream
    /// opened with); `then` ends the refusal's message.
    virtual absl::Status CheckCaller(absl::string_view then) = 0;
  };

  /// Admits a fetch of `spec` (its shuffle as the caller names it) for `call`: the caller's
  /// refusal (NOT_FOUND or PERMISSION_DENIED for another tenant's shuffle), RESOURCE_EXHAUSTED
  /// naming a full quota or limit. Chunks are built in `*chunk`, which the transport writes;
  /// `deps`, `host` and `chunk` outlive the session.
  static absl::StatusOr<std::unique_ptr<FetchStream>> Make(FetchSpec spec,
                                                           FetchStreamOptions options,
                                                           const CallContext& call,
                                                           const StreamDeps& deps, Host* host,
                                                           std::string* chunk);
  ~FetchStream();
  FetchStream(const FetchStream&) = delete;
  FetchStream& operator=(const FetchStream&) = delete;

  /// The first step: set up on a pool (a KEY fetch waits for the budget first while it is full).
  Step Start();
  /// On the pool the last kWork named.
  Step Work();
  /// The chunk written was taken by its reader (`ok`), or the stream broke (not `ok`).
  Step Written(bool ok);
  /// The last kWrite's deadline passed: kCancel if the reader had not taken the chunk and it is
  /// due by the clock (the write out then completes, not `ok`); nothing otherwise.
  Step Expired();
  /// A park check (the watchdog's thread, while a KEY chunk is out): parks the merge when it
  /// should, and says when to look again (nullopt: no more checks for this chunk).
  std::optional<Clock::time_point> ParkCheck();
  /// The chunk out was taken, or the stream ends: no park from now on (call before Written,
  /// serialised with ParkCheck).
  void StopParking();
  /// The client cancelled the call: a merge's intermediate passes stop.
  void Cancel() { cancelled_.store(true); }

  /// What the chunk of the last kWrite carries besides its frame.
  const Report& report() const { return report_; }
  /// The shuffle's id as the server keeps it (the tenant's prefix on it).
  const std::string& shuffle_id() const { return spec_.shuffle_id; }
  /// Whether the merge is parked now (its reader stalled; slot and memory given up).
  bool parked() const;

 private:
  FetchStream(FetchSpec spec, FetchStreamOptions options, const CallContext& call,
              const StreamDeps& deps, Host* host, std::string* chunk);
  Step SetUp();
  Step WhenRoom(bool on_pool);
  Step NextChunk();
  Step Finish(const absl::Status& st);
  absl::Status StillAdmitted();
  absl::Status Resume();
  void EndSession();
  void CountChunk();
  void Park(Clock::duration stalled, bool over_share);

  FetchSpec spec_;  // its shuffle id as the server keeps it
  const FetchStreamOptions options_;
  const CallContext call_;
  const StreamDeps& deps_;
  Host* const host_;
  std::string* const chunk_;
  std::unique_ptr<StreamAdmission> admission_;
  std::atomic<bool> cancelled_{false};
  std::unique_ptr<FetchSession> session_;
  bool set_up_ = false;
  bool report_range_;    // the first chunk still to say that it read a key range
  bool report_mappers_;  // ... and to carry the session's mappers
  Report report_;
  StreamPhase phase_;
  std::atomic<Clock::rep> deadline_{0};  // the stall deadline of the chunk out
  Clock::time_point checked_;            // when the credentials were last checked
  uint64_t records_sent_ = 0;            // in the chunks built so far
  // Parking (KEY): the merge given up while the reader stalls.
  mutable std::mutex park_mu_;
  bool write_pending_ = false;         // a chunk is out, its reader has not taken it
  Clock::time_point stalled_since_{};  // when the chunk out was written
  bool parked_ = false;
  std::vector<uint32_t> parked_mappers_;   // the mappers the merge was over
  std::vector<uint64_t> parked_attempts_;  // and their attempts
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_FETCH_STREAM_H_
