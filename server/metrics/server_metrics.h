// ServerMetrics: what the server counts as it works (docs/operations.md, "Metrics", names each
// metric): counters bumped on the data path (relaxed atomics, no locks per frame), histograms
// of commit latencies, calls counted by RPC and status code. Counting is ours, so that the data
// path pays an atomic add; a scrape turns the counts into families (metric_families.h,
// server/metrics_scrape.cc). No gRPC and no HTTP here: the gRPC interceptor that counts calls
// lives in server/service/grpc_server.cc, the HTTP endpoint in metrics_http.h.
//
//   ServerMetrics m;
//   ServerMetrics::Add(m.push_frames, 1);
#ifndef SLUICE_SERVER_METRICS_SERVER_METRICS_H_
#define SLUICE_SERVER_METRICS_SERVER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace sluice {

/// A Prometheus histogram with fixed upper bounds (seconds, say): cumulative counts on output.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  ///< per bucket, not cumulative; one more than bounds (+Inf)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;  // one observation per commit batch: a lock is cheap enough
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

/// Finished calls by method and status code (one lock per call, not per message).
class CallCounts {
 public:
  void Add(const std::string& method, int code);
  /// ((method, code), calls), sorted.
  std::vector<std::pair<std::pair<std::string, int>, uint64_t>> Read() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> counts_;
};

/// What the data path counts. Monotonic counters only: gauges (open streams, memory, disk,
/// shuffles) are read from their owners when scraped.
struct ServerMetrics {
  using Counter = std::atomic<uint64_t>;
  // Pushes, as received (attempts that later fail included).
  Counter push_frames{0}, push_bytes{0}, push_records{0};
  Counter commits{0};            ///< attempts committed (or prepared, in a cluster)
  Counter duplicate_commits{0};  ///< attempts whose mapper had committed already: discarded
  Counter aborted_attempts{0};   ///< attempts ended by an error, a cancel or a timeout
  // Fetches, as sent.
  Counter fetch_chunks{0}, fetch_bytes{0}, fetch_records{0};
  /// Stored frame bytes the fetches set to read (a key range's: the frames that meet it).
  Counter fetch_stored_bytes{0};
  Counter merge_passes{0};       ///< intermediate merge passes (runs beyond --merge_fan_in)
  Counter merge_spill_bytes{0};  ///< bytes those passes wrote to temporary files
  Counter merges_parked{0};      ///< KEY fetches that gave their merge slot up for a stalled reader
  Counter scrub_bytes{0};        ///< committed bytes the scrub read and checked (--scrub_mb_per_s)
  Counter scrub_passes{0};       ///< scrub passes over every open shuffle completed
  /// Background pre-merge (--premerge_mb_per_s): runs made visible, merges dropped (a mapper of
  /// the range changed meanwhile), bytes written and stored bytes read.
  Counter premerges{0}, premerges_dropped{0}, premerge_bytes{0}, premerge_read_bytes{0};
  Counter premerging{0};  ///< 1 while a pre-merge runs (a gauge)
  /// Partitions found damaged, by what found them (a fetch's read, the scrub).
  Counter damaged_by_fetch{0}, damaged_by_scrub{0};
  /// Re-replication (--repair_mb_per_s): bytes copied from other replicas, and the (mapper,
  /// partition) copies made.
  Counter repair_bytes{0}, repair_copies{0};
  /// Of those copies, the ones restored from the object store (no server held them).
  Counter restored_copies{0};
  /// The object tier (--object_store): partitions uploaded and recorded by this server, their
  /// bytes, uploads that failed, objects deleted (lost races, stale, deleted shuffles) and
  /// manifests written.
  Counter objects_uploaded{0}, object_upload_bytes{0}, object_upload_failures{0},
      objects_deleted{0}, manifests_written{0};
  /// Disks as a cache (--object_evict_pct): shuffles evicted and the bytes that freed; (mapper,
  /// partition) copies read back from the store for reads, and their bytes.
  Counter evicted_shuffles{0}, evicted_bytes{0}, read_back_copies{0}, read_back_bytes{0};
  /// Committed (mapper, partition) pairs this server's replicas lack (set by the repairer).
  std::atomic<uint64_t> repair_backlog{0};
  /// The bytes those come to, as their sources say (set by the repairer; copies take it down).
  std::atomic<uint64_t> repair_backlog_bytes{0};
  /// Of those, the pairs no server holds any more (lost; set by the repairer).
  std::atomic<uint64_t> lost_mappers{0};
  /// A commit batch's data and log writes and syncs (group commit: one per batch).
  Histogram commit_sync_seconds{DefaultLatencyBounds()};
  /// A commit message's handling, from its arrival to its answer (waiting for a batch included).
  Histogram commit_seconds{DefaultLatencyBounds()};
  CallCounts calls;

  static std::vector<double> DefaultLatencyBounds();
  static void Add(Counter& c, uint64_t n) { c.fetch_add(n, std::memory_order_relaxed); }
};

}  // namespace sluice

#endif  // SLUICE_SERVER_METRICS_SERVER_METRICS_H_
