// The end-to-end shuffle benchmark's workload: zephyr's benchmark_shuffle.py (shards of items
// of ~200 bytes, msgpack maps {key, seq, src, payload} keyed by an int key), generated on the
// fly and written with hand-made msgpack, scattered by one writer per shard and reduced by one
// reader per partition, every key's count checked against what was sent.
#ifndef SLUICE_BENCH_WORKLOAD_H_
#define SLUICE_BENCH_WORKLOAD_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/shuffle_client.h"
#include "codec/frame_format.h"

namespace sluice::shuffle_bench {

struct BenchConfig {
  int shards = 8;
  long long items_per_shard = 50000;
  int item_bytes = 200;
  int keys = 10000;
  int partitions = 8;
  double hot_frac = 0;  ///< share of items with key 0 (a hot key)
  /// Share of items put on partition 0 (a skewed partition: many keys, all of them partition
  /// 0's under HashPartition); the rest spread as usual.
  double skew = 0;
  bool heavy_tail = false;  ///< payload sizes lognormal with a Pareto tail, about the same mean
  /// Every payload the same run of 'x' (drawing no random numbers for it) rather than random
  /// alphanumeric characters of its own: Python's "same" payload (sluice.bench.columns makes
  /// the very same items).
  bool same_payload = false;
  LayoutChoice layout = LayoutChoice::kAuto;
  int zstd_level = 3;
  bool key_order = true;  ///< KEY-ordered fetches (and writers sort their frames)
  size_t buffer_mb = 4;   ///< each writer's buffer
  size_t frame_kb = 0;    ///< each writer's largest frame, sorted or not (0: the defaults)
  /// Mappers (and then reducers) running at once, like a cluster's task slots (0: four per
  /// hardware thread of this machine, 8 to 256; 256 keeps a 2,048-partition reduce under the
  /// server's fetch stream limit). A cluster runs a task or two per core: 256 tasks on the 2
  /// cores of a test machine cost each task 2-3x the client CPU in thread switches and fresh
  /// memory (docs/benchmarks.md, "Wide shuffles").
  int parallel = 0;
  /// In a cluster: the replicas of each partition (0 = the cluster's default).
  uint32_t replication = 0;
  /// A failed mapper attempt is retried with a new attempt id this many times (as an engine
  /// does), `retry_delay_ms` apart.
  int retries = 3;
  int retry_delay_ms = 1000;
  /// Leaves the shuffle in place after the run (its id is printed) rather than deleting it:
  /// bench/lost_server_bench.sh reads it again after more servers are lost.
  bool keep = false;
  /// After the run, partition 0 is read again whole and then as `split` slices (GetSplits) in
  /// parallel, KEY order: BenchResult::split. 0: not.
  int split = 0;
  /// Between the scatter and the reduce, wait up to this long for the servers' background
  /// pre-merge to make one run of each partition (GetShuffle's premerged_runs and
  /// premerged_mappers), or to stop changing for a second: BenchResult::settle_s. 0: not.
  double premerge_wait_s = 0;
  /// The server's CPU seconds so far (the bench's own child), for the split figures; may be
  /// null.
  std::function<double()> server_cpu;
  /// A client of one server alone (its address): for BenchResult::spread, in a cluster whose
  /// shuffles split; may be null.
  std::function<ShuffleClient*(const std::string& address)> server_client;
};

/// BenchConfig::parallel's default on this machine.
int DefaultParallel();

struct BenchResult {
  double elapsed_s = 0, scatter_s = 0, reduce_s = 0, gen_s = 0;
  double settle_s = 0;  ///< the wait for the pre-merge (BenchConfig::premerge_wait_s)
  uint64_t expected = 0, counted = 0, item_bytes = 0, disk_bytes = 0;
  bool counts_match = false;
  int retried_attempts = 0;  ///< mapper attempts that failed and were retried
  /// The longest a mapper took from its first failed attempt to its commit (0: none failed):
  /// what a fault cost the task that waited most.
  double longest_retry_s = 0;
  uint32_t replication = 1;
  size_t servers = 1;  ///< servers of the shuffle
  /// Frame bytes stored over all the shuffle's servers (every replica's copy): what the pushes
  /// carried over the network.
  uint64_t pushed_bytes = 0;
  /// The heaviest key the server names (GetShuffle's hot keys) and its share of all items.
  int64_t hot_key = -1;
  double hot_share = 0;
  /// --split: partition 0 read whole, then as slices in parallel. Bytes are stored frame
  /// bytes the server read (GetNode's fetch_stored_bytes), CPU the server's.
  struct Split {
    uint64_t partition_bytes = 0, records = 0;
    double full_s = 0, full_cpu_s = 0;
    uint64_t full_read_bytes = 0;
    size_t slices = 0;
    double sliced_s = 0, sliced_cpu_s = 0;
    uint64_t sliced_read_bytes = 0;
    uint64_t sliced_records = 0;
    std::vector<uint64_t> slice_records;
    std::vector<double> first_record_s;  ///< per slice, from its open
    double plan_s = 0;
  };
  Split split;
  /// In a cluster whose partitions split (docs/cluster.md, "Huge partitions"): partition 0's
  /// stored partitions, and the bytes of them each server keeps (by node id).
  struct Spread {
    uint64_t split_bytes = 0;
    uint32_t stored_partitions = 0;
    std::map<std::string, uint64_t> bytes_per_server;
  };
  Spread spread;
};

/// Creates shuffle `id`, scatters and reduces it through `client`, checks the counts and
/// deletes it.
absl::StatusOr<BenchResult> RunShuffle(ShuffleClient& client, const std::string& id,
                                       const BenchConfig& c);

}  // namespace sluice::shuffle_bench

#endif  // SLUICE_BENCH_WORKLOAD_H_
