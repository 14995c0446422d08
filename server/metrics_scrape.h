// The scrape: every counter, gauge and histogram of the server, in Prometheus's text format and
// in the order docs/operations.md ("Metrics") lists them. The data path counts into
// ServerMetrics; the gauges are read here from their owners. (The gRPC interceptor that counts
// calls by method and code lives in server/service/grpc_server.cc.)
#ifndef SLUICE_SERVER_METRICS_SCRAPE_H_
#define SLUICE_SERVER_METRICS_SCRAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "objstore/s3_store.h"
#include "server/metrics/metric_families.h"
#include "server/metrics/server_metrics.h"
#include "server/net/connection_guard.h"
#include "server/rules/admission.h"
#include "server/runtime/memory_budget.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

/// What a scrape reads.
struct MetricsSources {
  const ServerMetrics* metrics = nullptr;
  const ShuffleRegistry* registry = nullptr;
  const MemoryBudget* budget = nullptr;
  const OpenStreams* streams = nullptr;          ///< open push and fetch streams, server-wide
  const ConnectionGuard* connections = nullptr;  ///< connections kept and refused
  int listener_accepting = -1;  ///< the last probe of the listener: 1, 0 (-1: not probed)
  bool draining = false;
  uint64_t started_unix_ms = 0;
  int64_t tls_expiry_unix = 0;  ///< the served certificate's expiry; 0 without TLS
  uint64_t tls_reloads = 0;     ///< sets of TLS files taken since the start
  /// The object store's requests (--object_store), as it counts them; null without one.
  const objstore::S3Store* object_store = nullptr;
};

/// Everything in `sources`, as metric families (MetricsText turns them into the text format).
std::vector<prometheus::MetricFamily> CollectMetrics(const MetricsSources& sources);

}  // namespace sluice

#endif  // SLUICE_SERVER_METRICS_SCRAPE_H_
