// ListenerProbe: whether the server's listener still accepts connections. It connects to the
// listening address (loopback for a wildcard one) and waits for the ConnectionGuard to see that
// connection accepted. The guard keeps gRPC's listener alive through every accept failure it
// knows of; the probe is for the ones it does not: a listener that stopped taking connections
// serves only the connections it already has, and the only way back is a restart (the wiring
// then drains the server with readiness failing first, and the process exits 1 for its
// supervisor: docs/operations.md, "Connections").
//
//   ListenerProbe probe("0.0.0.0", port, guard, std::chrono::seconds(5));
//   if (!probe.Check()) ++failures;
#ifndef SLUICE_SERVER_NET_LISTENER_PROBE_H_
#define SLUICE_SERVER_NET_LISTENER_PROBE_H_

#include <chrono>
#include <string>

#include "server/net/connection_guard.h"

namespace sluice {

class ListenerProbe {
 public:
  /// `host` as given to --listen ("0.0.0.0", "[::]", "", an IP, a name), its bound `port`.
  ListenerProbe(std::string host, int port, ConnectionGuard* guard, std::chrono::milliseconds wait);
  /// Connects and waits up to `wait` for the connection to be accepted. False also when no
  /// connection could be made at all (the kernel refused it: nothing listens).
  bool Check();
  /// Why the last Check failed.
  const std::string& error() const { return error_; }

 private:
  const std::string host_;
  const int port_;
  ConnectionGuard* const guard_;
  const std::chrono::milliseconds wait_;
  std::string error_;
};

/// The host part of a --listen address ("host:port", "[v6]:port").
std::string ListenHost(const std::string& listen_address);

}  // namespace sluice

#endif  // SLUICE_SERVER_NET_LISTENER_PROBE_H_
