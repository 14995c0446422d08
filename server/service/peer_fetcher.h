// GrpcPeerFetcher: the repairer's reads of another server (PeerFetcher over the Fetch RPC): an
// UNORDERED fetch of one mapper of one partition (`only_mappers`), whose responses are the
// stored frames as they are. One channel per peer address, kept. Over TLS when the server serves
// TLS (PeerOptions::tls: the peers' CA, their name, a client certificate for mutual TLS), with a
// token when the servers ask for credentials (an admin's: it reads every tenant's shuffles; sent
// only over TLS or to this machine, as the client does). docs/cluster.md, "Re-replication".
#ifndef SLUICE_SERVER_SERVICE_PEER_FETCHER_H_
#define SLUICE_SERVER_SERVICE_PEER_FETCHER_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "rpc/tls_options.h"
#include "server/rules/repairer.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace sluice {

/// How a server reaches its peers.
struct PeerOptions {
  ClientTlsOptions tls;  ///< off: plaintext; PEMs already loaded (rpc::LoadClientTls)
  std::string token;     ///< empty: none sent
};

class GrpcPeerFetcher final : public PeerFetcher {
 public:
  explicit GrpcPeerFetcher(PeerOptions options = {}) : options_(std::move(options)) {}
  absl::Status Fetch(const std::string& address, const std::string& id, uint32_t partition,
                     uint32_t mapper, uint64_t attempt,
                     const std::function<absl::Status(absl::Span<const uint8_t>)>& each) override;
  absl::StatusOr<std::vector<PeerPartition>> MissingOf(const std::string& address,
                                                       const std::string& id) override;

 private:
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  // The token on a call to `address`, where it may go (FAILED_PRECONDITION otherwise).
  absl::Status Authorize(const std::string& address, grpc::ClientContext* ctx) const;
  const PeerOptions options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_PEER_FETCHER_H_
