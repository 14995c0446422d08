#include "server/metrics/metrics_http.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include <exception>

#include "absl/strings/str_cat.h"

namespace sluice {

class MetricsEndpoint::Source final : public prometheus::Collectable {
 public:
  explicit Source(Collector collect) : collect_(std::move(collect)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return collect_(); }

 private:
  const Collector collect_;
};

namespace {

// "host:port" as civetweb's listening_ports wants it: IPv6 hosts in brackets with a "+" for
// dual-stack wildcards is civetweb's own syntax; plain IPv4 and "[v6]:port" pass through.
absl::Status CheckAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size() || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen=", address, " is not host:port"));
  }
  for (size_t i = colon + 1; i < address.size(); ++i) {
    if (address[i] < '0' || address[i] > '9' || address.size() - colon - 1 > 5) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen=", address, ": the port is not a number"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address,
                                                                        Collector collect) {
  if (absl::Status st = CheckAddress(address); !st.ok()) return st;
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->source_ = std::make_shared<Source>(std::move(collect));
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", std::to_string(kThreads), "max_request_size",
        std::to_string(kMaxRequestBytes), "request_timeout_ms", std::to_string(kRequestTimeoutMs),
        "enable_keep_alive", "no"});
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat("metrics endpoint (--metrics_listen=", address,
                                               "): cannot listen: ", ex.what()));
  }
  e->exposer_->RegisterCollectable(e->source_);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? 0 : ports.front();
  return e;
}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace sluice
