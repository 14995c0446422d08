// sluice-object-bench: an upload to an S3-compatible store as the object tier makes them
// (objstore::ObjectUpload: parts of --part-mb, N in flight), at 1, 4 and 16 parts in flight,
// against this machine's disk taking the same bytes (written to a file and synced, as a
// server's commit does), the sides interleaved round by round (docs/benchmarks.md, "The object
// tier"). The bytes are made before any clock (incompressible, from one seed), the same for
// every side. Credentials as AWS's tools find them.
//
//   sluice-object-bench --store s3://bucket/prefix --endpoint http://127.0.0.1:4569
//       [--mb 256] [--part-mb 8] [--rounds 3] [--dir /tmp]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "objstore/object_upload.h"
#include "objstore/s3_store.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "sluice-object-bench: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"--store", ""},   {"--endpoint", ""},
                                              {"--mb", "256"},   {"--part-mb", "8"},
                                              {"--rounds", "3"}, {"--dir", "/tmp"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (flags.count(argv[i]) == 0) return Fail(std::string("unknown flag ") + argv[i]);
    flags[argv[i]] = argv[i + 1];
  }
  if (flags["--store"].empty()) return Fail("--store s3://bucket/prefix is needed");
  const uint64_t bytes = std::strtoull(flags["--mb"].c_str(), nullptr, 10) << 20;
  const uint64_t part = std::strtoull(flags["--part-mb"].c_str(), nullptr, 10) << 20;
  const int rounds = std::atoi(flags["--rounds"].c_str());
  auto store = sluice::objstore::S3Store::Open({flags["--store"], flags["--endpoint"]});
  if (!store.ok()) return Fail(store.status().ToString());

  // The bytes, before any clock.
  std::string data(bytes, '\0');
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(&data[i], &x, 8);
  }
  const std::string file = flags["--dir"] + "/sluice-object-bench.data";
  std::printf("# %d cores; %llu MiB an object, parts of %llu MiB; store %s at %s; disk: %s\n",
              static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)),
              static_cast<unsigned long long>(bytes >> 20),
              static_cast<unsigned long long>(part >> 20), flags["--store"].c_str(),
              (*store)->options().endpoint.c_str(), flags["--dir"].c_str());
  std::map<std::string, std::vector<double>> rates;
  for (int r = 1; r <= rounds; ++r) {
    // The disk: the same bytes written in 1 MiB writes, then synced.
    {
      const auto start = Clock::now();
      const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd < 0) return Fail("cannot write " + file);
      for (size_t at = 0; at < data.size(); at += 1 << 20) {
        const size_t n = std::min<size_t>(1 << 20, data.size() - at);
        if (::write(fd, data.data() + at, n) != static_cast<ssize_t>(n)) return Fail("write");
      }
      ::fdatasync(fd);
      ::close(fd);
      rates["disk"].push_back((bytes >> 20) / Seconds(start));
      ::unlink(file.c_str());
    }
    for (int parallel : {1, 4, 16}) {
      sluice::objstore::UploadOptions uo;
      uo.part_bytes = part;
      uo.parallel_parts = parallel;
      const std::string key =
          "object-bench/r" + std::to_string(r) + "-p" + std::to_string(parallel);
      const auto start = Clock::now();
      auto up = sluice::objstore::ObjectUpload::Start(store->get(), key, uo);
      if (!up.ok()) return Fail(up.status().ToString());
      for (size_t at = 0; at < data.size(); at += 1 << 20) {
        const size_t n = std::min<size_t>(1 << 20, data.size() - at);
        if (auto st = (*up)->Append(absl::string_view(data.data() + at, n)); !st.ok()) {
          return Fail(st.ToString());
        }
      }
      auto done = (*up)->Finish();
      if (!done.ok()) return Fail(done.status().ToString());
      const double s = Seconds(start);
      if (done->size != bytes) return Fail("the object's size is not what was sent");
      rates["parts " + std::to_string(parallel)].push_back((bytes >> 20) / s);
      (void)(*store)->Delete(key);
    }
    std::printf("round %d:", r);
    for (const char* side : {"disk", "parts 1", "parts 4", "parts 16"}) {
      std::printf(" %s %.0f MiB/s;", side, rates[side].back());
    }
    std::printf("\n");
  }
  std::printf("median:");
  for (const char* side : {"disk", "parts 1", "parts 4", "parts 16"}) {
    std::vector<double> v = rates[side];
    std::sort(v.begin(), v.end());
    std::printf(" %s %.0f MiB/s;", side, v[v.size() / 2]);
  }
  std::printf("\n");
  return 0;
}
