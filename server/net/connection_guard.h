// ConnectionGuard: which incoming connections the server keeps, decided as each is accepted,
// before gRPC sees it. A connection costs a descriptor and gRPC's buffers before it says a word
// (no credentials, no TLS handshake needed), so it is a resource a client can make the server
// spend: bounded in all (`max_connections`), per client address (`max_per_address`) and by the
// descriptors left (`descriptor_reserve` are never given to connections, so shuffles' files and
// the listener itself always have some). One past a bound is closed at once and counted.
//
// Why at accept: gRPC's listener (Debian's 1.51) stops accepting for good the first time
// accept4 fails with anything but EAGAIN (EMFILE above all). Accept() never lets it see such a
// failure: out of descriptors, it closes a reserve descriptor, takes and closes the waiting
// connection, and opens the reserve again; any other failure is logged and reported as EAGAIN.
// sluice-server routes gRPC's accept4 here (server/net/accept_shim.cc) and its close, so a
// connection is counted until its descriptor is closed.
//
//   ConnectionGuard guard({.max_connections = 4096, .max_per_address = 512,
//                          .descriptor_limit = 65536, .descriptor_reserve = 64});
//   ConnectionGuard::Install(&guard);  // the shim consults it from now on
//
// Thread-safe; Closed() takes a lock only for descriptors it counts.
#ifndef SLUICE_SERVER_NET_CONNECTION_GUARD_H_
#define SLUICE_SERVER_NET_CONNECTION_GUARD_H_

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

struct ConnectionLimits {
  size_t max_connections = 4096;  ///< open connections in all
  size_t max_per_address = 512;   ///< open connections from one client address
  int descriptor_limit = 1024;    ///< the process's RLIMIT_NOFILE
  int descriptor_reserve = 64;    ///< descriptors never given to a connection
  /// False: count and watch only (every connection kept, accept failures passed on as they
  /// are: gRPC's own behaviour, --guard_connections=false).
  bool protect = true;
};

class ConnectionGuard {
 public:
  enum class Refusal { kServerLimit = 0, kAddressLimit = 1, kDescriptors = 2 };
  static constexpr int kRefusals = 3;
  static const char* RefusalName(Refusal r);  ///< "server_limit", "address_limit", "descriptors"

  explicit ConnectionGuard(ConnectionLimits limits);
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  /// The rule: a connection accepted as `fd` from `peer` (its address bytes) is kept, and
  /// counted until Closed(fd), or refused (nothing counted; the caller closes it).
  std::optional<Refusal> Admit(int fd, std::string_view peer);
  /// Descriptor `fd` was closed: a connection counted on it is not any more.
  void Closed(int fd);
  /// A connection refused without an Admit (the process was out of descriptors).
  void NoteRefused(Refusal r, std::string_view peer);

  size_t open() const { return open_.load(std::memory_order_relaxed); }
  uint64_t refused(Refusal r) const {
    return refused_[static_cast<int>(r)].load(std::memory_order_relaxed);
  }
  const ConnectionLimits& limits() const { return limits_; }

  /// accept4 as gRPC calls it, with the rule applied: the first connection kept, or -1 with
  /// errno (EAGAIN when none is waiting, also after refusing some; never EMFILE).
  int Accept(int listen_fd, sockaddr* addr, socklen_t* addr_len, int flags);

  /// The listener probe's hook: whether a connection from loopback port `port` was accepted
  /// since Watch(port).
  void Watch(uint16_t port);
  bool Seen() const { return watch_seen_.load(std::memory_order_acquire); }

  /// The guard the accept4/close shim uses (null: none; calls pass straight through).
  static void Install(ConnectionGuard* guard);
  static ConnectionGuard* installed() { return installed_.load(std::memory_order_acquire); }

 private:
  // Takes and closes one waiting connection with the reserve descriptor; false if none waits
  // (or it could not). The reserve is left free: RetakeReserve after.
  bool ShedOne(int listen_fd);
  void RetakeReserve();
  // One connection of address `id` fewer; the id is freed with its last. Under mu_.
  void Unref(uint32_t id);
  // A warning at most every 10 s per kind, with the count since the last.
  void Warn(Refusal r, std::string_view peer);

  static std::atomic<ConnectionGuard*> installed_;

  const ConnectionLimits limits_;
  // Per descriptor: the id + 1 of the address of the connection counted on it, 0 for none.
  const size_t slots_size_;
  std::unique_ptr<std::atomic<uint32_t>[]> slots_;
  std::atomic<size_t> open_{0};
  std::atomic<uint32_t> watch_port_{0};
  std::atomic<bool> watch_seen_{false};
  std::atomic<uint64_t> refused_[kRefusals] = {};
  std::mutex mu_;  // guards the maps below and the reserve descriptor
  std::map<std::string, uint32_t, std::less<>> ids_;  // address -> id
  std::vector<std::string> addresses_;                // id -> address ("" when free)
  std::vector<size_t> per_id_;                        // id -> connections open
  std::vector<uint32_t> free_ids_;
  int reserve_fd_ = -1;
  std::chrono::steady_clock::time_point warned_at_[kRefusals] = {};
  uint64_t unwarned_[kRefusals] = {};
};

/// The client address of a socket address, as bytes (an IPv4-mapped IPv6 address as IPv4), and
/// printable.
std::string PeerKey(const sockaddr* addr, socklen_t len);
std::string PeerText(std::string_view key);

}  // namespace sluice

#endif  // SLUICE_SERVER_NET_CONNECTION_GUARD_H_
