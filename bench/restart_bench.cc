// sluice-restart-bench: what a server's start costs (issue 33; docs/benchmarks.md, "Start").
//
// Its data directories are filled by sluice-fill (server/fill_main.cc: the server's storage code,
// no server, no network), which this program does not link: it runs servers as children.
//
//   sluice-restart-bench start --server BIN --data_dir D [--shuffle ID] [--cold 1]
//       [--flag --x=y ...]
//     (as root, with --cold 1: syncs and drops the page cache first) execs BIN on D and reports,
//     as one JSON line: ms from exec until it listens, until it answers a call (GetNode), until
//     the first chunk of a fetch of partition 0 of shuffle ID arrives, and until the background
//     has opened what it opens (GetNode's shuffles_unopened reaches 0, or stays put for a
//     second: the open limits keep the rest closed until asked for; a server that opens all
//     before it listens has none), and its resident memory (VmRSS) at each of those moments.
//
//   sluice-restart-bench plan --server BIN --data_dir D --shuffle ID [--calls 9]
//     (issue 35, "plan reduces from what the server knows"; docs/benchmarks.md, "Reduce
//     planning") execs BIN on D and times the GetShuffle calls an engine makes to size its
//     reducers: the first (it opens the shuffle from its commit log) and then --calls more
//     (min, median, max), every page of them, with the bytes of the answers, the partitions
//     with records and the committed mappers they report; and the same through the C++ client.
//
//   sluice-restart-bench scrub-cost ... is not here: bench/restart_bench.sh interleaves
//   `sluice bench` runs with the scrub on and off.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/server_process.h"
#include "client/shuffle_client.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {
namespace {

namespace pb = sluice::v1;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The flags after the subcommand: --name value pairs (repeated --flag values kept in order).
struct Args {
  std::map<std::string, std::string> one;
  std::vector<std::string> server_flags;
  std::string Get(const std::string& k, const std::string& def = "") const {
    auto it = one.find(k);
    return it == one.end() ? def : it->second;
  }
  uint64_t Num(const std::string& k, uint64_t def) const {
    auto it = one.find(k);
    return it == one.end() ? def : std::strtoull(it->second.c_str(), nullptr, 10);
  }
};

bool ParseArgs(int argc, char** argv, Args* out) {
  for (int i = 2; i < argc; i += 2) {
    if (i + 1 >= argc || std::string(argv[i]).rfind("--", 0) != 0) return false;
    if (std::string(argv[i]) == "--flag") {
      out->server_flags.push_back(argv[i + 1]);
    } else {
      out->one[std::string(argv[i]).substr(2)] = argv[i + 1];
    }
  }
  return true;
}

// A field of /proc/<pid>/status in kB ("VmRSS:", "VmHWM:"), in bytes.
uint64_t StatusBytes(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field, 0) == 0) {
      return std::strtoull(line.c_str() + field.size(), nullptr, 10) << 10;
    }
  }
  return 0;
}
uint64_t RssBytes(pid_t pid) { return StatusBytes(pid, "VmRSS:"); }

int Start(const Args& a) {
  const std::string bin = a.Get("server"), dir = a.Get("data_dir"), shuffle = a.Get("shuffle");
  if (bin.empty() || dir.empty()) {
    std::fprintf(stderr, "start: --server BIN --data_dir D\n");
    return 2;
  }
  if (a.Num("cold", 0) != 0) {
    ::sync();
    std::ofstream drop("/proc/sys/vm/drop_caches");
    drop << "3\n";
    drop.close();
    if (!drop) {
      std::fprintf(stderr, "start: --cold 1 needs root (/proc/sys/vm/drop_caches)\n");
      return 1;
    }
  }
  std::vector<std::string> flags{"--data_dir=" + dir, "--log_level=warn"};
  for (const std::string& f : a.server_flags) flags.push_back(f);
  const auto t0 = Clock::now();
  auto server = ServerProcess::Start(bin, flags, "127.0.0.1", std::chrono::minutes(30));
  if (!server.ok()) {
    std::fprintf(stderr, "start: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const double listening = MsSince(t0);
  const pid_t pid = (*server)->pid();
  auto stub = pb::ShuffleService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials()));
  pb::NodeInfo node;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (stub->GetNode(&ctx, pb::GetNodeRequest(), &node).ok()) break;
  }
  const double answering = MsSince(t0);
  const uint64_t rss_answering = RssBytes(pid);
  double fetched = -1;
  uint64_t fetch_bytes = 0;
  if (!shuffle.empty()) {
    grpc::ClientContext ctx;
    pb::FetchRequest req;
    req.set_shuffle_id(shuffle);
    req.set_partition_id(0);
    auto reader = stub->Fetch(&ctx, req);
    pb::FetchResponse resp;
    if (reader->Read(&resp)) {
      fetched = MsSince(t0);
      fetch_bytes = resp.frame().size();
    }
    ctx.TryCancel();
    (void)reader->Finish();
  }
  // Until every shuffle is open, or as many as its open limits let the background open (the
  // count stays put for a second).
  const uint32_t unopened_first = node.shuffles_unopened();
  uint32_t last = unopened_first;
  auto changed = Clock::now();
  double all_open = MsSince(t0);
  for (;;) {
    grpc::ClientContext ctx;
    if (stub->GetNode(&ctx, pb::GetNodeRequest(), &node).ok()) {
      if (node.shuffles_unopened() != last) {
        last = node.shuffles_unopened();
        changed = Clock::now();
        all_open = MsSince(t0);
      }
      if (last == 0 || MsSince(changed) > 1000) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const uint64_t rss_all_open = RssBytes(pid);
  std::printf(
      "{\"listening_ms\": %.0f, \"answering_ms\": %.0f, \"first_fetch_ms\": %.0f, "
      "\"first_fetch_bytes\": %llu, \"all_open_ms\": %.0f, \"unopened_when_answering\": %u, "
      "\"shuffles\": %u, \"unopened_after\": %u, \"index_mb\": %.1f, \"rss_answering_mb\": %.1f, "
      "\"rss_all_open_mb\": %.1f, \"peak_rss_mb\": %.1f}\n",
      listening, answering, fetched, static_cast<unsigned long long>(fetch_bytes), all_open,
      unopened_first, node.shuffles(), node.shuffles_unopened(), node.index_bytes() / 1048576.0,
      rss_answering / 1048576.0, rss_all_open / 1048576.0, StatusBytes(pid, "VmHWM:") / 1048576.0);
  (void)(*server)->Stop();
  return 0;
}

// Every page of GetShuffle's answer for `id`: the partitions with records, the committed
// mappers, and the answers' bytes on the wire (their protobuf sizes).
struct Plan {
  uint64_t bytes = 0, nonempty = 0, records = 0, mappers = 0;
  bool ok = true;
};
Plan AskPlan(pb::ShuffleService::Stub* stub, const std::string& id) {
  Plan out;
  uint32_t next = 0;
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    pb::GetShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_first_partition(next);
    pb::ShuffleInfo info;
    const grpc::Status st = stub->GetShuffle(&ctx, req, &info);
    if (!st.ok()) {
      std::fprintf(stderr, "plan: GetShuffle: %s\n", st.error_message().c_str());
      out.ok = false;
      return out;
    }
    out.bytes += info.ByteSizeLong();
    out.mappers = info.committed_mappers_size();
    for (const pb::PartitionInfo& p : info.partitions()) {
      out.nonempty += p.records() > 0 ? 1 : 0;
      out.records += p.records();
    }
    next = info.next_partition();
  } while (next != 0);
  return out;
}

int PlanCost(const Args& a) {
  const std::string bin = a.Get("server"), dir = a.Get("data_dir"), shuffle = a.Get("shuffle");
  const uint64_t calls = a.Num("calls", 9);
  if (bin.empty() || dir.empty() || shuffle.empty() || calls == 0) {
    std::fprintf(stderr, "plan: --server BIN --data_dir D --shuffle ID [--calls N >= 1]\n");
    return 2;
  }
  std::vector<std::string> flags{"--data_dir=" + dir, "--log_level=warn"};
  for (const std::string& f : a.server_flags) flags.push_back(f);
  auto server = ServerProcess::Start(bin, flags, "127.0.0.1", std::chrono::minutes(30));
  if (!server.ok()) {
    std::fprintf(stderr, "plan: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  auto stub =
      pb::ShuffleService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto t = Clock::now();
  const Plan first = AskPlan(stub.get(), shuffle);
  const double first_ms = MsSince(t);
  if (!first.ok) return 1;
  std::vector<double> ms;
  Plan plan;
  for (uint64_t i = 0; i < calls; ++i) {
    t = Clock::now();
    plan = AskPlan(stub.get(), shuffle);
    ms.push_back(MsSince(t));
    if (!plan.ok) return 1;
  }
  std::sort(ms.begin(), ms.end());
  // The same through the C++ client (what an engine links), decoded into ShuffleStatus.
  ClientOptions co;
  co.server = address;
  auto client = ShuffleClient::Connect(co);
  std::vector<double> client_ms;
  for (uint64_t i = 0; client.ok() && i < calls; ++i) {
    t = Clock::now();
    auto st = (*client)->GetShuffle(shuffle);
    client_ms.push_back(MsSince(t));
    if (!st.ok()) {
      std::fprintf(stderr, "plan: client GetShuffle: %s\n", st.status().ToString().c_str());
      return 1;
    }
  }
  std::sort(client_ms.begin(), client_ms.end());
  std::printf(
      "{\"first_ms\": %.1f, \"min_ms\": %.2f, \"median_ms\": %.2f, \"max_ms\": %.2f, "
      "\"client_median_ms\": %.2f, \"bytes\": %llu, \"partitions_with_records\": %llu, "
      "\"records\": %llu, \"committed_mappers\": %llu, \"rss_mb\": %.1f}\n",
      first_ms, ms.front(), ms[ms.size() / 2], ms.back(),
      client_ms.empty() ? -1.0 : client_ms[client_ms.size() / 2],
      static_cast<unsigned long long>(plan.bytes), static_cast<unsigned long long>(plan.nonempty),
      static_cast<unsigned long long>(plan.records), static_cast<unsigned long long>(plan.mappers),
      RssBytes((*server)->pid()) / 1048576.0);
  (void)(*server)->Stop();
  return 0;
}

int Run(int argc, char** argv) {
  Args a;
  const std::string cmd = argc > 1 ? argv[1] : "";
  if ((cmd != "start" && cmd != "plan") || !ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: sluice-restart-bench start --server BIN --data_dir D [--shuffle ID] "
                 "[--cold 1] [--flag --x=y]...\n"
                 "       sluice-restart-bench plan --server BIN --data_dir D --shuffle ID "
                 "[--calls N] [--flag --x=y]...\n");
    return 2;
  }
  if (cmd == "plan") return PlanCost(a);
  return Start(a);
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) { return sluice::Run(argc, argv); }
