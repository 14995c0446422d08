#include "server/runtime/memory_budget.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"

namespace sluice {

void MemoryBudget::Add(const std::string& tenant, uint64_t n) {
  if (n == 0) return;
  accounts_[tenant].held += n;
  used_ += n;
}

void MemoryBudget::Sub(const std::string& tenant, uint64_t n) {
  auto it = accounts_.find(tenant);
  if (it == accounts_.end()) return;  // (more given back than was charged: nothing to take)
  n = std::min(n, it->second.held);
  it->second.held -= n;
  used_ -= n;
  if (it->second.held == 0 && it->second.waiting == 0) accounts_.erase(it);
}

uint64_t MemoryBudget::Share() const { return limit_ / std::max<uint64_t>(1, accounts_.size()); }

bool MemoryBudget::UnderShare(const std::string& tenant) const {
  auto it = accounts_.find(tenant);
  return (it == accounts_.end() ? 0 : it->second.held) < Share();
}

bool MemoryBudget::CreditCapped(const Waiter& w) const {
  if (!w.credit) return false;
  auto it = accounts_.find(w.tenant);
  const uint64_t outstanding = it == accounts_.end() ? 0 : it->second.credit;
  return outstanding > 0 && outstanding + w.reserve > limit_ / 4;
}

bool MemoryBudget::Fits(const Waiter& w) const {
  if (CreditCapped(w)) return false;
  const uint64_t n = Need(w);
  uint64_t limit = limit_;
  if (w.leave_share) {
    // Within its tenant's share, and a quarter of the budget left free for the others.
    limit -= limit_ / 4;
    auto it = accounts_.find(w.tenant);
    const uint64_t held = it == accounts_.end() ? 0 : it->second.held;
    if (held + n > Share() && held > 0) return false;
  }
  if (n == 0) return used_ < limit;
  return used_ == 0 || (n <= limit && used_ <= limit - n);
}

uint64_t MemoryBudget::Need(const Waiter& w) {
  return w.frame == nullptr ? w.reserve : w.frame->size_ - w.frame->arrived_ - w.frame->promised_;
}

bool MemoryBudget::Reclaim(const Waiter& w) {
  if (w.leave_share) return false;  // (it waits on its own client: it takes nothing back)
  const uint64_t need = Need(w);
  uint64_t deficit;
  if (need == 0) {
    deficit = used_ >= limit_ ? used_ - limit_ + 1 : 0;
  } else if (need > limit_) {
    deficit = used_;  // it goes alone
  } else {
    deficit = used_ + need > limit_ ? used_ + need - limit_ : 0;
  }
  if (deficit == 0) return true;
  std::vector<Frame*> candidates;
  for (Frame* f : frames_) {
    if (f->tenant_ != w.tenant) candidates.push_back(f);
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Frame* a, const Frame* b) { return a->granted_at_ > b->granted_at_; });
  // Taken only down to their share: what they were lent.
  const uint64_t share = Share();
  absl::flat_hash_map<std::string, uint64_t> held;
  std::vector<std::pair<Frame*, uint64_t>> take;
  uint64_t got = 0;
  for (Frame* f : candidates) {
    if (got >= deficit) break;
    auto [it, added] = held.try_emplace(f->tenant_, 0);
    if (added) it->second = accounts_[f->tenant_].held;
    if (it->second <= share) continue;
    const uint64_t n = std::min({f->promised_, it->second - share, deficit - got});
    take.emplace_back(f, n);
    got += n;
    it->second -= n;
  }
  if (got < deficit) return false;
  for (auto [f, n] : take) {
    Sub(f->tenant_, n);
    f->promised_ -= n;
    if (f->promised_ == 0) {
      f->listed_ = false;
      frames_.remove(f);
    }
    ++revoked_total_;
  }
  return true;
}

void MemoryBudget::Grant(Waiter& w) {
  auto it = accounts_.find(w.tenant);
  if (it != accounts_.end() && it->second.waiting > 0) --it->second.waiting;
  if (w.frame != nullptr) {
    Frame* f = w.frame;
    const uint64_t missing = f->size_ - f->arrived_ - f->promised_;
    f->promised_ += missing;
    f->granted_at_ = ++grants_;
    Add(f->tenant_, missing);
    if (f->promised_ > 0 && !f->listed_) {
      frames_.push_back(f);
      f->listed_ = true;
    }
  } else {
    Add(w.tenant, w.reserve);
    if (w.credit) accounts_[w.tenant].credit += w.reserve;
  }
  it = accounts_.find(w.tenant);
  if (it != accounts_.end() && it->second.held == 0 && it->second.waiting == 0) {
    accounts_.erase(it);
  }
}

void MemoryBudget::Pump(std::deque<std::function<void()>>* wake) {
  // Each tenant's requests are served in order (a later small one does not pass a large one of
  // its own), with its readers' reservations in a queue of their own: those wait on their own
  // rule (their tenant's share, a share left free), never holding up anyone else's.
  absl::flat_hash_set<std::string> seen;
  // (Credit waits in a queue of its own too: one capped by its tenant's outstanding credit
  // holds up nothing else.)
  const auto queue = [](const Waiter& w) {
    return w.leave_share ? w.tenant + '\x01' : w.credit ? w.tenant + '\x02' : w.tenant;
  };
  while (!waiters_.empty()) {
    auto chosen = waiters_.end();
    bool short_of_memory = false;  // a waiter that needs memory holds the rest of its pass up
    // Tenants under their share first; then the others, in order.
    for (int pass = 0; pass < 2 && chosen == waiters_.end() && !short_of_memory; ++pass) {
      seen.clear();
      for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
        if (!seen.insert(queue(*it)).second) continue;
        if ((pass == 0) != UnderShare(it->tenant)) continue;
        if (Fits(*it) || (pass == 0 && !CreditCapped(*it) && Reclaim(*it))) {
          chosen = it;
          break;
        }
        if (!it->leave_share && !CreditCapped(*it)) {
          short_of_memory = true;
          break;
        }
      }
    }
    if (chosen == waiters_.end()) return;
    Grant(*chosen);
    wake->push_back(std::move(chosen->resume));
    waiters_.erase(chosen);
  }
}

void MemoryBudget::Wake(std::deque<std::function<void()>>* wake) {
  for (auto& w : *wake) pool_->Submit(std::move(w));  // never on the caller's thread
}

void MemoryBudget::Enqueue(Waiter w) {
  std::deque<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++accounts_[w.tenant].waiting;
    w.id = ++waiter_ids_;
    const uint64_t mine = w.id;
    waiters_.push_back(std::move(w));
    Pump(&wake);
    if (std::any_of(waiters_.begin(), waiters_.end(),
                    [&](const Waiter& x) { return x.id == mine; })) {
      ++parked_total_;  // not granted at once
    }
  }
  Wake(&wake);
}

void MemoryBudget::Charge(const std::string& tenant, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  Add(tenant, n);
}

void MemoryBudget::Release(const std::string& tenant, uint64_t n) {
  std::deque<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Sub(tenant, n);
    Pump(&wake);
  }
  Wake(&wake);
}

void MemoryBudget::WhenAvailable(const std::string& tenant, std::function<void()> resume) {
  Enqueue(Waiter{tenant, 0, nullptr, false, std::move(resume), 0});
}

void MemoryBudget::Reserve(const std::string& tenant, uint64_t n, std::function<void()> granted) {
  Enqueue(Waiter{tenant, n, nullptr, false, std::move(granted), 0});
}

void MemoryBudget::ReserveLeavingShare(const std::string& tenant, uint64_t n,
                                       std::function<void()> granted) {
  Enqueue(Waiter{tenant, n, nullptr, true, std::move(granted), 0});
}

bool MemoryBudget::TryReserveLeavingShare(const std::string& tenant, uint64_t n) {
  return TryReserveAs(tenant, n, /*leave_share=*/true, /*credit=*/false);
}

bool MemoryBudget::TryReserve(const std::string& tenant, uint64_t n) {
  return TryReserveAs(tenant, n, /*leave_share=*/false, /*credit=*/false);
}

bool MemoryBudget::TryReserveCredit(const std::string& tenant, uint64_t n) {
  return TryReserveAs(tenant, n, /*leave_share=*/false, /*credit=*/true);
}

void MemoryBudget::ReserveCredit(const std::string& tenant, uint64_t n,
                                 std::function<void()> granted) {
  Waiter w{tenant, n, nullptr, false, std::move(granted), 0};
  w.credit = true;
  Enqueue(std::move(w));
}

void MemoryBudget::CreditUsed(const std::string& tenant, uint64_t n) {
  std::deque<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = accounts_.find(tenant);
    if (it == accounts_.end()) return;
    it->second.credit -= std::min(n, it->second.credit);
    Pump(&wake);  // (a credit waiter of its own may go now)
  }
  Wake(&wake);
}

void MemoryBudget::CreditReturned(const std::string& tenant, uint64_t n) {
  std::deque<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = accounts_.find(tenant); it != accounts_.end()) {
      it->second.credit -= std::min(n, it->second.credit);
    }
    Sub(tenant, n);
    Pump(&wake);
  }
  Wake(&wake);
}

bool MemoryBudget::TryReserveAs(const std::string& tenant, uint64_t n, bool leave_share,
                                bool credit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!waiters_.empty()) return false;
  ++accounts_[tenant].waiting;  // (counted as a waiter would be: its share is computed so)
  Waiter w{tenant, n, nullptr, leave_share, nullptr, 0};
  w.credit = credit;
  const bool fits = Fits(w);
  if (fits) {
    Grant(w);
  } else {
    auto it = accounts_.find(tenant);
    if (--it->second.waiting == 0 && it->second.held == 0) accounts_.erase(it);
  }
  return fits;
}

void MemoryBudget::Announce(Frame* frame, const std::string& tenant, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  frame->tenant_ = tenant;
  frame->size_ = size;
  frame->arrived_ = 0;
  frame->promised_ = 0;
}

void MemoryBudget::Promise(Frame* frame, std::function<void()> granted) {
  // (Its tenant is set by Announce, from the frame's own stream, as this call is.)
  Enqueue(Waiter{frame->tenant_, 0, frame, false, std::move(granted), 0});
}

bool MemoryBudget::Arrived(Frame* frame, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t covered = std::min(n, frame->promised_);
  frame->promised_ -= covered;
  Add(frame->tenant_, n - covered);  // bytes past a revoked promise: in memory all the same
  frame->arrived_ += n;
  if (frame->promised_ == 0 && frame->listed_) {
    frames_.remove(frame);
    frame->listed_ = false;
  }
  // Read on while some of the promise is left (a piece past it is charged as it comes).
  return frame->promised_ > 0 || frame->arrived_ >= frame->size_;
}

void MemoryBudget::Drop(Frame* frame) {
  std::deque<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (frame->size_ == 0) return;
    Sub(frame->tenant_, frame->arrived_ + frame->promised_);
    if (frame->listed_) frames_.remove(frame);
    frame->listed_ = false;
    frame->size_ = frame->arrived_ = frame->promised_ = 0;
    Pump(&wake);
  }
  Wake(&wake);
}

bool MemoryBudget::MustWait() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_ >= limit_ || !waiters_.empty();
}

uint64_t MemoryBudget::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t MemoryBudget::used_by(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = accounts_.find(tenant);
  return it == accounts_.end() ? 0 : it->second.held;
}

size_t MemoryBudget::active_tenants() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accounts_.size();
}

uint64_t MemoryBudget::parked_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return parked_total_;
}

uint64_t MemoryBudget::revoked_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return revoked_total_;
}

}  // namespace sluice
