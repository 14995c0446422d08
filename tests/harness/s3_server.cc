#include "tests/harness/s3_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tests/harness/etcd_process.h"
#include "tests/harness/run_command.h"

#ifndef SLUICE_S3RVER
#define SLUICE_S3RVER ""
#endif
#ifndef SLUICE_FAULT_PROXY
#error "SLUICE_FAULT_PROXY must name tests/harness/s3_fault_proxy.py"
#endif

namespace sluice::testing {
namespace {

// Whether it answers HTTP on host:port (any status line).
bool Answers(const std::string& host, int port) {
  return HttpReply(host, port, "/").rfind("HTTP/1.", 0) == 0;
}

}  // namespace

std::string S3Server::MotoBinary() {
  if (const char* env = std::getenv("SLUICE_MOTO_SERVER"); env != nullptr) return env;
  std::string out;
  if (RunCommand("command -v moto_server", &out) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

absl::StatusOr<std::unique_ptr<S3Server>> S3Server::Start(const std::string& bucket, Kind kind,
                                                          const std::string& host) {
  std::unique_ptr<S3Server> s3(new S3Server());
  s3->kind_ = kind;
  if (kind == kMoto) {
    s3->bin_ = MotoBinary();
    if (s3->bin_.empty()) {
      return absl::NotFoundError("no moto_server on this machine (SLUICE_MOTO_SERVER names one)");
    }
  } else {
    const char* env = std::getenv("SLUICE_S3RVER");
    s3->bin_ = env != nullptr ? env : SLUICE_S3RVER;
    if (s3->bin_.empty() || ::access(s3->bin_.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "s3rver is not installed at '", s3->bin_,
          "' (npm's s3rver: bash deploy/dev.sh test installs it; SLUICE_S3RVER names another)"));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(s3->port_, FreePort(host));
  s3->host_ = host;
  s3->bucket_ = bucket;
  s3->endpoint_ = absl::StrCat("http://", host, ":", s3->port_);
  SLUICE_RETURN_IF_ERROR(s3->Launch());
  return s3;
}

absl::Status S3Server::Launch() {
  std::vector<std::string> args = {
      bin_,     "--directory",         dir_.path() + "/data", "--address", host_,
      "--port", std::to_string(port_), "--configure-bucket",  bucket_,     "--silent"};
  if (kind_ == kMoto) args = {bin_, "-H", host_, "-p", std::to_string(port_)};
  const std::string log = dir_.path() + "/s3rver.log";
  ::mkdir((dir_.path() + "/data").c_str(), 0700);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    // (s3rver's list tokens use DES, which Node's OpenSSL 3 keeps in its legacy provider)
    ::setenv("NODE_OPTIONS", "--openssl-legacy-provider", 1);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Answers(host_, port_)) {
      if (kind_ != kMoto) return absl::OkStatus();
      // moto keeps nothing across starts: the bucket is made again (no auth asked by default).
      std::string out;
      if (RunCommand(absl::StrCat("curl --noproxy '*' -sf -X PUT ", endpoint_, "/", bucket_),
                     &out) == 0) {
        return absl::OkStatus();
      }
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      return absl::InternalError(absl::StrCat("s3rver exited at start; see ", log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Stop();
  return absl::DeadlineExceededError(absl::StrCat("s3rver did not answer in 30 s; see ", log));
}

void S3Server::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = 0;
}

absl::Status S3Server::Restart() {
  Stop();
  return Launch();
}

S3Server::~S3Server() { Stop(); }

objstore::S3Options S3Server::Options(const std::string& prefix) const {
  objstore::S3Options o;
  o.bucket = bucket_;
  o.prefix = prefix.empty() || prefix.back() == '/' ? prefix : prefix + "/";
  o.endpoint = endpoint_;
  o.region = "us-east-1";
  o.path_style = true;
  o.credentials.access_key_id = "S3RVER";  // (s3rver's own pair)
  o.credentials.secret_access_key = "S3RVER";
  o.credentials.source = "the test";
  return o;
}

absl::StatusOr<std::unique_ptr<S3FaultProxy>> S3FaultProxy::Start(const S3Server& upstream) {
  std::unique_ptr<S3FaultProxy> proxy(new S3FaultProxy(upstream));
  const std::string host = "127.0.0.1";
  SLUICE_ASSIGN_OR_RETURN(const int port, FreePort(host));
  proxy->endpoint_ = absl::StrCat("http://", host, ":", port);
  std::vector<std::string> args = {
      "/usr/bin/python3",   SLUICE_FAULT_PROXY, host,
      std::to_string(port), "127.0.0.1",        std::to_string(upstream.port())};
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  proxy->pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Answers(host, port)) return proxy;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError("the S3 fault proxy did not answer in 20 s");
}

S3FaultProxy::~S3FaultProxy() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
}

bool S3FaultProxy::Inject(const std::string& fault_json) {
  std::string out;
  std::string quoted;
  for (char c : fault_json) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted.push_back(c);
    }
  }
  return RunCommand(absl::StrCat("curl --noproxy '*' -sf -X POST --data-binary '", quoted, "' ",
                                 endpoint_, "/__faults"),
                    &out) == 0;
}

std::string S3FaultProxy::State() const {
  std::string out;
  (void)RunCommand(absl::StrCat("curl --noproxy '*' -sf ", endpoint_, "/__faults"), &out);
  return out;
}

objstore::S3Options S3FaultProxy::Options(const std::string& prefix) const {
  objstore::S3Options o = upstream_.Options(prefix);
  o.endpoint = endpoint_;
  return o;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

}  // namespace sluice::testing
