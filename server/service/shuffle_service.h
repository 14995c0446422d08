// The gRPC service (callback API), thin: each handler resolves its caller once (call_edge.h),
// converts the request, forwards it to the transport-free rules (ClusterNode, the admissions,
// PushAttempt and FetchSession through the stream reactors) and converts the answer. Nothing
// here blocks a gRPC thread: the small calls run on their own pool (so never behind bulk work),
// streams on the worker and merge pools. Included only by grpc_server.cc, so the generated gRPC
// headers stay out of widely included headers.
#ifndef SLUICE_SERVER_SERVICE_SHUFFLE_SERVICE_H_
#define SLUICE_SERVER_SERVICE_SHUFFLE_SERVICE_H_

#include <functional>

#include "server/service/service_deps.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {

class CallContext;

class ShuffleServiceImpl final : public v1::ShuffleService::CallbackService {
 public:
  explicit ShuffleServiceImpl(ServiceDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* CreateShuffle(grpc::CallbackServerContext* ctx,
                                          const v1::CreateShuffleRequest* req,
                                          v1::CreateShuffleResponse* resp) override;
  grpc::ServerUnaryReactor* GetShuffle(grpc::CallbackServerContext* ctx,
                                       const v1::GetShuffleRequest* req,
                                       v1::ShuffleInfo* resp) override;
  grpc::ServerUnaryReactor* ListShuffles(grpc::CallbackServerContext* ctx,
                                         const v1::ListShufflesRequest* req,
                                         v1::ListShufflesResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteShuffle(grpc::CallbackServerContext* ctx,
                                          const v1::DeleteShuffleRequest* req,
                                          v1::DeleteShuffleResponse* resp) override;
  grpc::ServerReadReactor<v1::PushRequest>* Push(grpc::CallbackServerContext* ctx,
                                                 v1::PushResponse* resp) override;
  grpc::ServerBidiReactor<v1::PushRequest, v1::PushReply>* PushFlow(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<v1::FetchResponse>* Fetch(grpc::CallbackServerContext* ctx,
                                                     const v1::FetchRequest* req) override;
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* ctx, const v1::GetNodeRequest* req,
                                    v1::NodeInfo* resp) override;
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx,
                                      const v1::ListNodesRequest* req,
                                      v1::ListNodesResponse* resp) override;
  grpc::ServerUnaryReactor* GetPlacement(grpc::CallbackServerContext* ctx,
                                         const v1::GetPlacementRequest* req,
                                         v1::Placement* resp) override;
  grpc::ServerUnaryReactor* CommitMapper(grpc::CallbackServerContext* ctx,
                                         const v1::CommitMapperRequest* req,
                                         v1::CommitMapperResponse* resp) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* ctx, const v1::DrainRequest* req,
                                  v1::DrainResponse* resp) override;
  grpc::ServerUnaryReactor* RevokeMappers(grpc::CallbackServerContext* ctx,
                                          const v1::RevokeMappersRequest* req,
                                          v1::RevokeMappersResponse* resp) override;
  grpc::ServerUnaryReactor* GetSplits(grpc::CallbackServerContext* ctx,
                                      const v1::GetSplitsRequest* req,
                                      v1::GetSplitsResponse* resp) override;
  grpc::ServerUnaryReactor* ReviveShuffle(grpc::CallbackServerContext* ctx,
                                          const v1::ReviveShuffleRequest* req,
                                          v1::ReviveShuffleResponse* resp) override;
  grpc::ServerUnaryReactor* Decommission(grpc::CallbackServerContext* ctx,
                                         const v1::DecommissionRequest* req,
                                         v1::DecommissionResponse* resp) override;

 private:
  // A unary call: its caller resolved (or UNAUTHENTICATED at once), then `handle` on the small
  // calls' pool, its status what the caller is told.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx,
                                  std::function<absl::Status(const CallContext&)> handle);

  const ServiceDeps deps_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_SHUFFLE_SERVICE_H_
