#include "server/service/peer_fetcher.h"

#include <grpcpp/grpcpp.h>

#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rpc/grpc_glue.h"
#include "rpc/tls.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {

std::shared_ptr<grpc::Channel> GrpcPeerFetcher::Channel(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& channel = channels_[address];
  if (channel == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(INT_MAX);  // a stored frame of any size a server took
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    if (!options_.tls.server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls.server_name);
    }
    channel = grpc::CreateCustomChannel(address,
                                        options_.tls.On() ? rpc::ChannelCredentials(options_.tls)
                                                          : grpc::InsecureChannelCredentials(),
                                        args);
  }
  return channel;
}

absl::Status GrpcPeerFetcher::Authorize(const std::string& address,
                                        grpc::ClientContext* ctx) const {
  if (options_.token.empty()) return absl::OkStatus();
  if (!options_.tls.On() && !rpc::IsLoopbackAddress(address)) {
    return absl::FailedPreconditionError(absl::StrCat("the peer token is not sent in clear to ",
                                                      address, " (serve TLS: docs/security.md)"));
  }
  ctx->AddMetadata("authorization", "Bearer " + options_.token);
  return absl::OkStatus();
}

absl::Status GrpcPeerFetcher::Fetch(
    const std::string& address, const std::string& id, uint32_t partition, uint32_t mapper,
    uint64_t attempt, const std::function<absl::Status(absl::Span<const uint8_t>)>& each) {
  auto stub = v1::ShuffleService::NewStub(Channel(address));
  v1::FetchRequest req;
  req.set_shuffle_id(id);
  req.set_partition_id(partition);
  req.set_order(v1::UNORDERED);
  req.add_only_mappers(mapper);
  req.add_only_attempts(attempt);
  grpc::ClientContext ctx;
  SLUICE_RETURN_IF_ERROR(Authorize(address, &ctx));
  // (A peer that stops sending is left after the keepalive; a whole copy has no deadline of
  // its own, only the rate the repairer paces it to.)
  auto reader = stub->Fetch(&ctx, req);
  v1::FetchResponse resp;
  absl::Status failed;
  while (reader->Read(&resp)) {
    const std::string& frame = resp.frame();
    failed =
        each(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size()));
    if (!failed.ok()) {
      ctx.TryCancel();
      break;
    }
  }
  const absl::Status st = rpc::FromGrpcStatus(reader->Finish());
  if (!failed.ok()) return failed;
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("fetch of mapper ", mapper, " of partition ",
                                                partition, " from ", address, ": ", st.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PeerPartition>> GrpcPeerFetcher::MissingOf(const std::string& address,
                                                                      const std::string& id) {
  auto stub = v1::ShuffleService::NewStub(Channel(address));
  std::vector<PeerPartition> out;
  uint32_t next = 0;
  do {
    v1::GetShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_first_partition(next);
    v1::ShuffleInfo info;
    grpc::ClientContext ctx;
    SLUICE_RETURN_IF_ERROR(Authorize(address, &ctx));
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const absl::Status st = rpc::FromGrpcStatus(stub->GetShuffle(&ctx, req, &info));
    if (!st.ok()) return st;
    if (info.damaged()) return absl::DataLossError(info.damage());
    for (const auto& p : info.partitions()) {
      PeerPartition here;
      here.usable = !p.damaged() && !p.not_kept();
      here.bytes = p.bytes();
      here.lacking.assign(p.lacking_mappers().begin(), p.lacking_mappers().end());
      // (A server too old to list them: lacking some it does not name.)
      if (here.lacking.size() < p.missing_mappers()) here.usable = false;
      out.push_back(std::move(here));
    }
    next = info.next_partition();
  } while (next != 0);
  return out;
}

}  // namespace sluice
