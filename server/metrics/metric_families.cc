#include "server/metrics/metric_families.h"

#include <prometheus/text_serializer.h>

#include <limits>

#include "absl/strings/str_cat.h"

namespace sluice {
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
