// Authentication (--auth_file): the credentials file's rules on their own, then a real server
// asking every call for a token or a known client certificate, with the health service open
// to probes, Drain for admins only, the file reloaded under a running server, and clients that
// never send a token in clear off this machine.
#include "server/security/auth.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "rpc/tls_options.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice::testing {
namespace {

constexpr char kTokenA[] = "slc_token-of-tenant-a";
constexpr char kTokenOps[] = "slc_token-of-the-operators";

std::string Lines() {
  return absl::StrCat("# test credentials\n", rpc::TokenHash(kTokenA), " tenant-a tenant\n",
                      rpc::TokenHash(kTokenOps), "\tops\tadmin   # the operators\n\n",
                      "cn:tenant-b tenant-b tenant\n");
}

TEST(CredentialsTest, ParsesTokensCertificateNamesAndRoles) {
  ASSERT_OK_AND_ASSIGN(auto creds, ParseCredentials(Lines(), "f"));
  ASSERT_EQ(creds.size(), 3u);
  Authenticator auth(creds);
  ASSERT_OK_AND_ASSIGN(Identity a, auth.Authenticate(absl::StrCat("Bearer ", kTokenA), ""));
  EXPECT_EQ(a.tenant, "tenant-a");
  EXPECT_FALSE(a.admin());
  ASSERT_OK_AND_ASSIGN(Identity ops, auth.Authenticate(absl::StrCat("bearer  ", kTokenOps), ""));
  EXPECT_EQ(ops.tenant, "ops");
  EXPECT_TRUE(ops.admin());
  ASSERT_OK_AND_ASSIGN(Identity b, auth.Authenticate("", "tenant-b"));
  EXPECT_EQ(b.tenant, "tenant-b");
  // A token wins over the certificate; a wrong one is not rescued by a good certificate.
  EXPECT_EQ(auth.Authenticate("Bearer nope", "tenant-b").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(CredentialsTest, RefusalsSayWhatWasWrongAndNeverEchoTheToken) {
  ASSERT_OK_AND_ASSIGN(auto creds, ParseCredentials(Lines(), "f"));
  Authenticator auth(creds);
  auto message = [&](absl::string_view authorization, absl::string_view cn) {
    absl::Status st = auth.Authenticate(authorization, cn).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnauthenticated) << st;
    return std::string(st.message());
  };
  EXPECT_NE(message("", "").find("requires credentials"), std::string::npos);
  EXPECT_NE(message("Basic abc", "").find("'Bearer <token>'"), std::string::npos);
  const std::string wrong = message("Bearer slc_secret-guess", "");
  EXPECT_NE(wrong.find("not one this server knows"), std::string::npos);
  EXPECT_EQ(wrong.find("secret-guess"), std::string::npos);
  EXPECT_NE(message("", "stranger").find("'stranger' is not one"), std::string::npos);
  EXPECT_NE(message("Bearer " + std::string(5000, 'x'), "").find("4096"), std::string::npos);
}

TEST(CredentialsTest, BadLinesAreNamed) {
  auto error = [](const std::string& text) {
    absl::StatusOr<std::vector<Credential>> c = ParseCredentials(text, "creds");
    EXPECT_FALSE(c.ok());
    return std::string(c.status().message());
  };
  EXPECT_NE(error("\nsha256:abc t tenant\n").find("creds line 2: the token's SHA-256"),
            std::string::npos);
  EXPECT_NE(error(rpc::TokenHash("x") + " t owner").find("the role is tenant or admin"),
            std::string::npos);
  EXPECT_NE(error(rpc::TokenHash("x") + " bad/name tenant").find("a tenant is"), std::string::npos);
  EXPECT_NE(error("token123 t tenant").find("must start with sha256: or cn:"), std::string::npos);
  EXPECT_NE(error("cn:a t").find("expected 3 fields"), std::string::npos);
  EXPECT_NE(error("cn:a t tenant\ncn:a u tenant").find("line 2: the credential is listed twice"),
            std::string::npos);
}

class AuthServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = dir_.path() + "/credentials";
    std::ofstream(file_) << Lines();
    MiniServerOptions o;
    o.server.auth_file = file_;
    o.server.auth_reload_interval = std::chrono::seconds(1);
    ASSERT_OK_AND_ASSIGN(server_, MiniServer::Start(o));
  }
  absl::StatusOr<std::unique_ptr<ShuffleClient>> Client(const std::string& token) {
    ClientOptions o;
    o.token = token;
    return server_->Client(o);
  }
  TempDir dir_;
  std::string file_;
  std::unique_ptr<MiniServer> server_;
};

TEST_F(AuthServerTest, EveryCallNeedsAKnownTokenButHealthProbesDoNot) {
  ASSERT_OK_AND_ASSIGN(auto anonymous, Client(""));
  ASSERT_OK_AND_ASSIGN(auto guesser, Client("slc_guess"));
  for (ShuffleClient* c : {anonymous.get(), guesser.get()}) {
    EXPECT_EQ(c->ListShuffles().status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(c->CreateShuffle("s", 2, 1).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(c->GetNode().status().code(), absl::StatusCode::kUnauthenticated);
  }
  // Pushes and fetches (streams) too; a known token goes end to end.
  ASSERT_OK_AND_ASSIGN(auto a, Client(kTokenA));
  ASSERT_OK(a->CreateShuffle("s", 2, 1).status());
  EXPECT_EQ(anonymous->OpenWriter("s", 0, 1, {}).status().code(),
            absl::StatusCode::kUnauthenticated);
  {
    // The streams themselves, below the client library: no token, no push or fetch.
    auto stub = MakeStub(*server_);
    grpc::ClientContext push_ctx;
    v1::PushResponse push_resp;
    auto push = stub->Push(&push_ctx, &push_resp);
    push->WritesDone();
    EXPECT_EQ(push->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext fetch_ctx;
    v1::FetchRequest req;
    req.set_shuffle_id("s");
    auto fetch = stub->Fetch(&fetch_ctx, req);
    v1::FetchResponse chunk;
    while (fetch->Read(&chunk)) {
    }
    EXPECT_EQ(fetch->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  ASSERT_OK_AND_ASSIGN(auto w, a->OpenWriter("s", 0, 1, {}));
  ASSERT_OK(w->Add("k", "v"));
  ASSERT_OK(w->Close().status());
  for (ShuffleClient* c : {anonymous.get(), a.get()}) {
    absl::StatusOr<std::unique_ptr<ShuffleReader>> r = c->OpenReader("s", 0, {});
    absl::Status st = r.status();
    size_t n = 0;
    if (st.ok()) {
      Record rec;
      while (true) {
        absl::StatusOr<bool> more = (*r)->Next(&rec);
        if (!more.ok()) st = more.status();
        if (!more.ok() || !*more) break;
        ++n;
      }
    }
    if (c == anonymous.get()) {
      EXPECT_EQ(st.code(), absl::StatusCode::kUnauthenticated) << st;
    } else {
      EXPECT_OK(st);
    }
  }
  ASSERT_OK_AND_ASSIGN(ShuffleStatus s, a->GetShuffle("s"));
  EXPECT_EQ(s.partitions[0].records + s.partitions[1].records, 1u);
  // Probes carry no credentials.
  ASSERT_OK_AND_ASSIGN(int health, HealthCheck(server_->address(), "sluice.v1.ShuffleService"));
  EXPECT_EQ(health, 1);
}

TEST_F(AuthServerTest, DrainIsForAdmins) {
  ASSERT_OK_AND_ASSIGN(auto a, Client(kTokenA));
  absl::Status st = a->Drain(1);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  ASSERT_OK_AND_ASSIGN(auto ops, Client(kTokenOps));
  EXPECT_OK(ops->Drain(1));
}

TEST_F(AuthServerTest, TheFileIsReadAgainAndABrokenOneKeepsThePrevious) {
  const std::string new_token = "slc_added-later";
  ASSERT_OK_AND_ASSIGN(auto later, Client(new_token));
  EXPECT_EQ(later->ListShuffles().status().code(), absl::StatusCode::kUnauthenticated);
  std::ofstream(file_ + ".new") << Lines() << rpc::TokenHash(new_token) << " tenant-c tenant\n";
  std::rename((file_ + ".new").c_str(), file_.c_str());
  // Taken at the next look (every --auth_reload_s: 1 s here).
  EXPECT_TRUE(Eventually([&] { return later->ListShuffles().ok(); }));
  // A broken file is not taken: once the server has looked at it (ReloadFiles returns then),
  // the tokens of the last good one still work.
  std::ofstream(file_ + ".new") << "this is not a credentials file\n";
  std::rename((file_ + ".new").c_str(), file_.c_str());
  server_->server()->ReloadFiles();
  EXPECT_OK(later->ListShuffles().status());
  ASSERT_OK_AND_ASSIGN(auto a, Client(kTokenA));
  EXPECT_OK(a->ListShuffles().status());
}

TEST(AuthClientTest, ATokenIsNeverSentInClearOffThisMachine) {
  ClientOptions o;
  o.server = "10.0.0.1:7070";  // never dialled: Connect refuses first
  o.token = kTokenA;
  absl::Status st = ShuffleClient::Connect(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("a token would cross the network in clear"), std::string::npos);
  o.server = "127.0.0.1:7070,10.0.0.2:7070";
  EXPECT_FALSE(ShuffleClient::Connect(o).ok());
  o.server = "127.0.0.5:7070";
  EXPECT_OK(ShuffleClient::Connect(o).status());
  o.token = "slc_with a space";
  EXPECT_NE(ShuffleClient::Connect(o).status().message().find("printable ASCII"),
            std::string::npos);
}

TEST(AuthServerStartTest, AMissingOrBrokenFileFailsTheStart) {
  TempDir dir;
  MiniServerOptions o;
  o.server.auth_file = dir.path() + "/missing";
  absl::Status st = MiniServer::Start(o).status();
  EXPECT_NE(st.message().find("--auth_file=" + dir.path() + "/missing: cannot read it"),
            std::string::npos)
      << st;
  std::ofstream(dir.path() + "/bad") << "cn:x y\n";
  o.server.auth_file = dir.path() + "/bad";
  st = MiniServer::Start(o).status();
  EXPECT_NE(st.message().find("line 1: expected 3 fields"), std::string::npos) << st;
  // A directory, and a file with no credentials (every call would be refused).
  o.server.auth_file = dir.path();
  st = MiniServer::Start(o).status();
  EXPECT_NE(st.message().find("not a regular file"), std::string::npos) << st;
  std::ofstream(dir.path() + "/empty") << "# nothing yet\n";
  o.server.auth_file = dir.path() + "/empty";
  st = MiniServer::Start(o).status();
  EXPECT_NE(st.message().find("no credentials in it"), std::string::npos) << st;
}

}  // namespace
}  // namespace sluice::testing
