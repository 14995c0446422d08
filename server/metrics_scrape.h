// The scrape: every counter, gauge and histogram of the server, in Prometheus's text format and
// in the order docs/operations.md ("Metrics") lists them. The data path counts into
// ServerMetrics; the gauges are read here from their owners. (The gRPC interceptor that counts
// calls by method and code lives in sluice_server.cc, with the other gRPC wiring.)
#ifndef SLUICE_SERVER_METRICS_SCRAPE_H_
#define SLUICE_SERVER_METRICS_SCRAPE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "server/metrics/server_metrics.h"
#include "server/storage/shuffle_registry.h"
#include "server/runtime/worker_pool.h"

namespace sluice {

/// What a scrape reads.
struct MetricsSources {
  const ServerMetrics* metrics = nullptr;
  const ShuffleRegistry* registry = nullptr;
  const MemoryBudget* budget = nullptr;
  const std::atomic<size_t>* push_streams = nullptr;  ///< open, server-wide
  const std::atomic<size_t>* fetch_streams = nullptr;
  bool draining = false;
  uint64_t started_unix_ms = 0;
  int64_t tls_expiry_unix = 0;  ///< the served certificate's expiry; 0 without TLS
};

/// Everything in `sources`, as metric families (MetricsText turns them into the text format).
std::vector<prometheus::MetricFamily> CollectMetrics(const MetricsSources& sources);

}  // namespace sluice

#endif  // SLUICE_SERVER_METRICS_SCRAPE_H_
