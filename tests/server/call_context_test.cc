// Who a call is (CallContext) and what tenants may hold, on their own: the id rules, quota
// lines and the quotas they set. No server, no socket (tenancy_test.cc drives the same through
// real servers).
#include "server/security/call_context.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/tls_options.h"
#include "server/storage/shuffle_id.h"
#include "tests/harness/status_matchers.h"

namespace sluice::testing {
namespace {

constexpr char kTokenA[] = "slc_token-of-tenant-a";
constexpr char kTokenB[] = "slc_token-of-tenant-b";
constexpr char kTokenOps[] = "slc_token-of-the-operators";

Identity Tenant(const std::string& name) { return Identity{name, Role::kTenant, {}}; }

TEST(CallContextTest, TenantsHaveNamespacesOfTheirOwn) {
  const CallContext a(Tenant("team-a"), TenantLimits{});
  EXPECT_EQ(a.prefix(), "team-a~");
  ASSERT_OK_AND_ASSIGN(std::string id, a.Kept("job"));
  EXPECT_EQ(id, "team-a~job");
  EXPECT_EQ(a.Shown(id), "job");
  EXPECT_EQ(TenantOf(id), "team-a");
  EXPECT_EQ(TenantOf("job"), "");
  // Messages name a shuffle as its tenant knows it.
  EXPECT_EQ(ShuffleName(id), "job");
  EXPECT_EQ(ShuffleName("job"), "job");
  // A tenant cannot name another's shuffle (or make an id that looks like one).
  EXPECT_EQ(a.Kept("team-b~job").status().code(), absl::StatusCode::kInvalidArgument);
  // Admins and servers without authentication address the kept names.
  const CallContext ops(Identity{"ops", Role::kAdmin, {}}, TenantLimits{});
  EXPECT_EQ(ops.prefix(), "");
  ASSERT_OK_AND_ASSIGN(std::string raw, ops.Kept("team-b~job"));
  EXPECT_EQ(raw, "team-b~job");
  EXPECT_EQ(ops.Shown(raw), "team-b~job");
  ASSERT_OK_AND_ASSIGN(std::string open, CallContext().Kept("job"));
  EXPECT_EQ(open, "job");
  EXPECT_TRUE(CallContext().admin());
  // The registry takes qualified ids, and only well-formed ones.
  EXPECT_OK(ValidateShuffleId("team-a~job"));
  EXPECT_FALSE(ValidateShuffleId("~job").ok());
  EXPECT_FALSE(ValidateShuffleId("team-a~").ok());
  EXPECT_FALSE(ValidateShuffleId("a~b~c").ok());
  EXPECT_FALSE(ValidateShuffleId(".a~job").ok());
  EXPECT_FALSE(ValidateShuffleId("a~.job").ok());
}

// Ids have a length limit, checked where a caller's id comes in, and messages never carry
// more than a few dozen characters of what a caller sent.
TEST(CallContextTest, ALongIdIsRefusedWithAShortMessage) {
  const std::string long_id(10000, 'x');
  for (const CallContext& call : {CallContext(Tenant("team-a"), TenantLimits{}), CallContext()}) {
    const absl::Status st = call.Kept(long_id).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("10000 characters"), absl::string_view::npos) << st;
    EXPECT_LT(st.message().size(), 200u);
  }
  EXPECT_OK(CallContext(Tenant("team-a"), TenantLimits{}).Kept(std::string(128, 'x')).status());
  EXPECT_FALSE(CallContext(Tenant("team-a"), TenantLimits{}).Kept(std::string(129, 'x')).ok());
  EXPECT_LT(ValidateShuffleId(long_id).message().size(), 200u);
}

TEST(CallContextTest, QuotaLinesSetLimitsAndFlagsFillTheRest) {
  const std::string text =
      absl::StrCat(rpc::TokenHash(kTokenA), " team-a tenant\n", rpc::TokenHash(kTokenB),
                   " team-b tenant\n", rpc::TokenHash(kTokenOps), " ops admin\n",
                   "quota team-a shuffles=3 stored_mb=2   # team-a's\nquota ops streams=1\n");
  ASSERT_OK_AND_ASSIGN(auto creds, ParseCredentials(text, "f"));
  Authenticator auth(creds);
  const TenantLimits defaults{10, 0, 7};
  ASSERT_OK_AND_ASSIGN(CallContext a,
                       CallContext::Resolve(&auth, defaults, absl::StrCat("Bearer ", kTokenA), "",
                                            "ipv4:10.0.0.1:5000", false));
  EXPECT_EQ(a.tenant(), "team-a");
  EXPECT_FALSE(a.local());
  const TenantLimits la = a.limits();
  EXPECT_EQ(la.shuffles, 3u);
  EXPECT_EQ(la.stored_bytes, uint64_t{2} << 20);
  EXPECT_EQ(la.streams, 7u);
  ASSERT_OK_AND_ASSIGN(CallContext b,
                       CallContext::Resolve(&auth, defaults, absl::StrCat("Bearer ", kTokenB), "",
                                            "ipv4:127.0.0.1:5000", true));
  EXPECT_TRUE(b.local());
  const TenantLimits lb = b.limits();
  EXPECT_EQ(lb.shuffles, 10u);
  EXPECT_EQ(lb.stored_bytes, 0u);
  // Admins have no quota, whatever a line says.
  ASSERT_OK_AND_ASSIGN(
      CallContext ops,
      CallContext::Resolve(&auth, defaults, absl::StrCat("Bearer ", kTokenOps), "", "", true));
  EXPECT_EQ(ops.limits().streams, 0u);
  // Without credentials the server knows: UNAUTHENTICATED; without --auth_file: an admin.
  EXPECT_EQ(CallContext::Resolve(&auth, defaults, "Bearer nope", "", "", true).status().code(),
            absl::StatusCode::kUnauthenticated);
  ASSERT_OK_AND_ASSIGN(CallContext anyone,
                       CallContext::Resolve(nullptr, defaults, "", "", "", true));
  EXPECT_TRUE(anyone.admin());
  EXPECT_EQ(anyone.limits().shuffles, 0u);

  auto error = [](const std::string& line) {
    absl::StatusOr<std::vector<Credential>> c =
        ParseCredentials(absl::StrCat("cn:x t tenant\n", line), "creds");
    EXPECT_FALSE(c.ok()) << line;
    return std::string(c.status().message());
  };
  EXPECT_NE(error("quota t disk=5").find("creds line 2: unknown quota 'disk'"), std::string::npos);
  EXPECT_NE(error("quota t shuffles=x").find("is not key=number"), std::string::npos);
  EXPECT_NE(error("quota t shuffles=1 shuffles=2").find("given twice"), std::string::npos);
  EXPECT_NE(error("quota t").find("a quota line is"), std::string::npos);
  EXPECT_NE(error("quota bad/name shuffles=1").find("a quota line is"), std::string::npos);
  EXPECT_NE(error("quota t streams=1\nquota t shuffles=1").find("line 3: a second quota line"),
            std::string::npos);
  EXPECT_NE(error("quota t stored_mb=99999999999999999").find("at most"), std::string::npos);
  EXPECT_NE(error("cn:y .hidden tenant").find("not starting with '.'"), std::string::npos);
  EXPECT_NE(error("quota t shuffles=+5").find("is not key=number"), std::string::npos);
  // A quota line no credential's tenant matches (misspelt, or the tenant's credentials removed)
  // is reported, not refused: removing a tenant's last credential must always take effect.
  std::vector<std::string> unused;
  ASSERT_OK(
      ParseCredentials("cn:x t tenant\nquota team_a shuffles=5\nquota t streams=1", "f", &unused)
          .status());
  EXPECT_EQ(unused, std::vector<std::string>{"team_a"});
}

}  // namespace
}  // namespace sluice::testing
