#include "codec/zstd_pool.h"

#include <pthread.h>

#include <mutex>
#include <vector>

namespace sluice::zstd_pool {
namespace {

// What the pool needs of each kind of context.
struct CTraits {
  using Ctx = ZSTD_CCtx;
  static Ctx* Create() { return ZSTD_createCCtx(); }
  static size_t Reset(Ctx* c) { return ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters); }
  static size_t Size(const Ctx* c) { return ZSTD_sizeof_CCtx(c); }
  static void Free(Ctx* c) { ZSTD_freeCCtx(c); }
};
struct DTraits {
  using Ctx = ZSTD_DCtx;
  static Ctx* Create() { return ZSTD_createDCtx(); }
  static size_t Reset(Ctx* c) { return ZSTD_DCtx_reset(c, ZSTD_reset_session_and_parameters); }
  static size_t Size(const Ctx* c) { return ZSTD_sizeof_DCtx(c); }
  static void Free(Ctx* c) { ZSTD_freeDCtx(c); }
};

template <typename Ctx>
struct Idle {
  std::mutex mu;
  std::vector<Ctx*> contexts;
};

struct Pools {
  Idle<ZSTD_CCtx> c;
  Idle<ZSTD_DCtx> d;
  template <typename T>
  Idle<typename T::Ctx>& Of();
};
template <>
Idle<ZSTD_CCtx>& Pools::Of<CTraits>() {
  return c;
}
template <>
Idle<ZSTD_DCtx>& Pools::Of<DTraits>() {
  return d;
}

Pools& Get();
// A fork() while another thread holds a pool's lock would leave the child a lock nobody
// releases (a Python process forking its workers, say): both are taken around a fork.
void LockForFork() {
  Get().c.mu.lock();
  Get().d.mu.lock();
}
void UnlockAfterFork() {
  Get().d.mu.unlock();
  Get().c.mu.unlock();
}
Pools& Get() {
  // Never destroyed: encoders may outlive statics.
  static Pools* pools = [] {
    auto* made = new Pools();
    ::pthread_atfork(LockForFork, UnlockAfterFork, UnlockAfterFork);
    return made;
  }();
  return *pools;
}

template <typename T>
typename T::Ctx* Take() {
  Idle<typename T::Ctx>& idle = Get().Of<T>();
  {
    std::lock_guard<std::mutex> lock(idle.mu);
    if (!idle.contexts.empty()) {
      typename T::Ctx* c = idle.contexts.back();
      idle.contexts.pop_back();
      return c;
    }
  }
  return T::Create();
}

// Reset (parameters and session: the next user starts as with a new context) and kept if
// there is room and it is not too large; freed otherwise.
template <typename T>
void Give(typename T::Ctx* c) {
  if (c == nullptr) return;
  if (!ZSTD_isError(T::Reset(c)) && T::Size(c) <= kMaxKeptBytes) {
    Idle<typename T::Ctx>& idle = Get().Of<T>();
    std::lock_guard<std::mutex> lock(idle.mu);
    if (idle.contexts.size() < kMaxIdle) {
      idle.contexts.push_back(c);
      return;
    }
  }
  T::Free(c);
}

template <typename T>
size_t IdleCount() {
  Idle<typename T::Ctx>& idle = Get().Of<T>();
  std::lock_guard<std::mutex> lock(idle.mu);
  return idle.contexts.size();
}

}  // namespace

ZSTD_CCtx* TakeCCtx() { return Take<CTraits>(); }
void GiveCCtx(ZSTD_CCtx* cctx) { Give<CTraits>(cctx); }
ZSTD_DCtx* TakeDCtx() { return Take<DTraits>(); }
void GiveDCtx(ZSTD_DCtx* dctx) { Give<DTraits>(dctx); }
size_t IdleCCtx() { return IdleCount<CTraits>(); }
size_t IdleDCtx() { return IdleCount<DTraits>(); }

}  // namespace sluice::zstd_pool
