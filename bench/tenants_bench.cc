// sluice-tenants-bench: tenant B's calls while tenant A holds the server every way a client can
// without sending data (docs/benchmarks.md, "Tenants under attack"). A sluice-server child with
// two tenants (--auth_file) on 127.0.0.1:0; tenant B pushes one-record attempts and reads its
// partition in key order, timed, alone and under each attack, side by side:
//
//   announce  A opens 5 push streams and announces a --frame-mb frame on each, sends no piece
//   unread    A opens 50 UNORDERED fetches of its 4 MiB frames and reads nothing
//   key       A opens --merges KEY fetches (every merge slot) of a 24 MiB partition, reads nothing
//   credit    A opens 420 PushFlow streams, asks for credit on each (the budget), sends nothing
//
// Each attack is run after a round of B alone, on the same server; B's figures are p50, p99 and
// the largest of --calls calls. Then A's calls are cancelled and the server's memory checked.
//
//   sluice-tenants-bench [--budget-mb 256] [--frame-mb 64] [--calls 50] [--merges 4]
//                        [--server-bin PATH]
//
// SLUICE_BENCH_TRACE=1 prints each of B's calls over 100 ms; SLUICE_BENCH_LOG=1 the server's
// info log.
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/server_process.h"
#include "client/shuffle_client.h"
#include "codec/frame_encoder.h"
#include "rpc/tls_options.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {
namespace {

namespace pb = sluice::v1;
using Clock = std::chrono::steady_clock;

constexpr char kTokenA[] = "slc_bench-tenant-a";
constexpr char kTokenB[] = "slc_bench-tenant-b";

std::unique_ptr<grpc::ClientContext> AsA() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("authorization", absl::StrCat("Bearer ", kTokenA));
  return ctx;
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// One frame to a push stream as a client sends it: whole, or announced and in 1 MiB pieces.
bool WriteFrame(grpc::ClientWriter<pb::PushRequest>* w, const std::string& frame) {
  pb::PushRequest msg;
  if (frame.size() + 16 <= (1u << 20)) {
    auto* f = msg.mutable_frames()->add_frames();
    f->set_partition_id(0);
    f->set_frame(frame);
    return w->Write(msg);
  }
  msg.mutable_large_frame()->set_partition_id(0);
  msg.mutable_large_frame()->set_frame_size(frame.size());
  bool ok = w->Write(msg);
  for (size_t at = 0; ok && at < frame.size(); at += 1u << 20) {
    msg.mutable_piece()->set_data(frame.substr(at, 1u << 20));
    ok = w->Write(msg);
  }
  return ok;
}

// Tenant A's shuffle `id`, one partition: `mappers` x `records` records of `value_bytes`.
bool FillA(pb::ShuffleService::Stub& stub, const std::string& id, uint32_t mappers, int records,
           size_t value_bytes) {
  {
    auto ctx = AsA();
    pb::CreateShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_num_partitions(1);
    pb::CreateShuffleResponse resp;
    if (!stub.CreateShuffle(ctx.get(), req, &resp).ok()) return false;
  }
  FrameEncoder encoder;
  for (uint32_t m = 0; m < mappers; ++m) {
    auto ctx = AsA();
    pb::PushResponse resp;
    auto w = stub.Push(ctx.get(), &resp);
    pb::PushRequest msg;
    msg.mutable_open()->set_shuffle_id(id);
    msg.mutable_open()->set_mapper_id(m);
    msg.mutable_open()->set_attempt_id(1);
    bool ok = w->Write(msg);
    for (int i = 0; ok && i < records; ++i) {
      const std::string key = absl::StrCat("k", 1000 + i * mappers + m);
      const std::string value = RandomBytes(value_bytes, m * 1000 + i);
      std::string frame;
      if (!encoder.Encode({Record{key, value}}, &frame).ok()) return false;
      ok = WriteFrame(w.get(), frame);
    }
    msg.Clear();
    msg.mutable_commit()->set_frame_count(records);
    msg.mutable_commit()->set_record_count(records);
    if (ok) w->Write(msg);
    w->WritesDone();
    if (!w->Finish().ok()) return false;
  }
  return true;
}

struct Figures {
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  int failed = 0;
};

Figures Summarise(std::vector<double> ms, int failed) {
  Figures f;
  f.failed = failed;
  if (ms.empty()) return f;
  std::sort(ms.begin(), ms.end());
  f.p50_ms = ms[ms.size() / 2];
  f.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  f.max_ms = ms.back();
  return f;
}

class TenantB {
 public:
  explicit TenantB(std::unique_ptr<ShuffleClient> c) : c_(std::move(c)) {}
  bool Setup() { return c_->CreateShuffle("b", 1, 0).ok() && Push() >= 0; }
  // One one-record attempt (a new mapper each time), in ms; -1 if it failed.
  double Push() {
    const auto start = Clock::now();
    auto w = c_->OpenWriter("b", mapper_++, 1, {});
    if (!w.ok() || !(*w)->Add(absl::StrCat("key", mapper_), "value").ok() || !(*w)->Close().ok()) {
      return -1;
    }
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }
  // Its whole partition in key order, in ms; -1 if it failed.
  double ReadKey() {
    const auto start = Clock::now();
    ReaderOptions o;
    o.order = FetchOrder::kKey;
    auto r = c_->OpenReader("b", 0, o);
    if (!r.ok()) return -1;
    Record rec;
    for (;;) {
      auto more = (*r)->Next(&rec);
      if (!more.ok()) return -1;
      if (!*more) break;
    }
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }
  Figures Round(int calls, bool key) {
    std::vector<double> ms;
    int failed = 0;
    for (int i = 0; i < calls; ++i) {
      const double t = key ? ReadKey() : Push();
      if (t < 0) {
        ++failed;
      } else {
        ms.push_back(t);
        if (std::getenv("SLUICE_BENCH_TRACE") != nullptr && t > 100) {
          std::fprintf(stderr, "call %d took %.1f ms\n", i, t);
        }
      }
    }
    return Summarise(std::move(ms), failed);
  }

 private:
  std::unique_ptr<ShuffleClient> c_;
  uint32_t mapper_ = 0;
};

// What tenant A holds open during an attack; cancelled when it goes.
struct Attack {
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientWriter<pb::PushRequest>>> pushes;
  std::vector<pb::PushResponse> resps = std::vector<pb::PushResponse>(64);
  std::vector<std::unique_ptr<grpc::ClientReader<pb::FetchResponse>>> fetches;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<pb::PushRequest, pb::PushReply>>> flows;
  ~Attack() {
    for (auto& c : ctxs) c->TryCancel();
    for (auto& p : pushes) (void)p->Finish();
    for (auto& f : fetches) (void)f->Finish();
    for (auto& f : flows) (void)f->Finish();
  }
};

// PushFlow streams that each ask for credit and never send the message: 120 for a whole message
// (2 x 1.06 MiB reserved each: the budget, were there no cap), then 300 for 4 KiB (what is
// left, to the last byte a one-record push would need).
void Credit(pb::ShuffleService::Stub& stub, Attack* a) {
  for (int i = 0; i < 420; ++i) {
    a->ctxs.push_back(AsA());
    a->flows.push_back(stub.PushFlow(a->ctxs.back().get()));
    pb::PushRequest msg;
    msg.mutable_open()->set_shuffle_id("announce");
    msg.mutable_open()->set_mapper_id(1000 + i);
    msg.mutable_open()->set_attempt_id(1);
    a->flows.back()->Write(msg);
    msg.Clear();
    msg.mutable_ask()->set_bytes(i < 120 ? (1 << 20) + (64 << 10) : 4096);
    a->flows.back()->Write(msg);
  }
}

void Announce(pb::ShuffleService::Stub& stub, size_t frame_mb, Attack* a) {
  for (int i = 0; i < 5; ++i) {
    a->ctxs.push_back(AsA());
    a->pushes.push_back(stub.Push(a->ctxs.back().get(), &a->resps[i]));
    pb::PushRequest msg;
    msg.mutable_open()->set_shuffle_id("announce");
    msg.mutable_open()->set_mapper_id(i);
    msg.mutable_open()->set_attempt_id(1);
    a->pushes.back()->Write(msg);
    msg.Clear();
    msg.mutable_large_frame()->set_partition_id(0);
    msg.mutable_large_frame()->set_frame_size((frame_mb << 20) - 32);
    a->pushes.back()->Write(msg);
  }
}

void Fetches(pb::ShuffleService::Stub& stub, const std::string& id, bool key, int n, Attack* a) {
  pb::FetchRequest req;
  req.set_shuffle_id(id);
  req.set_partition_id(0);
  req.set_order(key ? pb::KEY : pb::UNORDERED);
  for (int i = 0; i < n; ++i) {
    a->ctxs.push_back(AsA());
    a->fetches.push_back(stub.Fetch(a->ctxs.back().get(), req));
  }
}

// Tenant A runs in a process of its own (this program with --attack ADDRESS), told what to do
// on its standard input: a client's gRPC reads what arrives for any of its streams whenever one
// of its threads waits on a call, so tenant A's fetches in B's process would be read by B's own
// calls (and B would pay for receiving A's bytes).
int RunAttacker(const std::string& address) {
  auto stub =
      pb::ShuffleService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::unique_ptr<Attack> attack;
  char line[256];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    const std::string cmd(line);
    attack.reset();  // the last one's calls cancelled
    attack = std::make_unique<Attack>();
    if (cmd.rfind("announce ", 0) == 0) {
      Announce(*stub, std::strtoul(cmd.c_str() + 9, nullptr, 10), attack.get());
    } else if (cmd.rfind("unread", 0) == 0) {
      Fetches(*stub, "unread", false, 50, attack.get());
    } else if (cmd.rfind("credit", 0) == 0) {
      Credit(*stub, attack.get());
    } else if (cmd.rfind("key ", 0) == 0) {
      Fetches(*stub, "key", true, std::atoi(cmd.c_str() + 4), attack.get());
    }
    std::printf("ok\n");
    std::fflush(stdout);
  }
  return 0;
}

class Attacker {
 public:
  static std::unique_ptr<Attacker> Start(const std::string& address) {
    int in[2], out[2];
    if (::pipe(in) != 0 || ::pipe(out) != 0) return nullptr;
    const pid_t pid = ::fork();
    if (pid < 0) return nullptr;
    if (pid == 0) {  // (exec at once: nothing of gRPC runs in the forked copy)
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
      ::execl("/proc/self/exe", "sluice-tenants-bench", "--attack", address.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    auto a = std::unique_ptr<Attacker>(new Attacker());
    a->pid_ = pid;
    a->to_ = ::fdopen(in[1], "w");
    a->from_ = ::fdopen(out[0], "r");
    return a;
  }
  ~Attacker() {
    std::fclose(to_);  // end of input: it cancels what it holds and exits
    std::fclose(from_);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  bool Do(const std::string& cmd) {
    std::fprintf(to_, "%s\n", cmd.c_str());
    std::fflush(to_);
    char line[16];
    return std::fgets(line, sizeof line, from_) != nullptr && std::string(line) == "ok\n";
  }

 private:
  Attacker() = default;
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

void Row(const char* what, const Figures& alone, const Figures& attacked) {
  std::printf("| %s | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f | %.2fx / %.2fx | %d |\n", what,
              alone.p50_ms, alone.p99_ms, alone.max_ms, attacked.p50_ms, attacked.p99_ms,
              attacked.max_ms, alone.p50_ms > 0 ? attacked.p50_ms / alone.p50_ms : 0,
              alone.p99_ms > 0 ? attacked.p99_ms / alone.p99_ms : 0, attacked.failed);
  std::fflush(stdout);
}

int Run(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--attack") return RunAttacker(argv[2]);
  size_t budget_mb = 256, frame_mb = 64;
  int calls = 50, merges = 4;
  std::string bin;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--budget-mb") {
      budget_mb = std::strtoul(argv[i + 1], nullptr, 10);
    } else if (flag == "--frame-mb") {
      frame_mb = std::strtoul(argv[i + 1], nullptr, 10);
    } else if (flag == "--calls") {
      calls = std::atoi(argv[i + 1]);
    } else if (flag == "--merges") {
      merges = std::atoi(argv[i + 1]);
    } else if (flag == "--server-bin") {
      bin = argv[i + 1];
    } else {
      std::fprintf(stderr,
                   "usage: sluice-tenants-bench [--budget-mb 256] [--frame-mb 64] [--calls 50] "
                   "[--merges 4] [--server-bin PATH]\n");
      return 2;
    }
  }
  if (calls < 1 || merges < 1 || frame_mb < 2 || frame_mb > 64) {
    std::fprintf(stderr, "--calls >= 1, --merges >= 1, --frame-mb 2..64\n");
    return 2;
  }
  std::string dir = (std::filesystem::temp_directory_path() / "sluice-tenants-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return 1;
  if (bin.empty()) {
    auto found = FindProgram("sluice-server");
    if (!found.ok()) return std::fprintf(stderr, "%s\n", found.status().ToString().c_str()), 1;
    bin = *found;
  }
  std::ofstream(dir + "/credentials") << rpc::TokenHash(kTokenA) << " team-a tenant\n"
                                      << rpc::TokenHash(kTokenB) << " team-b tenant\n";
  std::filesystem::create_directories(dir + "/data");
  auto server = ServerProcess::Start(
      bin, {"--data_dir=" + dir + "/data", "--auth_file=" + dir + "/credentials",
            absl::StrCat("--memory_budget_mb=", budget_mb), "--worker_threads=2",
            absl::StrCat("--max_concurrent_merges=", merges), "--push_idle_timeout_s=300",
            "--fetch_stall_timeout_s=120",
            std::getenv("SLUICE_BENCH_LOG") ? "--log_level=info" : "--log_level=warn"});
  if (!server.ok()) return std::fprintf(stderr, "%s\n", server.status().ToString().c_str()), 1;
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  auto stub =
      pb::ShuffleService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  ClientOptions o;
  o.server = address;
  o.token = kTokenB;
  auto client = ShuffleClient::Connect(o);
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  TenantB b(*std::move(client));
  if (!b.Setup() || !FillA(*stub, "unread", 1, 4, 4 << 20) ||
      !FillA(*stub, "key", 3, 16, 512 << 10)) {
    std::fprintf(stderr, "setting up the shuffles failed\n");
    return 1;
  }
  {
    auto ctx = AsA();
    pb::CreateShuffleRequest req;
    req.set_shuffle_id("announce");
    req.set_num_partitions(1);
    pb::CreateShuffleResponse resp;
    if (!stub->CreateShuffle(ctx.get(), req, &resp).ok()) return 1;
  }
  std::printf("budget %zu MiB, %d calls of tenant B a round; p50 / p99 / max in ms\n\n", budget_mb,
              calls);
  std::printf(
      "| tenant A's attack | B alone | B under attack | ratio p50 / p99 | B failed |\n"
      "| --- | --- | --- | --- | --- |\n");
  auto attacker = Attacker::Start(address);
  if (attacker == nullptr) return std::fprintf(stderr, "could not start tenant A\n"), 1;
  const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(1000)); };
  struct Case {
    std::string name, cmd;
    bool key;
  };
  const std::vector<Case> cases = {
      {absl::StrCat("5 pushes announce a ", frame_mb, " MiB frame, send nothing; B pushes"),
       absl::StrCat("announce ", frame_mb), false},
      {"50 UNORDERED fetches of 4 MiB frames, never read; B pushes", "unread", false},
      {"420 PushFlow streams ask for credit (the budget), send nothing; B pushes", "credit", false},
      {absl::StrCat(merges, " KEY fetches (every merge slot), never read; B reads KEY"),
       absl::StrCat("key ", merges), true},
  };
  for (const Case& c : cases) {
    const Figures alone = b.Round(calls, c.key);
    if (!attacker->Do(c.cmd)) return std::fprintf(stderr, "tenant A failed\n"), 1;
    settle();
    const Figures attacked = b.Round(calls, c.key);
    if (!attacker->Do("stop")) return 1;
    Row(c.name.c_str(), alone, attacked);
    settle();
  }
  attacker.reset();
  const uint64_t peak = (*server)->PeakRssBytes();
  std::printf("\nserver peak RSS %.0f MiB (budget %zu MiB)\n", peak / 1048576.0, budget_mb);
  const absl::Status st = (*server)->Stop();
  std::filesystem::remove_all(dir);
  return st.ok() ? 0 : 1;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) { return sluice::Run(argc, argv); }
