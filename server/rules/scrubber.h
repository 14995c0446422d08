// Scrubber: --scrub_mb_per_s. Walks every shuffle's committed blocks (opening one that is not
// open: ShuffleRegistry::Get), one shuffle after another in id order and then again from the first,
// reading each block at about the rate given and checking it against its commit record and its
// frame's checksums (ShuffleStore::ScrubNext). A damaged block marks its partition damaged: its
// fetches then fail with DATA_LOSS naming it, so that in a cluster its readers use another replica.
// Its memory is one read piece (1 MiB).
//
//   Scrubber scrub(&registry, 16 << 20, &metrics);
//   Periodic every(Scrubber::kPeriod, [&] { scrub.Run(Scrubber::Clock::now()); });
//
// The clock is the caller's (tests hand in times). Not thread-safe: one caller at a time.
#ifndef SLUICE_SERVER_RULES_SCRUBBER_H_
#define SLUICE_SERVER_RULES_SCRUBBER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/metrics/server_metrics.h"
#include "server/storage/shuffle_registry.h"

namespace sluice {

class Scrubber {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kPeriod{100};

  /// `bytes_per_s` > 0. `metrics` may be null.
  Scrubber(ShuffleRegistry* registry, uint64_t bytes_per_s, ServerMetrics* metrics)
      : registry_(registry), rate_(bytes_per_s), metrics_(metrics) {}

  /// Reads what the rate allows since the last run (at most a second's worth, so an idle
  /// stretch is not made up in a burst; a block larger than that is read whole and paid for by
  /// the runs after). Returns the bytes read.
  uint64_t Run(Clock::time_point now);

  /// Passes over every open shuffle completed.
  uint64_t passes() const { return passes_; }

 private:
  // The next shuffle of the pass that can be opened, or null once the pass is over.
  std::shared_ptr<ShuffleStore> NextStore();

  ShuffleRegistry* const registry_;
  const uint64_t rate_;
  ServerMetrics* const metrics_;
  bool started_ = false;
  Clock::time_point last_;
  double allowance_ = 0;  // bytes the rate allows now (negative: a large block's debt)
  // The shuffles left in this pass, the next last.
  std::vector<std::string> pass_;
  bool in_pass_ = false;
  std::shared_ptr<ShuffleStore> store_;  // being scrubbed
  ShuffleStore::ScrubCursor cursor_;
  std::string buffer_;  // one read piece, reused
  uint64_t passes_ = 0;
  uint64_t pass_bytes_ = 0;
  Clock::time_point pass_started_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_SCRUBBER_H_
