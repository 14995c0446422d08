#include "client/server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace sluice {
namespace {

// Reads one line from `fd` within `timeout`; false on timeout, EOF or error.
bool ReadLine(int fd, std::chrono::milliseconds timeout, std::string* line) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  line->clear();
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
}

bool IsExecutable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::string& binary, const std::vector<std::string>& flags, const std::string& host,
    std::chrono::milliseconds timeout) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // --listen last, so that `binary` may be a wrapper (prlimit, say) whose own options come
  // first in `flags`; unless `flags` has one (a fixed port, to restart at the same address).
  std::vector<std::string> args = {binary};
  args.insert(args.end(), flags.begin(), flags.end());
  bool listen_given = false;
  for (const std::string& f : flags) listen_given = listen_given || f.rfind("--listen=", 0) == 0;
  if (!listen_given) args.push_back(absl::StrCat("--listen=", host, ":0"));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::dup2(out[1], 1);  // dup2 clears O_CLOEXEC on the copy
    ::execv(binary.c_str(), argv.data());
    std::fprintf(stderr, "exec %s: %s\n", binary.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(out[1]);
  std::unique_ptr<ServerProcess> proc(new ServerProcess(pid, 0));
  std::string line;
  const bool got = ReadLine(out[0], timeout, &line);
  ::close(out[0]);  // the server writes nothing else to stdout
  int port = 0;
  if (!got || std::sscanf(line.c_str(), "listening on port %d", &port) != 1 || port <= 0) {
    const int status = proc->Signal(SIGKILL);
    return absl::UnavailableError(absl::StrCat(
        binary, " did not start (", absl::StrJoin(flags, " "), "): ",
        got ? absl::StrCat("unexpected output '", line, "'")
            : (WIFEXITED(status) ? absl::StrCat("exited with status ", WEXITSTATUS(status))
                                 : absl::StrCat("no port within ", timeout.count(), " ms"))));
  }
  proc->port_ = port;
  return proc;
}

ServerProcess::~ServerProcess() {
  if (!reaped_) Signal(SIGKILL);
}

namespace {

// A "<field>: N kB" line of /proc/<pid>/status, in bytes (0 if absent).
uint64_t StatusBytes(pid_t pid, const char* field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  const std::string format = absl::StrCat(field, ": %llu kB");
  std::string line;
  while (std::getline(status, line)) {
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), format.c_str(), &kb) == 1) return kb << 10;
  }
  return 0;
}

}  // namespace

uint64_t ServerProcess::PeakRssBytes() const { return reaped_ ? 0 : StatusBytes(pid_, "VmHWM"); }

uint64_t ServerProcess::AnonRssBytes() const { return reaped_ ? 0 : StatusBytes(pid_, "RssAnon"); }

double ServerProcess::CpuSeconds() const {
  if (reaped_) return 0;
  std::ifstream in(absl::StrCat("/proc/", pid_, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces): state is the 3rd field, utime the 14th.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  if (f.size() < 13) return 0;
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return (std::strtod(f[11].c_str(), nullptr) + std::strtod(f[12].c_str(), nullptr)) / ticks;
}

int ServerProcess::Signal(int sig) {
  if (reaped_) return 0;
  ::kill(pid_, sig);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  return status;
}

absl::Status ServerProcess::Stop() {
  const int status = Signal(SIGTERM);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(
      WIFEXITED(status) ? absl::StrCat("sluice-server exited with status ", WEXITSTATUS(status))
                        : absl::StrCat("sluice-server died of signal ", WTERMSIG(status)));
}

absl::StatusOr<std::string> FindProgram(const std::string& name) {
  std::vector<std::string> tried;
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    std::string dir(self);
    dir.resize(dir.find_last_of('/'));
    for (const char* sub : {"", "/../server", "/../bench", "/../client"}) {
      tried.push_back(absl::StrCat(dir, sub, "/", name));
      if (IsExecutable(tried.back())) return tried.back();
    }
  }
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    for (absl::string_view d : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      std::string candidate = absl::StrCat(d, "/", name);
      if (IsExecutable(candidate)) return candidate;
    }
    tried.push_back("$PATH");
  }
  return absl::NotFoundError(
      absl::StrCat("cannot find ", name, " (looked at ", absl::StrJoin(tried, ", "), ")"));
}

}  // namespace sluice
