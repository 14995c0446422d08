// MetricsEndpoint: the HTTP port Prometheus scrapes (--metrics_listen). prometheus-cpp's Exposer
// (civetweb inside) answers `GET /metrics` with the families `collect` returns, in the text
// format; other paths get 404.
//
// Its own budget, as every resource a client can make the server spend: kThreads threads (one
// connection each at a time; more wait in the kernel's backlog), requests of at most
// kMaxRequestBytes, and kRequestTimeoutMs for a request to arrive and its answer to be taken. A
// slow or hostile scraper costs these threads, never a gRPC thread.
//
//   auto endpoint = MetricsEndpoint::Start("0.0.0.0:9090", [&] { return Collect(); });
//   ... (*endpoint)->port() ...
#ifndef SLUICE_SERVER_METRICS_METRICS_HTTP_H_
#define SLUICE_SERVER_METRICS_METRICS_HTTP_H_

#include <prometheus/metric_family.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
}

namespace sluice {

class MetricsEndpoint {
 public:
  static constexpr int kThreads = 2;
  static constexpr int kMaxRequestBytes = 8192;
  static constexpr int kRequestTimeoutMs = 5000;
  using Collector = std::function<std::vector<prometheus::MetricFamily>()>;

  /// Listens on `address` ("host:port", "[v6]:port"; port 0 picks a free one) and serves until
  /// destroyed. UNAVAILABLE naming --metrics_listen when it cannot listen.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address,
                                                                Collector collect);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  class Source;
  MetricsEndpoint() = default;
  std::shared_ptr<Source> source_;  // what the exposer asks (it keeps a weak pointer)
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_METRICS_METRICS_HTTP_H_
