// WorkerPool: a fixed set of threads for the work that must not run on gRPC threads (disk,
// compression, validation). Tasks are queued; the queue is bounded in practice because every
// stream keeps at most one task in flight.
// The memory budget is server/runtime/memory_budget.h.
#ifndef SLUICE_SERVER_RUNTIME_WORKER_POOL_H_
#define SLUICE_SERVER_RUNTIME_WORKER_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
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

/// Admits at most `limit` holders at once (e.g. KEY merges, each of which may keep up to
/// fan-in decoded frames); the others wait, holding nothing, and resume on the pool. Holders
/// and waiters belong to tenants ("" for none): a tenant's share is the limit over the tenants
/// holding or waiting (at least one slot); a freed slot goes to the first waiter whose tenant
/// holds less than its share, else to the first waiter.
class Gate {
 public:
  Gate(size_t limit, WorkerPool* pool) : limit_(limit < 1 ? 1 : limit), pool_(pool) {}
  /// Runs `admitted` on the pool once a slot is free (at once if one is).
  void Enter(const std::string& tenant, std::function<void()> admitted);
  /// Takes a slot if one is free and nobody waits for one; the caller, already on the pool,
  /// then goes on without a hand-over (and Leaves later, as after Enter).
  bool TryEnter(const std::string& tenant);
  void Leave(const std::string& tenant);
  /// Whether anyone waits for a slot now.
  bool waiting() const;
  /// Whether `tenant` holds more than its share while a tenant under its share waits: then
  /// its holders that do not need their slot now (a stalled reader's merge) should give one up.
  bool OverShareWhileOthersWait(const std::string& tenant) const;

 private:
  struct Waiter {
    std::string tenant;
    std::function<void()> admitted;
  };
  // Under mu_.
  size_t ShareLocked() const;
  size_t HeldLocked(const std::string& tenant) const;
  const size_t limit_;
  WorkerPool* const pool_;
  mutable std::mutex mu_;
  size_t inside_ = 0;
  std::map<std::string, size_t> held_;  // slots by tenant (holders only)
  std::deque<Waiter> waiters_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RUNTIME_WORKER_POOL_H_
