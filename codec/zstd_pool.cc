#include "codec/zstd_pool.h"

#include <pthread.h>

#include <mutex>
#include <vector>

namespace sluice::zstd_pool {
namespace {

template <typename Ctx>
struct Idle {
  std::mutex mu;
  std::vector<Ctx*> contexts;
};
Idle<ZSTD_CCtx>& IdleC();
Idle<ZSTD_DCtx>& IdleD();

// A fork() while another thread holds a pool's lock would leave the child a lock nobody
// releases (a Python process forking its workers, say): both are taken around a fork.
void LockForFork() {
  IdleC().mu.lock();
  IdleD().mu.lock();
}
void UnlockAfterFork() {
  IdleD().mu.unlock();
  IdleC().mu.unlock();
}

Idle<ZSTD_CCtx>& IdleC() {
  // Never destroyed: encoders may outlive statics.
  static auto* idle = [] {
    auto* made = new Idle<ZSTD_CCtx>();
    ::pthread_atfork(LockForFork, UnlockAfterFork, UnlockAfterFork);
    return made;
  }();
  return *idle;
}
Idle<ZSTD_DCtx>& IdleD() {
  static auto* idle = new Idle<ZSTD_DCtx>();
  return *idle;
}

template <typename Ctx>
Ctx* Take(Idle<Ctx>& idle) {
  std::lock_guard<std::mutex> lock(idle.mu);
  if (idle.contexts.empty()) return nullptr;
  Ctx* c = idle.contexts.back();
  idle.contexts.pop_back();
  return c;
}
// Keeps `c` if there is room; false: the caller frees it.
template <typename Ctx>
bool Keep(Idle<Ctx>& idle, Ctx* c) {
  std::lock_guard<std::mutex> lock(idle.mu);
  if (idle.contexts.size() >= kMaxIdle) return false;
  idle.contexts.push_back(c);
  return true;
}

}  // namespace

ZSTD_CCtx* TakeCCtx() {
  ZSTD_CCtx* c = Take(IdleC());
  return c != nullptr ? c : ZSTD_createCCtx();
}

void GiveCCtx(ZSTD_CCtx* cctx) {
  if (cctx == nullptr) return;
  // Parameters and session reset: the next user starts as with a new context.
  if (ZSTD_isError(ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters)) ||
      ZSTD_sizeof_CCtx(cctx) > kMaxKeptBytes || !Keep(IdleC(), cctx)) {
    ZSTD_freeCCtx(cctx);
  }
}

ZSTD_DCtx* TakeDCtx() {
  IdleC();  // (registers the fork handlers)
  ZSTD_DCtx* d = Take(IdleD());
  return d != nullptr ? d : ZSTD_createDCtx();
}

void GiveDCtx(ZSTD_DCtx* dctx) {
  if (dctx == nullptr) return;
  if (ZSTD_isError(ZSTD_DCtx_reset(dctx, ZSTD_reset_session_and_parameters)) ||
      ZSTD_sizeof_DCtx(dctx) > kMaxKeptBytes || !Keep(IdleD(), dctx)) {
    ZSTD_freeDCtx(dctx);
  }
}

size_t IdleCCtx() {
  std::lock_guard<std::mutex> lock(IdleC().mu);
  return IdleC().contexts.size();
}

size_t IdleDCtx() {
  std::lock_guard<std::mutex> lock(IdleD().mu);
  return IdleD().contexts.size();
}

}  // namespace sluice::zstd_pool
