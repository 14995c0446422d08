#include "server/metrics/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/metrics/metric_families.h"

namespace sluice {

struct MetricsEndpoint::Connection {
  int fd = -1;  // -1 once closed (swept at the end of the round)
  int64_t deadline_ms = 0;
  std::string peer;  // the client's address, without its port
  std::string in;    // the request so far
  std::string out;   // the answer, once the request is complete
  size_t sent = 0;
  bool answered = false;
};

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status BadAddress(const std::string& address, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--metrics_listen=", address, ": ", why));
}

// "host:port" or "[v6]:port" into its host and port.
absl::Status SplitAddress(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return BadAddress(address, "not host:port");
  }
  *port = address.substr(colon + 1);
  if (port->size() > 5 ||
      !std::all_of(port->begin(), port->end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(*port) > 65535) {
    return BadAddress(address, "the port is not a number from 0 to 65535");
  }
  *host = address.substr(0, colon);
  if (host->front() == '[') {
    if (host->size() < 3 || host->back() != ']') return BadAddress(address, "unclosed [");
    *host = host->substr(1, host->size() - 2);
  }
  return absl::OkStatus();
}

std::string PeerOf(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

std::string Response(absl::string_view status, absl::string_view type, const std::string& body,
                     bool with_body) {
  std::string out = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                                 "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n");
  if (absl::StartsWith(status, "405")) absl::StrAppend(&out, "Allow: GET, HEAD\r\n");
  absl::StrAppend(&out, "\r\n");
  if (with_body) out += body;
  return out;
}

std::string Plain(absl::string_view status, absl::string_view text) {
  return Response(status, "text/plain; charset=utf-8", absl::StrCat(text, "\n"), true);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address,
                                                                        Collector collect) {
  std::string host, port;
  if (absl::Status st = SplitAddress(address, &host, &port); !st.ok()) return st;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("metrics endpoint (--metrics_listen=", address,
                                               "): cannot resolve '", host,
                                               "': ", ::gai_strerror(rc)));
  }
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->collect_ = std::move(collect);
  std::string why = "no address";
  for (addrinfo* ai = found; ai != nullptr && e->listen_fd_ < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    e->listen_fd_ = fd;
  }
  ::freeaddrinfo(found);
  if (e->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint (--metrics_listen=", address, "): cannot listen: ", why));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(e->listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  e->port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (::pipe2(e->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::UnavailableError(absl::StrCat("metrics endpoint: pipe: ", std::strerror(errno)));
  }
  e->thread_ = std::thread([p = e.get()] { p->Run(); });
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (thread_.joinable()) {
    const char byte = 0;
    (void)!::write(wake_[1], &byte, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

std::string MetricsEndpoint::Answer(const std::string& request) const {
  const absl::string_view line = absl::string_view(request).substr(0, request.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == absl::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == absl::string_view::npos || !absl::StartsWith(line.substr(sp2 + 1), "HTTP/1.")) {
    return Plain("400 Bad Request", "not an HTTP/1 request line");
  }
  const absl::string_view method = line.substr(0, sp1);
  absl::string_view path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET" && method != "HEAD") {
    return Plain("405 Method Not Allowed", "only GET and HEAD");
  }
  if (path != "/metrics") return Plain("404 Not Found", "the metrics are at /metrics");
  return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", MetricsText(collect_()),
                  method == "GET");
}

void MetricsEndpoint::Run() {
  std::vector<std::unique_ptr<Connection>> conns;  // in the order they were accepted
  std::vector<pollfd> fds;
  int64_t accept_paused_until = 0;  // out of descriptors: look again a little later
  auto close_conn = [](Connection& c) {
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  };
  // Sends what it can of the answer; closes the connection once all of it went.
  auto send_some = [&](Connection& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n =
          ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      break;  // the client went away
    }
    close_conn(c);
  };
  auto answer = [&](Connection& c, std::string out) {
    c.out = std::move(out);
    c.answered = true;
    send_some(c);
  };
  for (;;) {
    const int64_t now = NowMs();
    int timeout = -1;
    for (auto& c : conns) {
      if (now >= c->deadline_ms) {
        if (!c->answered) {
          const std::string late = Plain("408 Request Timeout", "the request took too long");
          (void)!::send(c->fd, late.data(), late.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        close_conn(*c);
        continue;
      }
      const int64_t left = c->deadline_ms - now;
      if (timeout < 0 || left < timeout) timeout = static_cast<int>(left);
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const auto& c) { return c->fd < 0; }),
                conns.end());
    const bool accepting = now >= accept_paused_until;
    if (!accepting) {
      const int left = static_cast<int>(accept_paused_until - now);
      if (timeout < 0 || left < timeout) timeout = left;
    }
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    for (const auto& c : conns) {
      fds.push_back({c->fd, static_cast<short>(c->answered ? POLLOUT : POLLIN), 0});
    }
    const size_t polled = conns.size();
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;  // destroyed
    // Newcomers first: past a limit, the oldest connection makes room (a scrape is answered at
    // once, so the oldest is the likeliest to be idle or slow).
    if (fds[1].revents != 0) {
      for (int i = 0; i < kMaxConnections; ++i) {
        sockaddr_storage ss{};
        socklen_t len = sizeof(ss);
        // The kernel's accept4: the process's own (server/net/accept_shim.cc) counts gRPC's.
        const int fd =
            static_cast<int>(::syscall(SYS_accept4, listen_fd_, reinterpret_cast<sockaddr*>(&ss),
                                       &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            accept_paused_until = NowMs() + 100;
          }
          if (errno == EINTR || errno == ECONNABORTED) continue;
          break;
        }
        auto c = std::make_unique<Connection>();
        c->fd = fd;
        c->deadline_ms = NowMs() + kRequestTimeoutMs;
        c->peer = PeerOf(ss);
        int same = 0;
        Connection* oldest_same = nullptr;
        size_t open = 0;
        Connection* oldest = nullptr;
        for (auto& o : conns) {
          if (o->fd < 0) continue;
          ++open;
          if (oldest == nullptr) oldest = o.get();
          if (o->peer == c->peer) {
            ++same;
            if (oldest_same == nullptr) oldest_same = o.get();
          }
        }
        if (same >= kMaxPerAddress) {
          close_conn(*oldest_same);
        } else if (open >= static_cast<size_t>(kMaxConnections)) {
          close_conn(*oldest);
        }
        conns.push_back(std::move(c));
      }
    }
    for (size_t i = 0; i < polled; ++i) {
      Connection& c = *conns[i];
      const short ev = fds[i + 2].revents;
      if (c.fd < 0 || ev == 0) continue;
      if (c.answered) {
        if (ev & (POLLERR | POLLHUP | POLLNVAL)) {
          close_conn(c);
        } else {
          send_some(c);
        }
        continue;
      }
      char buf[4096];
      bool ended = false;  // the client half-closed: what it sent is all there will be
      for (;;) {
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
          if (c.in.size() > static_cast<size_t>(kMaxRequestBytes)) break;
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) {
          ended = true;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
          close_conn(c);
        }
        break;
      }
      if (c.fd < 0) continue;
      // (A complete request is answered even when its client half-closed right after it: the
      // way back is still open.)
      if (c.in.size() > static_cast<size_t>(kMaxRequestBytes)) {
        answer(c, Plain("431 Request Header Fields Too Large",
                        absl::StrCat("a request is at most ", kMaxRequestBytes, " bytes")));
      } else if (c.in.find("\r\n\r\n") != std::string::npos) {
        answer(c, Answer(c.in));
      } else if (ended) {
        close_conn(c);  // cut short: nothing more will come
      }
    }
  }
  for (auto& c : conns) close_conn(*c);
}

}  // namespace sluice
