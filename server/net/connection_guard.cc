#include "server/net/connection_guard.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "spdlog/spdlog.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kWarnEvery = std::chrono::seconds(10);

// The system calls themselves: the shim routes the process's accept4 and close here.
int RawAccept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return static_cast<int>(::syscall(SYS_accept4, fd, addr, len, flags));
}
void RawClose(int fd) { (void)::syscall(SYS_close, fd); }

uint32_t PeerPort(const sockaddr* addr, socklen_t len) {
  if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(addr)->sin_port);
  }
  if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port);
  }
  return 0;
}

bool NonBlocking(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_NONBLOCK) != 0;
}

}  // namespace

std::atomic<ConnectionGuard*> ConnectionGuard::installed_{nullptr};

const char* ConnectionGuard::RefusalName(Refusal r) {
  switch (r) {
    case Refusal::kServerLimit:
      return "server_limit";
    case Refusal::kAddressLimit:
      return "address_limit";
    case Refusal::kDescriptors:
      return "descriptors";
  }
  return "?";
}

ConnectionGuard::ConnectionGuard(ConnectionLimits limits)
    : limits_(limits),
      slots_size_(static_cast<size_t>(std::clamp(limits.descriptor_limit, 64, 1 << 22))),
      slots_(new std::atomic<uint32_t>[slots_size_]) {
  for (size_t i = 0; i < slots_size_; ++i) slots_[i].store(0, std::memory_order_relaxed);
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

ConnectionGuard::~ConnectionGuard() {
  if (installed() == this) Install(nullptr);
  if (reserve_fd_ >= 0) RawClose(reserve_fd_);
}

void ConnectionGuard::Watch(uint16_t port) {
  watch_seen_.store(false, std::memory_order_release);
  watch_port_.store(port, std::memory_order_release);
}

void ConnectionGuard::Install(ConnectionGuard* guard) {
  installed_.store(guard, std::memory_order_release);
}

std::optional<ConnectionGuard::Refusal> ConnectionGuard::Admit(int fd, std::string_view peer) {
  std::optional<Refusal> refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ids_.find(peer);
    const size_t from_peer = it == ids_.end() ? 0 : per_id_[it->second];
    if (fd < 0 || static_cast<size_t>(fd) >= slots_size_) {
      // (Not counted: the slots cover the descriptor limit, so only a refusal can land here.)
      if (limits_.protect) refusal = Refusal::kDescriptors;
    } else if (limits_.protect && fd >= limits_.descriptor_limit - limits_.descriptor_reserve) {
      refusal = Refusal::kDescriptors;
    } else if (limits_.protect &&
               open_.load(std::memory_order_relaxed) >= limits_.max_connections) {
      refusal = Refusal::kServerLimit;
    } else if (limits_.protect && from_peer >= limits_.max_per_address) {
      refusal = Refusal::kAddressLimit;
    } else {
      uint32_t id;
      if (it != ids_.end()) {
        id = it->second;
      } else {
        if (free_ids_.empty()) {
          free_ids_.push_back(static_cast<uint32_t>(addresses_.size()));
          addresses_.emplace_back();
          per_id_.push_back(0);
        }
        id = free_ids_.back();
        free_ids_.pop_back();
        addresses_[id] = std::string(peer);
        ids_.emplace(std::string(peer), id);
      }
      ++per_id_[id];
      // A descriptor closed without passing Closed (not through the shim) is counted off here.
      const uint32_t stale = slots_[fd].exchange(id + 1, std::memory_order_acq_rel);
      if (stale != 0) {
        Unref(stale - 1);  // (never `id`: it was just counted)
      } else {
        open_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  if (refusal.has_value()) NoteRefused(*refusal, peer);
  return refusal;
}

void ConnectionGuard::Closed(int fd) {
  if (fd < 0 || static_cast<size_t>(fd) >= slots_size_) return;
  if (slots_[fd].load(std::memory_order_relaxed) == 0) return;  // not a connection: no lock
  const uint32_t slot = slots_[fd].exchange(0, std::memory_order_acq_rel);
  if (slot == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  open_.fetch_sub(1, std::memory_order_relaxed);
  Unref(slot - 1);
}

void ConnectionGuard::Unref(uint32_t id) {
  if (--per_id_[id] != 0) return;
  ids_.erase(addresses_[id]);
  addresses_[id].clear();
  free_ids_.push_back(id);
}

void ConnectionGuard::NoteRefused(Refusal r, std::string_view peer) {
  refused_[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed);
  Warn(r, peer);
}

void ConnectionGuard::Warn(Refusal r, std::string_view peer) {
  const int k = static_cast<int>(r);
  uint64_t count;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++unwarned_[k];
    const auto now = Clock::now();
    if (warned_at_[k] != Clock::time_point() && now - warned_at_[k] < kWarnEvery) return;
    warned_at_[k] = now;
    count = unwarned_[k];
    unwarned_[k] = 0;
  }
  const char* flag = r == Refusal::kServerLimit    ? "--max_connections"
                     : r == Refusal::kAddressLimit ? "--max_connections_per_address"
                                                   : "the open files limit";
  spdlog::warn(
      "event=connection_refused reason={} peer={} refused={} open={} limit=\"{}\" note=\"closed "
      "as accepted; counted in sluice_connections_refused_total\"",
      RefusalName(r), PeerText(peer), count, open(), flag);
}

bool ConnectionGuard::ShedOne(int listen_fd) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reserve_fd_ < 0) return false;
  RawClose(reserve_fd_);
  reserve_fd_ = -1;
  // (The kernel takes a descriptor before it looks for a connection: EMFILE also says nothing
  // of whether one waits. With the reserve's free, EAGAIN says none does.)
  const int fd = RawAccept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) RawClose(fd);
  return fd >= 0;  // (the reserve is taken again by RetakeReserve)
}

void ConnectionGuard::RetakeReserve() {
  std::lock_guard<std::mutex> lock(mu_);
  if (reserve_fd_ < 0) reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

int ConnectionGuard::Accept(int listen_fd, sockaddr* addr, socklen_t* addr_len, int flags) {
  const bool drain = NonBlocking(listen_fd);  // (a blocking one would wait for the next)
  for (;;) {
    sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    const int fd = RawAccept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, flags);
    if (fd < 0) {
      const int err = errno;
      if (!limits_.protect) {
        errno = err;
        return -1;
      }
      if (err == EMFILE || err == ENFILE) {
        // Out of descriptors: the waiting connection is taken and closed with the reserve one,
        // and the next looked at, until none waits.
        if (drain) {
          const bool shed = ShedOne(listen_fd);
          // Said while the reserve's descriptor is still free: a log sink (or a sanitizer)
          // may need one.
          if (shed) NoteRefused(Refusal::kDescriptors, "");
          RetakeReserve();
          if (shed) continue;
        }
        errno = EAGAIN;  // none waits (or the reserve is gone: the next arrival tries again)
        return -1;
      }
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) {
        errno = err;
        return -1;
      }
      // Anything else (ENOBUFS, ENOMEM, EPERM from a firewall...) would end gRPC's listener.
      spdlog::warn("event=accept_failed error=\"{}\" note=\"the listener goes on\"",
                   std::strerror(err));
      errno = EAGAIN;
      return -1;
    }
    const std::string peer = PeerKey(reinterpret_cast<sockaddr*>(&ss), len);
    const uint32_t watched = watch_port_.load(std::memory_order_relaxed);
    if (watched != 0 && PeerPort(reinterpret_cast<sockaddr*>(&ss), len) == watched) {
      watch_seen_.store(true, std::memory_order_release);
    }
    if (!Admit(fd, peer).has_value()) {
      if (addr != nullptr && addr_len != nullptr) {
        std::memcpy(addr, &ss, std::min<socklen_t>(*addr_len, len));
        *addr_len = len;
      }
      return fd;
    }
    RawClose(fd);
    if (!drain) {
      errno = ECONNABORTED;
      return -1;
    }
  }
}

std::string PeerKey(const sockaddr* addr, socklen_t len) {
  if (addr == nullptr) return "";
  if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    return std::string(reinterpret_cast<const char*>(&in->sin_addr), 4);
  }
  if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      return std::string(reinterpret_cast<const char*>(&in6->sin6_addr) + 12, 4);
    }
    return std::string(reinterpret_cast<const char*>(&in6->sin6_addr), 16);
  }
  return "";  // (a Unix socket: one address)
}

std::string PeerText(std::string_view key) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (key.size() == 4) {
    ::inet_ntop(AF_INET, key.data(), buf, sizeof(buf));
  } else if (key.size() == 16) {
    ::inet_ntop(AF_INET6, key.data(), buf, sizeof(buf));
  } else {
    return key.empty() ? "-" : "?";
  }
  return buf;
}

}  // namespace sluice
