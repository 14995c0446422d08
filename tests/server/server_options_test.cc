// ServerOptions' checks and the defaults worked out from them (server/server_options.h): each
// option out of range is refused naming its flag, and every "0 = work it out" default comes
// from one place, ResolveOptions, as docs/operations.md says.
#include "server/server_options.h"

#include <gtest/gtest.h>

#include "tests/harness/status_matchers.h"

namespace sluice::testing {
namespace {

ServerOptions Valid() {
  ServerOptions o;
  o.data_dir = "/tmp/unused";
  return o;
}

TEST(ServerOptionsTest, AnOptionOutOfRangeIsRefusedNamingItsFlag) {
  EXPECT_THAT(ValidateOptions(ServerOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, "--data_dir"));
  ServerOptions o = Valid();
  o.worker_threads = 0;
  EXPECT_THAT(ValidateOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "--worker_threads=0 is out of range"));
  o = Valid();
  o.data_dir = "/a,/b/,/a";
  EXPECT_THAT(ValidateOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, "names /a twice"));
  o = Valid();
  o.push_credit_timeout = std::chrono::milliseconds(500);
  EXPECT_THAT(ResolveOptions(o, 1024).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "--push_credit_timeout_s=0.5"));
  EXPECT_OK(ValidateOptions(Valid()));
}

// Eviction (docs/object-store.md, "Disks as a cache") must begin below the mark where pushes
// are refused, or it would never make room before they are.
TEST(ServerOptionsTest, TheEvictionMarkIsBelowTheHighWaterMark) {
  ServerOptions o = Valid();
  o.object_store = "s3://bucket/prefix";
  o.etcd_endpoints = "127.0.0.1:2379";
  EXPECT_OK(ValidateOptions(o)) << "85 under 95 by default";
  o.object_evict_pct = 95;
  EXPECT_THAT(ValidateOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--object_evict_pct=95 must be below --disk_high_water_pct=95"));
  o.object_evict_pct = 101;
  EXPECT_THAT(ValidateOptions(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                           "--object_evict_pct=101 is out of range [0, 100]"));
  o.object_evict_pct = 0;  // never
  EXPECT_OK(ValidateOptions(o));
  o.object_evict_pct = 50;
  o.disk_high_water_pct = 0;  // pushes never refused: any mark
  EXPECT_OK(ValidateOptions(o));
  // The pre-merge's copies never take a disk past where eviction begins.
  o.disk_high_water_pct = 95;
  o.object_evict_pct = 60;
  ASSERT_OK_AND_ASSIGN(ResolvedOptions r, ResolveOptions(o, 1024));
  EXPECT_EQ(r.premerge_disk_mark_pct, 60u);
  // Without the tier, the flag is not looked at (a low high-water mark stays valid).
  o = Valid();
  o.disk_high_water_pct = 1;
  EXPECT_OK(ValidateOptions(o));
}

TEST(ServerOptionsTest, DefaultsThatDependOnOtherOptionsAreWorkedOutInOnePlace) {
  ServerOptions o = Valid();
  o.worker_threads = 6;
  o.memory_budget_bytes = 600 << 20;
  o.node_lease_ttl = std::chrono::seconds(3);
  o.disk_high_water_pct = 0;
  ASSERT_OK_AND_ASSIGN(ResolvedOptions r, ResolveOptions(o, 65536));
  EXPECT_FALSE(r.clustered);
  EXPECT_EQ(r.merges, 6u) << "--max_concurrent_merges 0: one per worker thread";
  EXPECT_EQ(r.merge_threads, 6);
  EXPECT_EQ(r.merge_memory_bytes, uint64_t{100} << 20) << "an equal share of the budget";
  EXPECT_EQ(r.premerge_memory_bytes, uint64_t{100} << 20);
  EXPECT_EQ(r.settle, std::chrono::seconds(6)) << "two leases";
  EXPECT_EQ(r.descriptor_limit, 65536);
  EXPECT_EQ(r.max_connections, 32768u);
  EXPECT_EQ(r.max_connections_per_address, 256u) << "a quarter, at most 256";
  EXPECT_EQ(r.max_open_shuffles, (65536u - 32768u - 256u) / 2);
  EXPECT_EQ(r.premerge_disk_mark_pct, 90u) << "no high-water mark";

  o.max_concurrent_merges = 100;
  o.memory_budget_bytes = 64 << 20;
  o.disk_high_water_pct = 95;
  o.etcd_endpoints = "127.0.0.1:2379";
  ASSERT_OK_AND_ASSIGN(r, ResolveOptions(o, 64));
  EXPECT_TRUE(r.clustered);
  EXPECT_EQ(r.merge_threads, 64) << "one thread a slot, at most 64";
  EXPECT_EQ(r.premerge_memory_bytes, r.merge_memory_bytes);
  EXPECT_EQ(r.premerge_disk_mark_pct, 85u) << "10 points under --disk_high_water_pct";
  EXPECT_EQ(r.max_connections, 32u);
  EXPECT_EQ(r.max_connections_per_address, 8u);
  EXPECT_EQ(r.max_open_shuffles, 16u) << "at least 16, however few descriptors";

  o.max_connections = 10;
  o.max_connections_per_address = 2;
  o.max_open_shuffles = 5;
  o.disk_high_water_pct = 15;
  ASSERT_OK_AND_ASSIGN(r, ResolveOptions(o, 64));
  EXPECT_EQ(r.max_connections, 10u) << "the flags win";
  EXPECT_EQ(r.max_connections_per_address, 2u);
  EXPECT_EQ(r.max_open_shuffles, 5u);
  EXPECT_EQ(r.premerge_disk_mark_pct, 15u);
}

}  // namespace
}  // namespace sluice::testing
