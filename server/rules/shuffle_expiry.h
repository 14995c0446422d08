// ShuffleExpiry: --shuffle_ttl_s. A shuffle nobody pushed to, fetched from or asked about for
// the lifetime (ShuffleStore::Touch) is deleted, unless a push is writing to it. For servers on
// their own: in a cluster a shuffle idle on one server may be in use on another, and engines
// delete their shuffles (server_options.cc refuses the flag with --etcd).
//
//   ShuffleExpiry expiry(&registry, std::chrono::hours(6));
//   Periodic every(expiry.period(), [&] { expiry.ExpireIdle(Clock::now()); });
//
// The clock is the caller's: tests hand in a time instead of sleeping through a lifetime.
#ifndef SLUICE_SERVER_RULES_SHUFFLE_EXPIRY_H_
#define SLUICE_SERVER_RULES_SHUFFLE_EXPIRY_H_

#include <chrono>
#include <cstddef>

#include "server/storage/shuffle_registry.h"

namespace sluice {

class ShuffleExpiry {
 public:
  using Clock = std::chrono::steady_clock;
  ShuffleExpiry(ShuffleRegistry* registry, std::chrono::milliseconds ttl)
      : registry_(registry), ttl_(ttl) {}

  /// Deletes every shuffle idle for the lifetime at `now` that no push is writing to (each
  /// logged, event=expire); how many it deleted.
  size_t ExpireIdle(Clock::time_point now);
  /// How often to look: a quarter of the lifetime, within [100 ms, 60 s].
  std::chrono::milliseconds period() const;

 private:
  ShuffleRegistry* const registry_;
  const std::chrono::milliseconds ttl_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_SHUFFLE_EXPIRY_H_
