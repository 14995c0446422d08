#include "server/runtime/watchdog.h"

#include <utility>
#include <vector>

namespace sluice {

Watchdog::Watchdog(std::chrono::milliseconds tick) : tick_(tick), thread_([this] { Run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t Watchdog::Arm(Clock::time_point deadline, std::function<void()> on_expiry) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{deadline, std::move(on_expiry)});
  return id;
}

bool Watchdog::Disarm(uint64_t id) {
  if (id == 0) return false;  // never armed
  std::unique_lock<std::mutex> lock(mu_);
  if (entries_.erase(id) != 0) return true;
  cv_.wait(lock, [&] { return running_ != id; });
  return false;
}

size_t Watchdog::armed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void Watchdog::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, tick_, [this] { return stopping_; });
    if (stopping_) break;
    const Clock::time_point now = Clock::now();
    std::vector<uint64_t> expired;
    for (const auto& [id, entry] : entries_) {
      if (entry.deadline <= now) expired.push_back(id);
    }
    for (uint64_t id : expired) {
      auto it = entries_.find(id);
      if (it == entries_.end()) continue;  // disarmed meanwhile
      std::function<void()> callback = std::move(it->second.on_expiry);
      entries_.erase(it);
      running_ = id;
      lock.unlock();
      callback();
      lock.lock();
      running_ = 0;
      cv_.notify_all();
    }
  }
}

}  // namespace sluice
