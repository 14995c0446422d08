#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

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

// Counters stay exact as integers (StrCat's 6 digits would round 1234567890); others get
// enough digits to round-trip.
std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[32];
  for (int digits = 15; digits <= 17; ++digits) {  // the shortest that reads back exactly
    std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// Label values: backslash, double quote and newline escaped. HELP text: backslash and newline.
std::string Escape(const std::string& s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

void MetricsText::Header(const std::string& name, const std::string& type,
                         const std::string& help) {
  absl::StrAppend(&out_, "# HELP ", name, " ", Escape(help, false), "\n# TYPE ", name, " ", type,
                  "\n");
}

void MetricsText::Sample(const std::string& name, const Labels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&out_, i == 0 ? "" : ",", labels[i].first, "=\"",
                      Escape(labels[i].second, true), "\"");
    }
    out_ += '}';
  }
  absl::StrAppend(&out_, " ", Number(value), "\n");
}

void MetricsText::Counter(const std::string& name, const std::string& help, double value) {
  Header(name, "counter", help);
  Sample(name, {}, value);
}

void MetricsText::Gauge(const std::string& name, const std::string& help, double value) {
  Header(name, "gauge", help);
  Sample(name, {}, value);
}

void MetricsText::Family(const std::string& name, const std::string& type, const std::string& help,
                         const std::vector<std::pair<Labels, double>>& samples) {
  Header(name, type, help);
  for (const auto& [labels, value] : samples) Sample(name, labels, value);
}

void MetricsText::Histo(const std::string& name, const std::string& help,
                        const sluice::Histogram::Snapshot& h) {
  Header(name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    const std::string le = i < h.bounds.size() ? Number(h.bounds[i]) : "+Inf";
    Sample(name + "_bucket", {{"le", le}}, static_cast<double>(cumulative));
  }
  Sample(name + "_sum", {}, h.sum);
  Sample(name + "_count", {}, static_cast<double>(h.count));
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
