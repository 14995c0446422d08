// MemoryBudget: the server-wide byte budget of what clients make the server hold (push
// messages being handled, large frames being assembled, fetch chunks until sent, a merge's
// frames), shared fairly between tenants (docs/operations.md, "Memory").
//
// Counting. Memory already in hand is charged at once (Charge: a message that was read, a
// chunk that was built). A stream that finds the budget full does not read or build more: it
// parks a continuation (WhenAvailable, Reserve) that runs on the pool once there is room, and
// HTTP/2 flow control pushes back on its client meanwhile. Only callers that hold none of the
// budget while they wait may wait, or they could wait on themselves.
//
// Fair shares. A tenant is active while it holds or waits for memory; each active tenant's
// share is the limit divided by their number. A tenant may take more than its share while no
// tenant under its share waits (what the others do not use is lent). Once one waits, it goes
// first, and what the borrowers were promised but have not received is taken back for it.
//
// Large frames. A frame announced by its size (sent in pieces) is promised its whole size
// before a piece is read, so that frames being assembled never wait on each other's memory.
// Only the bytes that arrived are the tenant's for good: what is promised and has not come is
// taken back, down to the tenant's share, when a tenant under its share waits and that makes
// room for it (youngest promises first). The frame's stream reads on into what is left of its
// promise, then asks again for the rest (Promise) before it reads its next piece. So an
// announcement alone holds nothing another tenant needs.
//
// Waiters are served in order within the same standing (under their share or not), so a large
// request is not passed over by later small ones. Thread-safe.
#ifndef SLUICE_SERVER_RUNTIME_MEMORY_BUDGET_H_
#define SLUICE_SERVER_RUNTIME_MEMORY_BUDGET_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "server/runtime/worker_pool.h"

namespace sluice {

class MemoryBudget {
 public:
  /// One large frame's hold: the bytes that came, and the rest while promised. Owned by its
  /// stream; Drop it before it is destroyed.
  class Frame {
   public:
    Frame() = default;
    Frame(const Frame&) = delete;
    Frame& operator=(const Frame&) = delete;
    uint64_t size() const { return size_; }
    uint64_t arrived() const { return arrived_; }

   private:
    friend class MemoryBudget;
    std::string tenant_;
    uint64_t size_ = 0, arrived_ = 0, promised_ = 0;
    uint64_t granted_at_ = 0;  // the budget's grant sequence number: youngest revoked first
    bool listed_ = false;      // in frames_ (while promised_ > 0)
  };

  MemoryBudget(uint64_t limit_bytes, WorkerPool* pool) : limit_(limit_bytes), pool_(pool) {}

  /// Counts `n` bytes held for `tenant` (always granted: the data is already in memory).
  void Charge(const std::string& tenant, uint64_t n);
  /// Returns `n` bytes of `tenant`'s and wakes waiters while there is room.
  void Release(const std::string& tenant, uint64_t n);
  /// Runs `resume` on the pool once usage is below the limit and `tenant` may go (at once if
  /// it may now). Charges nothing.
  void WhenAvailable(const std::string& tenant, std::function<void()> resume);
  /// Runs `granted` on the pool once `n` more bytes fit under the limit (or once nothing else
  /// is held: a request larger than the limit goes alone), with the `n` bytes charged to
  /// `tenant`: the caller releases them.
  void Reserve(const std::string& tenant, uint64_t n, std::function<void()> granted);
  /// Reserve for memory that waits on a client (a chunk until its reader takes it), which
  /// cannot be taken back: granted only within the tenant's share (or as its first request)
  /// and while, with it, a quarter of the budget stays free. So readers that do not read fill
  /// at most three quarters of the budget while their tenant is alone, and their tenant's share
  /// once others are active; a tenant that comes next always finds room to start.
  void ReserveLeavingShare(const std::string& tenant, uint64_t n, std::function<void()> granted);
  /// ReserveLeavingShare's grant, taken at once if nobody waits and it fits now (charged, true);
  /// false and nothing charged otherwise. For a caller already on the pool.
  bool TryReserveLeavingShare(const std::string& tenant, uint64_t n);
  /// Reserve's grant, taken at once if nobody waits and it fits now (charged, true); false and
  /// nothing charged otherwise.
  bool TryReserve(const std::string& tenant, uint64_t n);

  // Credit: memory reserved for a message a client holds and will send once granted (PushFlow).
  // Until the message comes it is the tenant's *outstanding credit*, of which a tenant may hold
  // at most a quarter of the budget (or one grant): credit cannot be taken back, so a tenant
  // that asks and sends nothing leaves the rest to the others.
  /// As Reserve, within the tenant's outstanding-credit cap.
  void ReserveCredit(const std::string& tenant, uint64_t n, std::function<void()> granted);
  /// As TryReserve, within the cap.
  bool TryReserveCredit(const std::string& tenant, uint64_t n);
  /// `n` bytes of the tenant's credit came: held as before, no longer outstanding.
  void CreditUsed(const std::string& tenant, uint64_t n);
  /// `n` bytes of outstanding credit go back unused (released).
  void CreditReturned(const std::string& tenant, uint64_t n);

  // Large frames.
  /// Sets `frame` up for `size` bytes of `tenant`'s; nothing is held until Promise is granted.
  void Announce(Frame* frame, const std::string& tenant, uint64_t size);
  /// Runs `granted` on the pool once the rest of the frame (its size less what arrived and what
  /// is still promised) is promised, as Reserve would.
  void Promise(Frame* frame, std::function<void()> granted);
  /// `n` more bytes of the frame came: they are held for good. Returns whether the stream may
  /// read on: false when the frame is not complete and nothing of its promise is left (part of
  /// it was taken back): Promise again first.
  bool Arrived(Frame* frame, uint64_t n);
  /// Gives back everything the frame holds (it is complete, or its stream failed). The frame
  /// must not be waiting for a Promise.
  void Drop(Frame* frame);

  /// Whether a newcomer would wait now (the budget full, or others waiting before it).
  bool MustWait() const;
  uint64_t used() const;
  /// What `tenant` holds now (its charges, frames' bytes and promises).
  uint64_t used_by(const std::string& tenant) const;
  /// Tenants holding or waiting for memory now.
  size_t active_tenants() const;
  uint64_t limit() const { return limit_; }
  uint64_t parked_total() const;   ///< times a caller had to wait
  uint64_t revoked_total() const;  ///< large frames' promises revoked for another tenant

 private:
  struct Account {
    uint64_t held = 0;
    uint64_t credit = 0;  // of held: credit granted whose message has not come
    uint32_t waiting = 0;
  };
  struct Waiter {
    std::string tenant;
    uint64_t reserve = 0;      // bytes to charge when granted; 0: WhenAvailable
    Frame* frame = nullptr;    // a Promise: reserve is the frame's rest
    bool leave_share = false;  // ReserveLeavingShare
    std::function<void()> resume;
    uint64_t id = 0;
    bool credit = false;  // ReserveCredit
  };
  static uint64_t Need(const Waiter& w);  // the bytes it asks for
  bool TryReserveAs(const std::string& tenant, uint64_t n, bool leave_share, bool credit);
  // A credit waiter that its tenant's outstanding credit keeps waiting (not memory).
  bool CreditCapped(const Waiter& w) const;
  // Everything below is under mu_.
  uint64_t Share() const;
  bool UnderShare(const std::string& tenant) const;  // holds less than its share
  bool Fits(const Waiter& w) const;
  void Add(const std::string& tenant, uint64_t n);
  void Sub(const std::string& tenant, uint64_t n);
  // Takes back promises from tenants over their share, youngest first, when that makes room
  // for `w`; false (and nothing taken) when it would not.
  bool Reclaim(const Waiter& w);
  void Grant(Waiter& w);
  void Enqueue(Waiter w);
  // Grants what may go; the continuations to run on the pool go to *wake.
  void Pump(std::deque<std::function<void()>>* wake);
  void Wake(std::deque<std::function<void()>>* wake);

  const uint64_t limit_;
  WorkerPool* const pool_;
  mutable std::mutex mu_;
  uint64_t used_ = 0;
  uint64_t parked_total_ = 0, revoked_total_ = 0, grants_ = 0, waiter_ids_ = 0;
  absl::flat_hash_map<std::string, Account> accounts_;  // active tenants only
  std::deque<Waiter> waiters_;
  std::list<Frame*> frames_;  // frames with a promise outstanding
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RUNTIME_MEMORY_BUDGET_H_
