// What the transport-free stream sessions (PushStream, FetchStream) take of the server: its
// registry, cluster node, admission, limits, counters, timeouts and clock. Wired once by
// SluiceServer; the gRPC service's ServiceDeps extends it with what only the transport uses.
#ifndef SLUICE_SERVER_RULES_STREAM_DEPS_H_
#define SLUICE_SERVER_RULES_STREAM_DEPS_H_

#include <chrono>

#include "server/metrics/server_metrics.h"
#include "server/rules/admission.h"
#include "server/rules/cluster_node.h"
#include "server/rules/fetch_session.h"
#include "server/rules/push_attempt.h"
#include "server/runtime/clock.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

/// How long a stream may wait for progress.
struct StreamTimeouts {
  /// A push stream waiting this long for its next message (or for a large frame's pieces) is
  /// ended with DEADLINE_EXCEEDED and its attempt discarded (--push_idle_timeout_s).
  std::chrono::milliseconds push_idle{std::chrono::seconds(300)};
  /// A fetch whose reader takes no chunk for this long is cancelled, giving back its memory
  /// and merge slot (--fetch_stall_timeout_s).
  std::chrono::milliseconds fetch_stall{std::chrono::seconds(120)};
  /// A KEY fetch whose reader takes no chunk for this long, while another fetch waits for a
  /// merge slot, gives its slot and its merge's memory up; it merges again from where it was
  /// once its reader reads (--merge_park_after_s).
  std::chrono::milliseconds merge_park{std::chrono::seconds(2)};
  /// Credit granted to a PushFlow stream whose message does not come within this long goes
  /// back, the stream ended with DEADLINE_EXCEEDED (--push_credit_timeout_s).
  std::chrono::milliseconds push_credit{std::chrono::seconds(10)};
  /// A fetch checks its caller's credentials again (a token taken out of --auth_file ends it)
  /// at most this often as its chunks go.
  std::chrono::milliseconds caller_recheck{std::chrono::seconds(1)};
};

struct StreamDeps {
  ShuffleRegistry* registry = nullptr;
  ClusterNode* node = nullptr;
  AdmissionDeps admission;
  PushLimits push;
  FetchDeps fetch;
  StreamTimeouts timeouts;
  ServerMetrics* metrics = nullptr;
  const Clock* clock = Clock::Steady();
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_STREAM_DEPS_H_
