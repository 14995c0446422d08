// MetricsEndpoint: the HTTP port Prometheus scrapes (--metrics_listen). It answers
// `GET /metrics` with the text `render` returns (the Prometheus text format, MetricsText) and
// nothing else of use: `/` names the path, other paths get 404, other methods 405.
//
// Its own budget, as every resource a client can make the server spend: one thread with
// poll(), at most kMaxConnections connections at once (more wait in the kernel's backlog), a
// request of at most kMaxRequestBytes whose headers must arrive within kRequestTimeout, and
// every response closes its connection. A slow or hostile scraper costs this thread a few
// seconds, never a gRPC thread.
//
//   auto endpoint = MetricsEndpoint::Start("0.0.0.0:9090", [&] { return RenderMetrics(); });
//   ... (*endpoint)->port() ...
#ifndef SLUICE_SERVER_METRICS_HTTP_H_
#define SLUICE_SERVER_METRICS_HTTP_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace sluice {

class MetricsEndpoint {
 public:
  static constexpr size_t kMaxConnections = 16;
  static constexpr size_t kMaxRequestBytes = 8192;
  static constexpr std::chrono::seconds kRequestTimeout{5};

  /// Listens on `address` ("host:port", "[v6]:port", ":port" for every address; port 0 picks
  /// a free one) and serves until destroyed.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, std::function<std::string()> render);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint(int listen_fd, int port, int wake_read, int wake_write,
                  std::function<std::string()> render);
  void Run();

  const int listen_fd_;
  const int port_;
  const int wake_read_, wake_write_;  // a pipe: one byte written stops Run
  const std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_METRICS_HTTP_H_
