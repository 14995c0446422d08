#include "server/metrics_http.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sluice {

namespace {

absl::Status SocketError(const std::string& what, const std::string& address, int err) {
  return absl::UnavailableError(absl::StrCat("metrics endpoint (--metrics_listen=", address,
                                             "): ", what, ": ", std::strerror(err)));
}

// host:port -> (host, port); "[::]:9090" -> ("::", "9090"); ":9090" -> ("", "9090").
absl::Status SplitAddress(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen=", address, " is not host:port"));
  }
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  for (char c : *port) {
    if (c < '0' || c > '9' || port->size() > 5) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen=", address, ": the port is not a number"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Listen(const std::string& address) {
  std::string host, port;
  if (absl::Status st = SplitAddress(address, &host, &port); !st.ok()) return st;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const bool any = host.empty() || host == "0.0.0.0" || host == "::";
  if (host.empty()) hints.ai_family = AF_INET6;  // v6 and (not v6-only) v4
  if (int rc = ::getaddrinfo(any && host != "0.0.0.0" ? nullptr : host.c_str(), port.c_str(),
                             &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen=", address, ": ", ::gai_strerror(rc)));
  }
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    ::freeaddrinfo(found);
    return SocketError("socket", address, err);
  }
  const int one = 1, zero = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (found->ai_family == AF_INET6)
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  const int bound = ::bind(fd, found->ai_addr, found->ai_addrlen);
  const int err = errno;
  ::freeaddrinfo(found);
  if (bound != 0 || ::listen(fd, 64) != 0) {
    const int e = bound != 0 ? err : errno;
    ::close(fd);
    return SocketError(bound != 0 ? "bind" : "listen", address, e);
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

std::string Response(int code, const char* reason, const char* type, const std::string& body,
                     bool head, const char* extra = "") {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra,
                      "Connection: close\r\n\r\n", head ? std::string() : body);
}

struct Connection {
  int fd = -1;
  std::string in;
  std::string out;
  size_t sent = 0;
  std::chrono::steady_clock::time_point deadline;
  bool responding = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, std::function<std::string()> render) {
  auto fd = Listen(address);
  if (!fd.ok()) return fd.status();
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(*fd);
    return SocketError("pipe", address, err);
  }
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(*fd, BoundPort(*fd), pipe_fds[0], pipe_fds[1], std::move(render)));
}

MetricsEndpoint::MetricsEndpoint(int listen_fd, int port, int wake_read, int wake_write,
                                 std::function<std::string()> render)
    : listen_fd_(listen_fd),
      port_(port),
      wake_read_(wake_read),
      wake_write_(wake_write),
      render_(std::move(render)) {
  thread_ = std::thread([this] { Run(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  const char b = 0;
  (void)!::write(wake_write_, &b, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

namespace {

// The answer to a complete request head (`head` ends with the blank line).
std::string Answer(const std::string& head, const std::function<std::string()>& render) {
  const size_t line_end = head.find("\r\n");
  const std::string line = head.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) {
    return Response(400, "Bad Request", "text/plain", "not an HTTP request line\n", false);
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return Response(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false,
                    "Allow: GET, HEAD\r\n");
  }
  if (path == "/metrics") {
    return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render(), head_only);
  }
  if (path == "/") {
    return Response(200, "OK", "text/plain", "sluice-server: metrics at /metrics\n", head_only);
  }
  return Response(404, "Not Found", "text/plain", "not found; metrics are at /metrics\n",
                  head_only);
}

// Reads what the connection has; false once it should close (EOF before a whole request, or
// an error). Sets the response once the request head is complete or too large.
bool ReadRequest(Connection& c, const std::function<std::string()>& render) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      if (c.in.find("\r\n\r\n") != std::string::npos) {
        c.out = Answer(c.in, render);
        c.responding = true;
        return true;
      }
      if (c.in.size() > MetricsEndpoint::kMaxRequestBytes) {
        c.out = Response(431, "Request Header Fields Too Large", "text/plain",
                         "the request is larger than 8 KiB\n", false);
        c.responding = true;
        return true;
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

// Sends what it can; false once done or broken.
bool WriteResponse(Connection& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
  return false;
}

}  // namespace

void MetricsEndpoint::Run() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    int timeout_ms = 1000;
    fds.clear();
    fds.push_back({wake_read_, POLLIN, 0});
    // Past the connection limit, new ones wait in the kernel's backlog.
    fds.push_back({conns.size() < kMaxConnections ? listen_fd_ : -1, POLLIN, 0});
    for (const Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.responding ? POLLOUT : POLLIN), 0});
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
      timeout_ms = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(timeout_ms, left)));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      spdlog::error("event=metrics_poll_failed error=\"{}\"", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) break;
    // Handle existing connections first (fds[i + 2] is conns[i]); new ones join after.
    std::vector<Connection> kept;
    kept.reserve(conns.size());
    const auto after = std::chrono::steady_clock::now();
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = conns[i];
      bool open = true;
      if (fds[i + 2].revents != 0) {
        open = c.responding ? WriteResponse(c) : ReadRequest(c, render_);
        if (open && c.responding && c.sent == 0) open = WriteResponse(c);  // answer at once
      }
      if (open && after >= c.deadline) open = false;  // too slow: closed, whatever its state
      if (open) {
        kept.push_back(std::move(c));
      } else {
        ::close(c.fd);
      }
    }
    conns.swap(kept);
    if (fds[1].revents != 0) {
      while (conns.size() < kMaxConnections) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        Connection c;
        c.fd = fd;
        c.deadline = after + kRequestTimeout;
        conns.push_back(std::move(c));
      }
    }
  }
  for (const Connection& c : conns) ::close(c.fd);
}

}  // namespace sluice
