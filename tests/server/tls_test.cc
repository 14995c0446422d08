// TLS and mutual TLS on real sluice-server processes, with certificates each test makes with
// openssl (tests/harness/make_certs.sh): what is refused (plaintext, no client certificate, a
// certificate of another CA, an expired one, a wrong server name), what a bad file does to a
// start, the whole data path over mTLS, and a certificate rotated without a restart.
#include "rpc/tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "rpc/tls_options.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The common name of the certificate a new connection to `address` is served.
std::string ServedName(const std::string& address, const std::string& ca_pem) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ca_pem;
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // a new connection, not a shared one
  auto stub = v1::ShuffleService::NewStub(
      grpc::CreateCustomChannel(address, grpc::SslCredentials(o), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListShufflesRequest req;
  v1::ListShufflesResponse resp;
  if (!stub->ListShuffles(&ctx, req, &resp).ok()) return "(call failed)";
  auto names = ctx.auth_context()->FindPropertyValues("x509_common_name");
  return names.empty() ? "(no name)" : std::string(names[0].data(), names[0].size());
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string cmd =
        absl::StrCat("bash ", SLUICE_SOURCE_DIR, "/tests/harness/make_certs.sh ", certs_.path(),
                     " >/dev/null 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0)
        << "make_certs.sh failed: is openssl installed (bash deploy/dev.sh test installs it)?";
  }
  std::string Cert(const std::string& name) const { return certs_.path() + "/" + name; }

 public:
  std::string Path(const std::string& name) const { return Cert(name); }
  std::string Pem(const std::string& name) const { return Slurp(Cert(name)); }

 protected:
  ServerTlsOptions ServerTls(bool mutual) const {
    ServerTlsOptions tls;
    tls.cert_file = Cert("server.pem");
    tls.key_file = Cert("server.key");
    if (mutual) tls.client_ca_file = Cert("ca.pem");
    return tls;
  }
  absl::StatusOr<std::unique_ptr<MiniServer>> StartServer(const ServerTlsOptions& tls) const {
    MiniServerOptions o;
    o.child_process = true;  // the real daemon, with its flags
    o.server.tls = tls;
    return MiniServer::Start(o);
  }
  ClientTlsOptions ClientTls(const std::string& ca, const std::string& client = "") const {
    ClientTlsOptions tls;
    tls.ca_file = Cert(ca);
    if (!client.empty()) {
      tls.cert_file = Cert(client + ".pem");
      tls.key_file = Cert(client + ".key");
    }
    return tls;
  }
  static absl::StatusOr<std::unique_ptr<ShuffleClient>> Client(const MiniServer& s,
                                                               const ClientTlsOptions& tls) {
    ClientOptions o;
    o.tls = tls;
    o.call_deadline = std::chrono::seconds(5);
    return s.Client(o);
  }

  TempDir certs_;
};

// Two mappers' records through a shuffle, read back in both orders: the counts per key match.
void RoundTrip(ShuffleClient& client, const std::string& id) {
  ASSERT_OK(client.CreateShuffle(id, 3, 2).status());
  std::map<std::string, int> sent;
  for (uint32_t m = 0; m < 2; ++m) {
    WriterOptions wo;
    wo.sort_by_key = true;
    ASSERT_OK_AND_ASSIGN(auto w, client.OpenWriter(id, m, 1, wo));
    for (int i = 0; i < 500; ++i) {
      const std::string key = absl::StrCat("k", (i * 7 + m) % 50);
      ASSERT_OK(w->Add(key, absl::StrCat("value ", m, " ", i)));
      ++sent[key];
    }
    ASSERT_OK(w->Close().status());
  }
  for (FetchOrder order : {FetchOrder::kKey, FetchOrder::kUnordered}) {
    std::map<std::string, int> got;
    for (uint32_t p = 0; p < 3; ++p) {
      ReaderOptions ro;
      ro.order = order;
      ro.require_complete = true;
      ASSERT_OK_AND_ASSIGN(auto r, client.OpenReader(id, p, ro));
      Record rec;
      std::string last;
      while (true) {
        ASSERT_OK_AND_ASSIGN(bool more, r->Next(&rec));
        if (!more) break;
        if (order == FetchOrder::kKey) {
          EXPECT_LE(last, std::string(rec.key));
        }
        last = std::string(rec.key);
        ++got[last];
      }
    }
    EXPECT_EQ(got, sent);
  }
}

TEST_F(TlsTest, PlaintextClientIsRefusedAndATlsClientGoesEndToEnd) {
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(ServerTls(/*mutual=*/false)));
  ASSERT_OK_AND_ASSIGN(auto plain, Client(*server, {}));
  absl::Status st = plain->ListShuffles().status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  ASSERT_OK_AND_ASSIGN(auto client, Client(*server, ClientTls("ca.pem")));
  RoundTrip(*client, "tls1");
}

TEST_F(TlsTest, MutualTlsRefusesNoCertificateAnotherCaAndAnExpiredOne) {
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(ServerTls(/*mutual=*/true)));
  // No client certificate.
  ASSERT_OK_AND_ASSIGN(auto anonymous, Client(*server, ClientTls("ca.pem")));
  EXPECT_EQ(anonymous->ListShuffles().status().code(), absl::StatusCode::kUnavailable);
  // A certificate another CA signed.
  ASSERT_OK_AND_ASSIGN(auto stranger, Client(*server, ClientTls("ca.pem", "other-client")));
  EXPECT_EQ(stranger->ListShuffles().status().code(), absl::StatusCode::kUnavailable);
  // An expired certificate: the client library refuses it itself, naming it...
  absl::Status expired = Client(*server, ClientTls("ca.pem", "client-expired")).status();
  EXPECT_EQ(expired.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(expired.message().find("expired on"), std::string::npos) << expired;
  // ... and the server refuses it from a client that does not check (raw gRPC).
  grpc::SslCredentialsOptions raw;
  raw.pem_root_certs = Slurp(Cert("ca.pem"));
  raw.pem_cert_chain = Slurp(Cert("client-expired.pem"));
  raw.pem_private_key = Slurp(Cert("client-expired.key"));
  auto stub = v1::ShuffleService::NewStub(
      grpc::CreateChannel(server->address(), grpc::SslCredentials(raw)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListShufflesRequest req;
  v1::ListShufflesResponse resp;
  EXPECT_EQ(stub->ListShuffles(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
  // The tenants' good certificates go end to end, and the server kept serving throughout.
  ASSERT_OK_AND_ASSIGN(auto a, Client(*server, ClientTls("ca.pem", "client-a")));
  RoundTrip(*a, "mtls1");
  ASSERT_OK_AND_ASSIGN(auto b, Client(*server, ClientTls("ca.pem", "client-b")));
  RoundTrip(*b, "mtls2");
}

TEST_F(TlsTest, AClientCertificatesNameCanBeItsCredential) {
  TempDir dir;
  const std::string creds = dir.path() + "/credentials";
  std::ofstream(creds) << "cn:tenant-a tenant-a tenant\n";
  MiniServerOptions o;
  o.child_process = true;
  o.server.tls = ServerTls(/*mutual=*/true);
  o.server.auth_file = creds;
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(o));
  ASSERT_OK_AND_ASSIGN(auto a, Client(*server, ClientTls("ca.pem", "client-a")));
  RoundTrip(*a, "by-cert");  // no token: the certificate says who it is
  ASSERT_OK_AND_ASSIGN(auto b, Client(*server, ClientTls("ca.pem", "client-b")));
  absl::Status st = b->ListShuffles().status();  // a good certificate, but not listed
  EXPECT_EQ(st.code(), absl::StatusCode::kUnauthenticated) << st;
  EXPECT_NE(st.message().find("'tenant-b' is not one this server knows"), std::string::npos);
}

TEST_F(TlsTest, TheServerIsCheckedAgainstTheCaAndItsName) {
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(ServerTls(/*mutual=*/false)));
  ASSERT_OK_AND_ASSIGN(auto wrong_ca, Client(*server, ClientTls("other-ca.pem")));
  EXPECT_EQ(wrong_ca->ListShuffles().status().code(), absl::StatusCode::kUnavailable);
  ClientTlsOptions named = ClientTls("ca.pem");
  named.server_name = "not-the-server.example";
  ASSERT_OK_AND_ASSIGN(auto wrong_name, Client(*server, named));
  EXPECT_EQ(wrong_name->ListShuffles().status().code(), absl::StatusCode::kUnavailable);
  named.server_name = "localhost";  // a name the certificate carries
  ASSERT_OK_AND_ASSIGN(auto right_name, Client(*server, named));
  EXPECT_OK(right_name->ListShuffles().status());
}

absl::Status StartInProcess(ServerOptions o) {
  TempDir dir;
  o.data_dir = dir.path();
  if (o.listen_address == ServerOptions().listen_address) o.listen_address = "127.0.0.1:0";
  return SluiceServer::Start(o).status();
}

void ExpectRefused(const ServerOptions& o, const std::string& says) {
  absl::Status st = StartInProcess(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(says), std::string::npos) << st << "\nshould say: " << says;
}

TEST_F(TlsTest, AChainIsSentWholeAndOnlyWhatWasCheckedIsServed) {
  // The server's certificate comes from an intermediate CA; clients trust only the root.
  ServerTlsOptions tls;
  tls.cert_file = Cert("chained-full.pem");
  tls.key_file = Cert("chained.key");
  {
    ASSERT_OK_AND_ASSIGN(auto server, StartServer(tls));
    EXPECT_EQ(ServedName(server->address(), Pem("ca.pem")), "sluice-server-chained");
  }
  // A key file that carries a certificate too (of another key): the certificate served is the
  // one checked, --tls_cert's, not the first one gRPC would find in the key's file.
  TempDir dir;
  const std::string key = dir.path() + "/combined.key";
  {
    std::ofstream out(key);
    out << Pem("server2.pem") << Pem("server.key");
  }
  tls.cert_file = Cert("server.pem");
  tls.key_file = key;
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(tls));
  EXPECT_EQ(ServedName(server->address(), Pem("ca.pem")), "sluice-server");
}

TEST_F(TlsTest, TheCertificatesExpiryIsAMetric) {
  MiniServerOptions o;  // in process: its metrics are read directly
  o.server.tls = ServerTls(/*mutual=*/false);
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(o));
  const std::string text = server->server()->RenderMetrics();
  const size_t at = text.find("\nsluice_tls_certificate_expiry_seconds ");
  ASSERT_NE(at, std::string::npos) << text;
  const double expiry = std::stod(text.substr(at + 39));
  // make_certs.sh made it for 30 days from now.
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_GT(expiry, now + 29 * 86400.0);
  EXPECT_LT(expiry, now + 31 * 86400.0);
  ASSERT_OK_AND_ASSIGN(auto plain, MiniServer::Start());
  EXPECT_EQ(plain->server()->RenderMetrics().find("sluice_tls_certificate_expiry_seconds"),
            std::string::npos);
}

TEST_F(TlsTest, BadFilesAndFlagsFailTheStartNamingThem) {
  ServerOptions o;
  o.tls = ServerTls(false);
  o.tls.cert_file = Cert("server-expired.pem");
  o.tls.key_file = Cert("server-expired.key");
  ExpectRefused(o, "--tls_cert=" + Cert("server-expired.pem") + ": the certificate");
  ExpectRefused(o, "expired on");
  o.tls = ServerTls(false);
  o.tls.key_file = Cert("server2.key");
  ExpectRefused(o, "--tls_key=" + Cert("server2.key") + " is not the key of --tls_cert=");
  o.tls.key_file = Cert("missing.key");
  ExpectRefused(o, "--tls_key=" + Cert("missing.key") + ": cannot read it");
  o.tls.key_file = Cert("ca.pem");  // a certificate, not a key
  ExpectRefused(o, "no PEM private key");
  o.tls = ServerTls(false);
  o.tls.cert_file = Cert("server.key");  // a key, not a certificate
  ExpectRefused(o, "no PEM certificate");
  o.tls = ServerTls(false);
  o.tls.key_file.clear();
  ExpectRefused(o, "--tls_cert and --tls_key go together");
  o.tls = ServerTls(true);
  o.tls.client_ca_file = Cert("server.key");
  ExpectRefused(o, "--tls_client_ca=");
  // A chain cut short in its second certificate (a file caught half-written), and one out of
  // order.
  TempDir dir;
  const std::string full = Pem("chained-full.pem");
  const std::string cut = dir.path() + "/cut.pem", reversed = dir.path() + "/reversed.pem";
  std::ofstream(cut) << full.substr(0, full.size() - 200);
  std::ofstream(reversed) << Pem("inter.pem") << Pem("chained.pem");
  o.tls.cert_file = cut;
  o.tls.key_file = Cert("chained.key");
  ExpectRefused(o, "--tls_cert=" + cut + ": the PEM block after certificate 1 is malformed");
  o.tls.cert_file = reversed;
  ExpectRefused(o, "did not sign certificate 1");
  // A FIFO (or any file but a regular one) is refused at once, not waited on for a writer.
  const std::string fifo = dir.path() + "/key.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  o.tls = ServerTls(false);
  o.tls.key_file = fifo;
  ExpectRefused(o, "--tls_key=" + fifo + ": not a regular file");
  o.tls = ServerTls(false);
  o.tls.cert_file = dir.path();  // a directory
  ExpectRefused(o, ": not a regular file");
  o.tls = {};
  o.tls.client_ca_file = Cert("ca.pem");
  ExpectRefused(o, "--tls_client_ca needs --tls_cert and --tls_key");
  o.tls = ServerTls(false);
  o.plaintext = true;
  ExpectRefused(o, "--plaintext and --tls_cert exclude each other");
  o.tls.reload_interval = std::chrono::seconds(0);
  o.plaintext = false;
  ExpectRefused(o, "--tls_reload_s=0 is out of range");
  // Re-replication's flags: each with what it goes with.
  o.tls = ServerTls(false);
  o.peer_tls.cert_file = Cert("client-a.pem");
  ExpectRefused(o, "--peer_tls_cert and --peer_tls_key go together");
  o.peer_tls = {};
  o.tls = {};
  o.peer_tls.ca_file = Cert("ca.pem");
  ExpectRefused(o, "--peer_tls_* are for a server with TLS");
  o.peer_tls = {};
  o.peer_token_file = Cert("ca.pem");
  ExpectRefused(o, "--peer_token_file is for a server with --auth_file");
  o.peer_token_file.clear();
  // Plaintext where other hosts can reach it: only with --plaintext (refused before binding).
  o = ServerOptions();
  o.listen_address = "0.0.0.0:0";
  ExpectRefused(o, "--listen=0.0.0.0:0 is reachable from other hosts: give --tls_cert");
  o.listen_address = "[::]:0";
  ExpectRefused(o, "--plaintext");
  // The client library checks its own files alike.
  ClientOptions c;
  c.tls = ClientTls("ca.pem", "client-a");
  c.tls.key_file = Cert("client-b.key");
  absl::Status st = ShuffleClient::Connect(c).status();
  EXPECT_NE(st.message().find("is not the key of TLS certificate"), std::string::npos) << st;
  c.tls = ClientTls("missing-ca.pem");
  st = ShuffleClient::Connect(c).status();
  EXPECT_NE(st.message().find("TLS CA file " + Cert("missing-ca.pem") + ": cannot read it"),
            std::string::npos)
      << st;
}

// What lets others in is said at the start: a private key every user may read, an auth file
// others may write, the Drain RPC from other hosts with no credentials asked.
TEST_F(TlsTest, UnsafeFilesAndSettingsAreWarnedOf) {
  TempDir dir;
  const std::string key = dir.path() + "/server.key", auth = dir.path() + "/credentials";
  std::ofstream(key) << Pem("server.key");
  std::ofstream(auth) << rpc::TokenHash("slc_a-token") << " team-a tenant\n";
  ASSERT_EQ(::chmod(key.c_str(), 0644), 0);
  ASSERT_EQ(::chmod(auth.c_str(), 0666), 0);
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  ServerOptions o;
  o.tls = ServerTls(false);
  o.tls.key_file = key;
  o.auth_file = auth;
  EXPECT_OK(StartInProcess(o));
  ServerOptions open;
  open.allow_remote_admin = true;
  EXPECT_OK(StartInProcess(open));
  ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  ASSERT_EQ(::chmod(auth.c_str(), 0644), 0);
  open.allow_remote_admin = false;
  const size_t before = log.str().size();
  EXPECT_OK(StartInProcess(o));
  spdlog::set_default_logger(previous);
  const std::string said = log.str();
  EXPECT_NE(said.find("event=unsafe_file flag=--tls_key file=" + key + " mode=644"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("event=unsafe_file flag=--auth_file file=" + auth + " mode=666"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("event=unsafe_setting flag=--allow_remote_admin"), std::string::npos) << said;
  EXPECT_EQ(said.find("event=unsafe", before), std::string::npos) << "safe files warned of";
}

TEST(TlsLoopbackTest, ServesInClearOnLoopbackOnly) {
  EXPECT_TRUE(rpc::IsLoopbackAddress("127.0.0.1:7070"));
  EXPECT_TRUE(rpc::IsLoopbackAddress("127.3.2.1:0"));
  EXPECT_TRUE(rpc::IsLoopbackAddress("localhost:7070"));
  EXPECT_TRUE(rpc::IsLoopbackAddress("[::1]:7070"));
  EXPECT_FALSE(rpc::IsLoopbackAddress("0.0.0.0:7070"));
  EXPECT_FALSE(rpc::IsLoopbackAddress("[::]:7070"));
  EXPECT_FALSE(rpc::IsLoopbackAddress("10.0.0.1:7070"));
  EXPECT_FALSE(rpc::IsLoopbackAddress("sluice-0.sluice:7070"));
  EXPECT_FALSE(rpc::IsLoopbackAddress(":7070"));
  EXPECT_FALSE(rpc::IsLoopbackAddress("128.0.0.1:7070"));
  EXPECT_TRUE(rpc::IsLoopbackAddress("127.0.0.1"));
  EXPECT_FALSE(rpc::IsLoopbackAddress("::1:7070"));  // gRPC dials [::1:7070]:443
  EXPECT_FALSE(rpc::IsLoopbackAddress("localhost.:7070"));
  EXPECT_TRUE(rpc::IsLoopbackAddress("[::ffff:127.0.0.1]:7070"));  // IPv4-mapped
  EXPECT_FALSE(rpc::IsLoopbackAddress("[::ffff:10.0.0.1]:7070"));
  // A call's peer, as gRPC names it.
  EXPECT_TRUE(rpc::IsLoopbackPeer("ipv4:127.0.0.1:5000"));
  EXPECT_TRUE(rpc::IsLoopbackPeer("ipv6:[::1]:5000"));
  EXPECT_TRUE(rpc::IsLoopbackPeer("ipv6:%5B::1%5D:5000"));
  EXPECT_TRUE(rpc::IsLoopbackPeer("ipv6:%5B::ffff:127.0.0.1%5D:5000"));
  EXPECT_TRUE(rpc::IsLoopbackPeer("unix:/run/sluice.sock"));
  EXPECT_FALSE(rpc::IsLoopbackPeer("ipv4:10.0.0.1:5000"));
  EXPECT_FALSE(rpc::IsLoopbackPeer("ipv6:%5B::ffff:10.0.0.1%5D:5000"));
  EXPECT_FALSE(rpc::IsLoopbackPeer("ipv6:[fe80::1]:5000"));
  EXPECT_FALSE(rpc::IsLoopbackPeer("127.0.0.1:5000"));  // not a peer string
}

// Replaces `to` with a copy of `from` in one step, as an operator (or cert-manager) would.
void Install(const std::string& from, const std::string& to) {
  std::filesystem::copy_file(from, to + ".new", std::filesystem::copy_options::overwrite_existing);
  std::filesystem::rename(to + ".new", to);
}

// Waits up to 10 s for new connections to be served the certificate named `want`.
std::string AwaitServedName(const std::string& address, const std::string& ca,
                            const std::string& want) {
  std::string name;
  for (int i = 0; i < 100 && (name = ServedName(address, ca)) != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return name;
}

// The server's certificate and key copied where a test can replace them, and the options that
// name them.
struct Watched {
  Watched(const TlsTest* t, std::chrono::seconds reload)
      : cert(dir.path() + "/tls.pem"), key(dir.path() + "/tls.key"), ca(t->Pem("ca.pem")) {
    Install(t->Path("server.pem"), cert);
    Install(t->Path("server.key"), key);
    tls.cert_file = cert;
    tls.key_file = key;
    tls.reload_interval = reload;
  }
  TempDir dir;
  const std::string cert, key, ca;
  ServerTlsOptions tls;
};

// Rotation, driven by the test (ReloadFiles returns once the files have been looked at): a
// pair caught half-way and an expired one are never taken (the count of sets taken stays), a
// whole new pair is, and is then served to new connections, same process, same data.
TEST_F(TlsTest, ARotatedCertificateIsServedWithoutARestartAndAHalfDoneOneNever) {
  Watched w(this, std::chrono::seconds(3600));  // only the looks the test asks for
  const std::string &cert = w.cert, &key = w.key, &ca = w.ca;
  MiniServerOptions o;  // in process: the test asks it to look at its files now
  o.server.tls = w.tls;
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(o));
  auto reloads = [&] {
    const std::string text = server->server()->RenderMetrics();
    const size_t at = text.find("\nsluice_tls_reloads_total ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + 26));
  };
  EXPECT_EQ(reloads(), 0);
  EXPECT_EQ(ServedName(server->address(), ca), "sluice-server");
  ASSERT_OK_AND_ASSIGN(auto client, Client(*server, ClientTls("ca.pem")));
  ASSERT_OK(client->CreateShuffle("before", 1, 1).status());
  // Half-way: the new certificate is in place, its key not yet. That pair is never taken (gRPC
  // watching the files itself would take it and fail every handshake until the key came).
  Install(Cert("server2.pem"), cert);
  server->server()->ReloadFiles();
  EXPECT_EQ(reloads(), 0);
  EXPECT_EQ(ServedName(server->address(), ca), "sluice-server");
  // The key arrives: the new pair is taken, and served once gRPC reads it (within a second).
  Install(Cert("server2.key"), key);
  server->server()->ReloadFiles();
  EXPECT_EQ(reloads(), 1);
  EXPECT_EQ(AwaitServedName(server->address(), ca, "sluice-server-2"), "sluice-server-2");
  ASSERT_OK_AND_ASSIGN(auto after, Client(*server, ClientTls("ca.pem")));
  ASSERT_OK_AND_ASSIGN(auto status, after->GetShuffle("before"));
  EXPECT_EQ(status.num_partitions, 1u);
  // An expired certificate (with its key) is not taken either.
  Install(Cert("server-expired.pem"), cert);
  Install(Cert("server-expired.key"), key);
  server->server()->ReloadFiles();
  EXPECT_EQ(reloads(), 1);
  EXPECT_EQ(ServedName(server->address(), ca), "sluice-server-2");
}

TEST_F(TlsTest, SighupLooksAtTheFilesAtOnce) {
  Watched w(this, std::chrono::seconds(3600));
  const std::string &cert = w.cert, &key = w.key, &ca = w.ca;
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(w.tls));
  EXPECT_EQ(ServedName(server->address(), ca), "sluice-server");
  Install(Cert("server2.key"), key);
  Install(Cert("server2.pem"), cert);
  ASSERT_EQ(::kill(server->pid(), SIGHUP), 0);
  EXPECT_EQ(AwaitServedName(server->address(), ca, "sluice-server-2"), "sluice-server-2");
  EXPECT_OK(server->Stop());  // SIGHUP did not stop it: a clean stop still exits 0
}

}  // namespace
}  // namespace sluice::testing
