// Metrics: the text format on its own, the HTTP endpoint over real sockets (what it answers,
// and that a silent or oversized client costs it nothing), and a real in-process server whose
// counters follow what a client did: pushes, commits, a duplicate, a refused push, fetches.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/metrics/metric_families.h"
#include "server/metrics/metrics_http.h"
#include "server/metrics/server_metrics.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"

namespace sluice {
namespace {

// A connected socket to 127.0.0.1:port (-1 on failure).
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{10, 0};  // a test never hangs on a server that does not answer
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Sends `request` and reads the whole response (the endpoint closes every connection).
std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "connect failed";
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  ::close(fd);
  return out;
}

// Sends `request`, then half-closes (as `nc -N` and `curl --http0.9`-style clients do), and reads
// the whole response.
std::string ExchangeHalfClosed(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "connect failed";
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  ::close(fd);
  return out;
}

std::string Get(int port, const std::string& path) {
  return Exchange(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
}

// "name{labels}" -> value, from a scrape's samples.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    double v = 0;
    if (sp != absl::string_view::npos && absl::SimpleAtod(line.substr(sp + 1), &v)) {
      out[std::string(line.substr(0, sp))] = v;
    }
  }
  return out;
}

TEST(MetricsTextTest, CountersStayExactLabelsAreEscapedAndHistogramsAccumulate) {
  MetricFamilies f;
  f.Counter("big_total", "a help", 1234567890123.0);
  f.Family("calls_total", prometheus::MetricType::Counter, "by label",
           {{{{"m", "a\"b\\c\nd"}}, 3}});
  Histogram h({0.1, 1});
  h.Observe(0.05);
  h.Observe(0.1);  // le: on the bound counts in it
  h.Observe(0.5);
  h.Observe(7);
  f.Histo("lat_seconds", "latency", h.Read());
  const std::string s = MetricsText(f.families());
  auto v = Samples(s);
  EXPECT_EQ(v["big_total"], 1234567890123.0) << s;
  EXPECT_NE(s.find("# TYPE big_total counter\n"), std::string::npos) << s;
  EXPECT_NE(s.find("calls_total{m=\"a\\\"b\\\\c\\nd\"} 3"), std::string::npos) << s;
  EXPECT_NE(s.find("# TYPE lat_seconds histogram\n"), std::string::npos) << s;
  EXPECT_EQ(v["lat_seconds_bucket{le=\"0.1\"}"], 2) << s;
  EXPECT_EQ(v["lat_seconds_bucket{le=\"1\"}"], 3) << s;
  EXPECT_EQ(v["lat_seconds_bucket{le=\"+Inf\"}"], 4) << s;
  EXPECT_DOUBLE_EQ(v["lat_seconds_sum"], 7.65) << s;
  EXPECT_EQ(v["lat_seconds_count"], 4) << s;
}

std::vector<prometheus::MetricFamily> Up(int* calls = nullptr) {
  if (calls != nullptr) ++*calls;
  MetricFamilies f;
  f.Gauge("up", "up", 1);
  return std::move(f.families());
}

TEST(MetricsEndpointTest, ServesMetricsAndNothingElse) {
  int renders = 0;
  ASSERT_OK_AND_ASSIGN(auto endpoint,
                       MetricsEndpoint::Start("127.0.0.1:0", [&] { return Up(&renders); }));
  const int port = endpoint->port();
  ASSERT_GT(port, 0);
  std::string r = Get(port, "/metrics");
  EXPECT_EQ(r.substr(0, 15), "HTTP/1.1 200 OK") << r;
  EXPECT_NE(r.find("Content-Type: text/plain"), std::string::npos) << r;
  EXPECT_EQ(Samples(r.substr(r.find("\r\n\r\n") + 4))["up"], 1) << r;
  EXPECT_EQ(Get(port, "/other").substr(0, 12), "HTTP/1.1 404");
  r = Exchange(port, "GET /metrics HTTP/1.1\r\nX-Junk: " + std::string(20000, 'a') + "\r\n\r\n");
  EXPECT_EQ(r.find("200 OK"), std::string::npos) << "an oversized request is not served: " << r;
  EXPECT_EQ(renders, 1);
}

// Connects from `source` (a loopback address: each one counts as another client host).
int ConnectFrom(const char* source, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// What a scrape takes while `silent` connections say nothing or half a request.
std::chrono::milliseconds ScrapeTime(int port) {
  const auto start = std::chrono::steady_clock::now();
  const std::string r = Get(port, "/metrics");
  EXPECT_EQ(r.substr(0, 15), "HTTP/1.1 200 OK") << r;
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

// Slow and idle clients cost the endpoint a slot each, never its scrapes: 4 clients trickling a
// request a byte at a time and 220 idle connections (from one address, then from many) left
// prometheus-cpp's endpoint (two threads, a connection each) blind for as long as they kept at
// it; a scrape is answered at once beside them now.
// A complete request followed at once by the client's half-close is answered (it was an empty
// reply for 35 of 40 such clients: the end of the request and its half-close were read in one
// go, and the connection closed unanswered); a request cut short by the close is not.
TEST(MetricsEndpointTest, AClientThatHalfClosesAfterItsRequestIsAnswered) {
  ASSERT_OK_AND_ASSIGN(auto endpoint, MetricsEndpoint::Start("127.0.0.1:0", [] {
                         int renders = 0;
                         return Up(&renders);
                       }));
  for (int i = 0; i < 40; ++i) {
    const std::string r =
        ExchangeHalfClosed(endpoint->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_EQ(r.substr(0, 15), "HTTP/1.1 200 OK") << "try " << i << ": '" << r << "'";
  }
  EXPECT_EQ(ExchangeHalfClosed(endpoint->port(), "GET /metrics HTTP/1.1\r\nHo"), "");
}

TEST(MetricsEndpointTest, SlowAndIdleClientsDoNotBlindScrapes) {
  ASSERT_OK_AND_ASSIGN(auto endpoint, MetricsEndpoint::Start("127.0.0.1:0", [] { return Up(); }));
  const int port = endpoint->port();
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    fds.push_back(Connect(port));
    ASSERT_GE(fds.back(), 0);
    (void)!::send(fds.back(), "G", 1, MSG_NOSIGNAL);
  }
  for (int i = 0; i < 220; ++i) {
    const int fd = Connect(port);
    if (fd >= 0) fds.push_back(fd);
  }
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) (void)!::send(fds[j], "E", 1, MSG_NOSIGNAL);  // still trickling
    EXPECT_LT(ScrapeTime(port), std::chrono::milliseconds(1000));
  }
  // The same from 220 client addresses (127.0.1.x): no one address's limit applies.
  for (int i = 0; i < 220; ++i) {
    const std::string source = "127.0.1." + std::to_string(1 + i % 250);
    const int fd = ConnectFrom(source.c_str(), port);
    if (fd >= 0) fds.push_back(fd);
  }
  EXPECT_LT(ScrapeTime(port), std::chrono::milliseconds(1000));
  for (int fd : fds) ::close(fd);
}

// A client that sends half a request is closed once the request timeout passes.
TEST(MetricsEndpointTest, SilentClientsAreClosedAfterTheTimeout) {
  ASSERT_OK_AND_ASSIGN(auto endpoint, MetricsEndpoint::Start("127.0.0.1:0", [] { return Up(); }));
  const int fd = Connect(endpoint->port());
  ASSERT_GE(fd, 0);
  (void)!::send(fd, "GET /met", 8, MSG_NOSIGNAL);
  const auto start = std::chrono::steady_clock::now();
  std::string left;
  char buf[512];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) left.append(buf, n);
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(MetricsEndpoint::kRequestTimeoutMs + 2000));
  // Closed, with a 4xx answer or without one.
  EXPECT_TRUE(left.empty() || (left.substr(0, 7) == "HTTP/1." && left[9] == '4')) << left;
  ::close(fd);
}

TEST(MetricsEndpointTest, BadAddressesAreNamed) {
  auto bad = MetricsEndpoint::Start("127.0.0.1", [] { return Up(); });
  EXPECT_THAT(bad.status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, "--metrics_listen"));
  ASSERT_OK_AND_ASSIGN(auto first, MetricsEndpoint::Start("127.0.0.1:0", [] { return Up(); }));
  auto taken =
      MetricsEndpoint::Start("127.0.0.1:" + std::to_string(first->port()), [] { return Up(); });
  EXPECT_THAT(taken.status(),
              testing::StatusIs(absl::StatusCode::kUnavailable, "--metrics_listen"));
}

TEST(ServerMetricsTest, CountersFollowWhatClientsDid) {
  testing::MiniServerOptions opts;
  opts.server.metrics_listen = "127.0.0.1:0";
  ASSERT_OK_AND_ASSIGN(auto server, testing::MiniServer::Start(opts));
  const int port = server->server()->metrics_port();
  ASSERT_GT(port, 0);
  ASSERT_OK_AND_ASSIGN(auto client, server->Client());
  ASSERT_OK(client->CreateShuffle("m", 4, 1).status());
  constexpr int kRecords = 5000;
  for (uint64_t attempt : {1, 2}) {  // the second is a duplicate
    WriterOptions w;
    w.sort_by_key = true;
    ASSERT_OK_AND_ASSIGN(auto writer, client->OpenWriter("m", 0, attempt, w));
    for (int i = 0; i < kRecords; ++i) {
      ASSERT_OK(writer->Add("k" + std::to_string(i), std::string(100, 'v')));
    }
    ASSERT_OK_AND_ASSIGN(auto result, writer->Close());
    EXPECT_EQ(result.duplicate, attempt == 2);
  }
  // Refused: a mapper out of range (the shuffle has one).
  auto refused = client->OpenWriter("m", 3, 1);
  if (refused.ok()) {
    ASSERT_OK((*refused)->Add("k", "v"));
    EXPECT_FALSE((*refused)->Close().ok());
  }
  uint64_t fetched = 0;
  for (uint32_t p = 0; p < 4; ++p) {
    ReaderOptions r;
    r.order = FetchOrder::kKey;
    ASSERT_OK_AND_ASSIGN(auto reader, client->OpenReader("m", p, r));
    Record rec;
    for (;;) {
      ASSERT_OK_AND_ASSIGN(bool more, reader->Next(&rec));
      if (!more) break;
      ++fetched;
    }
  }
  ASSERT_EQ(fetched, uint64_t{kRecords});

  const std::string r = Get(port, "/metrics");
  ASSERT_EQ(r.substr(0, 15), "HTTP/1.1 200 OK") << r;
  auto s = Samples(r.substr(r.find("\r\n\r\n") + 4));
  EXPECT_EQ(s["sluice_push_records_total"], 2 * kRecords);  // both attempts were received
  EXPECT_GE(s["sluice_push_frames_total"], 8);
  EXPECT_GT(s["sluice_push_bytes_total"], 1000);
  EXPECT_EQ(s["sluice_commits_total"], 1);
  EXPECT_EQ(s["sluice_duplicate_commits_total"], 1);
  EXPECT_EQ(s["sluice_fetch_records_total"], kRecords);
  EXPECT_GE(s["sluice_fetch_chunks_total"], 4);
  EXPECT_EQ(s["sluice_rpc_handled_total{method=\"PushFlow\",code=\"OK\"}"], 2);
  EXPECT_EQ(s["sluice_rpc_handled_total{method=\"PushFlow\",code=\"INVALID_ARGUMENT\"}"], 1) << r;
  EXPECT_EQ(s["sluice_rpc_handled_total{method=\"Fetch\",code=\"OK\"}"], 4);
  EXPECT_EQ(s["sluice_commit_seconds_count"], 2);
  EXPECT_GE(s["sluice_commit_sync_seconds_count"], 1);
  EXPECT_EQ(s["sluice_commit_sync_seconds_bucket{le=\"+Inf\"}"],
            s["sluice_commit_sync_seconds_count"]);
  EXPECT_EQ(s["sluice_shuffles"], 1);
  EXPECT_EQ(s["sluice_partitions"], 4);
  EXPECT_EQ(s["sluice_push_streams"], 0);
  EXPECT_EQ(s["sluice_memory_budget_bytes"], 256.0 * (1 << 20));
  EXPECT_GT(s["sluice_disk_free_bytes{dir=\"1\"}"], 0) << r;
  EXPECT_EQ(r.find(server->data_dir()), std::string::npos) << "a scrape names no server path";
  EXPECT_EQ(s["sluice_draining"], 0);
  EXPECT_GT(s["sluice_start_time_seconds"], 1.7e9);
  // The same text in process.
  EXPECT_NE(server->server()->RenderMetrics().find("sluice_commits_total 1\n"), std::string::npos);
}

// Calls to methods the server does not have are counted under one name: a client sending
// random paths must not grow the server's memory and its scrapes.
TEST(ServerMetricsTest, UnknownMethodsAreCountedUnderOneLabel) {
  ASSERT_OK_AND_ASSIGN(auto server, testing::MiniServer::Start());
  grpc::GenericStub generic(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 5; ++i) {
    grpc::ClientContext ctx;
    grpc::Slice empty;
    grpc::ByteBuffer request(&empty, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/x.Y/random" + std::to_string(i), grpc::StubOptions(), &request,
                      &response, [&done](grpc::Status st) { done.set_value(st); });
    EXPECT_EQ(done.get_future().get().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  const std::string text = server->server()->RenderMetrics();
  EXPECT_EQ(Samples(text)["sluice_rpc_handled_total{method=\"unknown\",code=\"UNIMPLEMENTED\"}"], 5)
      << text;
  EXPECT_EQ(text.find("random"), std::string::npos) << text;
}

TEST(ServerMetricsTest, ATakenMetricsPortFailsTheStartAndNamesTheFlag) {
  ASSERT_OK_AND_ASSIGN(auto first, MetricsEndpoint::Start("127.0.0.1:0", [] { return Up(); }));

  testing::MiniServerOptions opts;
  opts.server.metrics_listen = "127.0.0.1:" + std::to_string(first->port());
  EXPECT_THAT(testing::MiniServer::Start(opts).status(),
              testing::StatusIs(absl::StatusCode::kUnavailable, "--metrics_listen"));
}

}  // namespace
}  // namespace sluice
