#include "bench/workload.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/msgpack_scan.h"

namespace sluice::shuffle_bench {
namespace {

using Clock = std::chrono::steady_clock;

class Rng {  // splitmix64
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9e3779b97f4a7c15ULL + 1) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t s_;
};

// Payload length: fixed (item_bytes - 32 bytes of the other fields), or with --heavy-tail
// lognormal for most items and a Pareto tail for 2% of them, with about the same mean.
size_t PayloadLength(Rng& rng, const BenchConfig& c) {
  const double base = std::max(8, c.item_bytes - 32);
  if (!c.heavy_tail) return static_cast<size_t>(base);
  if (rng.Uniform() < 0.02) {
    const double pareto = base * 4 / std::pow(1.0 - rng.Uniform(), 1.0 / 1.5);
    return static_cast<size_t>(std::min(pareto, 1e6));
  }
  const double u1 = rng.Uniform() + 1e-12, u2 = rng.Uniform();
  const double normal = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  return static_cast<size_t>(std::max(1.0, base * 0.6 * std::exp(0.5 * normal)));
}

// 12 random bits -> two alphanumeric characters (each 6 bits mod 62), one table load for two.
const std::array<uint16_t, 4096>& AlnumPairs() {
  static const std::array<uint16_t, 4096> table = [] {
    static constexpr char kAlnum[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::array<uint16_t, 4096> t{};
    for (int v = 0; v < 4096; ++v) {
      const auto lo = static_cast<uint8_t>(kAlnum[(v & 63) % 62]);
      const auto hi = static_cast<uint8_t>(kAlnum[(v >> 6) % 62]);
      t[v] = static_cast<uint16_t>(lo | (hi << 8));
    }
    return t;
  }();
  return table;
}

// n random alphanumeric characters, ten per random draw.
void FillAlnum(Rng& rng, const std::array<uint16_t, 4096>& pairs, char* out, size_t n) {
  size_t j = 0;
  for (; j + 10 <= n; j += 10) {
    uint64_t r = rng.Next();
    for (int k = 0; k < 5; ++k, r >>= 12) std::memcpy(out + j + 2 * k, &pairs[r & 4095], 2);
  }
  if (j < n) {
    uint64_t r = rng.Next();
    char tail[10];
    for (int k = 0; k < 5; ++k, r >>= 12) std::memcpy(tail + 2 * k, &pairs[r & 4095], 2);
    std::memcpy(out + j, tail, n - j);
  }
}

// msgpack writers straight into a buffer with room.
char* WriteInt(char* w, int64_t v) {
  auto* p = reinterpret_cast<uint8_t*>(w);
  return reinterpret_cast<char*>(mp::WriteInt(p, v));
}
char* WriteStr(char* w, std::string_view s) {
  auto* p = reinterpret_cast<uint8_t*>(w);
  p = mp::WriteStrHeader(p, static_cast<uint32_t>(s.size()));
  std::memcpy(p, s.data(), s.size());
  return reinterpret_cast<char*>(p + s.size());
}

// What one shard's mapper sent: items per key, bytes of values, time spent generating.
struct ShardTally {
  std::vector<uint64_t> per_key;
  uint64_t bytes = 0;
  double gen_s = 0;
  double retry_s = 0;  // from the first failed attempt to the commit
};

// Generates one shard's items in small batches (timed per batch, so the clock is not read per
// item) and hands each batch to the writer before the next: never more than kBatch at once.
absl::Status MapShardAttempt(ShuffleClient& client, const std::string& id, const BenchConfig& c,
                             int s, uint64_t attempt, ShardTally* tally) {
  WriterOptions wopts;
  wopts.layout = c.layout;
  wopts.zstd_level = c.zstd_level;
  wopts.sort_by_key = c.key_order;
  if (c.frame_kb > 0) wopts.frame_bytes = wopts.sorted_frame_bytes = c.frame_kb << 10;
  wopts.buffer_bytes = c.buffer_mb << 20;
  auto writer = client.OpenWriter(id, static_cast<uint32_t>(s), attempt, wopts);
  if (!writer.ok()) return writer.status();
  Rng rng(static_cast<uint64_t>(s) + 1);
  // --skew: the keys of the key space that partition 0 takes, drawn from for that share.
  std::vector<int> skewed;
  if (c.skew > 0) {
    char key[16];
    for (int k = 0; k < c.keys; ++k) {
      const size_t n = static_cast<size_t>(WriteInt(key, k) - key);
      if (HashPartition(std::string_view(key, n), static_cast<uint32_t>(c.partitions)) == 0) {
        skewed.push_back(k);
      }
    }
    if (skewed.empty()) {
      return absl::InvalidArgumentError("--skew: no key of --keys falls in partition 0");
    }
  }
  static constexpr int kBatch = 256;
  const auto& pairs = AlnumPairs();
  std::string batch;
  std::vector<uint32_t> ends;  // per item: key end, value end in `batch`
  std::chrono::nanoseconds gen{0};
  for (long long i = 0; i < c.items_per_shard;) {
    const auto g0 = Clock::now();
    batch.clear();
    ends.clear();
    for (int n = 0; n < kBatch && i < c.items_per_shard; ++n, ++i) {
      int k = c.hot_frac > 0 && rng.Uniform() < c.hot_frac
                  ? 0
                  : static_cast<int>(rng.Next() % static_cast<uint64_t>(c.keys));
      if (!skewed.empty() && rng.Uniform() < c.skew) {
        k = skewed[rng.Next() % skewed.size()];
      }
      const size_t payload_len = PayloadLength(rng, c);
      // key (<= 9 bytes), map header, 4 names (<= 24), 3 ints (<= 27), payload header (5)
      const size_t start = batch.size();
      batch.resize(start + payload_len + 80);
      char* w = batch.data() + start;
      w = WriteInt(w, k);
      ends.push_back(static_cast<uint32_t>(w - batch.data()));
      char* const value = w;
      *w++ = static_cast<char>(0x84);
      w = WriteStr(w, "key");
      w = WriteInt(w, k);
      w = WriteStr(w, "seq");
      w = WriteInt(w, i);
      w = WriteStr(w, "src");
      w = WriteInt(w, s);
      w = WriteStr(w, "payload");
      auto* h = reinterpret_cast<uint8_t*>(w);
      w = reinterpret_cast<char*>(mp::WriteStrHeader(h, static_cast<uint32_t>(payload_len)));
      if (c.same_payload) {
        std::memset(w, 'x', payload_len);
      } else {
        FillAlnum(rng, pairs, w, payload_len);
      }
      w += payload_len;
      batch.resize(static_cast<size_t>(w - batch.data()));
      ends.push_back(static_cast<uint32_t>(batch.size()));
      ++tally->per_key[k];
      tally->bytes += static_cast<size_t>(w - value);
    }
    gen += Clock::now() - g0;
    uint32_t start = 0;
    for (size_t e = 0; e < ends.size(); e += 2) {
      const std::string_view key(batch.data() + start, ends[e] - start);
      const std::string_view value(batch.data() + ends[e], ends[e + 1] - ends[e]);
      start = ends[e + 1];
      if (absl::Status st = (*writer)->Add(key, value); !st.ok()) return st;
    }
  }
  auto result = (*writer)->Close();
  tally->gen_s = std::chrono::duration<double>(gen).count();
  return result.status();
}

// One shard's mapper as an engine runs it: a failed attempt (a server lost, say) is run again
// with a new attempt id, up to c.retries times; the tally is the winning attempt's.
absl::Status MapShard(ShuffleClient& client, const std::string& id, const BenchConfig& c, int s,
                      ShardTally* tally, std::atomic<int>* retried) {
  absl::Status st;
  std::optional<Clock::time_point> first_failure;
  for (int attempt = 1; attempt <= 1 + c.retries; ++attempt) {
    std::fill(tally->per_key.begin(), tally->per_key.end(), 0);
    tally->bytes = 0;
    st = MapShardAttempt(client, id, c, s, static_cast<uint64_t>(attempt), tally);
    if (st.ok() && first_failure.has_value()) {
      tally->retry_s = std::chrono::duration<double>(Clock::now() - *first_failure).count();
    }
    if (st.ok() || absl::IsInvalidArgument(st) || absl::IsNotFound(st)) return st;
    if (!first_failure.has_value()) first_failure = Clock::now();
    if (attempt <= c.retries) {
      retried->fetch_add(1);
      std::fprintf(stderr, "sluice bench: mapper %d attempt %d failed, retrying: %s\n", s, attempt,
                   st.ToString().c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(c.retry_delay_ms));
    }
  }
  return st;
}

// Reads partition `p` with `options` to the end, passing each record to `fn` (its error ends
// the read).
template <typename Fn>
absl::Status ForEachRecord(ShuffleClient& client, const std::string& id, uint32_t p,
                           const ReaderOptions& options, Fn fn) {
  auto reader = client.OpenReader(id, p, options);
  if (!reader.ok()) return reader.status();
  Record r;
  for (;;) {
    auto more = (*reader)->Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
    SLUICE_RETURN_IF_ERROR(fn(r));
  }
}

// Reads one partition (grouping as a reducer would) and counts every key it gets.
absl::Status ReducePartition(ShuffleClient& client, const std::string& id, const BenchConfig& c,
                             int p, std::vector<std::atomic<uint64_t>>* counted) {
  ReaderOptions ropts;
  ropts.order = c.key_order ? FetchOrder::kKey : FetchOrder::kUnordered;
  ropts.require_complete = true;
  return ForEachRecord(client, id, static_cast<uint32_t>(p), ropts, [&](const Record& r) {
    int64_t k = -1;
    const auto* kp = reinterpret_cast<const uint8_t*>(r.key.data());
    if (mp::ReadCanonicalInt(kp, kp + r.key.size(), &k) == nullptr || k < 0 || k >= c.keys) {
      return absl::DataLossError("a record came back with a key that was never sent");
    }
    (*counted)[k].fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  });
}

// Runs fn(i) for i in [0, n) on at most `slots` threads named `name` (like a cluster's task
// slots: each thread takes the next task when it is done with one); the first error, if any.
template <typename Fn>
absl::Status OnThreads(int n, int slots, const char* name, Fn fn) {
  std::vector<absl::Status> errors(n);
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min(n, std::max(slots, 1)); ++t) {
    threads.emplace_back([&] {
      pthread_setname_np(pthread_self(), name);
      for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) errors[i] = fn(i);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e.ok()) return e;
  }
  return absl::OkStatus();
}

// Stored bytes the servers read for fetches so far (each server of a cluster, asked alone).
absl::StatusOr<uint64_t> StoredRead(ShuffleClient& client, const BenchConfig& c) {
  if (!c.server_client) {
    auto node = client.GetNode();
    if (!node.ok()) return node.status();
    return node->fetch_stored_bytes;
  }
  auto nodes = client.ListNodes();
  if (!nodes.ok()) return nodes.status();
  uint64_t sum = 0;
  for (const NodeAddress& n : *nodes) {
    auto node = c.server_client(n.address)->GetNode();
    if (!node.ok()) return node.status();
    sum += node->fetch_stored_bytes;
  }
  return sum;
}

// Reads partition 0 with `options` to the end: its records, and when the first came.
absl::Status ReadAll(ShuffleClient& client, const std::string& id, const ReaderOptions& options,
                     uint64_t* records, double* first_s) {
  const auto start = Clock::now();
  return ForEachRecord(client, id, 0, options, [&](const Record&) {
    if (*records == 0 && first_s != nullptr) {
      *first_s = std::chrono::duration<double>(Clock::now() - start).count();
    }
    ++*records;
    return absl::OkStatus();
  });
}

// --split: partition 0 whole, then as c.split slices at once.
absl::StatusOr<BenchResult::Split> ReadSplit(ShuffleClient& client, const std::string& id,
                                             const BenchConfig& c) {
  BenchResult::Split out;
  const auto cpu = [&c] { return c.server_cpu ? c.server_cpu() : 0.0; };
  ReaderOptions whole;
  whole.order = FetchOrder::kKey;
  auto read0 = StoredRead(client, c);
  if (!read0.ok()) return read0.status();
  double cpu0 = cpu();
  auto t0 = Clock::now();
  SLUICE_RETURN_IF_ERROR(ReadAll(client, id, whole, &out.records, nullptr));
  out.full_s = std::chrono::duration<double>(Clock::now() - t0).count();
  out.full_cpu_s = cpu() - cpu0;
  auto read1 = StoredRead(client, c);
  if (!read1.ok()) return read1.status();
  out.full_read_bytes = *read1 - *read0;
  // The slices: planned, then read at once, one reader each.
  cpu0 = cpu();
  t0 = Clock::now();
  auto splits = client.GetSplits(id, 0, static_cast<uint32_t>(c.split));
  if (!splits.ok()) return splits.status();
  out.plan_s = std::chrono::duration<double>(Clock::now() - t0).count();
  out.partition_bytes = splits->partition_bytes;
  out.slices = splits->keys.size() + 1;
  out.slice_records.assign(out.slices, 0);
  out.first_record_s.assign(out.slices, 0);
  SLUICE_RETURN_IF_ERROR(OnThreads(
      static_cast<int>(out.slices), static_cast<int>(out.slices), "bench-slice", [&](int i) {
        return ReadAll(client, id, splits->Slice(i), &out.slice_records[i], &out.first_record_s[i]);
      }));
  out.sliced_s = std::chrono::duration<double>(Clock::now() - t0).count();
  out.sliced_cpu_s = cpu() - cpu0;
  auto read2 = StoredRead(client, c);
  if (!read2.ok()) return read2.status();
  out.sliced_read_bytes = *read2 - *read1;
  for (uint64_t n : out.slice_records) out.sliced_records += n;
  if (out.sliced_records != out.records) {
    return absl::DataLossError(absl::StrCat("the slices held ", out.sliced_records,
                                            " records, partition 0 ", out.records));
  }
  return out;
}

}  // namespace

int DefaultParallel() {
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(4 * std::max(threads, 1), 8, 256);
}

absl::StatusOr<BenchResult> RunShuffle(ShuffleClient& client, const std::string& id,
                                       const BenchConfig& c) {
  BenchResult res;
  auto created = client.CreateShuffle(id, c.partitions, c.shards, c.replication);
  if (!created.ok()) return created.status();
  auto placed = client.GetPlacement(id);
  if (!placed.ok()) return placed.status();
  res.replication = placed->replication;
  res.servers = placed->nodes.size();
  std::atomic<int> retried{0};
  // Scatter: every shard a mapper, `parallel` at a time, generating its items on the fly.
  std::vector<ShardTally> shards(c.shards);
  for (auto& t : shards) t.per_key.assign(c.keys, 0);
  const auto t0 = Clock::now();
  const int slots = c.parallel > 0 ? c.parallel : DefaultParallel();
  absl::Status st = OnThreads(c.shards, slots, "bench-map", [&](int s) {
    return MapShard(client, id, c, s, &shards[s], &retried);
  });
  const auto t1s = Clock::now();
  if (!st.ok()) return st;
  if (c.premerge_wait_s > 0) {
    // Until each partition is one pre-merged run of every mapper, or for 1 s no merge ran and
    // neither the runs nor the bytes the server's pre-merge wrote changed.
    const auto until = t1s + std::chrono::duration<double>(c.premerge_wait_s);
    std::vector<std::pair<uint64_t, uint64_t>> last;
    auto changed = Clock::now();
    while (Clock::now() < until) {
      auto status = client.GetShuffle(id);
      if (!status.ok()) return status.status();
      auto node = client.GetNode();
      std::vector<std::pair<uint64_t, uint64_t>> now;
      now.emplace_back(node.ok() ? node->premerge_written_bytes : 0,
                       node.ok() && node->premerging ? Clock::now().time_since_epoch().count() : 0);
      bool one = true;
      for (const auto& p : status->partitions) {
        now.emplace_back(p.premerged_runs, p.premerged_mappers);
        one =
            one && p.premerged_runs == 1 && p.premerged_mappers == static_cast<uint32_t>(c.shards);
      }
      if (one) break;
      if (now != last) {
        last = now;
        changed = Clock::now();
      } else if (Clock::now() - changed > std::chrono::seconds(1)) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const auto t1 = Clock::now();
  res.settle_s = std::chrono::duration<double>(t1 - t1s).count();
  // Reduce: every partition a reducer, `parallel` at a time, grouping by key and counting.
  // One count a key, shared by the reducers (a count a key and partition would make the
  // bench's own bookkeeping the largest thing in the client at thousands of partitions).
  std::vector<std::atomic<uint64_t>> counted(c.keys);
  st = OnThreads(c.partitions, slots, "bench-reduce",
                 [&](int p) { return ReducePartition(client, id, c, p, &counted); });
  const auto t2 = Clock::now();
  if (!st.ok()) return st;

  res.counts_match = true;
  for (int k = 0; k < c.keys; ++k) {
    uint64_t want = 0, got = 0;
    for (const ShardTally& s : shards) want += s.per_key[k];
    got = counted[k].load();
    res.expected += want;
    res.counted += got;
    if (want != got) res.counts_match = false;
  }
  for (const ShardTally& s : shards) {
    res.gen_s += s.gen_s;
    res.item_bytes += s.bytes;
    res.longest_retry_s = std::max(res.longest_retry_s, s.retry_s);
  }
  res.retried_attempts = retried.load();
  // Stored bytes: each partition once; pushed: every replica's copy (replicas hold the same
  // frames).
  StatusOptions status_options;
  status_options.hot_keys = 1;
  auto status = client.GetShuffle(id, status_options);
  if (status.ok()) {
    for (size_t p = 0; p < status->partitions.size(); ++p) {
      // The heaviest key the server's sketch names, of the whole shuffle.
      for (const auto& h : status->partitions[p].hot_keys) {
        if (static_cast<double>(h.records) / static_cast<double>(res.expected) > res.hot_share) {
          int64_t k = -1;
          const auto* kp = reinterpret_cast<const uint8_t*>(h.key.data());
          if (mp::ReadCanonicalInt(kp, kp + h.key.size(), &k) != nullptr) {
            res.hot_key = k;
            res.hot_share = static_cast<double>(h.records) / static_cast<double>(res.expected);
          }
        }
      }
      const uint64_t bytes = status->partitions[p].bytes;
      res.disk_bytes += bytes;
      res.pushed_bytes += bytes * (p < placed->replicas.size() ? placed->replicas[p].size() : 1);
    }
  }
  if (auto now = client.GetPlacement(id); now.ok() && now->split_bytes != 0 && c.server_client) {
    res.spread.split_bytes = now->split_bytes;
    const std::vector<uint32_t> chain = now->ChainOf(0);
    res.spread.stored_partitions = static_cast<uint32_t>(chain.size());
    for (size_t n = 0; n < now->nodes.size(); ++n) {
      ShuffleClient* one =
          now->nodes[n].address.empty() ? nullptr : c.server_client(now->nodes[n].address);
      if (one == nullptr) continue;
      auto mine = one->GetShuffle(id);
      if (!mine.ok()) continue;  // (keeps nothing of it)
      for (uint32_t q : chain) {
        const auto& on = now->ReplicasOf(q);
        if (std::find(on.begin(), on.end(), n) != on.end() && q < mine->partitions.size()) {
          res.spread.bytes_per_server[now->nodes[n].node_id] += mine->partitions[q].bytes;
        }
      }
    }
  }
  if (c.split > 0 && res.counts_match) {
    auto split = ReadSplit(client, id, c);
    if (!split.ok()) return split.status();
    res.split = *std::move(split);
  }
  res.scatter_s = std::chrono::duration<double>(t1s - t0).count();
  res.reduce_s = std::chrono::duration<double>(t2 - t1).count();
  res.elapsed_s = std::chrono::duration<double>(t2 - t0).count();
  if (!c.keep) (void)client.DeleteShuffle(id);
  return res;
}

}  // namespace sluice::shuffle_bench
