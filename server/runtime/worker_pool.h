// WorkerPool: a fixed set of threads for the work that must not run on gRPC threads (disk,
// compression, validation). Tasks are queued; the queue is bounded in practice because every
// stream keeps at most one task in flight.
//
// MemoryBudget: the server-wide byte budget of buffered push data and fetch buffers. A stream
// that finds it full does not read more: it parks a continuation that runs when memory is
// released, and HTTP/2 flow control pushes back on its client meanwhile.
#ifndef SLUICE_SERVER_RUNTIME_WORKER_POOL_H_
#define SLUICE_SERVER_RUNTIME_WORKER_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sluice {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();  // runs what is queued, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Submit(std::function<void()> task);

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

class MemoryBudget {
 public:
  MemoryBudget(uint64_t limit_bytes, WorkerPool* pool) : limit_(limit_bytes), pool_(pool) {}

  /// Counts `n` bytes (always granted: the data is already in memory).
  void Charge(uint64_t n);
  /// Returns `n` bytes and wakes parked streams while there is room.
  void Release(uint64_t n);
  /// Runs `resume` on the pool as soon as usage is below the limit (at once if it is now).
  /// Only streams that hold none of the budget while waiting may wait (or they could wait on
  /// themselves): push streams release their message before they wait.
  void WhenAvailable(std::function<void()> resume);
  /// Runs `granted` on the pool once `n` more bytes fit under the limit, or once nothing else
  /// is charged (a reservation larger than the limit goes alone), with the `n` bytes charged:
  /// the caller releases them. Waiters are served in order, so a large reservation is not
  /// passed over by later small ones; the same rule as WhenAvailable on what a waiter may hold.
  void Reserve(uint64_t n, std::function<void()> granted);

  /// Whether a newcomer would wait now (the budget full, or others waiting before it).
  bool MustWait() const;
  uint64_t used() const;
  uint64_t limit() const { return limit_; }
  uint64_t parked_total() const;  ///< how many times a stream had to wait (for stats/tests)

 private:
  const uint64_t limit_;
  WorkerPool* const pool_;
  mutable std::mutex mu_;
  uint64_t used_ = 0;
  uint64_t parked_total_ = 0;
  struct Waiter {
    uint64_t reserve = 0;  // bytes to charge when granted; 0: WhenAvailable
    std::function<void()> resume;
  };
  bool Fits(const Waiter& w) const;  // under mu_
  std::deque<Waiter> waiters_;
};

/// Admits at most `limit` holders at once (e.g. KEY merges, each of which may keep up to
/// fan-in decoded frames); the others wait, holding nothing, and resume on the pool.
class Gate {
 public:
  Gate(size_t limit, WorkerPool* pool) : limit_(limit < 1 ? 1 : limit), pool_(pool) {}
  /// Runs `admitted` on the pool once a slot is free (at once if one is).
  void Enter(std::function<void()> admitted);
  /// Takes a slot if one is free and nobody waits for one; the caller, already on the pool,
  /// then goes on without a hand-over (and Leaves later, as after Enter).
  bool TryEnter();
  void Leave();

 private:
  const size_t limit_;
  WorkerPool* const pool_;
  std::mutex mu_;
  size_t inside_ = 0;
  std::deque<std::function<void()>> waiters_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RUNTIME_WORKER_POOL_H_
