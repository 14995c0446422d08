// GrpcPeerFetcher: the repairer's reads of another server (PeerFetcher over the Fetch RPC): an
// UNORDERED fetch of one mapper of one partition (`only_mappers`), whose responses are the
// stored frames as they are. One channel per peer address, kept. Plaintext only: a server with
// TLS or --auth_file does not repair yet (docs/cluster.md, "Re-replication").
#ifndef SLUICE_SERVER_SERVICE_PEER_FETCHER_H_
#define SLUICE_SERVER_SERVICE_PEER_FETCHER_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/rules/repairer.h"

namespace grpc {
class Channel;
}

namespace sluice {

class GrpcPeerFetcher final : public PeerFetcher {
 public:
  absl::Status Fetch(const std::string& address, const std::string& id, uint32_t partition,
                     uint32_t mapper,
                     const std::function<absl::Status(absl::Span<const uint8_t>)>& each) override;
  absl::StatusOr<std::vector<PeerPartition>> MissingOf(const std::string& address,
                                                       const std::string& id) override;

 private:
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_PEER_FETCHER_H_
