// MetricFamilies: the families a scrape returns, built from the server's counts and gauges
// (prometheus-cpp's MetricFamily; MetricsText writes the text format and MetricsEndpoint serves
// it). Names are the caller's constants (server/metrics_scrape.cc).
//
//   MetricFamilies f;
//   f.Counter("sluice_push_frames_total", "Frames received", m.push_frames.load());
//   ... MetricsText(f.families()) ...
#ifndef SLUICE_SERVER_METRICS_METRIC_FAMILIES_H_
#define SLUICE_SERVER_METRICS_METRIC_FAMILIES_H_

#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <string>
#include <utility>
#include <vector>

#include "server/metrics/server_metrics.h"

namespace sluice {

/// Builds the families a scrape returns (prometheus-cpp's MetricFamily: its Exposer serves them,
/// its TextSerializer writes the text format). Names are the caller's constants.
class MetricFamilies {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  void Counter(const std::string& name, const std::string& help, double value);
  void Gauge(const std::string& name, const std::string& help, double value);
  /// A family with one sample per label set.
  void Family(const std::string& name, prometheus::MetricType type, const std::string& help,
              const std::vector<std::pair<Labels, double>>& samples);
  void Histo(const std::string& name, const std::string& help,
             const sluice::Histogram::Snapshot& h);
  std::vector<prometheus::MetricFamily>& families() { return families_; }

 private:
  std::vector<prometheus::MetricFamily> families_;
};

/// The Prometheus text format of `families` (what GET /metrics answers).
std::string MetricsText(const std::vector<prometheus::MetricFamily>& families);

/// The name of a gRPC status code ("OK", "INVALID_ARGUMENT", ...), or its number.
std::string StatusCodeName(int code);

}  // namespace sluice

#endif  // SLUICE_SERVER_METRICS_METRIC_FAMILIES_H_
