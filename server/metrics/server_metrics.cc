#include "server/metrics/server_metrics.h"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace sluice {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();  // le
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::Read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Snapshot{bounds_, counts_, sum_, count_};
}

void CallCounts::Add(const std::string& method, int code) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[{method, code}];
}

std::vector<std::pair<std::pair<std::string, int>, uint64_t>> CallCounts::Read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {counts_.begin(), counts_.end()};
}

std::vector<double> ServerMetrics::DefaultLatencyBounds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

namespace {

prometheus::ClientMetric Sample(const MetricFamilies::Labels& labels) {
  prometheus::ClientMetric m;
  for (const auto& [name, value] : labels) m.label.push_back({name, value});
  return m;
}

void Set(prometheus::ClientMetric& m, prometheus::MetricType type, double value) {
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else if (type == prometheus::MetricType::Gauge) {
    m.gauge.value = value;
  } else {
    m.untyped.value = value;
  }
}

}  // namespace

void MetricFamilies::Family(const std::string& name, prometheus::MetricType type,
                            const std::string& help,
                            const std::vector<std::pair<Labels, double>>& samples) {
  prometheus::MetricFamily f{name, help, type, {}};
  for (const auto& [labels, value] : samples) {
    f.metric.push_back(Sample(labels));
    Set(f.metric.back(), type, value);
  }
  families_.push_back(std::move(f));
}

void MetricFamilies::Counter(const std::string& name, const std::string& help, double value) {
  Family(name, prometheus::MetricType::Counter, help, {{{}, value}});
}

void MetricFamilies::Gauge(const std::string& name, const std::string& help, double value) {
  Family(name, prometheus::MetricType::Gauge, help, {{{}, value}});
}

void MetricFamilies::Histo(const std::string& name, const std::string& help,
                           const sluice::Histogram::Snapshot& h) {
  prometheus::MetricFamily f{name, help, prometheus::MetricType::Histogram, {}};
  prometheus::ClientMetric m;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    m.histogram.bucket.push_back(
        {cumulative, i < h.bounds.size() ? h.bounds[i] : std::numeric_limits<double>::infinity()});
  }
  m.histogram.sample_count = h.count;
  m.histogram.sample_sum = h.sum;
  f.metric.push_back(std::move(m));
  families_.push_back(std::move(f));
}

std::string MetricsText(const std::vector<prometheus::MetricFamily>& families) {
  return prometheus::TextSerializer().Serialize(families);
}

std::string StatusCodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return kNames[code];
  return absl::StrCat(code);
}

}  // namespace sluice
