// sluice-big-push-bench: N mappers at once each push one large frame of incompressible bytes
// (two records of half the frame) to a sluice-server child process started with a small memory
// budget, on 127.0.0.1:0 with a temporary data directory: what the server's peak RSS is
// against its budget when every stream's first message is a large one. One RESULT line of
// JSON. docs/benchmarks.md has the figures.
//
//   sluice-big-push-bench [--mappers 32] [--frame-mb 60] [--budget-mb 64] [--server-bin PATH]
//                         [--server-arg --flag=value]...
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/server_process.h"
#include "client/shuffle_client.h"

namespace sluice {
namespace {

int Run(int argc, char** argv) {
  uint32_t mappers = 32;
  size_t frame_mb = 60, budget_mb = 64;
  std::string bin;
  std::vector<std::string> server_args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mappers") {
      mappers = static_cast<uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
    } else if (flag == "--frame-mb") {
      frame_mb = std::strtoul(argv[i + 1], nullptr, 10);
    } else if (flag == "--budget-mb") {
      budget_mb = std::strtoul(argv[i + 1], nullptr, 10);
    } else if (flag == "--server-bin") {
      bin = argv[i + 1];
    } else if (flag == "--server-arg") {
      server_args.push_back(argv[i + 1]);
    } else {
      std::fprintf(stderr,
                   "usage: sluice-big-push-bench [--mappers 32] [--frame-mb 60] [--budget-mb 64] "
                   "[--server-bin PATH] [--server-arg --flag=value]...\n");
      return 2;
    }
  }
  if (mappers == 0 || frame_mb < 2 || frame_mb > 62) {
    std::fprintf(stderr, "--mappers >= 1, --frame-mb 2..62 (a frame holds two records)\n");
    return 2;
  }
  std::string dir = (std::filesystem::temp_directory_path() / "sluice-bigpush-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return 1;
  int rc = 1;
  {
    if (bin.empty()) {
      auto found = FindProgram("sluice-server");
      if (!found.ok()) return std::fprintf(stderr, "%s\n", found.status().ToString().c_str()), 1;
      bin = *found;
    }
    std::vector<std::string> args = {"--data_dir=" + dir, "--log_level=warn",
                                     absl::StrCat("--memory_budget_mb=", budget_mb)};
    args.insert(args.end(), server_args.begin(), server_args.end());
    auto server = ServerProcess::Start(bin, args);
    if (!server.ok()) {
      std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
      return 1;
    }
    ClientOptions copts;
    copts.server = absl::StrCat("127.0.0.1:", (*server)->port());
    auto client = ShuffleClient::Connect(copts);
    if (!client.ok() || !(*client)->CreateShuffle("big", 1, mappers).ok()) return 1;
    std::string value(frame_mb << 20, '\0');
    std::mt19937_64 rng(1);
    for (size_t i = 0; i + 8 <= value.size(); i += 8) {
      const uint64_t r = rng();
      std::memcpy(&value[i], &r, 8);
    }
    const std::string_view half(value.data(), value.size() / 2);
    std::atomic<int> committed{0};
    std::vector<std::string> errors(mappers);
    std::vector<std::thread> pushers;
    for (uint32_t m = 0; m < mappers; ++m) {
      pushers.emplace_back([&, m] {
        WriterOptions w;
        w.buffer_bytes = w.frame_bytes = (frame_mb + 4) << 20;  // the two records: one frame
        auto writer = (*client)->OpenWriter("big", m, 1, w);
        absl::Status st = writer.status();
        if (st.ok()) st = (*writer)->Add(absl::StrCat("a", m), half);
        if (st.ok()) st = (*writer)->Add(absl::StrCat("b", m), half);
        if (st.ok()) st = (*writer)->Close().status();
        if (st.ok()) {
          ++committed;
        } else {
          errors[m] = st.ToString();
        }
      });
    }
    for (auto& t : pushers) t.join();
    std::string first_error;
    for (const auto& e : errors) {
      if (!e.empty()) {
        first_error = e;
        break;
      }
    }
    std::printf(
        "RESULT {\"mappers\": %u, \"frame_mb\": %zu, \"budget_mb\": %zu, \"committed\": %d, "
        "\"server_peak_rss_mb\": %.1f, \"first_error\": \"%s\"}\n",
        mappers, frame_mb, budget_mb, committed.load(), (*server)->PeakRssBytes() / 1048576.0,
        first_error.c_str());
    rc = committed.load() == static_cast<int>(mappers) ? 0 : 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) { return sluice::Run(argc, argv); }
