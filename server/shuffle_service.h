// The gRPC service (callback API): thin glue. Each reactor converts the wire messages and
// forwards them to the transport-free rules (PushAttempt, FetchSession, ShuffleRegistry), and
// never blocks a gRPC thread on disk, validation or compression: that work runs on the
// WorkerPool, and streams resume from there. Included only by sluice_server.cc, so the
// generated gRPC headers stay out of widely included headers.
#ifndef SLUICE_SERVER_SHUFFLE_SERVICE_H_
#define SLUICE_SERVER_SHUFFLE_SERVICE_H_

#include "server/fetch_session.h"
#include "server/push_attempt.h"
#include "server/shuffle_registry.h"
#include "server/worker_pool.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {

class ShuffleServiceImpl final : public v1::ShuffleService::CallbackService {
 public:
  struct Deps {
    ShuffleRegistry* registry;
    WorkerPool* pool;
    MemoryBudget* budget;
    PushLimits push;
    FetchDeps fetch;
    Gate* merge_gate;  ///< bounds concurrent KEY merges (each holds up to fan-in frames)
  };
  explicit ShuffleServiceImpl(Deps deps) : deps_(std::move(deps)) {}

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
  grpc::ServerWriteReactor<v1::FetchResponse>* Fetch(grpc::CallbackServerContext* ctx,
                                                     const v1::FetchRequest* req) override;

 private:
  const Deps deps_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SHUFFLE_SERVICE_H_
