#include "server/metrics/server_metrics.h"

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

}  // namespace sluice
