// sluice-merge-bench: a KEY-ordered fetch over many tiny frames, against a sluice-server
// child process on 127.0.0.1:0 with a temporary data directory. Mappers push
// one-record frames into one partition, then one reducer reads it in key order. One RESULT
// line of JSON: push and fetch seconds, the server's peak RSS, the most descriptors it held
// during the fetch, the server's CPU per frame pushed and fetched, and the bytes a stored frame
// costs past itself (block header, commit log). docs/benchmarks.md has the figures.
//
//   sluice-merge-bench [--frames 1048576] [--mappers 4] [--server-bin PATH]
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/server_process.h"
#include "client/shuffle_client.h"

namespace sluice {
namespace {

size_t OpenFds(pid_t pid) {
  size_t n = 0;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = ::opendir(dir.c_str());
  while (d != nullptr && ::readdir(d) != nullptr) ++n;
  if (d != nullptr) ::closedir(d);
  return n;
}

// CPU seconds (user + system) the process has used so far, from /proc/<pid>/stat.
double CpuSeconds(pid_t pid) {
  FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  unsigned long long utime = 0, stime = 0;
  if (p == nullptr || std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                                  &utime, &stime) != 2) {
    return 0;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Bytes of the regular files under `dir` (st_size: holes count, as a file's length).
uint64_t FileBytes(const std::string& dir, const std::string& name) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().filename() == name) n += e.file_size();
  }
  return n;
}

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int Run(int argc, char** argv) {
  uint64_t frames = 1 << 20;
  uint32_t mappers = 4;
  std::string bin;
  unsigned long keepalive_s = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--frames") {
      frames = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--mappers") {
      mappers = static_cast<uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
    } else if (flag == "--server-bin") {
      bin = argv[i + 1];
    } else if (flag == "--keepalive-s") {  // 0: none (servers before keepalive refuse pings)
      keepalive_s = std::strtoul(argv[i + 1], nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "usage: sluice-merge-bench [--frames N] [--mappers M] [--server-bin P] "
                   "[--keepalive-s 10]\n");
      return 2;
    }
  }
  if (bin.empty()) {
    auto found = FindProgram("sluice-server");
    if (!found.ok()) return std::fprintf(stderr, "%s\n", found.status().ToString().c_str()), 1;
    bin = *found;
  }
  std::string dir = (std::filesystem::temp_directory_path() / "sluice-merge-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return 1;
  int rc = 1;
  {
    auto server = ServerProcess::Start(
        bin, {"--data_dir=" + dir, "--log_level=warn",
              absl::StrCat("--max_frames_per_attempt=", frames / mappers + 1)});
    if (!server.ok()) {
      std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
      return 1;
    }
    ClientOptions copts;
    copts.server = absl::StrCat("127.0.0.1:", (*server)->port());
    copts.call_deadline = std::chrono::minutes(10);
    copts.keepalive_time = std::chrono::seconds(keepalive_s);
    auto client = ShuffleClient::Connect(copts);
    if (!client.ok() || !(*client)->CreateShuffle("tiny", 1, mappers).ok()) return 1;

    const pid_t pid = (*server)->pid();
    const double cpu_start = CpuSeconds(pid);
    const auto push_start = std::chrono::steady_clock::now();
    std::vector<std::thread> pushers;
    std::atomic<int> failed{0};
    for (uint32_t m = 0; m < mappers; ++m) {
      pushers.emplace_back([&, m] {
        WriterOptions w;
        w.buffer_bytes = 1;  // every record flushes: one frame each
        w.sort_by_key = true;
        auto writer = (*client)->OpenWriter("tiny", m, 1, w);
        if (!writer.ok()) {
          ++failed;
          return;
        }
        for (uint64_t i = m; i < frames; i += mappers) {
          const std::string key = absl::StrCat("k", (i * 2654435761u) % frames);
          if (!(*writer)->Add(key, absl::StrCat(i)).ok()) {
            ++failed;
            return;
          }
        }
        if (!(*writer)->Close().ok()) ++failed;
      });
    }
    for (auto& t : pushers) t.join();
    const double push_s = Since(push_start);
    const double push_cpu = CpuSeconds(pid) - cpu_start;
    if (failed.load() != 0) {
      std::fprintf(stderr, "a push failed\n");
      return 1;
    }

    std::atomic<bool> fetching{true};
    std::atomic<size_t> max_fds{0};
    std::thread sampler([&] {
      while (fetching.load()) {
        const size_t n = OpenFds(pid);
        if (n > max_fds.load()) max_fds = n;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    const size_t fds_idle = OpenFds(pid);
    const auto fetch_start = std::chrono::steady_clock::now();
    ReaderOptions r;
    r.order = FetchOrder::kKey;
    uint64_t records = 0;
    bool ordered = true;
    std::string last;
    auto reader = (*client)->OpenReader("tiny", 0, r);
    absl::Status st = reader.status();
    if (st.ok()) {
      Record rec;
      for (;;) {
        auto more = (*reader)->Next(&rec);
        if (!more.ok()) {
          st = more.status();
          break;
        }
        if (!*more) break;
        if (records > 0 && std::string_view(rec.key) < std::string_view(last)) ordered = false;
        last.assign(rec.key.data(), rec.key.size());
        ++records;
      }
    }
    const double fetch_s = Since(fetch_start);
    const double fetch_cpu = CpuSeconds(pid) - cpu_start - push_cpu;
    // What storing a frame costs past the frame: its block header in the data file and its
    // entry in the commit log.
    uint64_t frame_bytes = 0;
    if (auto info = (*client)->GetShuffle("tiny"); info.ok()) {
      for (const auto& p : info->partitions) frame_bytes += p.bytes;
    }
    const uint64_t data_bytes = FileBytes(dir, "data");
    const uint64_t log_bytes = FileBytes(dir, "commits.log");
    fetching = false;
    sampler.join();
    if (!st.ok()) {
      std::fprintf(stderr, "fetch: %s\n", st.ToString().c_str());
      return 1;
    }
    std::printf(
        "RESULT {\"frames\": %llu, \"mappers\": %u, \"push_s\": %.2f, \"fetch_s\": %.2f, "
        "\"records\": %llu, \"ordered\": %s, \"server_peak_rss_mb\": %.1f, "
        "\"server_fds_idle\": %zu, \"server_fds_max_during_fetch\": %zu, "
        "\"server_push_cpu_us_per_frame\": %.2f, \"server_fetch_cpu_us_per_frame\": %.2f, "
        "\"frame_bytes_per_frame\": %.1f, \"data_file_overhead_per_frame\": %.1f, "
        "\"commit_log_bytes_per_frame\": %.1f}\n",
        static_cast<unsigned long long>(frames), mappers, push_s, fetch_s,
        static_cast<unsigned long long>(records), ordered ? "true" : "false",
        (*server)->PeakRssBytes() / 1048576.0, fds_idle, max_fds.load(), push_cpu * 1e6 / frames,
        fetch_cpu * 1e6 / frames, static_cast<double>(frame_bytes) / frames,
        (static_cast<double>(data_bytes) - static_cast<double>(frame_bytes)) / frames,
        static_cast<double>(log_bytes) / frames);
    rc = records == frames && ordered ? 0 : 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) { return sluice::Run(argc, argv); }
