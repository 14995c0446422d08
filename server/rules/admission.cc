#include "server/rules/admission.h"

#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/error_reason.h"
#include "server/rules/cluster_node.h"

namespace sluice {

absl::Status OpenStreams::Take(StreamKind kind) {
  std::atomic<size_t>& count = kind == StreamKind::kPush ? push_ : fetch_;
  const size_t limit = kind == StreamKind::kPush ? max_push_ : max_fetch_;
  size_t n = count.load();
  while (n < limit) {
    if (count.compare_exchange_weak(n, n + 1)) return absl::OkStatus();
  }
  const char* what = kind == StreamKind::kPush ? "push" : "fetch";
  return absl::ResourceExhaustedError(absl::StrCat("the server has ", limit, " ", what,
                                                   " streams open, its limit (--max_", what,
                                                   "_streams); retry later"));
}

void OpenStreams::Give(StreamKind kind) {
  (kind == StreamKind::kPush ? push_ : fetch_).fetch_sub(1);
}

absl::StatusOr<std::unique_ptr<StreamAdmission>> StreamAdmission::Enter(StreamKind kind,
                                                                        const CallContext& call,
                                                                        const AdmissionDeps& deps) {
  if (kind == StreamKind::kPush && deps.node != nullptr && deps.node->membership().draining()) {
    return WithReason(
        absl::UnavailableError(absl::StrCat(
            "the server is draining (shutting down or restarting): it takes no new push "
            "streams; retry the attempt in about ",
            kDrainRetryAfter.count() / 1000, " s (it is back, or out of the cluster, by then)")),
        ErrorReason::kDraining, kDrainRetryAfter);
  }
  std::unique_ptr<StreamAdmission> a(new StreamAdmission(kind, call, deps));
  if (a->limits_.streams != 0) {
    absl::Status st = deps.tenants->Enter(a->tenant_, a->limits_.streams);
    if (!st.ok()) return st;
    a->tenant_slot_ = true;
  }
  absl::Status st = deps.streams->Take(kind);
  if (!st.ok()) return st;  // (the destructor gives the tenant's slot back)
  a->server_slot_ = true;
  return a;
}

StreamAdmission::~StreamAdmission() {
  // A wait's callback would run on a destroyed admission and keep what it was granted.
  assert(!waiting_.load() && "an admission destroyed while it waits for memory or a merge slot");
  ReleaseCharge();
  if (credit_ != 0) deps_.budget->CreditReturned(tenant_, kCreditCopies * credit_);
  ReleaseLargeFrame();
  if (merge_slot_) deps_.merge_gate->Leave(tenant_);
  if (server_slot_) deps_.streams->Give(kind_);
  if (plain_slot_) deps_.streams->plain_push_.fetch_sub(1);
  if (tenant_slot_) deps_.tenants->Leave(tenant_);
}

void StreamAdmission::Charge(uint64_t bytes) {
  deps_.budget->Charge(tenant_, bytes);
  charged_ += bytes;
}

void StreamAdmission::ReleaseCharge() {
  if (charged_ == 0) return;
  deps_.budget->Release(tenant_, charged_);
  charged_ = 0;
}

void StreamAdmission::Recharge(uint64_t bytes) {
  if (bytes > charged_) {
    deps_.budget->Charge(tenant_, bytes - charged_);
  } else if (bytes < charged_) {
    deps_.budget->Release(tenant_, charged_ - bytes);
  }
  charged_ = bytes;
}

bool StreamAdmission::TryReserveChargeForReader(uint64_t bytes) {
  if (!deps_.budget->TryReserveLeavingShare(tenant_, bytes)) return false;
  charged_ += bytes;
  return true;
}

void StreamAdmission::ReserveChargeForReader(uint64_t bytes, std::function<void()> granted) {
  waiting_.store(true);
  deps_.budget->ReserveLeavingShare(tenant_, bytes, [this, bytes, granted = std::move(granted)] {
    charged_ += bytes;
    waiting_.store(false);
    granted();
  });
}

bool StreamAdmission::TryReserveCredit(uint64_t bytes) {
  if (!deps_.budget->TryReserveCredit(tenant_, kCreditCopies * bytes)) return false;
  credit_ += bytes;
  return true;
}

void StreamAdmission::ReserveCredit(uint64_t bytes, std::function<void()> granted) {
  waiting_.store(true);
  deps_.budget->ReserveCredit(tenant_, kCreditCopies * bytes,
                              [this, bytes, granted = std::move(granted)] {
                                credit_ += bytes;
                                waiting_.store(false);
                                granted();
                              });
}

bool StreamAdmission::UseCredit(uint64_t bytes) {
  if (bytes > credit_) return false;
  credit_ -= bytes;
  charged_ += kCreditCopies * bytes;
  deps_.budget->CreditUsed(tenant_, kCreditCopies * bytes);
  return true;
}

void StreamAdmission::WhenBudgetAllows(std::function<void()> resume) {
  deps_.budget->WhenAvailable(tenant_, std::move(resume));
}

bool StreamAdmission::BudgetMustWait() const { return deps_.budget->MustWait(); }

absl::Status StreamAdmission::EnterPlainPush() {
  OpenStreams& s = *deps_.streams;
  size_t n = s.plain_push_.load();
  do {
    if (n >= s.max_plain_push_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server has ", s.max_plain_push_,
          " plain Push streams open, its limit (--max_plain_push_streams: a client that sends "
          "without credit may make it hold its stream window and a message outside the memory "
          "budget); retry later, or push with PushFlow, which has no such limit"));
    }
  } while (!s.plain_push_.compare_exchange_weak(n, n + 1));
  plain_slot_ = true;
  return absl::OkStatus();
}

absl::Status StreamAdmission::CheckStored(uint64_t bytes) {
  if (limits_.stored_bytes == 0) return absl::OkStatus();
  if (stored_ == nullptr) stored_ = deps_.registry->TenantBytes(tenant_);
  const int64_t have = stored_->load();
  const uint64_t held = have < 0 ? 0 : static_cast<uint64_t>(have);
  if (held + bytes <= limits_.stored_bytes) return absl::OkStatus();
  return QuotaRefusal(held, bytes);
}

absl::Status StreamAdmission::QuotaRefusal(uint64_t held, uint64_t bytes) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant '", tenant_, "' holds ", held, " bytes on this server; ", bytes,
      " more would pass its quota of ", limits_.stored_bytes,
      " (stored_mb: its quota line in --auth_file, else --tenant_max_stored_mb); the attempt was "
      "discarded: delete shuffles it no longer needs"));
}

absl::Status StreamAdmission::ReserveLargeFrame(uint64_t bytes, std::function<void()> granted) {
  if (limits_.stored_bytes != 0) {
    // Counted at once, so that many streams announcing together cannot pass the quota by a
    // frame each; taken back when the frame is stored (its store counts it then) or fails.
    if (stored_ == nullptr) stored_ = deps_.registry->TenantBytes(tenant_);
    int64_t have = stored_->load();
    for (;;) {
      const uint64_t held = have < 0 ? 0 : static_cast<uint64_t>(have);
      if (held + bytes > limits_.stored_bytes) return QuotaRefusal(held, bytes);
      if (stored_->compare_exchange_weak(have, have + static_cast<int64_t>(bytes))) break;
    }
    quota_reserved_ = bytes;
  }
  large_bytes_ = bytes;
  deps_.budget->Announce(&frame_, tenant_, bytes);
  PromiseRestOfLargeFrame(std::move(granted));
  return absl::OkStatus();
}

void StreamAdmission::PromiseRestOfLargeFrame(std::function<void()> granted) {
  waiting_.store(true);
  deps_.budget->Promise(&frame_, [this, granted = std::move(granted)] {
    waiting_.store(false);
    granted();
  });
}

bool StreamAdmission::LargeFrameArrived(uint64_t n) { return deps_.budget->Arrived(&frame_, n); }

void StreamAdmission::ReleaseLargeFrame() {
  deps_.budget->Drop(&frame_);
  if (quota_reserved_ != 0) stored_->fetch_sub(static_cast<int64_t>(quota_reserved_));
  quota_reserved_ = 0;
  large_bytes_ = 0;
}

bool StreamAdmission::TryEnterMerge() {
  if (merge_slot_) return true;
  merge_slot_ = deps_.merge_gate->TryEnter(tenant_);
  return merge_slot_;
}

void StreamAdmission::EnterMerge(std::function<void()> admitted) {
  waiting_.store(true);
  deps_.merge_gate->Enter(tenant_, [this, admitted = std::move(admitted)] {
    merge_slot_ = true;
    waiting_.store(false);
    admitted();
  });
}

void StreamAdmission::LeaveMerge() {
  if (!merge_slot_) return;
  merge_slot_ = false;
  deps_.merge_gate->Leave(tenant_);
}

bool StreamAdmission::OthersWaitForMerge() const { return deps_.merge_gate->waiting(); }

bool StreamAdmission::OverShareOfMerges() const {
  return deps_.merge_gate->OverShareWhileOthersWait(tenant_);
}

absl::StatusOr<std::unique_ptr<CreateAdmission>> CreateAdmission::Enter(
    const CallContext& call, Tenants* tenants, bool clustered,
    const std::function<absl::StatusOr<size_t>(const std::string& prefix)>& have) {
  std::unique_ptr<CreateAdmission> a(new CreateAdmission());
  const uint64_t limit = call.limits().shuffles;
  if (limit == 0) return a;
  a->mu_ = tenants->CreateMutex(call.tenant());
  a->lock_ = std::unique_lock<std::mutex>(*a->mu_);
  absl::StatusOr<size_t> n = have(call.prefix());
  if (!n.ok()) return n.status();
  if (*n >= limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant '", call.tenant(), "' has ", *n, " shuffles",
        clustered ? " in the cluster" : " on this server",
        ", its quota (shuffles: its quota line in --auth_file, else --tenant_max_shuffles); "
        "delete shuffles it no longer needs"));
  }
  return a;
}

}  // namespace sluice
