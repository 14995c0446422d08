// sluice: the command-line client.
//
//   sluice create --server HOST:PORT --shuffle ID --partitions N [--mappers M]
//   sluice status --server HOST:PORT --shuffle ID
//   sluice list   --server HOST:PORT
//   sluice delete --server HOST:PORT --shuffle ID
//   sluice push   --server HOST:PORT --shuffle ID --mapper M --input FILE --key-field NAME
//   sluice fetch  --server HOST:PORT --shuffle ID --partition P [--order KEY] [--output FILE]
//                 [--from KEY --to KEY]
//   sluice splits --server HOST:PORT --shuffle ID --partition P --n N
//   sluice bench  [--server HOST:PORT] [flags]      (runs sluice-bench; no --server: it starts
//                                                   a sluice-server child)
//
// `sluice <command> --help` lists a command's flags.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "client/cli_flags.h"
#include "client/server_process.h"
#include "client/shuffle_client.h"
#include "client/store_fallback.h"
#include "codec/msgpack_scan.h"
#include "nlohmann/json.hpp"
#include "rpc/error_reason.h"

namespace {

using sluice::cli::Flags;

// Exit status of a failure a retry may fix (sysexits' EX_TEMPFAIL); 1 for the others.
constexpr int kExitRetryable = 75;

// Says what failed and whether a retry can help; exits 75 if it can, else 1 (scripts decide on
// the status alone, as engines decide on the code).
int Fail(const absl::Status& st) {
  std::string retry;
  if (sluice::Retryable(st)) {
    const auto after = sluice::RetryAfterOf(st);
    retry = after.count() > 0
                ? absl::StrCat(" (retryable: retry in about ", (after.count() + 999) / 1000, " s)")
                : " (retryable)";
  }
  std::fprintf(stderr, "sluice: %s%s\n", sluice::Describe(st).c_str(), retry.c_str());
  return sluice::Retryable(st) ? kExitRetryable : 1;
}

// The TLS flags (cli::TlsFlags), the token (cli::TokenFlag) and the timeouts
// (cli::TimeoutFlags), read once in main.
sluice::ClientTlsOptions g_tls;
std::string g_token;
sluice::ClientOptions g_timeouts;

std::unique_ptr<sluice::ShuffleClient> Connect(const std::string& server) {
  sluice::ClientOptions opts = g_timeouts;
  opts.server = server;
  opts.tls = g_tls;
  opts.token = g_token;
  auto client = sluice::ShuffleClient::Connect(opts);
  if (!client.ok()) {
    Fail(client.status());
    std::exit(1);
  }
  return std::move(client).value();
}

// A key as the CLI shows it: its JSON when it is a msgpack value, and its bytes in hex.
std::string ShowKey(const std::string& key) {
  nlohmann::json v = nlohmann::json::from_msgpack(key.begin(), key.end(), true, false);
  const std::string hex = absl::BytesToHexString(key);
  if (v.is_discarded()) return absl::StrCat("hex ", hex.empty() ? "(empty)" : hex);
  return absl::StrCat(v.dump(), " (hex ", hex, ")");
}

void PrintStatus(const sluice::ShuffleStatus& s) {
  if (s.damaged) {
    std::printf("shuffle %s: DAMAGED: %s (delete it to reuse the id)\n", s.shuffle_id.c_str(),
                s.damage.c_str());
    return;
  }
  if (s.unopened) {
    std::printf(
        "shuffle %s: %u partitions, %u mappers (not open on its server now; `sluice status "
        "--shuffle` opens it)\n",
        s.shuffle_id.c_str(), s.num_partitions, s.num_mappers);
    return;
  }
  std::printf("shuffle %s: %u partitions, %u mappers (%zu committed)\n", s.shuffle_id.c_str(),
              s.num_partitions, s.num_mappers, s.committed_mappers.size());
  if (s.wedged) std::printf("  WEDGED: %s\n", s.wedge.c_str());
  if (!s.unavailable_partitions.empty()) {
    std::string list;
    for (uint32_t p : s.unavailable_partitions) absl::StrAppend(&list, list.empty() ? "" : ", ", p);
    std::printf("  UNAVAILABLE (no server of theirs answers): partitions %s\n", list.c_str());
  }
  if (!s.under_replicated_partitions.empty()) {
    std::string list;
    for (uint32_t p : s.under_replicated_partitions) {
      absl::StrAppend(&list, list.empty() ? "" : ", ", p);
    }
    std::printf("  UNDER-REPLICATED (fewer whole replicas than the replication): partitions %s\n",
                list.c_str());
  }
  for (const sluice::LostPartition& lost : s.lost_partitions) {
    std::printf(
        "  LOST partition %u: no server holds the records of mappers %s any more (every "
        "server that held them was taken out); revoke them (sluice revoke --lost) and run them "
        "again\n",
        lost.partition, absl::StrJoin(lost.mappers, ", ").c_str());
  }
  for (size_t p = 0; p < s.partitions.size(); ++p) {
    std::printf("  partition %zu: %llu records, %llu bytes, %u frames\n", p,
                static_cast<unsigned long long>(s.partitions[p].records),
                static_cast<unsigned long long>(s.partitions[p].bytes), s.partitions[p].frames);
    if (s.partitions[p].damaged) {
      std::printf("    DAMAGED: %s\n", s.partitions[p].damage.c_str());
    }
    // Its heaviest keys, those with 1% of its records or more.
    for (const auto& h : s.partitions[p].hot_keys) {
      const double share = s.partitions[p].records == 0
                               ? 0
                               : 100.0 * static_cast<double>(h.records) /
                                     static_cast<double>(s.partitions[p].records);
      if (share < 1) continue;
      std::printf("    hot key %s%s: %llu records (%.1f%%), %llu bytes\n", ShowKey(h.key).c_str(),
                  h.cut ? " (its first 32 bytes)" : "", static_cast<unsigned long long>(h.records),
                  share, static_cast<unsigned long long>(h.bytes));
    }
  }
}

// What the server at `address` says of itself (GetNode), within 5 s.
absl::StatusOr<sluice::NodeStatus> AskNode(const std::string& address) {
  sluice::ClientOptions options = g_timeouts;
  options.server = address;
  options.tls = g_tls;
  options.token = g_token;
  options.call_deadline =
      std::min<std::chrono::milliseconds>(options.call_deadline, std::chrono::seconds(5));
  auto client = sluice::ShuffleClient::Connect(options);
  if (!client.ok()) return client.status();
  return (*client)->GetNode();
}

// A server's health in a few words.
std::string Health(const sluice::NodeAddress& n) {
  if (n.address.empty()) return "DOWN (not registered)";
  absl::StatusOr<sluice::NodeStatus> st = AskNode(n.address);
  if (!st.ok()) return "UNREACHABLE: " + std::string(st.status().message());
  if (!st->serving) return "NOT SERVING";
  std::string failed;
  for (const auto& d : st->data_dirs) {
    if (d.failed) absl::StrAppend(&failed, ", DATA DIRECTORY ", d.index, " FAILED");
  }
  return absl::StrCat("serving, disk ", st->disk_free_bytes >> 20, " MiB free",
                      st->clustered && !st->registered ? ", NOT REGISTERED" : "", failed);
}

// Where the shuffle lives: each server with how many partitions it keeps (and is primary of)
// and its health, then the partitions' replicas (the first 16 of a wide shuffle).
void PrintPlacement(const sluice::PlacementInfo& p) {
  std::printf("placement: replication %u over %zu servers\n", p.replication, p.nodes.size());
  std::vector<uint32_t> kept(p.nodes.size(), 0), primary(p.nodes.size(), 0);
  for (const auto& r : p.replicas) {
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i] >= p.nodes.size()) continue;  // (a server's answer is not trusted blindly)
      ++kept[r[i]];
      if (i == 0) ++primary[r[i]];
    }
  }
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    std::printf("  server %s at %s: %u partitions (%u as primary), %s\n",
                p.nodes[n].node_id.c_str(),
                p.nodes[n].address.empty() ? "(not registered)" : p.nodes[n].address.c_str(),
                kept[n], primary[n], Health(p.nodes[n]).c_str());
  }
  for (size_t q = 0; q < p.replicas.size() && q < 16; ++q) {
    std::string names;
    for (uint32_t i : p.replicas[q]) {
      if (!names.empty()) names += ", ";
      names += i < p.nodes.size() ? p.nodes[i].node_id : "?";
    }
    std::printf("  partition %zu on %s\n", q, names.c_str());
  }
  if (p.replicas.size() > 16) std::printf("  ... (%zu partitions)\n", p.replicas.size());
  if (p.split_bytes == 0) return;
  // Huge partitions: those split over further servers, each with its stored partitions.
  std::printf("huge partitions: split at %.0f MiB; %zu segments\n",
              static_cast<double>(p.split_bytes) / (1 << 20), p.segments.size());
  std::set<uint32_t> parents;
  for (const auto& g : p.segments) parents.insert(g.parent);
  size_t shown = 0;
  for (uint32_t parent : parents) {
    if (parent >= p.num_partitions) continue;
    if (++shown > 16) {
      std::printf("  ... (%zu partitions split)\n", parents.size());
      break;
    }
    std::string chain;
    for (uint32_t q : p.ChainOf(parent)) {
      std::string names;
      for (uint32_t i : p.ReplicasOf(q)) {
        if (!names.empty()) names += "+";
        names += i < p.nodes.size() ? p.nodes[i].node_id : "?";
      }
      absl::StrAppend(&chain, chain.empty() ? "" : ", ", q, " on ", names);
    }
    std::printf("  partition %u in %zu stored partitions: %s\n", parent, p.ChainOf(parent).size(),
                chain.c_str());
  }
}

// One server of `sluice nodes`: asked itself for its health and space (unreachable ones say so).
void PrintNode(const sluice::NodeAddress& n) {
  absl::StatusOr<sluice::NodeStatus> st = AskNode(n.address);
  if (!st.ok()) {
    std::printf("node %s at %s: UNREACHABLE: %s\n", n.node_id.c_str(), n.address.c_str(),
                std::string(st.status().message()).c_str());
    return;
  }
  const auto mib = [](uint64_t b) { return static_cast<unsigned long long>(b >> 20); };
  std::printf(
      "node %s at %s: %s, %s%s, disk %llu of %llu MiB free, memory %llu of %llu MiB used, "
      "%u shuffles, %u push and %u fetch streams\n",
      n.node_id.c_str(), n.address.c_str(), st->decommissioning ? "decommissioning" : "alive",
      st->serving ? "serving" : "NOT SERVING",
      st->clustered && !st->registered ? " (NOT REGISTERED)" : "", mib(st->disk_free_bytes),
      mib(st->disk_total_bytes), mib(st->memory_used_bytes), mib(st->memory_budget_bytes),
      st->shuffles, st->push_streams, st->fetch_streams);
  if (st->repair_backlog != 0 || st->repaired_bytes != 0) {
    std::printf("  repair: %llu (mapper, partition) copies to make (%llu MiB), %llu MiB copied\n",
                static_cast<unsigned long long>(st->repair_backlog), mib(st->repair_backlog_bytes),
                mib(st->repaired_bytes));
  }
  // Data directories: listed when there are several, or when one failed.
  for (const auto& d : st->data_dirs) {
    if (st->data_dirs.size() < 2 && !d.failed) break;
    if (d.failed) {
      std::printf("  data directory %u: FAILED: %s\n", d.index, d.error.c_str());
    } else {
      std::printf("  data directory %u: %u shuffles, %llu partitions, %llu of %llu MiB free\n",
                  d.index, d.shuffles, static_cast<unsigned long long>(d.partitions),
                  mib(d.disk_free_bytes), mib(d.disk_total_bytes));
    }
  }
}

// bench: the benchmark is a program of its own (sluice-bench, beside this one), so that this
// CLI links the client library alone. Its flags and output are its own.
int Bench(int argc, char** argv) {
  auto bin = sluice::FindProgram("sluice-bench");
  if (!bin.ok()) return Fail(bin.status());
  std::vector<char*> args = {bin->data()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(bin->c_str(), args.data());
  return Fail(absl::InternalError(absl::StrCat("exec ", *bin, ": ", std::strerror(errno))));
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

// A range key from --NAME (a JSON value, as `push` makes keys: msgpack of the key field) or
// --NAME-hex (the key's bytes in hex). Not given: nullopt.
absl::StatusOr<std::optional<std::string>> RangeKey(Flags& flags, const std::string& name) {
  const std::string json = flags.Get(name, "");
  const std::string hex = flags.Get(name + "-hex", "");
  if (!json.empty() && !hex.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("give --", name, " or --", name, "-hex"));
  }
  if (!hex.empty()) {
    if (hex.size() % 2 != 0 || hex.find_first_not_of("0123456789abcdefABCDEF") != hex.npos) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, "-hex is not hex: ", hex));
    }
    return absl::HexStringToBytes(hex);
  }
  if (json.empty()) return std::optional<std::string>();
  nlohmann::json value = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " is not a JSON value (a string needs its quotes: --", name,
                     " '\"k\"'; raw bytes: --", name, "-hex)"));
  }
  const std::vector<uint8_t> key = nlohmann::json::to_msgpack(value);
  return std::string(key.begin(), key.end());
}

// sluice splits: keys that cut a partition into slices of nearly equal bytes.
int Splits(Flags& flags) {
  const std::string server = flags.Get("server", "127.0.0.1:7070");
  const std::string id = flags.Get("shuffle", "");
  const auto partition = static_cast<uint32_t>(flags.Int("partition", 0));
  const auto n = static_cast<uint32_t>(flags.Int("n", 2));
  std::string why;
  if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
  auto splits = Connect(server)->GetSplits(id, partition, n);
  if (!splits.ok()) return Fail(splits.status());
  if (splits->slice_bytes.size() != splits->keys.size() + 1) {
    return Fail(
        absl::InternalError(absl::StrCat("the server answered ", splits->keys.size(), " keys and ",
                                         splits->slice_bytes.size(), " slice sizes")));
  }
  std::printf("partition %u: %llu bytes in %u frames%s; %zu slices\n", partition,
              static_cast<unsigned long long>(splits->partition_bytes), splits->frames,
              splits->frames_without_bounds == 0
                  ? ""
                  : absl::StrCat(" (", splits->frames_without_bounds,
                                 " without key bounds, counted evenly)")
                        .c_str(),
              splits->keys.size() + 1);
  for (size_t i = 0; i <= splits->keys.size(); ++i) {
    std::printf("slice %zu  ~%llu bytes  from %s  to %s\n", i,
                static_cast<unsigned long long>(splits->slice_bytes[i]),
                i == 0 ? "the start" : ShowKey(splits->keys[i - 1]).c_str(),
                i == splits->keys.size() ? "the end" : ShowKey(splits->keys[i]).c_str());
  }
  return 0;
}

int Fetch(Flags& flags) {
  const std::string server = flags.Get("server", "127.0.0.1:7070");
  const std::string id = flags.Get("shuffle", "");
  const auto partition = static_cast<uint32_t>(flags.Int("partition", 0));
  const std::string order = flags.Get("order", "UNORDERED");
  const std::string output = flags.Get("output", "-");
  const std::string format = flags.Get("format", "jsonl");
  const std::string object_store = flags.Get("object-store", "");
  const std::string object_endpoint = flags.Get("object-endpoint", "");
  auto from = RangeKey(flags, "from");
  auto to = RangeKey(flags, "to");
  std::string why;
  if (!flags.Check(&why) || (format != "jsonl" && format != "msgpack") ||
      (order != "KEY" && order != "UNORDERED")) {
    return Fail(absl::InvalidArgumentError(
        why.empty() ? "fetch takes --format jsonl|msgpack and --order KEY|UNORDERED" : why));
  }
  if (!from.ok()) return Fail(from.status());
  if (!to.ok()) return Fail(to.status());
  std::ofstream file;
  if (output != "-") {
    file.open(output, std::ios::binary);
    if (!file) return Fail(absl::InternalError("cannot write " + output));
  }
  std::ostream& out = output == "-" ? std::cout : file;
  sluice::ReaderOptions ropts;
  ropts.order = order == "KEY" ? sluice::FetchOrder::kKey : sluice::FetchOrder::kUnordered;
  if (from->has_value() || to->has_value()) {  // a key range is read in KEY order
    ropts.order = sluice::FetchOrder::kKey;
    ropts.from_key = from->value_or("");
    ropts.to_key = *to;
  }
  // (The reader uses its client's connections, or the store: they must outlive it.)
  std::unique_ptr<sluice::ShuffleClient> client;
  sluice::client_internal::StoreFallback store(object_store, object_endpoint);
  absl::StatusOr<std::unique_ptr<sluice::ShuffleReader>> reader;
  if (!object_store.empty()) {  // no server: the shuffle's manifest and objects
    reader = store.Open(id, partition, ropts, /*stored=*/false);
  } else {
    client = Connect(server);
    reader = client->OpenReader(id, partition, ropts);
  }
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

// A new random token (32 bytes from the kernel, hex) and the line a server's --auth_file needs
// for it: the token goes to the job, the line to the server (which never sees the token).
int NewToken(Flags& flags) {
  const std::string tenant = flags.Get("tenant", "");
  const std::string role = flags.Get("role", "tenant");
  std::string why;
  const bool name_ok = !tenant.empty() && tenant.size() <= 64 &&
                       tenant.find_first_not_of(
                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                           "0123456789._-") == std::string::npos;
  if (!flags.Check(&why) || !name_ok || (role != "tenant" && role != "admin")) {
    std::fprintf(stderr,
                 "usage: sluice token --tenant T [--role tenant|admin] (T: 1-64 of letters, "
                 "digits, '.', '_', '-')%s%s\n",
                 why.empty() ? "" : ": ", why.c_str());
    return 2;
  }
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char raw[32];
  if (!urandom.read(reinterpret_cast<char*>(raw), sizeof(raw))) {
    return Fail(absl::InternalError("cannot read /dev/urandom"));
  }
  std::string token = "slc_";
  for (unsigned char b : raw) absl::StrAppend(&token, absl::Hex(b, absl::kZeroPad2));
  std::printf("token: %s\nline:  %s %s %s\n", token.c_str(), sluice::rpc::TokenHash(token).c_str(),
              tenant.c_str(), role.c_str());
  return 0;
}

void Usage() {
  std::fprintf(
      stderr,
      "usage: sluice <command> [flags]   (--server: H:P, a list H:P,H:P,... or a DNS name)\n"
      "  create --server H:P --shuffle ID --partitions N [--mappers M] [--replication R]\n"
      "  status --server H:P --shuffle ID\n"
      "  list   --server H:P\n"
      "  delete --server H:P --shuffle ID\n"
      "  nodes  --server H:P   the servers of its cluster, each one's health and free space\n"
      "  drain  --server H:P [--grace-s N] [--decommission-wait-s N]   stop taking pushes,\n"
      "         finish what runs, exit (a decommissioning server first moves its replicas)\n"
      "  decommission --server H:P [--wait [--timeout-s N]]   move its replicas elsewhere; with\n"
      "         --wait, until it may be stopped (exit 0), or the timeout (exit 1)\n"
      "  revoke --server H:P --shuffle ID (--mappers M,M,... | --lost) [--epoch E]   revoke\n"
      "         the mappers' winning decisions (a cluster), to run them again into the shuffle;\n"
      "         --lost: those of its lost partitions; --epoch: as the status showed them\n"
      "  push   --server H:P --shuffle ID --mapper M [--attempt A] --input FILE\n"
      "         --key-field NAME [--format jsonl|msgpack] [--sort]\n"
      "  fetch  --server H:P --shuffle ID --partition P [--order KEY|UNORDERED]\n"
      "         [--object-store s3://BUCKET/PREFIX [--object-endpoint URL]]   from the object\n"
      "         store alone, no server (the servers' --object_store; AWS credentials)\n"
      "         [--output FILE|-] [--format jsonl|msgpack]\n"
      "         [--from KEY] [--to KEY]   the keys in [from, to), KEY order (KEY: a JSON value,\n"
      "         as push's --key-field makes keys; --from-hex/--to-hex: the key's bytes)\n"
      "  splits --server H:P --shuffle ID --partition P [--n 2]   keys cutting the partition\n"
      "         into at most N slices of nearly equal bytes, each read with fetch --from/--to\n"
      "  bench  [flags]   the end-to-end benchmark (runs sluice-bench; `sluice bench --help`)\n"
      "  token  --tenant T [--role tenant|admin]   a new token, and its line for --auth_file\n"
      "TLS (any command; docs/security.md): --tls-ca FILE [--tls-cert FILE --tls-key FILE]\n"
      "  [--tls-server-name NAME], or --tls for the system's CAs; none of them: plaintext\n"
      "Credentials: --token-file FILE, or $SLUICE_TOKEN\n"
      "Timeouts (any command; seconds): --call-timeout-s 30 --keepalive-s 10\n"
      "  --keepalive-timeout-s 10 (a hung server is found within the two)\n"
      "Exit status: 0 done; 75 failed, and a retry can succeed (UNAVAILABLE, DEADLINE_EXCEEDED,\n"
      "  ABORTED, RESOURCE_EXHAUSTED); 1 failed, and retrying will not help; 2 usage\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    Usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "bench") return Bench(argc, argv);
  Flags flags(argc, argv, 2);
  if (flags.Has("help")) {
    Usage();
    return 0;
  }
  g_tls = sluice::cli::TlsFlags(flags);
  g_token = sluice::cli::TokenFlag(flags);
  g_timeouts = sluice::cli::TimeoutFlags(flags);
  if (cmd == "token") return NewToken(flags);
  if (cmd == "push") return Push(flags);
  if (cmd == "fetch") return Fetch(flags);
  if (cmd == "splits") return Splits(flags);
  const std::string server = flags.Get("server", "127.0.0.1:7070");
  const std::string id = flags.Get("shuffle", "");
  if (cmd == "create") {
    const auto partitions = static_cast<uint32_t>(flags.Int("partitions", 0));
    const auto mappers = static_cast<uint32_t>(flags.Int("mappers", 0));
    // In a cluster: the servers that keep each partition (0 = 2 with two or more servers).
    const auto replication = static_cast<uint32_t>(flags.Int("replication", 0));
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    auto created = Connect(server)->CreateShuffle(id, partitions, mappers, replication);
    if (!created.ok()) return Fail(created.status());
    std::printf("%s %s\n", *created ? "created" : "exists", id.c_str());
    return 0;
  }
  if (cmd == "status") {
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    auto client = Connect(server);
    sluice::StatusOptions options;
    options.hot_keys = 3;
    auto st = client->GetShuffle(id, options);
    if (!st.ok()) return Fail(st.status());
    PrintStatus(*st);
    auto placement = client->GetPlacement(id);
    if (!placement.ok()) return Fail(placement.status());
    PrintPlacement(*placement);
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
  if (cmd == "nodes") {
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    auto nodes = Connect(server)->ListNodes();
    if (!nodes.ok()) return Fail(nodes.status());
    for (const auto& n : *nodes) PrintNode(n);
    // Servers of its shuffles that are gone: suspect, then dead (taken out of placements).
    auto absent = Connect(server)->AbsentNodes();
    if (!absent.ok()) return Fail(absent.status());
    for (const auto& a : *absent) {
      std::printf("node %s: %s, not registered for %lld s%s\n", a.node_id.c_str(),
                  a.dead ? "dead" : "suspect", static_cast<long long>(a.absent.count() / 1000),
                  a.dead ? " (taken out of its shuffles' placements)" : "");
    }
    return 0;
  }
  if (cmd == "drain") {
    const auto grace = static_cast<uint32_t>(flags.Int("grace-s", 0));
    const long long decommission_wait_s = flags.Int("decommission-wait-s", 80);
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    auto client = Connect(server);
    // A server being decommissioned (a scale-down) first finishes moving its replicas, so
    // that the stop after the drain loses none: the Kubernetes preStop hook runs this.
    if (auto node = client->GetNode(); node.ok() && node->decommissioning) {
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::seconds(decommission_wait_s);
      for (;;) {
        auto progress = client->Decommission();
        if (progress.ok() && progress->done) break;
        if (std::chrono::steady_clock::now() >= until) {
          std::fprintf(stderr, "decommission of %s not done after %lld s (%s); draining anyway\n",
                       server.c_str(), decommission_wait_s,
                       progress.ok() ? progress->waiting_for.c_str()
                                     : std::string(progress.status().message()).c_str());
          break;
        }
        std::this_thread::sleep_for(std::chrono::seconds(2));
      }
    }
    absl::Status st = client->Drain(grace);
    if (!st.ok()) return Fail(st);
    std::printf("draining %s\n", server.c_str());
    return 0;
  }
  if (cmd == "decommission") {
    const std::string wait = flags.Get("wait", "false");
    const long long timeout_s = flags.Int("timeout-s", 3600);
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    if (wait != "true" && wait != "false") {
      return Fail(absl::InvalidArgumentError("--wait takes no value (or --wait=false)"));
    }
    auto client = Connect(server);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
      auto progress = client->Decommission();
      if (!progress.ok()) return Fail(progress.status());
      if (progress->done) {
        std::printf(
            "decommissioned %s: no placement names it and its replicas are whole "
            "elsewhere; it may be stopped\n",
            server.c_str());
        return 0;
      }
      std::printf(
          "decommissioning %s: %u shuffles still placed on it, %u partitions short of "
          "whole replicas elsewhere (waiting for %s)\n",
          server.c_str(), progress->shuffles_placed, progress->partitions_short,
          progress->waiting_for.c_str());
      std::fflush(stdout);
      if (wait != "true") return 0;
      if (std::chrono::steady_clock::now() >= until) return 1;
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
  }
  if (cmd == "revoke") {
    const std::string list = flags.Get("mappers", "");
    const std::string lost = flags.Get("lost", "false");
    const long long epoch_flag = flags.Int("epoch", -1);
    std::string why;
    if (!flags.Check(&why)) return Fail(absl::InvalidArgumentError(why));
    if (lost != "true" && lost != "false") {
      return Fail(absl::InvalidArgumentError("--lost takes no value (or --lost=false)"));
    }
    if (id.empty() || (list.empty() == (lost == "false"))) {
      return Fail(absl::InvalidArgumentError(
          "revoke needs --shuffle and exactly one of --mappers M,M,... and --lost"));
    }
    if (epoch_flag < -1 || epoch_flag > UINT32_MAX) {
      return Fail(absl::InvalidArgumentError("--epoch must be a placement epoch (0 or more)"));
    }
    std::vector<uint32_t> mappers;
    for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
      uint32_t m = 0;
      if (!absl::SimpleAtoi(part, &m)) {
        return Fail(
            absl::InvalidArgumentError(absl::StrCat("--mappers: '", part, "' is not a mapper id")));
      }
      mappers.push_back(m);
    }
    auto client = Connect(server);
    uint32_t epoch = static_cast<uint32_t>(epoch_flag);
    if (epoch_flag < 0 || lost == "true") {
      auto status = client->GetShuffle(id);
      if (!status.ok()) return Fail(status.status());
      if (epoch_flag < 0) epoch = status->placement_epoch;
      if (lost == "true") {
        std::set<uint32_t> all;
        for (const sluice::LostPartition& p : status->lost_partitions) {
          all.insert(p.mappers.begin(), p.mappers.end());
        }
        if (all.empty()) {
          std::printf("no lost partition in %s: nothing to revoke\n", id.c_str());
          return 0;
        }
        mappers.assign(all.begin(), all.end());
      }
    }
    auto revoked = client->RevokeMappers(id, mappers, epoch);
    if (!revoked.ok()) return Fail(revoked.status());
    std::vector<std::string> pairs;
    for (size_t i = 0; i < mappers.size() && i < revoked->attempts.size(); ++i) {
      pairs.push_back(absl::StrCat(mappers[i], " (attempt ", revoked->attempts[i], ")"));
    }
    std::printf(
        "revoked in %s at placement epoch %u: mappers %s; run them again (new attempt ids)\n",
        id.c_str(), revoked->placement_epoch, absl::StrJoin(pairs, ", ").c_str());
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
