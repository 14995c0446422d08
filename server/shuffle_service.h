// The gRPC service (callback API). Handlers never block a gRPC thread on disk, validation or
// compression: that work runs on the WorkerPool, and streams resume from there. Included only
// by sluice_server.cc, so the generated gRPC headers stay out of widely included headers.
#ifndef SLUICE_SERVER_SHUFFLE_SERVICE_H_
#define SLUICE_SERVER_SHUFFLE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "codec/frame_format.h"
#include "server/merge.h"
#include "server/shuffle_registry.h"
#include "server/worker_pool.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {

/// The one place an absl::Status becomes a grpc::Status (the codes share their numbering).
grpc::Status ToGrpc(const absl::Status& st);

class ShuffleServiceImpl final : public v1::ShuffleService::CallbackService {
 public:
  struct Deps {
    ShuffleRegistry* registry;
    WorkerPool* pool;
    MemoryBudget* budget;
    FrameLimits limits;
    MergeOptions merge;
    Gate* merge_gate;  ///< bounds concurrent KEY merges (each holds up to fan-in frames)
    uint64_t max_frames_per_attempt = uint64_t{1} << 20;
  };
  explicit ShuffleServiceImpl(Deps deps) : deps_(deps) {}

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
  static void FillInfo(const ShuffleStore& store, bool partitions, v1::ShuffleInfo* info);
  const Deps deps_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SHUFFLE_SERVICE_H_
