// A real etcd (Debian's etcd-server) as a child process for cluster tests: one member on a
// loopback address, free client and peer ports, its data in a fresh temporary directory that
// goes with it. Its log is in <dir>/etcd.log.
//
//   ASSERT_OK_AND_ASSIGN(auto etcd, EtcdProcess::Start());
//   EtcdClient::Connect({etcd->endpoint()});
#ifndef SLUICE_TESTS_HARNESS_ETCD_PROCESS_H_
#define SLUICE_TESTS_HARNESS_ETCD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {

/// A port that was free on `host` (an IPv4 address) a moment ago: the kernel's pick for port 0.
absl::StatusOr<int> FreePort(const std::string& host);
/// What an HTTP/1.0 GET of `path` on host:port answers, status line first, read until the
/// server closes or 1 s passes without a byte; empty when nothing answers. What the harnesses
/// wait for their children by.
std::string HttpReply(const std::string& host, int port, const std::string& path);

class EtcdProcess {
 public:
  /// Starts etcd ($SLUICE_ETCD_BIN, else /usr/bin/etcd) on `host` and waits until it answers.
  /// NOT_FOUND if etcd is not installed (deploy/dev.sh installs it).
  /// `also`: another address it answers clients on, at the same port (one a network namespace
  /// reaches it by).
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(const std::string& host = "127.0.0.1",
                                                            const std::string& also = "");
  ~EtcdProcess();  // SIGKILL, wait, and its directory removed
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  /// host:port of its client URL.
  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }
  /// Sends `sig` (SIGSTOP and SIGCONT too); after a signal that ends it, waits for it.
  void Signal(int sig);
  /// Kills it (-9) if it runs, and starts it again on the same ports and data (what it had
  /// committed is kept); returns once it answers.
  absl::Status Restart();

 private:
  EtcdProcess() = default;
  absl::Status Launch(bool append_log);
  TempDir dir_;
  std::string endpoint_;
  std::string host_;
  int client_port_ = 0;
  std::vector<std::string> args_;
  pid_t pid_ = 0;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_ETCD_PROCESS_H_
