// MiniServer: the one server fixture every test uses (Kudu's mini-server idea). It runs a real
// sluice-server on 127.0.0.1 with a real data directory, either in this process (a SluiceServer:
// fast, and under the sanitizers with the test) or as the sluice-server executable in a child
// process (for signals: kill -9, SIGTERM), which a standalone MiniCluster of one server
// launches (tests/harness/mini_cluster.h: the one launcher of server processes). Restart
// brings it back on the same directory.
//
//   ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start());
//   ASSERT_OK_AND_ASSIGN(auto client, server->Client());
//   ... client->CreateShuffle("s", 4, 2) ...
//   ASSERT_OK(server->Restart());  // same data, new port: make new clients
#ifndef SLUICE_TESTS_HARNESS_MINI_SERVER_H_
#define SLUICE_TESTS_HARNESS_MINI_SERVER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/shuffle_client.h"
#include "server/sluice_server.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {

struct MiniServerOptions {
  /// The server's options; listen_address is the harness's (127.0.0.1:0), data_dir too unless
  /// set. Tests default to 2 worker threads (this machine has 2 cores).
  ServerOptions server = [] {
    ServerOptions o;
    o.worker_threads = 2;
    return o;
  }();
  /// Run the sluice-server executable as a child process. Options that have no flag (frame caps
  /// below 1 MiB, shutdown grace) are refused rather than ignored.
  bool child_process = false;
};

class MiniServer {
 public:
  static absl::StatusOr<std::unique_ptr<MiniServer>> Start(MiniServerOptions options = {});
  ~MiniServer();

  /// Stops the server (gracefully) and starts it again on the same data directory, with the
  /// same options or new ones. The port may change (in process it does): clients and stubs must
  /// be made again.
  absl::Status Restart();
  absl::Status Restart(MiniServerOptions options);
  /// Stops gracefully (in-process: Shutdown; child: SIGTERM, and its exit status must be 0).
  absl::Status Stop();
  /// Child only: sends `sig`, waits, returns the wait status.
  int Kill(int sig);

  int port() const { return port_; }
  /// Child only: its process id (to SIGSTOP it, say); 0 in process.
  pid_t pid() const;
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& data_dir() const { return options_.server.data_dir; }
  /// The in-process server (null for a child process or when stopped).
  SluiceServer* server() const { return in_process_.get(); }
  absl::StatusOr<std::unique_ptr<ShuffleClient>> Client(ClientOptions options = {}) const;

 private:
  explicit MiniServer(MiniServerOptions options) : options_(std::move(options)) {}
  absl::Status Launch();

  MiniServerOptions options_;
  std::optional<TempDir> owned_dir_;
  std::unique_ptr<SluiceServer> in_process_;
  std::unique_ptr<MiniCluster> child_;  // its one standalone server: the child process
  int port_ = 0;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_MINI_SERVER_H_
