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

bool Gate::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !waiters_.empty();
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
