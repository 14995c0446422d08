// MetricsEndpoint: the HTTP port Prometheus scrapes (--metrics_listen). It answers `GET /metrics`
// (and HEAD) with the families `collect` returns, in the text format; other paths get 404,
// other methods 405, a malformed request 400, an oversized one 431, and every connection is
// closed after its answer.
//
// Its own budget, as every resource a client can make the server spend, and one thread that
// waits on all its connections at once (poll): a connection is a slot, not a thread, so slow or
// idle clients cannot keep a scrape waiting (prometheus-cpp's endpoint, a thread per
// connection, went blind under 4 slow clients). At most kMaxConnections are open, and
// kMaxPerAddress from one client address: past either, the oldest of them is closed for the
// newcomer. A request is at most kMaxRequestBytes; a connection lives at most kRequestTimeoutMs
// (its request in, its answer out). Its descriptors are its own: they are not counted by the
// gRPC listener's ConnectionGuard.
//
//   auto endpoint = MetricsEndpoint::Start("0.0.0.0:9090", [&] { return Collect(); });
//   ... (*endpoint)->port() ...
#ifndef SLUICE_SERVER_METRICS_METRICS_HTTP_H_
#define SLUICE_SERVER_METRICS_METRICS_HTTP_H_

#include <prometheus/metric_family.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice {

class MetricsEndpoint {
 public:
  static constexpr int kMaxConnections = 64;
  static constexpr int kMaxPerAddress = 8;
  static constexpr int kMaxRequestBytes = 8192;
  static constexpr int kRequestTimeoutMs = 5000;
  using Collector = std::function<std::vector<prometheus::MetricFamily>()>;

  /// Listens on `address` ("host:port", "[v6]:port"; host a name or an address, port 0 picks a
  /// free one) and serves until destroyed. INVALID_ARGUMENT for an address that is not
  /// host:port, UNAVAILABLE when it cannot listen; both name --metrics_listen.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address,
                                                                Collector collect);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  struct Connection;
  MetricsEndpoint() = default;
  void Run();
  // The answer to the request in `c.in` (complete: it holds the blank line).
  std::string Answer(const std::string& request) const;

  Collector collect_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a byte written to wake_[1] ends Run
  int port_ = 0;
  std::thread thread_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_METRICS_METRICS_HTTP_H_
