// sluice-bench: the end-to-end shuffle benchmark (bench/workload.h) against a sluice-server —
// the one given with --server, or else a real sluice-server child process this program starts
// on 127.0.0.1:0 with a temporary data directory (durable commits, as deployed). `sluice bench`
// runs this program. One RESULT line of JSON per repeat; docs/benchmarks.md has the figures.
//
//   sluice-bench [--server H:P] [--shards 8] [--items-per-shard 50000] [--partitions 8] ...
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/workload.h"
#include "client/cli_flags.h"
#include "client/server_process.h"
#include "client/shuffle_client.h"
#include "client/transport.h"

namespace sluice::shuffle_bench {
namespace {

constexpr char kUsage[] =
    "usage: sluice bench [--server H:P | --servers H:P,H:P,...] [--replication 0] [--retries 3]\n"
    "         [--shards 8] [--items-per-shard 50000] [--item-bytes 200]\n"
    "         [--keys 10000] [--partitions 8] [--hot-shard-frac 0] [--skew 0] [--split 0] "
    "[--heavy-tail] [--premerge-wait 0] [--payload random|same]\n"
    "         [--layout auto|msgpack|columnar|opaque] [--zstd-level 3]\n"
    "         [--order KEY|UNORDERED] [--repeat 1] [--buffer-mb 4] [--frame-kb 0] [--parallel 0]\n"
    "         [--server-memory-mb 128] [--server-args='FLAGS'] [--data-dir DIR]\n"
    "         [--server-bin PATH] [--push-credit 1]\n"
    "  (without --server: a sluice-server child process with the last four;\n"
    "  --server-args: its further flags, space-separated)\n"
    "  --push-credit 0: the plain Push stream instead of PushFlow's credit (for comparison)\n"
    "  --skew F: a share F (0 to 1) of the items on partition 0, over its many keys\n"
    "  --payload: each item's payload random alphanumeric characters (item-bytes - 32 of\n"
    "  them), or the same run of 'x' for all; python3 -m sluice.bench makes the same items\n"
    "  --split N: then partition 0 read whole and as N slices at once (GetSplits; KEY order):\n"
    "  a SPLIT line (bytes read and server CPU of both, slice balance, first records)\n"
    "  --premerge-wait S: between scatter and reduce, up to S seconds for the servers' pre-merge\n"
    "  to make one run of each partition, or to stop merging for 1 s (settle_s; the reduce is\n"
    "  timed after it)\n"
    "  --parallel: mappers, then reducers, at once (0: 4 per hardware thread, 8 to 256)\n"
    "  --servers: a cluster (or any server list); --replication: each partition's replicas\n"
    "  (0 = the cluster's default); a failed mapper attempt is retried with a new attempt id\n"
    "  up to --retries times, a second apart; --keep 1: the shuffle is left in place (KEPT ID)\n"
    "  TLS to --server(s): --tls-ca FILE [--tls-cert FILE --tls-key FILE] [--tls-server-name N]\n"
    "  credentials: --token-file FILE, or $SLUICE_TOKEN\n";

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "sluice bench: %s\n", st.ToString().c_str());
  return 1;
}

// The sluice-server child: its data directory (a temporary one unless given) and process.
// The server child's anonymous resident memory (RssAnon: its heap, not the data file's
// mapped page-cache pages, which VmHWM counts too), sampled every 10 ms: its peak.
class AnonSampler {
 public:
  explicit AnonSampler(const ServerProcess* server) : server_(server) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        Sample();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  ~AnonSampler() {
    stop_.store(true);
    thread_.join();
  }
  // The peak since the last Take, in MiB; starts again.
  double Take() {
    Sample();
    return static_cast<double>(peak_.exchange(0)) / (1 << 20);
  }

 private:
  void Sample() {
    const uint64_t now = server_->AnonRssBytes();
    uint64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
  }
  const ServerProcess* const server_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread thread_;
};

struct OwnServer {
  std::string data_dir;
  bool remove_dir = false;
  std::unique_ptr<ServerProcess> process;
  std::unique_ptr<AnonSampler> anon;
  ~OwnServer() {
    anon.reset();
    process.reset();
    if (remove_dir) std::filesystem::remove_all(data_dir);
  }
};

absl::Status StartOwnServer(uint64_t memory_mb, std::string bin, const std::string& extra_args,
                            OwnServer* own) {
  if (own->data_dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "sluice-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    own->data_dir = tmpl;
    own->remove_dir = true;
  }
  if (bin.empty()) {
    auto found = FindProgram("sluice-server");
    if (!found.ok()) return found.status();
    bin = *found;
  }
  std::vector<std::string> args = {absl::StrCat("--data_dir=", own->data_dir), "--worker_threads=2",
                                   absl::StrCat("--memory_budget_mb=", memory_mb),
                                   "--log_level=warn"};
  for (absl::string_view arg : absl::StrSplit(extra_args, ' ', absl::SkipEmpty())) {
    args.emplace_back(arg);
  }
  auto process = ServerProcess::Start(bin, args);
  if (!process.ok()) return process.status();
  own->process = std::move(process).value();
  own->anon = std::make_unique<AnonSampler>(own->process.get());
  return absl::OkStatus();
}

void PrintResult(int r, const BenchConfig& c, const BenchResult& res, const OwnServer& own) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double client_mb = ru.ru_maxrss / 1024.0;
  const double server_mb =
      own.process != nullptr ? static_cast<double>(own.process->PeakRssBytes()) / (1 << 20) : 0;
  const double server_anon_mb = own.anon != nullptr ? own.anon->Take() : 0;
  const double items = static_cast<double>(res.expected);
  // peak_rss_mb: the client's peak plus the server child's (the figure the single process of
  // earlier versions reported held both).
  std::printf(
      "RESULT {\"repeat\": %d, \"shards\": %d, \"items_per_shard\": %lld, \"partitions\": %d, "
      "\"parallel\": %d, \"order\": \"%s\", \"layout\": \"%s\", \"elapsed_s\": %.3f, "
      "\"items_per_sec\": %.0f, "
      "\"mb_per_sec\": %.1f, \"expected_items\": %llu, \"counted_items\": %llu, "
      "\"counts_match\": %s, \"gen_s\": %.3f, \"scatter_s\": %.3f, \"reduce_s\": %.3f, "
      "\"stored_bytes\": %llu, \"peak_rss_mb\": %.1f, \"embedded_server\": %s, "
      "\"client_peak_rss_mb\": %.1f, \"server_peak_rss_mb\": %.1f, \"servers\": %zu, "
      "\"replication\": %u, \"retried_attempts\": %d, \"pushed_bytes_per_item\": %.1f, "
      "\"server_peak_anon_mb\": %.1f, \"hot_key\": %lld, \"hot_key_share\": %.3f, "
      "\"settle_s\": %.3f, \"longest_retry_s\": %.3f}\n",
      r, c.shards, c.items_per_shard, c.partitions, c.parallel, c.key_order ? "KEY" : "UNORDERED",
      LayoutChoiceName(c.layout), res.elapsed_s, items / res.elapsed_s,
      static_cast<double>(res.item_bytes) / res.elapsed_s / 1e6,
      static_cast<unsigned long long>(res.expected), static_cast<unsigned long long>(res.counted),
      res.counts_match ? "true" : "false", res.gen_s, res.scatter_s, res.reduce_s,
      static_cast<unsigned long long>(res.disk_bytes), client_mb + server_mb,
      own.process != nullptr ? "true" : "false", client_mb, server_mb, res.servers, res.replication,
      res.retried_attempts, items > 0 ? static_cast<double>(res.pushed_bytes) / items : 0.0,
      server_anon_mb, static_cast<long long>(res.hot_key), res.hot_share, res.settle_s,
      res.longest_retry_s);
  if (res.split.slices > 0) {
    const BenchResult::Split& s = res.split;
    uint64_t least = UINT64_MAX, most = 0;
    double first_max = 0;
    for (uint64_t n : s.slice_records) {
      least = std::min(least, n);
      most = std::max(most, n);
    }
    for (double f : s.first_record_s) first_max = std::max(first_max, f);
    std::printf(
        "SPLIT {\"repeat\": %d, \"partition_bytes\": %llu, \"records\": %llu, "
        "\"full_s\": %.3f, \"full_server_cpu_s\": %.3f, \"full_read_bytes\": %llu, "
        "\"slices\": %zu, \"plan_s\": %.4f, \"sliced_s\": %.3f, "
        "\"sliced_server_cpu_s\": %.3f, \"sliced_read_bytes\": %llu, "
        "\"read_ratio\": %.3f, \"cpu_ratio\": %.3f, \"slice_records_min\": %llu, "
        "\"slice_records_max\": %llu, \"slice_balance\": %.3f, \"first_record_max_s\": %.3f}\n",
        r, static_cast<unsigned long long>(s.partition_bytes),
        static_cast<unsigned long long>(s.records), s.full_s, s.full_cpu_s,
        static_cast<unsigned long long>(s.full_read_bytes), s.slices, s.plan_s, s.sliced_s,
        s.sliced_cpu_s, static_cast<unsigned long long>(s.sliced_read_bytes),
        s.full_read_bytes > 0
            ? static_cast<double>(s.sliced_read_bytes) / static_cast<double>(s.full_read_bytes)
            : 0.0,
        s.full_cpu_s > 0 ? s.sliced_cpu_s / s.full_cpu_s : 0.0,
        static_cast<unsigned long long>(least), static_cast<unsigned long long>(most),
        least > 0 ? static_cast<double>(most) / static_cast<double>(least) : 0.0, first_max);
  }
  if (res.spread.split_bytes > 0) {
    // Partition 0 over the cluster: its stored partitions, the most any server keeps of it.
    std::string per_server;
    uint64_t most = 0, total = 0;
    for (const auto& [node, bytes] : res.spread.bytes_per_server) {
      absl::StrAppend(&per_server, per_server.empty() ? "" : ", ", "\"", node, "\": ", bytes);
      most = std::max(most, bytes);
      total += bytes;
    }
    std::printf(
        "SPREAD {\"repeat\": %d, \"split_bytes\": %llu, \"stored_partitions\": %u, "
        "\"servers\": %zu, \"partition_bytes_on_servers\": %llu, \"most_on_a_server\": %llu, "
        "\"most_over_split\": %.3f, \"bytes_per_server\": {%s}}\n",
        r, static_cast<unsigned long long>(res.spread.split_bytes), res.spread.stored_partitions,
        res.spread.bytes_per_server.size(), static_cast<unsigned long long>(total),
        static_cast<unsigned long long>(most),
        static_cast<double>(most) / static_cast<double>(res.spread.split_bytes),
        per_server.c_str());
  }
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  cli::Flags flags(argc, argv, 1);
  if (flags.Has("help")) {
    std::fputs(kUsage, stderr);
    return 0;
  }
  BenchConfig c;
  c.shards = static_cast<int>(flags.Int("shards", c.shards));
  c.items_per_shard = flags.Int("items-per-shard", c.items_per_shard);
  c.item_bytes = static_cast<int>(flags.Int("item-bytes", c.item_bytes));
  c.keys = static_cast<int>(flags.Int("keys", c.keys));
  c.partitions = static_cast<int>(flags.Int("partitions", c.partitions));
  c.hot_frac = flags.Double("hot-shard-frac", 0);
  c.skew = flags.Double("skew", 0);
  c.heavy_tail = flags.Get("heavy-tail", "false") == "true";
  const std::string payload = flags.Get("payload", "random");
  if (payload != "random" && payload != "same") {
    return Fail(absl::InvalidArgumentError("--payload is random or same"));
  }
  c.same_payload = payload == "same";
  auto layout = ParseLayoutChoice(flags.Get("layout", "auto"));
  if (!layout.ok()) return Fail(layout.status());
  c.layout = *layout;
  c.zstd_level = static_cast<int>(flags.Int("zstd-level", 3));
  const std::string order = flags.Get("order", "KEY");
  if (order != "KEY" && order != "UNORDERED") {
    return Fail(absl::InvalidArgumentError("--order is KEY or UNORDERED"));
  }
  c.key_order = order == "KEY";
  c.buffer_mb = static_cast<size_t>(flags.Int("buffer-mb", 4));
  c.parallel = static_cast<int>(flags.Int("parallel", c.parallel));
  if (c.parallel == 0) c.parallel = DefaultParallel();
  const int repeat = static_cast<int>(flags.Int("repeat", 1));
  std::string address = flags.Get("server", "");
  if (const std::string list = flags.Get("servers", ""); !list.empty()) address = list;
  c.replication = static_cast<uint32_t>(flags.Int("replication", 0));
  c.retries = static_cast<int>(flags.Int("retries", c.retries));
  c.keep = flags.Int("keep", 0) != 0;
  c.split = static_cast<int>(flags.Int("split", 0));
  c.premerge_wait_s = flags.Double("premerge-wait", 0);
  c.frame_kb = static_cast<size_t>(flags.Int("frame-kb", 0));
  const auto server_memory_mb = static_cast<uint64_t>(flags.Int("server-memory-mb", 128));
  const std::string server_bin = flags.Get("server-bin", "");
  const std::string server_args = flags.Get("server-args", "");
  const bool push_credit = flags.Int("push-credit", 1) != 0;
  OwnServer own;
  own.data_dir = flags.Get("data-dir", "");
  const ClientTlsOptions tls = cli::TlsFlags(flags);
  const std::string token = cli::TokenFlag(flags);
  std::string why;
  if (!flags.Check(&why) || c.shards < 1 || c.partitions < 1 || c.keys < 1 || c.parallel < 1 ||
      c.replication > 3 || c.retries < 0 || !(c.skew >= 0 && c.skew <= 1) ||
      !(c.hot_frac >= 0 && c.hot_frac <= 1) || c.split < 0 || c.split > 4096 ||
      (c.split > 0 && !c.key_order)) {
    std::fprintf(stderr, "sluice bench: %s\n%s", why.empty() ? "bad arguments" : why.c_str(),
                 kUsage);
    return 2;
  }
  if (address.empty()) {
    if (absl::Status st = StartOwnServer(server_memory_mb, server_bin, server_args, &own);
        !st.ok()) {
      return Fail(st);
    }
    address = absl::StrCat("127.0.0.1:", own.process->port());
    c.server_cpu = [&own] { return own.process->CpuSeconds(); };
  }
  ClientOptions copts;
  copts.server = address;
  copts.push_credit = push_credit;
  copts.tls = tls;
  copts.token = token;
  auto client = ShuffleClient::Connect(copts);
  if (!client.ok()) return Fail(client.status());
  // One server alone (a single-server link), for what each keeps of a huge partition.
  std::map<std::string, std::unique_ptr<ServerLink>> links;
  c.server_client = [&](const std::string& server) -> ShuffleClient* {
    std::unique_ptr<ServerLink>& link = links[server];
    if (link == nullptr) {
      ClientOptions one = copts;
      one.server = server;
      link = ConnectServer(one);
    }
    return &link->client();
  };
  int rc = 0;
  for (int r = 0; r < repeat; ++r) {
    const std::string id = absl::StrCat("bench-", ::getpid(), "-", r);
    auto res = RunShuffle(**client, id, c);
    if (!res.ok()) {
      rc = Fail(res.status());
      break;
    }
    PrintResult(r, c, *res, own);
    if (c.keep) std::printf("KEPT %s\n", id.c_str());
    if (!res->counts_match) rc = 1;
  }
  return rc;
}

}  // namespace
}  // namespace sluice::shuffle_bench

int main(int argc, char** argv) { return sluice::shuffle_bench::Main(argc, argv); }
