// What connections a client can make the server hold, against the real daemon: idle TCP
// connections that send nothing (no credentials, no TLS handshake) past the descriptor limit,
// from one address and from many. The listener must live on, others must get in while the
// flood is there, and everyone once it is gone.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/net/connection_guard.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using testing::MiniCluster;
using testing::MiniClusterOptions;

// TCP connections from `source` to 127.0.0.1:`port` that send nothing. Each is connected (the
// kernel's handshake) whether or not the server takes it.
class IdleConnections {
 public:
  IdleConnections(const std::string& source, int port, int n) {
    for (int i = 0; i < n; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0) break;
      sockaddr_in from{};
      from.sin_family = AF_INET;
      ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
      if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
          ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
        ::close(fd);
        continue;
      }
      fds_.push_back(fd);
    }
  }
  ~IdleConnections() { CloseAll(); }
  void CloseAll() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
  }
  size_t size() const { return fds_.size(); }
  // How many the server has taken: answered (a kept connection gets the server's HTTP/2
  // settings) or closed. One still in the listen backlog has heard nothing.
  size_t Answered() const {
    size_t answered = 0;
    for (int fd : fds_) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 0) == 1) ++answered;
    }
    return answered;
  }
  // How many the server has closed (refused after accepting, or timed out): EOF or reset.
  size_t ClosedByServer() const {
    size_t closed = 0;
    for (int fd : fds_) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 0) == 1) {
        char c;
        if (::recv(fd, &c, 1, MSG_DONTWAIT) <= 0) ++closed;
      }
    }
    return closed;
  }

 private:
  std::vector<int> fds_;
};

// Whether process `pid` has exited and waits to be reaped.
bool Zombie(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

// How many descriptors process `pid` has open.
size_t OpenDescriptors(pid_t pid) {
  std::error_code ec;
  size_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n;
}

// A new client (its own connection, from 127.0.0.1) asks the server for its GetNode.
absl::Status NewClientCall(const MiniCluster& server) {
  auto client = server.Client();
  if (!client.ok()) return client.status();
  return (*client)->GetNode().status();
}

// The daemon alone (server 0 of a standalone MiniCluster) with `nofile` descriptors.
absl::StatusOr<std::unique_ptr<MiniCluster>> StartServer(int nofile,
                                                         std::vector<std::string> flags = {}) {
  MiniClusterOptions options;
  options.servers = 1;
  options.etcd = false;
  options.nofile = absl::StrCat(nofile, ":", nofile);
  options.flags.insert(options.flags.end(), flags.begin(), flags.end());
  return MiniCluster::Start(options);
}

// More idle connections from one address than the server has descriptors: gRPC's listener
// (Debian's 1.51) stops accepting for good at the first "Too many open files". The server must
// refuse the excess instead, keep serving another address meanwhile, and everyone after.
TEST(ConnectionsTest, AFloodPastTheDescriptorLimitNeitherKillsTheListenerNorShutsOthersOut) {
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(256));
  {
    IdleConnections flood("127.0.0.9", server->port(0), 400);
    ASSERT_EQ(flood.size(), 400u);
    // The server has taken all of them, past its descriptors: a listener that died at the
    // first EMFILE leaves the rest unanswered in its backlog.
    ASSERT_TRUE(testing::Eventually([&] { return flood.Answered() == flood.size(); }))
        << flood.Answered() << " of the flood's connections taken: the listener stopped";
    EXPECT_OK(NewClientCall(*server)) << "another address was shut out by the flood";
  }
  EXPECT_OK(NewClientCall(*server)) << "the listener died";
  ASSERT_OK(server->Stop(0));
}

// Without the guard's protection (--guard_connections=false, gRPC's own accept loop) the same
// flood kills the listener for good; the listener probe finds it, the server drains itself
// (readiness fails first) and exits 1, for its supervisor to restart it.
TEST(ConnectionsTest, ADeadListenerIsFoundAndTheServerExitsForARestart) {
  ASSERT_OK_AND_ASSIGN(
      auto server,
      StartServer(256, {"--guard_connections=false", "--listener_probe_s=1", "--drain_grace_s=1"}));
  {
    IdleConnections flood("127.0.0.9", server->port(0), 400);
    // gRPC took connections until it had no descriptor left: its listener met EMFILE.
    ASSERT_TRUE(testing::Eventually([&] { return OpenDescriptors(server->pid(0)) >= 256; }))
        << OpenDescriptors(server->pid(0)) << " descriptors open";
  }
  // (A new client cannot get in any more: gRPC's listener is gone.)
  EXPECT_FALSE(NewClientCall(*server).ok());
  ASSERT_TRUE(
      testing::Eventually([&] { return ::kill(server->pid(0), 0) != 0 || Zombie(server->pid(0)); },
                          std::chrono::seconds(30)))
      << "the server did not notice that its listener died";
  const int status = server->Signal(0, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 1);
}

// From many addresses at once: the server keeps --max_connections, closes the rest as it
// accepts them (a client then gets UNAVAILABLE, retryable), and takes everyone once they go.
TEST(ConnectionsTest, AFloodFromManyAddressesIsHeldToTheServerLimit) {
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(4096, {"--max_connections=100",
                                                       "--max_connections_per_address=40"}));
  {
    std::vector<std::unique_ptr<IdleConnections>> flood;
    for (int a = 10; a < 20; ++a) {
      flood.push_back(
          std::make_unique<IdleConnections>(absl::StrCat("127.0.0.", a), server->port(0), 30));
    }
    size_t kept = 0;
    ASSERT_TRUE(testing::Eventually(
        [&] {
          size_t closed = 0, opened = 0;
          for (const auto& f : flood) {
            closed += f->ClosedByServer();
            opened += f->size();
          }
          kept = opened - closed;
          return opened == 300 && kept <= 100;
        },
        std::chrono::seconds(10)));
    EXPECT_GE(kept, 90u) << "the server kept far fewer than its limit";
    EXPECT_THAT(NewClientCall(*server), testing::StatusIs(absl::StatusCode::kUnavailable, ""));
  }
  EXPECT_TRUE(
      testing::Eventually([&] { return NewClientCall(*server).ok(); }, std::chrono::seconds(10)));
  ASSERT_OK(server->Stop(0));
}

// A connection that never starts its handshake is closed after --handshake_timeout_s.
TEST(ConnectionsTest, AConnectionThatSaysNothingIsClosedAfterTheHandshakeTimeout) {
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(4096, {"--handshake_timeout_s=1"}));
  IdleConnections idle("127.0.0.1", server->port(0), 5);
  ASSERT_EQ(idle.size(), 5u);
  EXPECT_TRUE(
      testing::Eventually([&] { return idle.ClosedByServer() == 5; }, std::chrono::seconds(10)));
  EXPECT_OK(NewClientCall(*server));
  ASSERT_OK(server->Stop(0));
}

// Out of descriptors, accept4 fails with EMFILE, which ends gRPC's listener. The guard never
// reports it: it takes the waiting connection with its reserve descriptor, closes it, and says
// EAGAIN (nothing waits). Run in a child process with a small limit filled to the top.
TEST(ConnectionsTest, OutOfDescriptorsTheGuardShedsTheWaitingConnectionAndSaysEagain) {
#if defined(__SANITIZE_ADDRESS__)
  // UBSan checks a member call's object by probing its memory through a pipe: two descriptors a
  // process out of them does not have, so the guard's warning reads as an error there. The
  // release suite runs this test.
  GTEST_SKIP() << "out of descriptors, the sanitizers cannot check the guard's log call";
#endif
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ConnectionLimits limits;
    limits.descriptor_limit = 64;
    ConnectionGuard guard(limits);  // (its reserve descriptor taken now)
    rlimit r{64, 64};
    ::setrlimit(RLIMIT_NOFILE, &r);
    while (::dup(0) >= 0) {
    }
    pollfd p{listener, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) ::_exit(2);
    const int fd = guard.Accept(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd != -1) ::_exit(3);
    if (errno != EAGAIN) ::_exit(4);
    ::_exit(10 + static_cast<int>(guard.refused(ConnectionGuard::Refusal::kDescriptors)));
  }
  IdleConnections waiting("127.0.0.1", ntohs(addr.sin_port), 1);
  ASSERT_EQ(waiting.size(), 1u);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  // 11: EAGAIN after one connection shed (3: a descriptor returned, 4: another error).
  EXPECT_EQ(WEXITSTATUS(status), 11);
  EXPECT_EQ(waiting.ClosedByServer(), 1u) << "the waiting connection was not taken and closed";
  ::close(listener);
}

}  // namespace
}  // namespace sluice
