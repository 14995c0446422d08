#include "server/net/listener_probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

// The address to dial for `host`: loopback for a wildcard (or empty) host.
bool Resolve(const std::string& host, int port, sockaddr_storage* out, socklen_t* len,
             std::string* error) {
  std::string h = host;
  if (h.empty() || h == "0.0.0.0" || h == "*") h = "127.0.0.1";
  if (h == "::" || h == "[::]") h = "::1";
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    *error = absl::StrCat("cannot resolve ", h, ": ", ::gai_strerror(rc));
    return false;
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return true;
}

uint16_t LocalPort(int fd) {
  sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

}  // namespace

ListenerProbe::ListenerProbe(std::string host, int port, ConnectionGuard* guard,
                             std::chrono::milliseconds wait)
    : host_(std::move(host)), port_(port), guard_(guard), wait_(wait) {}

bool ListenerProbe::Check() {
  sockaddr_storage addr;
  socklen_t len = 0;
  if (!Resolve(host_, port_, &addr, &len, &error_)) return false;
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error_ = absl::StrCat("socket: ", std::strerror(errno));
    return true;  // (out of descriptors here says nothing of the listener)
  }
  // Bound first, so that the guard knows the port before the kernel hands the connection on.
  sockaddr_storage local{};
  local.ss_family = addr.ss_family;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&local), len) == 0;
  const uint16_t port = ok ? LocalPort(fd) : 0;
  if (port != 0) guard_->Watch(port);
  if (!ok || port == 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    error_ = absl::StrCat("connect to the listening port ", port_, ": ", std::strerror(errno));
    ::close(fd);
    return false;
  }
  const auto until = std::chrono::steady_clock::now() + wait_;
  while (!guard_->Seen() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ok = guard_->Seen();
  ::close(fd);
  if (!ok) {
    error_ = absl::StrCat("a connection to the listening port ", port_, " was not accepted within ",
                          wait_.count(), " ms");
  }
  return ok;
}

std::string ListenHost(const std::string& listen_address) {
  if (!listen_address.empty() && listen_address.front() == '[') {
    const auto end = listen_address.find(']');
    return end == std::string::npos ? listen_address : listen_address.substr(0, end + 1);
  }
  const auto colon = listen_address.rfind(':');
  return colon == std::string::npos ? listen_address : listen_address.substr(0, colon);
}

}  // namespace sluice
