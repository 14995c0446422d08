// A function run on a thread of its own every `every`, or at once when poked (SIGHUP): the
// watchers of files an operator may change under a running server (TLS certificates, the
// credentials file) share it. The destructor stops and joins the thread.
#ifndef SLUICE_SERVER_RUNTIME_PERIODIC_H_
#define SLUICE_SERVER_RUNTIME_PERIODIC_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace sluice {

class Periodic {
 public:
  Periodic(std::chrono::milliseconds every, std::function<void()> fn)
      : every_(every), fn_(std::move(fn)), thread_([this] { Loop(); }) {}
  ~Periodic() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Periodic(const Periodic&) = delete;
  Periodic& operator=(const Periodic&) = delete;

  /// Runs the function now (on its thread) instead of at the next interval.
  void Poke() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      poked_ = true;
    }
    cv_.notify_all();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait_for(lock, every_, [this] { return stop_ || poked_; });
      if (stop_) return;
      poked_ = false;
      lock.unlock();
      fn_();
      lock.lock();
    }
  }

  const std::chrono::milliseconds every_;
  const std::function<void()> fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, poked_ = false;  // guarded by mu_
  std::thread thread_;                 // last: starts once the rest is built
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RUNTIME_PERIODIC_H_
