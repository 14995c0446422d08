// sluice: the command-line client.
//
//   sluice create --server HOST:PORT --shuffle ID --partitions N [--mappers M]
//   sluice status --server HOST:PORT --shuffle ID
//   sluice list   --server HOST:PORT
//   sluice delete --server HOST:PORT --shuffle ID
//   sluice push   --server HOST:PORT --shuffle ID --mapper M --input FILE --key-field NAME
//   sluice fetch  --server HOST:PORT --shuffle ID --partition P [--order KEY] [--output FILE]
//   sluice bench  [--server HOST:PORT] [flags]      (no --server: an embedded server)
//
// `sluice <command> --help` lists a command's flags.
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/shuffle_client.h"
#include "codec/msgpack_scan.h"
#include "codec/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/sluice_server.h"

namespace {

using Clock = std::chrono::steady_clock;

// --name=value or --name value; bare --flag means "true".
class Flags {
 public:
  Flags(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        bad_ = a;
        continue;
      }
      a = a.substr(2);
      const auto eq = a.find('=');
      if (eq != std::string::npos) {
        values_[a.substr(0, eq)] = a.substr(eq + 1);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values_[a] = argv[++i];
      } else {
        values_[a] = "true";
      }
    }
  }
  std::string Get(const std::string& name, const std::string& def) {
    used_.insert(name);
    auto it = values_.find(name);
    return it == values_.end() ? def : it->second;
  }
  long long Int(const std::string& name, long long def) {
    return std::atoll(Get(name, std::to_string(def)).c_str());
  }
  double Double(const std::string& name, double def) {
    return std::atof(Get(name, std::to_string(def)).c_str());
  }
  bool Has(const std::string& name) { return values_.count(name) != 0; }
  // Unknown flags are an error: a typo must not silently run a different benchmark.
  bool Check(std::string* why) {
    if (!bad_.empty()) {
      *why = "unexpected argument '" + bad_ + "'";
      return false;
    }
    for (const auto& [k, v] : values_) {
      if (used_.count(k) == 0 && k != "help") {
        *why = "unknown flag --" + k;
        return false;
      }
    }
    return true;
  }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> used_;
  std::string bad_;
};

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "sluice: %s\n", st.ToString().c_str());
  return 1;
}

std::unique_ptr<sluice::ShuffleClient> Connect(const std::string& server) {
  sluice::ClientOptions opts;
  opts.server = server;
  auto client = sluice::ShuffleClient::Connect(opts);
  if (!client.ok()) {
    Fail(client.status());
    std::exit(1);
  }
  return std::move(client).value();
}

void PrintStatus(const sluice::ShuffleStatus& s) {
  std::printf("shuffle %s: %u partitions, %u mappers (%zu committed)\n", s.shuffle_id.c_str(),
              s.num_partitions, s.num_mappers, s.committed_mappers.size());
  for (size_t p = 0; p < s.partitions.size(); ++p) {
    std::printf("  partition %zu: %llu records, %llu bytes, %u frames\n", p,
                static_cast<unsigned long long>(s.partitions[p].records),
                static_cast<unsigned long long>(s.partitions[p].bytes), s.partitions[p].frames);
  }
}

// ---------------------------------------------------------------------------------------------
// bench: zephyr's benchmark_shuffle.py workload.

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

struct BenchConfig {
  int shards = 8;
  long long items_per_shard = 50000;
  int item_bytes = 200;
  int keys = 10000;
  int partitions = 8;
  double hot_frac = 0;
  bool heavy_tail = false;
  sluice::LayoutChoice layout = sluice::LayoutChoice::kAuto;
  int zstd_level = 3;
  bool key_order = true;
  size_t buffer_mb = 4;
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
  return reinterpret_cast<char*>(sluice::mp::WriteInt(p, v));
}
char* WriteStr(char* w, std::string_view s) {
  auto* p = reinterpret_cast<uint8_t*>(w);
  p = sluice::mp::WriteStrHeader(p, static_cast<uint32_t>(s.size()));
  std::memcpy(p, s.data(), s.size());
  return reinterpret_cast<char*>(p + s.size());
}

struct BenchResult {
  double elapsed_s = 0, scatter_s = 0, reduce_s = 0, gen_s = 0;
  uint64_t expected = 0, counted = 0, item_bytes = 0, disk_bytes = 0;
  bool counts_match = false;
};

absl::StatusOr<BenchResult> RunBench(sluice::ShuffleClient& client, const std::string& id,
                                     const BenchConfig& c) {
  BenchResult res;
  auto created = client.CreateShuffle(id, c.partitions, c.shards);
  if (!created.ok()) return created.status();
  std::vector<std::vector<uint64_t>> expected(c.shards, std::vector<uint64_t>(c.keys, 0));
  std::vector<double> gen_s(c.shards, 0);
  std::vector<uint64_t> bytes(c.shards, 0);
  std::vector<absl::Status> errors(std::max(c.shards, c.partitions));

  // Scatter: every shard a mapper, concurrently, generating its items on the fly.
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < c.shards; ++s) {
    threads.emplace_back([&, s] {
      pthread_setname_np(pthread_self(), "bench-map");
      sluice::WriterOptions wopts;
      wopts.layout = c.layout;
      wopts.zstd_level = c.zstd_level;
      wopts.sort_by_key = c.key_order;
      wopts.buffer_bytes = c.buffer_mb << 20;
      auto writer = client.OpenWriter(id, static_cast<uint32_t>(s), 1, wopts);
      if (!writer.ok()) {
        errors[s] = writer.status();
        return;
      }
      Rng rng(static_cast<uint64_t>(s) + 1);
      // Items are generated in small batches (timed per batch, so the clock is not read per
      // item) and handed to the writer before the next batch: never more than kBatch at once.
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
          const int k = c.hot_frac > 0 && rng.Uniform() < c.hot_frac
                            ? 0
                            : static_cast<int>(rng.Next() % static_cast<uint64_t>(c.keys));
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
          w = reinterpret_cast<char*>(
              sluice::mp::WriteStrHeader(h, static_cast<uint32_t>(payload_len)));
          FillAlnum(rng, pairs, w, payload_len);
          w += payload_len;
          batch.resize(static_cast<size_t>(w - batch.data()));
          ends.push_back(static_cast<uint32_t>(batch.size()));
          ++expected[s][k];
          bytes[s] += static_cast<size_t>(w - value);
        }
        gen += Clock::now() - g0;
        uint32_t start = 0;
        for (size_t e = 0; e < ends.size(); e += 2) {
          const std::string_view key(batch.data() + start, ends[e] - start);
          const std::string_view value(batch.data() + ends[e], ends[e + 1] - ends[e]);
          start = ends[e + 1];
          absl::Status st = (*writer)->Add(key, value);
          if (!st.ok()) {
            errors[s] = st;
            return;
          }
        }
      }
      auto result = (*writer)->Close();
      if (!result.ok()) errors[s] = result.status();
      gen_s[s] = std::chrono::duration<double>(gen).count();
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  const auto t1 = Clock::now();
  for (const auto& e : errors) {
    if (!e.ok()) return e;
  }

  // Reduce: every partition a reducer, concurrently, grouping by key and counting.
  std::vector<std::vector<uint64_t>> counted(c.partitions, std::vector<uint64_t>(c.keys, 0));
  for (int p = 0; p < c.partitions; ++p) {
    threads.emplace_back([&, p] {
      pthread_setname_np(pthread_self(), "bench-reduce");
      sluice::ReaderOptions ropts;
      ropts.order = c.key_order ? sluice::FetchOrder::kKey : sluice::FetchOrder::kUnordered;
      ropts.require_complete = true;
      auto reader = client.OpenReader(id, static_cast<uint32_t>(p), ropts);
      if (!reader.ok()) {
        errors[p] = reader.status();
        return;
      }
      sluice::Record r;
      for (;;) {
        auto more = (*reader)->Next(&r);
        if (!more.ok()) {
          errors[p] = more.status();
          return;
        }
        if (!*more) break;
        int64_t k = -1;
        const auto* kp = reinterpret_cast<const uint8_t*>(r.key.data());
        if (sluice::mp::ReadCanonicalInt(kp, kp + r.key.size(), &k) == nullptr || k < 0 ||
            k >= c.keys) {
          errors[p] = absl::DataLossError("a record came back with a key that was never sent");
          return;
        }
        ++counted[p][k];
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto t2 = Clock::now();
  for (const auto& e : errors) {
    if (!e.ok()) return e;
  }

  res.counts_match = true;
  for (int k = 0; k < c.keys; ++k) {
    uint64_t want = 0, got = 0;
    for (int s = 0; s < c.shards; ++s) want += expected[s][k];
    for (int p = 0; p < c.partitions; ++p) got += counted[p][k];
    res.expected += want;
    res.counted += got;
    if (want != got) res.counts_match = false;
  }
  for (int s = 0; s < c.shards; ++s) {
    res.gen_s += gen_s[s];
    res.item_bytes += bytes[s];
  }
  auto status = client.GetShuffle(id);
  if (status.ok()) {
    for (const auto& p : status->partitions) res.disk_bytes += p.bytes;
  }
  res.scatter_s = std::chrono::duration<double>(t1 - t0).count();
  res.reduce_s = std::chrono::duration<double>(t2 - t1).count();
  res.elapsed_s = std::chrono::duration<double>(t2 - t0).count();
  (void)client.DeleteShuffle(id);
  return res;
}

int Bench(Flags& flags) {
  BenchConfig c;
  c.shards = static_cast<int>(flags.Int("shards", c.shards));
  c.items_per_shard = flags.Int("items-per-shard", c.items_per_shard);
  c.item_bytes = static_cast<int>(flags.Int("item-bytes", c.item_bytes));
  c.keys = static_cast<int>(flags.Int("keys", c.keys));
  c.partitions = static_cast<int>(flags.Int("partitions", c.partitions));
  c.hot_frac = flags.Double("hot-shard-frac", 0);
  c.heavy_tail = flags.Get("heavy-tail", "false") == "true";
  auto layout = sluice::ParseLayoutChoice(flags.Get("layout", "auto"));
  if (!layout.ok()) return Fail(layout.status());
  c.layout = *layout;
  c.zstd_level = static_cast<int>(flags.Int("zstd-level", 3));
  const std::string order = flags.Get("order", "KEY");
  if (order != "KEY" && order != "UNORDERED") {
    return Fail(absl::InvalidArgumentError("--order is KEY or UNORDERED"));
  }
  c.key_order = order == "KEY";
  c.buffer_mb = static_cast<size_t>(flags.Int("buffer-mb", 4));
  const auto server_memory_mb = static_cast<uint64_t>(flags.Int("server-memory-mb", 128));
  const int repeat = static_cast<int>(flags.Int("repeat", 1));
  const std::string server_addr = flags.Get("server", "");
  std::string data_dir = flags.Get("data-dir", "");
  std::string why;
  if (!flags.Check(&why) || c.shards < 1 || c.partitions < 1 || c.keys < 1) {
    std::fprintf(stderr, "sluice bench: %s\n", why.empty() ? "bad arguments" : why.c_str());
    return 2;
  }

  // No --server: an embedded server on an ephemeral port with a temporary directory.
  std::unique_ptr<sluice::SluiceServer> embedded;
  bool remove_dir = false;
  std::string address = server_addr;
  if (address.empty()) {
    if (data_dir.empty()) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "sluice-bench-XXXXXX").string();
      if (::mkdtemp(tmpl.data()) == nullptr) return Fail(absl::InternalError("mkdtemp failed"));
      data_dir = tmpl;
      remove_dir = true;
    }
    sluice::ServerOptions sopts;
    sopts.listen_address = "127.0.0.1:0";
    sopts.data_dir = data_dir;
    sopts.worker_threads = 2;
    sopts.memory_budget_bytes = server_memory_mb << 20;
    auto server = sluice::SluiceServer::Start(sopts);
    if (!server.ok()) return Fail(server.status());
    embedded = std::move(server).value();
    address = "127.0.0.1:" + std::to_string(embedded->port());
  }
  auto client = Connect(address);
  int rc = 0;
  for (int r = 0; r < repeat; ++r) {
    const std::string id = absl::StrCat("bench-", ::getpid(), "-", r);
    auto res = RunBench(*client, id, c);
    if (!res.ok()) {
      rc = Fail(res.status());
      break;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double items = static_cast<double>(res->expected);
    std::printf(
        "RESULT {\"repeat\": %d, \"shards\": %d, \"items_per_shard\": %lld, \"partitions\": %d, "
        "\"order\": \"%s\", \"layout\": \"%s\", \"elapsed_s\": %.3f, \"items_per_sec\": %.0f, "
        "\"mb_per_sec\": %.1f, \"expected_items\": %llu, \"counted_items\": %llu, "
        "\"counts_match\": %s, \"gen_s\": %.3f, \"scatter_s\": %.3f, \"reduce_s\": %.3f, "
        "\"stored_bytes\": %llu, \"peak_rss_mb\": %.1f, \"embedded_server\": %s}\n",
        r, c.shards, c.items_per_shard, c.partitions, c.key_order ? "KEY" : "UNORDERED",
        sluice::LayoutChoiceName(c.layout), res->elapsed_s, items / res->elapsed_s,
        static_cast<double>(res->item_bytes) / res->elapsed_s / 1e6,
        static_cast<unsigned long long>(res->expected),
        static_cast<unsigned long long>(res->counted), res->counts_match ? "true" : "false",
        res->gen_s, res->scatter_s, res->reduce_s, static_cast<unsigned long long>(res->disk_bytes),
        ru.ru_maxrss / 1024.0, embedded != nullptr ? "true" : "false");
    std::fflush(stdout);
    if (!res->counts_match) rc = 1;
  }
  client.reset();
  embedded.reset();
  if (remove_dir) std::filesystem::remove_all(data_dir);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// push / fetch: records through files.

// Splits a msgpack stream into objects.
absl::Status ForEachMsgpackObject(const std::string& bytes,
                                  const std::function<absl::Status(std::string_view)>& fn) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t* end = p + bytes.size();
  size_t index = 0;
  while (p < end) {
    sluice::mp::ScanError err;
    const uint8_t* q = sluice::mp::SkipObject(p, end, &err);
    if (q == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("input object ", index, ": ", sluice::mp::ScanErrorName(err)));
    }
    SLUICE_RETURN_IF_ERROR(fn(std::string_view(reinterpret_cast<const char*>(p), q - p)));
    p = q;
    ++index;
  }
  return absl::OkStatus();
}

int Push(Flags& flags) {
  const std::string server = flags.Get("server", "127.0.0.1:7070");
  const std::string id = flags.Get("shuffle", "");
  const auto mapper = static_cast<uint32_t>(flags.Int("mapper", 0));
  const auto attempt = static_cast<uint64_t>(flags.Int("attempt", 1));
  const std::string input = flags.Get("input", "");
  const std::string format = flags.Get("format", "jsonl");
  const std::string key_field = flags.Get("key-field", "");
  const bool sort = flags.Get("sort", "false") == "true";
  std::string why;
  if (!flags.Check(&why) || input.empty() || key_field.empty() ||
      (format != "jsonl" && format != "msgpack")) {
    return Fail(absl::InvalidArgumentError(
        why.empty() ? "push needs --input FILE, --key-field NAME and --format jsonl|msgpack"
                    : why));
  }
  std::ifstream in(input, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError("cannot open " + input));
  auto client = Connect(server);
  sluice::WriterOptions wopts;
  wopts.sort_by_key = sort;
  auto writer = client->OpenWriter(id, mapper, attempt, wopts);
  if (!writer.ok()) return Fail(writer.status());
  size_t n = 0;
  // Each record: key = msgpack of the key field, value = the object as msgpack.
  auto add = [&](const nlohmann::json& obj, std::string_view value) -> absl::Status {
    if (!obj.is_object() || !obj.contains(key_field)) {
      return absl::InvalidArgumentError(
          absl::StrCat("record ", n, " has no field '", key_field, "'"));
    }
    const std::vector<uint8_t> key = nlohmann::json::to_msgpack(obj[key_field]);
    ++n;
    return (*writer)->Add(std::string_view(reinterpret_cast<const char*>(key.data()), key.size()),
                          value);
  };
  absl::Status st;
  if (format == "jsonl") {
    std::string line;
    while (st.ok() && std::getline(in, line)) {
      if (line.empty()) continue;
      nlohmann::json obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (obj.is_discarded()) {
        st = absl::InvalidArgumentError(absl::StrCat("line ", n + 1, " is not JSON"));
        break;
      }
      const std::vector<uint8_t> value = nlohmann::json::to_msgpack(obj);
      st = add(obj, std::string_view(reinterpret_cast<const char*>(value.data()), value.size()));
    }
  } else {
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    st = ForEachMsgpackObject(bytes, [&](std::string_view value) {
      nlohmann::json obj = nlohmann::json::from_msgpack(value.begin(), value.end(), true, false);
      if (obj.is_discarded()) return absl::InvalidArgumentError("input object is not JSON-like");
      return add(obj, value);
    });
  }
  if (!st.ok()) {
    (*writer)->Abort();
    return Fail(st);
  }
  auto result = (*writer)->Close();
  if (!result.ok()) return Fail(result.status());
  std::printf("pushed %llu records in %llu frames%s\n",
              static_cast<unsigned long long>(result->records),
              static_cast<unsigned long long>(result->frames),
              result->duplicate ? " (duplicate attempt: discarded)" : "");
  return 0;
}

int Fetch(Flags& flags) {
  const std::string server = flags.Get("server", "127.0.0.1:7070");
  const std::string id = flags.Get("shuffle", "");
  const auto partition = static_cast<uint32_t>(flags.Int("partition", 0));
  const std::string order = flags.Get("order", "UNORDERED");
  const std::string output = flags.Get("output", "-");
  const std::string format = flags.Get("format", "jsonl");
  std::string why;
  if (!flags.Check(&why) || (format != "jsonl" && format != "msgpack") ||
      (order != "KEY" && order != "UNORDERED")) {
    return Fail(absl::InvalidArgumentError(
        why.empty() ? "fetch takes --format jsonl|msgpack and --order KEY|UNORDERED" : why));
  }
  std::ofstream file;
  if (output != "-") {
    file.open(output, std::ios::binary);
    if (!file) return Fail(absl::InternalError("cannot write " + output));
  }
  std::ostream& out = output == "-" ? std::cout : file;
  sluice::ReaderOptions ropts;
  ropts.order = order == "KEY" ? sluice::FetchOrder::kKey : sluice::FetchOrder::kUnordered;
  auto reader = Connect(server)->OpenReader(id, partition, ropts);
  if (!reader.ok()) return Fail(reader.status());
  sluice::Record r;
  size_t n = 0;
  for (;;) {
    auto more = (*reader)->Next(&r);
    if (!more.ok()) return Fail(more.status());
    if (!*more) break;
    if (format == "msgpack") {
      out.write(r.value.data(), static_cast<std::streamsize>(r.value.size()));
    } else {
      nlohmann::json obj =
          nlohmann::json::from_msgpack(r.value.begin(), r.value.end(), true, false);
      if (obj.is_discarded()) {
        return Fail(absl::DataLossError(absl::StrCat("record ", n,
                                                     " is not msgpack; use "
                                                     "--format msgpack for opaque values")));
      }
      out << obj.dump() << '\n';
    }
    ++n;
  }
  out.flush();
  std::fprintf(stderr, "fetched %zu records\n", n);
  return 0;
}

void Usage() {
  std::fprintf(stderr,
               "usage: sluice <command> [flags]\n"
               "  create --server H:P --shuffle ID --partitions N [--mappers M]\n"
               "  status --server H:P --shuffle ID\n"
               "  list   --server H:P\n"
               "  delete --server H:P --shuffle ID\n"
               "  push   --server H:P --shuffle ID --mapper M [--attempt A] --input FILE\n"
               "         --key-field NAME [--format jsonl|msgpack] [--sort]\n"
               "  fetch  --server H:P --shuffle ID --partition P [--order KEY|UNORDERED]\n"
               "         [--output FILE|-] [--format jsonl|msgpack]\n"
               "  bench  [--server H:P] [--shards 8] [--items-per-shard 50000] [--item-bytes 200]\n"
               "         [--keys 10000] [--partitions 8] [--hot-shard-frac 0] [--heavy-tail]\n"
               "         [--layout auto|msgpack|columnar|opaque] [--zstd-level 3]\n"
               "         [--order KEY|UNORDERED] [--repeat 1] [--buffer-mb 4]\n"
               "         [--server-memory-mb 128 (embedded server)] [--data-dir DIR]\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    Usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  Flags flags(argc, argv, 2);
  if (flags.Has("help")) {
    Usage();
    return 0;
  }
  if (cmd == "bench") return Bench(flags);
  if (cmd == "push") return Push(flags);
  if (cmd == "fetch") return Fetch(flags);
  const std::string server = flags.Get("server", "127.0.0.1:7070");
  const std::string id = flags.Get("shuffle", "");
  if (cmd == "create") {
    const auto partitions = static_cast<uint32_t>(flags.Int("partitions", 0));
    const auto mappers = static_cast<uint32_t>(flags.Int("mappers", 0));
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    auto created = Connect(server)->CreateShuffle(id, partitions, mappers);
    if (!created.ok()) return Fail(created.status());
    std::printf("%s %s\n", *created ? "created" : "exists", id.c_str());
    return 0;
  }
  if (cmd == "status") {
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    auto st = Connect(server)->GetShuffle(id);
    if (!st.ok()) return Fail(st.status());
    PrintStatus(*st);
    return 0;
  }
  if (cmd == "list") {
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    auto all = Connect(server)->ListShuffles();
    if (!all.ok()) return Fail(all.status());
    for (const auto& s : *all) PrintStatus(s);
    return 0;
  }
  if (cmd == "delete") {
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    absl::Status st = Connect(server)->DeleteShuffle(id);
    if (!st.ok()) return Fail(st);
    std::printf("deleted %s\n", id.c_str());
    return 0;
  }
  Usage();
  return 2;
}
