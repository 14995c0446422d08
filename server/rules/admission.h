// Admission: everything one call takes of what the server shares (docs/operations.md,
// "Limits"), held by one object that gives it all back in its destructor; handlers never
// release by hand.
//
// A stream (StreamAdmission) holds a slot of its tenant's open streams (--tenant_max_streams,
// or its quota line) and of the server's (--max_push_streams, --max_fetch_streams); then, as
// it goes, the memory budget of the message being handled (Charge), a large frame's announced
// size (its memory and its tenant's stored-bytes quota, ReserveLargeFrame) and, for a KEY
// fetch, a merge slot (the merge gate). Waits for memory or a slot hold nothing of the budget
// and resume on the pool. A create (CreateAdmission) holds its tenant's create lock while the
// tenant's shuffle quota is counted and taken.
//
//   SLUICE_ASSIGN_OR_RETURN(auto admitted,
//                           StreamAdmission::Enter(StreamKind::kPush, call, deps));
//   admitted->Charge(message.ByteSizeLong());
//   ... handle the message ...
//   admitted->ReleaseCharge();
//   admitted->WhenBudgetAllows([this] { ReadNext(); });
//
// Not thread-safe: a stream uses its admission from one callback at a time. An admission must
// not be destroyed while it waits (for the budget to grant a large frame, for a merge slot):
// its stream is idle then, and ends only once the wait is over.
#ifndef SLUICE_SERVER_RULES_ADMISSION_H_
#define SLUICE_SERVER_RULES_ADMISSION_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/runtime/memory_budget.h"
#include "server/security/call_context.h"
#include "server/security/tenancy.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

class ClusterNode;

enum class StreamKind { kPush, kFetch };

/// When a draining server tells a push to retry: by then it has restarted (a rolling restart's
/// server is back within a few seconds) or left the cluster's list, and the attempt goes to a
/// server that takes it (docs/api.md, "Errors and retries").
inline constexpr std::chrono::milliseconds kDrainRetryAfter{2000};

/// The server's open push and fetch streams and their limits.
class OpenStreams {
 public:
  /// `max_plain_push`: of the push streams, plain ones (StreamAdmission::EnterPlainPush).
  OpenStreams(size_t max_push, size_t max_fetch, size_t max_plain_push = 16)
      : max_push_(max_push), max_fetch_(max_fetch), max_plain_push_(max_plain_push) {}
  size_t push() const { return push_.load(); }
  size_t plain_push() const { return plain_push_.load(); }
  size_t fetch() const { return fetch_.load(); }
  size_t total() const { return push() + fetch(); }

 private:
  friend class StreamAdmission;
  // Takes a slot of `kind` if one is free, else RESOURCE_EXHAUSTED naming the limit's flag.
  absl::Status Take(StreamKind kind);
  void Give(StreamKind kind);

  const size_t max_push_, max_fetch_, max_plain_push_;
  std::atomic<size_t> push_{0}, fetch_{0}, plain_push_{0};
};

/// What admissions take from.
struct AdmissionDeps {
  Tenants* tenants = nullptr;
  OpenStreams* streams = nullptr;
  MemoryBudget* budget = nullptr;
  Gate* merge_gate = nullptr;           ///< KEY merges at once (--max_concurrent_merges)
  ShuffleRegistry* registry = nullptr;  ///< the bytes each tenant's shuffles hold
  const ClusterNode* node = nullptr;    ///< whether it drains (no new pushes)
};

class StreamAdmission {
 public:
  /// A stream of `kind` for `call`: UNAVAILABLE while the server drains (a push), else
  /// RESOURCE_EXHAUSTED naming the quota or limit that is full; holds nothing then.
  static absl::StatusOr<std::unique_ptr<StreamAdmission>> Enter(StreamKind kind,
                                                                const CallContext& call,
                                                                const AdmissionDeps& deps);
  ~StreamAdmission();
  StreamAdmission(const StreamAdmission&) = delete;
  StreamAdmission& operator=(const StreamAdmission&) = delete;

  // The memory budget.
  /// Counts the message being handled (always granted: it is in memory already).
  void Charge(uint64_t bytes);
  /// Gives the message's charge back.
  void ReleaseCharge();
  /// Runs `resume` on the pool once the budget has room (holding no charge meanwhile).
  void WhenBudgetAllows(std::function<void()> resume);
  /// Whether a newcomer would wait for the budget now.
  bool BudgetMustWait() const;
  /// Counts the stream among the plain Push streams (clients that send without credit) until
  /// the admission ends: RESOURCE_EXHAUSTED naming --max_plain_push_streams when that many are
  /// open (what gRPC holds of them is outside the budget, so their number is bounded).
  absl::Status EnterPlainPush();

  // Credit (PushFlow): memory reserved before the client sends the message it is for. All
  /// in message bytes; the budget is charged kCreditCopies times that: gRPC's copy of a message
  /// (the bytes it received, until it is parsed) and the parsed one being handled.
  static constexpr uint64_t kCreditCopies = 2;
  /// Reserves credit for a `bytes`-byte message at once if it may (true), as Reserve would.
  bool TryReserveCredit(uint64_t bytes);
  /// Runs `granted` on the pool once credit for a `bytes`-byte message is reserved (fairly,
  /// as Reserve). Asked for holding no charge (ReleaseCharge first).
  void ReserveCredit(uint64_t bytes, std::function<void()> granted);
  /// Credit granted but not used yet, in message bytes; it is given back with the admission.
  uint64_t credit() const { return credit_; }
  /// A `bytes`-byte message came within the credit: its reservation becomes its charge
  /// (ReleaseCharge gives it back). False, with nothing changed, past the credit.
  bool UseCredit(uint64_t bytes);

  // The tenant's stored-bytes quota (its stores count what they hold into its total).
  /// RESOURCE_EXHAUSTED when `bytes` more would take the tenant past its quota.
  absl::Status CheckStored(uint64_t bytes);

  // A frame larger than a message, announced by its size and sent in pieces.
  /// Counts `bytes` against the tenant's stored-bytes quota at once (RESOURCE_EXHAUSTED past
  /// it), then runs `granted` on the pool once the budget has promised all of them: no number
  /// of streams announcing at once takes the server past its budget by more than a message
  /// each. The promise is firm only for the bytes that came (LargeFrameArrived); the rest may
  /// be taken back for another tenant while this one is over its share. Asked for holding no
  /// charge (ReleaseCharge first), or it could wait on itself.
  absl::Status ReserveLargeFrame(uint64_t bytes, std::function<void()> granted);
  /// Whether a large frame's reservation is asked for or held (until ReleaseLargeFrame).
  bool holds_large_frame() const { return large_bytes_ != 0; }
  /// `n` more bytes of the frame came. False when the rest of its promise was taken back for
  /// another tenant: PromiseRestOfLargeFrame before the next piece is read.
  bool LargeFrameArrived(uint64_t n);
  /// Runs `granted` on the pool once the rest of the frame is promised again.
  void PromiseRestOfLargeFrame(std::function<void()> granted);
  /// Gives the frame's memory and quota bytes back (it is complete, or the attempt failed).
  void ReleaseLargeFrame();

  /// Runs `granted` on the pool once `bytes` fit in the budget, charged as by Charge: for what
  /// waits on the stream's client (a chunk until its reader takes it), which leaves a share of
  /// the budget free for the next tenant (MemoryBudget::ReserveLeavingShare).
  void ReserveChargeForReader(uint64_t bytes, std::function<void()> granted);
  /// The same, taken at once when it may be (true), for a caller already on the pool.
  bool TryReserveChargeForReader(uint64_t bytes);
  /// Makes the charge `bytes` (what the message being handled holds now).
  void Recharge(uint64_t bytes);
  const std::string& tenant() const { return tenant_; }

  // The merge gate (KEY fetches).
  /// Takes a merge slot if one is free and nobody waits for one.
  bool TryEnterMerge();
  /// Runs `admitted` on the pool once a merge slot is taken.
  void EnterMerge(std::function<void()> admitted);
  /// Gives the merge slot back before the stream ends (a fetch whose reader stalls).
  void LeaveMerge();
  /// Whether another fetch waits for a merge slot now.
  bool OthersWaitForMerge() const;
  /// Whether this stream's tenant holds more than its share of merge slots while a tenant
  /// under its share waits for one.
  bool OverShareOfMerges() const;

 private:
  StreamAdmission(StreamKind kind, const CallContext& call, const AdmissionDeps& deps)
      : kind_(kind), tenant_(call.tenant()), limits_(call.limits()), deps_(deps) {}
  // RESOURCE_EXHAUSTED: `bytes` more on the `held` the tenant's stores hold pass its quota.
  absl::Status QuotaRefusal(uint64_t held, uint64_t bytes) const;

  const StreamKind kind_;
  const std::string tenant_;
  const TenantLimits limits_;
  const AdmissionDeps deps_;
  bool tenant_slot_ = false, server_slot_ = false, plain_slot_ = false;
  uint64_t charged_ = 0;
  uint64_t credit_ = 0;  // message bytes reserved, not received yet (PushFlow)
  std::shared_ptr<std::atomic<int64_t>> stored_;  // the tenant's stored bytes, with a quota
  uint64_t large_bytes_ = 0;                      // the large frame's size, once asked for
  uint64_t quota_reserved_ = 0;                   // of stored_, for the large frame
  MemoryBudget::Frame frame_;                     // its memory
  bool merge_slot_ = false;
  std::atomic<bool> waiting_{false};  // a Reserve or EnterMerge callback is outstanding
};

/// A create's hold on its tenant's shuffle quota: the tenant's creates are serialised while
/// one counts its shuffles and takes one, so that racing creates cannot pass the quota together.
class CreateAdmission {
 public:
  /// `have(prefix)`: the tenant's shuffles a create would add to (0 when it exists already).
  /// RESOURCE_EXHAUSTED naming the quota when the tenant has its quota's worth; holds its lock
  /// until destroyed otherwise. Admins and tenants without a shuffle quota take nothing.
  static absl::StatusOr<std::unique_ptr<CreateAdmission>> Enter(
      const CallContext& call, Tenants* tenants, bool clustered,
      const std::function<absl::StatusOr<size_t>(const std::string& prefix)>& have);

 private:
  CreateAdmission() = default;
  std::shared_ptr<std::mutex> mu_;
  std::unique_lock<std::mutex> lock_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_ADMISSION_H_
