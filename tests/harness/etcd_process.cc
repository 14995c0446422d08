#include "tests/harness/etcd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cluster/etcd_client.h"
#include "tests/harness/wait.h"

namespace sluice::testing {

absl::StatusOr<int> FreePort(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("cannot bind to ", host));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string HttpReply(const std::string& host, int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[1024];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) reply.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return reply;
}

namespace {

// Whether etcd's HTTP /health on host:port says it is healthy. (A gRPC connection made before
// etcd serves is held until a connect timeout, ~10 s; this asks first.)
bool Healthy(const std::string& host, int port) {
  return HttpReply(host, port, "/health").find("\"health\":\"true\"") != std::string::npos;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(const std::string& host,
                                                                const std::string& also) {
  const char* env = std::getenv("SLUICE_ETCD_BIN");
  const std::string bin = env != nullptr ? env : "/usr/bin/etcd";
  if (::access(bin.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(bin,
                                            " is not installed (Debian's etcd-server; "
                                            "bash deploy/dev.sh test installs it)"));
  }
  std::unique_ptr<EtcdProcess> etcd(new EtcdProcess());
  auto client_port = FreePort(host);
  auto peer_port = FreePort(host);
  if (!client_port.ok()) return client_port.status();
  if (!peer_port.ok()) return peer_port.status();
  etcd->endpoint_ = absl::StrCat(host, ":", *client_port);
  const std::string client_url = "http://" + etcd->endpoint_;
  const std::string peer_url = absl::StrCat("http://", host, ":", *peer_port);
  std::vector<std::string> args = {
      bin,
      "--name=sluice-test",
      "--data-dir=" + etcd->dir_.path() + "/data",
      "--listen-client-urls=" + client_url +
          (also.empty() ? std::string() : absl::StrCat(",http://", also, ":", *client_port)),
      "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + peer_url,
      "--initial-advertise-peer-urls=" + peer_url,
      "--initial-cluster=sluice-test=" + peer_url,
      "--logger=zap",
      "--log-level=warn"};
  etcd->args_ = std::move(args);
  etcd->host_ = host;
  etcd->client_port_ = *client_port;
  SLUICE_RETURN_IF_ERROR(etcd->Launch(/*append_log=*/false));
  return etcd;
}

absl::Status EtcdProcess::Restart() {
  if (pid_ != 0) Signal(SIGKILL);
  return Launch(/*append_log=*/true);
}

absl::Status EtcdProcess::Launch(bool append_log) {
  const std::string log = dir_.path() + "/etcd.log";
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    const int fd =
        ::open(log.c_str(), O_WRONLY | O_CREAT | (append_log ? O_APPEND : O_TRUNC), 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (auto& a : args_) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  EtcdOptions options;
  options.endpoints = endpoint_;
  options.deadline = std::chrono::milliseconds(500);
  auto client = EtcdClient::Connect(options);
  if (!client.ok()) return client.status();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  absl::Status last;
  while (std::chrono::steady_clock::now() < until) {
    last = Healthy(host_, client_port_) ? (*client)->Get("/sluice-test/ready").status()
                                        : absl::UnavailableError("not healthy yet");
    if (last.ok()) return absl::OkStatus();
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      pid_ = 0;
      return absl::InternalError(
          absl::StrCat("etcd exited at start (status ", status, "); its log: ", log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("etcd did not answer within 30 s: ", last.message(), "; its log: ", log));
}

void EtcdProcess::Signal(int sig) {
  if (pid_ == 0) return;
  if (sig == SIGSTOP) {
    StopProcess(pid_);  // (returns once stopped)
    return;
  }
  ::kill(pid_, sig);
  if (sig == SIGKILL || sig == SIGTERM || sig == SIGINT) {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
  }
}

EtcdProcess::~EtcdProcess() {
  Signal(SIGKILL);  // also ends a stopped one
}

}  // namespace sluice::testing
