#include "server/runtime/worker_pool.h"

#include <pthread.h>

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

void MemoryBudget::Charge(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  used_ += n;
}

bool MemoryBudget::Fits(const Waiter& w) const {
  if (w.reserve == 0) return used_ < limit_;
  return used_ == 0 || (w.reserve <= limit_ && used_ <= limit_ - w.reserve);
}

void MemoryBudget::Release(uint64_t n) {
  std::deque<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ = n > used_ ? 0 : used_ - n;
    while (!waiters_.empty() && Fits(waiters_.front())) {
      used_ += waiters_.front().reserve;
      wake.push_back(std::move(waiters_.front().resume));
      waiters_.pop_front();
    }
  }
  for (auto& w : wake) pool_->Submit(std::move(w));
}

void MemoryBudget::WhenAvailable(std::function<void()> resume) { Reserve(0, std::move(resume)); }

void MemoryBudget::Reserve(uint64_t n, std::function<void()> granted) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Waiter w{n, std::move(granted)};
    // Behind others that wait, whatever fits now: first come, first served.
    if (!waiters_.empty() || !Fits(w)) {
      ++parked_total_;
      waiters_.push_back(std::move(w));
      return;
    }
    used_ += n;
    granted = std::move(w.resume);
  }
  pool_->Submit(std::move(granted));  // never on the caller's (possibly gRPC) thread
}

bool MemoryBudget::MustWait() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_ >= limit_ || !waiters_.empty();
}

uint64_t MemoryBudget::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t MemoryBudget::parked_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return parked_total_;
}

void Gate::Enter(std::function<void()> admitted) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (inside_ >= limit_) {
      waiters_.push_back(std::move(admitted));
      return;
    }
    ++inside_;
  }
  pool_->Submit(std::move(admitted));
}

bool Gate::TryEnter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (inside_ >= limit_ || !waiters_.empty()) return false;
  ++inside_;
  return true;
}

void Gate::Leave() {
  std::function<void()> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiters_.empty()) {
      --inside_;
      return;
    }
    next = std::move(waiters_.front());  // the slot passes straight to the next waiter
    waiters_.pop_front();
  }
  pool_->Submit(std::move(next));
}

}  // namespace sluice
