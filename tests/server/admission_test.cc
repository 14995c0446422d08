// Admission on its own: what one stream or create takes of the server's shared resources
// (tenant and server stream slots, the memory budget, a large frame's reservation, the
// tenant's stored-bytes quota, a merge slot, the create lock), refused with the error that
// names the limit, and all given back by the admission's destructor. Real pools and budget;
// no server, no socket.
#include "server/rules/admission.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "server/rules/cluster_node.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice::testing {
namespace {

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest()
      : registry_(*ShuffleRegistry::Open(dir_.path(), StoreOptions{})),
        node_(registry_.get(), /*clustered=*/false) {}

  AdmissionDeps Deps() {
    return AdmissionDeps{&tenants_, &streams_, &budget_, &gate_, registry_.get(), &node_};
  }
  static CallContext Tenant(const std::string& name, TenantQuota quota = {}) {
    return CallContext(Identity{name, Role::kTenant, quota}, TenantLimits{});
  }

  TempDir dir_;
  std::unique_ptr<ShuffleRegistry> registry_;
  ClusterNode node_;
  Tenants tenants_;
  OpenStreams streams_{2, 1};  // 2 push streams, 1 fetch stream
  WorkerPool pool_{2};
  MemoryBudget budget_{1000, &pool_};
  Gate gate_{1, &pool_};
};

TEST_F(AdmissionTest, StreamsTakeTheirTenantsAndTheServersSlotsUntilDestroyed) {
  const CallContext a = Tenant("a", TenantQuota{std::nullopt, std::nullopt, 1});
  auto first = StreamAdmission::Enter(StreamKind::kPush, a, Deps());
  ASSERT_OK(first.status());
  EXPECT_EQ(streams_.push(), 1u);
  // The tenant's quota of one stream is taken; another tenant is not held up by it.
  EXPECT_THAT(StreamAdmission::Enter(StreamKind::kFetch, a, Deps()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "tenant 'a' has 1 push and fetch"));
  EXPECT_EQ(streams_.fetch(), 0u) << "a refused stream holds nothing";
  auto b1 = StreamAdmission::Enter(StreamKind::kPush, Tenant("b"), Deps());
  ASSERT_OK(b1.status());
  // The server's push streams are full: refused naming the flag.
  EXPECT_THAT(StreamAdmission::Enter(StreamKind::kPush, Tenant("b"), Deps()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "--max_push_streams"));
  auto f = StreamAdmission::Enter(StreamKind::kFetch, CallContext(), Deps());
  ASSERT_OK(f.status());
  EXPECT_THAT(StreamAdmission::Enter(StreamKind::kFetch, CallContext(), Deps()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "--max_fetch_streams"));
  first->reset();  // the destructor gives both slots back
  EXPECT_EQ(streams_.push(), 1u);
  EXPECT_THAT(StreamAdmission::Enter(StreamKind::kFetch, a, Deps()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "--max_fetch_streams"))
      << "the tenant's slot is free again, the server's fetch slot is still taken";
  f->reset();
  EXPECT_OK(StreamAdmission::Enter(StreamKind::kFetch, a, Deps()).status());
}

TEST_F(AdmissionTest, ADrainingServerTakesNoNewPushesButServesFetches) {
  node_.membership().SetDraining();
  EXPECT_THAT(StreamAdmission::Enter(StreamKind::kPush, CallContext(), Deps()).status(),
              StatusIs(absl::StatusCode::kUnavailable, "draining"));
  EXPECT_EQ(streams_.push(), 0u);
  EXPECT_OK(StreamAdmission::Enter(StreamKind::kFetch, CallContext(), Deps()).status());
}

TEST_F(AdmissionTest, ChargesAndALargeFramesReservationGoBackWithTheAdmission) {
  {
    ASSERT_OK_AND_ASSIGN(auto s, StreamAdmission::Enter(StreamKind::kPush, CallContext(), Deps()));
    s->Charge(300);
    EXPECT_EQ(budget_.used(), 300u);
    s->ReleaseCharge();
    EXPECT_EQ(budget_.used(), 0u);
    s->Charge(200);
    // A reservation larger than what is left waits for room, holding nothing meanwhile.
    ASSERT_OK_AND_ASSIGN(auto other,
                         StreamAdmission::Enter(StreamKind::kPush, CallContext(), Deps()));
    std::atomic<bool> granted{false};
    s->ReleaseCharge();
    other->Charge(500);
    const uint64_t parked = budget_.parked_total();
    ASSERT_OK(s->ReserveLargeFrame(900, [&] { granted = true; }));
    EXPECT_TRUE(s->holds_large_frame());
    // 500 + 900 do not fit a budget of 1000: it waits (parked by the call itself, so its grant
    // can come only from a release).
    EXPECT_EQ(budget_.parked_total(), parked + 1);
    EXPECT_FALSE(granted.load());
    other.reset();  // its charge goes back: the reservation fits
    ASSERT_TRUE(Eventually([&] { return granted.load(); }));
    EXPECT_EQ(budget_.used(), 900u);
  }
  // Both admissions are gone, the reservation with them.
  ASSERT_TRUE(Eventually([&] { return budget_.used() == 0; }));
}

TEST_F(AdmissionTest, ATenantsStoredBytesQuotaCountsALargeFrameAtOnce) {
  const CallContext a = Tenant("a", TenantQuota{std::nullopt, 1000, std::nullopt});
  auto held = registry_->TenantBytes("a");
  held->store(600);  // what its stores hold
  ASSERT_OK_AND_ASSIGN(auto s, StreamAdmission::Enter(StreamKind::kPush, a, Deps()));
  EXPECT_OK(s->CheckStored(400));
  EXPECT_THAT(s->CheckStored(401),
              StatusIs(absl::StatusCode::kResourceExhausted, "would pass its quota of 1000"));
  std::atomic<bool> granted{false};
  ASSERT_OK(s->ReserveLargeFrame(300, [&] { granted = true; }));
  EXPECT_EQ(held->load(), 900) << "counted before any piece arrives";
  ASSERT_OK_AND_ASSIGN(auto t, StreamAdmission::Enter(StreamKind::kPush, a, Deps()));
  EXPECT_THAT(t->ReserveLargeFrame(200, [] {}),
              StatusIs(absl::StatusCode::kResourceExhausted, "tenant 'a' holds 900 bytes"));
  EXPECT_FALSE(t->holds_large_frame());
  ASSERT_TRUE(Eventually([&] { return granted.load(); }));
  s->ReleaseLargeFrame();
  EXPECT_EQ(held->load(), 600);
  EXPECT_EQ(budget_.used(), 0u);
  // Admins and tenants without the quota are not counted.
  t.reset();
  ASSERT_OK_AND_ASSIGN(auto admin,
                       StreamAdmission::Enter(StreamKind::kPush, CallContext(), Deps()));
  EXPECT_OK(admin->CheckStored(uint64_t{1} << 40));
}

TEST_F(AdmissionTest, AMergeSlotIsHeldUntilTheAdmissionGoes) {
  ASSERT_OK_AND_ASSIGN(auto a, StreamAdmission::Enter(StreamKind::kFetch, CallContext(), Deps()));
  EXPECT_TRUE(a->TryEnterMerge());
  EXPECT_TRUE(a->TryEnterMerge()) << "one slot per admission, taken once";
  OpenStreams more(2, 2);
  AdmissionDeps deps = Deps();
  deps.streams = &more;
  ASSERT_OK_AND_ASSIGN(auto b, StreamAdmission::Enter(StreamKind::kFetch, CallContext(), deps));
  EXPECT_FALSE(b->TryEnterMerge());
  std::atomic<bool> admitted{false};
  b->EnterMerge([&] { admitted = true; });
  EXPECT_FALSE(admitted.load());
  a.reset();
  ASSERT_TRUE(Eventually([&] { return admitted.load(); }));
}

TEST_F(AdmissionTest, ATenantsCreatesCountItsShufflesOneAtATime) {
  const CallContext a = Tenant("a", TenantQuota{2, std::nullopt, std::nullopt});
  std::atomic<size_t> have{1};
  auto count = [&](const std::string& prefix) -> absl::StatusOr<size_t> {
    EXPECT_EQ(prefix, "a~");
    return have.load();
  };
  ASSERT_OK_AND_ASSIGN(auto first, CreateAdmission::Enter(a, &tenants_, false, count));
  // A second create of the tenant waits for the first to be done (its shuffle made).
  auto second = std::async(std::launch::async, [&] {
    return CreateAdmission::Enter(a, &tenants_, false, count).status();
  });
  EXPECT_EQ(second.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  have = 2;  // the first made its shuffle
  first.reset();
  EXPECT_THAT(second.get(), StatusIs(absl::StatusCode::kResourceExhausted,
                                     "tenant 'a' has 2 shuffles on this server, its quota"));
  // Another tenant, and admins, are not held by it.
  ASSERT_OK_AND_ASSIGN(auto held, CreateAdmission::Enter(a, &tenants_, false, [](const auto&) {
                         return absl::StatusOr<size_t>(0);
                       }));
  EXPECT_OK(CreateAdmission::Enter(Tenant("b", TenantQuota{2, std::nullopt, std::nullopt}),
                                   &tenants_, false,
                                   [](const auto&) { return absl::StatusOr<size_t>(0); })
                .status());
  EXPECT_OK(CreateAdmission::Enter(CallContext(), &tenants_, true, count).status());
}

}  // namespace
}  // namespace sluice::testing
