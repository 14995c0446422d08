#include "server/rules/scrubber.h"

#include <algorithm>

#include "spdlog/spdlog.h"

namespace sluice {

std::shared_ptr<ShuffleStore> Scrubber::NextStore() {
  while (!pass_.empty()) {
    const std::string id = std::move(pass_.back());
    pass_.pop_back();
    // (Deleted since, damaged, or no room to open it now: the next pass tries again.)
    auto store = registry_->Get(id);
    if (store.ok()) return *std::move(store);
  }
  return nullptr;
}

uint64_t Scrubber::Run(Clock::time_point now) {
  if (!started_) {
    started_ = true;
    last_ = now;
    pass_started_ = now;
  }
  const double elapsed = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  allowance_ = std::min<double>(allowance_ + elapsed * static_cast<double>(rate_),
                                static_cast<double>(rate_));
  uint64_t read = 0;
  while (allowance_ > 0) {
    if (store_ == nullptr) {
      if (pass_.empty() && !in_pass_) {
        // A new pass: every shuffle held now, in id order (popped from the back).
        const std::vector<std::string> ids = registry_->Ids();
        if (ids.empty()) break;
        pass_.assign(ids.rbegin(), ids.rend());
        in_pass_ = true;
      }
      cursor_ = ShuffleStore::ScrubCursor{};
      store_ = NextStore();
      if (store_ == nullptr) {  // the pass is over
        ++passes_;
        if (metrics_ != nullptr) ServerMetrics::Add(metrics_->scrub_passes, 1);
        spdlog::debug("event=scrub_pass bytes={} seconds={:.1f}", pass_bytes_,
                      std::chrono::duration<double>(now - pass_started_).count());
        pass_bytes_ = 0;
        pass_started_ = now;
        in_pass_ = false;
        break;  // (the next run starts the next pass)
      }
    }
    const ShuffleStore::ScrubStep step =
        store_->ScrubNext(&cursor_, static_cast<uint64_t>(allowance_), &buffer_);
    allowance_ -= static_cast<double>(step.bytes);
    read += step.bytes;
    pass_bytes_ += step.bytes;
    if (metrics_ != nullptr) ServerMetrics::Add(metrics_->scrub_bytes, step.bytes);
    if (step.done) store_.reset();
  }
  return read;
}

}  // namespace sluice
