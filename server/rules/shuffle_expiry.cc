#include "server/rules/shuffle_expiry.h"

#include <algorithm>
#include <string>

#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

std::chrono::milliseconds ShuffleExpiry::period() const {
  return std::clamp<std::chrono::milliseconds>(ttl_ / 4, std::chrono::milliseconds(100),
                                               std::chrono::seconds(60));
}

size_t ShuffleExpiry::ExpireIdle(Clock::time_point now) {
  size_t expired = 0;
  registry_->ForEachOpen([&](const std::shared_ptr<ShuffleStore>& store) {
    const auto idle = now - store->last_used();
    if (store->writers() > 0 || idle < ttl_) return;
    // (An explicit DeleteShuffle may come first: then this one finds nothing.)
    const std::string id = store->params().shuffle_id;
    const absl::Status st = registry_->Delete(id);
    if (st.ok()) {
      ++expired;
      spdlog::info("event=expire tenant={} shuffle={} idle_s={} ttl_s={}", TenantField(id), id,
                   std::chrono::duration_cast<std::chrono::seconds>(idle).count(),
                   std::chrono::duration_cast<std::chrono::seconds>(ttl_).count());
    } else if (!absl::IsNotFound(st)) {
      spdlog::warn("event=expire_failed tenant={} shuffle={} error=\"{}\"", TenantField(id), id,
                   std::string(st.message()));
    }
  });
  // Those not open (listed at start and not opened yet, or closed while idle) age too.
  for (const std::string& id : registry_->UnopenedIdleSince(now - ttl_)) {
    if (registry_->DeleteIfUnopenedSince(id, now - ttl_)) {
      ++expired;
      spdlog::info("event=expire tenant={} shuffle={} ttl_s={} open=false", TenantField(id), id,
                   std::chrono::duration_cast<std::chrono::seconds>(ttl_).count());
    }
  }
  return expired;
}

}  // namespace sluice
