#include "server/runtime/worker_pool.h"

#include <pthread.h>

#include <set>
#include <utility>

namespace sluice {

WorkerPool::WorkerPool(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i)
    threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "sluice-worker");
      Run();
    });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void WorkerPool::Run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

size_t Gate::HeldLocked(const std::string& tenant) const {
  auto it = held_.find(tenant);
  return it == held_.end() ? 0 : it->second;
}

size_t Gate::ShareLocked() const {
  std::set<std::string> active;
  for (const auto& [tenant, n] : held_) active.insert(tenant);
  for (const Waiter& w : waiters_) active.insert(w.tenant);
  const size_t share = active.empty() ? limit_ : limit_ / active.size();
  return share < 1 ? 1 : share;
}

void Gate::Enter(const std::string& tenant, std::function<void()> admitted) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (inside_ >= limit_) {
      waiters_.push_back(Waiter{tenant, std::move(admitted)});
      return;
    }
    ++inside_;
    ++held_[tenant];
  }
  pool_->Submit(std::move(admitted));
}

bool Gate::TryEnter(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  if (inside_ >= limit_ || !waiters_.empty()) return false;
  ++inside_;
  ++held_[tenant];
  return true;
}

bool Gate::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !waiters_.empty();
}

bool Gate::OverShareWhileOthersWait(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t share = ShareLocked();
  if (HeldLocked(tenant) <= share) return false;
  for (const Waiter& w : waiters_) {
    if (w.tenant != tenant && HeldLocked(w.tenant) < share) return true;
  }
  return false;
}

void Gate::Leave(const std::string& tenant) {
  std::function<void()> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = held_.find(tenant); it != held_.end() && --it->second == 0) held_.erase(it);
    if (waiters_.empty()) {
      --inside_;
      return;
    }
    // The slot passes straight to a waiter: the first whose tenant is under its share, else
    // the first.
    const size_t share = ShareLocked();
    auto chosen = waiters_.begin();
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      if (HeldLocked(it->tenant) < share) {
        chosen = it;
        break;
      }
    }
    ++held_[chosen->tenant];
    next = std::move(chosen->admitted);
    waiters_.erase(chosen);
  }
  pool_->Submit(std::move(next));
}

}  // namespace sluice
