// A function run on a thread of its own every `every`, or on the caller's thread by RunNow
// (SIGHUP, tests): the watchers of files an operator may change under a running server (TLS
// certificates, the credentials file) and the shuffle lifetime share it. Runs never overlap.
// The destructor stops and joins the thread.
#ifndef SLUICE_SERVER_RUNTIME_PERIODIC_H_
#define SLUICE_SERVER_RUNTIME_PERIODIC_H_

#include <atomic>
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

  /// Runs the function now, on the calling thread, and returns once it has run (after a run in
  /// progress on the thread, if there is one).
  void RunNow() {
    std::lock_guard<std::mutex> lock(run_mu_);
    fn_();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (cv_.wait_for(lock, every_, [this] { return stop_; })) return;
      lock.unlock();
      {
        std::lock_guard<std::mutex> run(run_mu_);
        fn_();
      }
      lock.lock();
    }
  }

  const std::chrono::milliseconds every_;
  const std::function<void()> fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;   // guarded by mu_
  std::mutex run_mu_;   // held while fn_ runs
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace sluice

/// A function run once on a thread of its own; it is handed a flag the destructor sets before it
/// joins the thread (the function should return soon after it is set).
class Background {
 public:
  explicit Background(std::function<void(const std::atomic<bool>& stop)> fn)
      : fn_(std::move(fn)), thread_([this] { fn_(stop_); }) {}
  ~Background() {
    stop_.store(true);
    thread_.join();
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

 private:
  const std::function<void(const std::atomic<bool>&)> fn_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: starts once the rest is built
};

#endif  // SLUICE_SERVER_RUNTIME_PERIODIC_H_
