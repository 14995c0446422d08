// ServerProcess: a real sluice-server executable run as a child process on a loopback port,
// for the benchmark (which must not embed the server) and the tests (kill -9, restarts).
//
//   SLUICE_ASSIGN_OR_RETURN(std::string bin, FindProgram("sluice-server"));
//   SLUICE_ASSIGN_OR_RETURN(auto server, ServerProcess::Start(bin, {"--data_dir=/tmp/d"}));
//   Use("127.0.0.1:" + std::to_string(server->port()));
//   server->Stop();  // SIGTERM, then wait
#ifndef SLUICE_CLIENT_SERVER_PROCESS_H_
#define SLUICE_CLIENT_SERVER_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice {

class ServerProcess {
 public:
  /// Starts `binary` with `flags`, then --listen=<host>:0 (unless `flags` has a --listen), and
  /// waits (up to `timeout`) for the "listening on port N" line it prints once it serves. The
  /// child's stderr is ours.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::string& binary, const std::vector<std::string>& flags,
      const std::string& host = "127.0.0.1",
      std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~ServerProcess();  // SIGKILL if still running
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  /// Peak resident memory of the child so far (VmHWM), in bytes; 0 once it has exited.
  uint64_t PeakRssBytes() const;
  /// Its anonymous resident memory now (RssAnon: its heap, not mapped files), in bytes; 0 once
  /// it has exited.
  uint64_t AnonRssBytes() const;
  /// The CPU time (user and system) it has used, in seconds; 0 once reaped.
  double CpuSeconds() const;
  /// Sends `sig` and waits for the child; returns its wait status.
  int Signal(int sig);
  /// SIGTERM and wait: OK if it exited with status 0.
  absl::Status Stop();

 private:
  ServerProcess(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
  bool reaped_ = false;
};

/// Finds an executable of this project: beside the running program, in the build tree's
/// sibling folders (../server, ../bench, ../client), then on PATH. NOT_FOUND names where it
/// looked.
absl::StatusOr<std::string> FindProgram(const std::string& name);

}  // namespace sluice

#endif  // SLUICE_CLIENT_SERVER_PROCESS_H_
