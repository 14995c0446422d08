// The gRPC service (callback API): thin glue. Each reactor converts the wire messages and
// forwards them to the transport-free rules (PushAttempt, FetchSession, ShuffleRegistry), and
// never blocks a gRPC thread on disk, validation or compression: that work runs on the
// WorkerPool, and streams resume from there. Included only by sluice_server.cc, so the
// generated gRPC headers stay out of widely included headers.
#ifndef SLUICE_SERVER_SERVICE_SHUFFLE_SERVICE_H_
#define SLUICE_SERVER_SERVICE_SHUFFLE_SERVICE_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cluster/membership.h"
#include "cluster/placement_store.h"
#include "server/security/auth.h"
#include "server/rules/fetch_session.h"
#include "server/metrics/server_metrics.h"
#include "server/rules/push_attempt.h"
#include "server/storage/shuffle_registry.h"
#include "server/security/tenancy.h"
#include "server/runtime/watchdog.h"
#include "server/runtime/worker_pool.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {

/// What one stream may hold, and for how long it may hold it without progress.
struct StreamLimits {
  size_t max_push_streams = 4096;   ///< open push streams, server-wide (--max_push_streams)
  size_t max_fetch_streams = 1024;  ///< open fetch streams, server-wide (--max_fetch_streams)
  /// A push stream waiting this long for its next message is ended with DEADLINE_EXCEEDED and
  /// its attempt discarded (--push_idle_timeout_s).
  std::chrono::milliseconds push_idle_timeout{std::chrono::seconds(300)};
  /// A fetch whose reader takes no chunk for this long is cancelled, giving back its memory
  /// and merge slot (--fetch_stall_timeout_s).
  std::chrono::milliseconds fetch_stall_timeout{std::chrono::seconds(120)};
  /// New push streams are refused past this fill of the data directory's file system, in
  /// percent (--disk_high_water_pct; 0 = never).
  uint32_t disk_high_water_pct = 95;
};

/// Who this server is, for GetNode and ListNodes: filled in once the server listens.
struct NodeState {
  mutable std::mutex mu;
  std::string node_id;
  std::string address;
  uint64_t started_unix_ms = 0;
  bool clustered = false;                ///< runs with --etcd (set before it serves)
  std::atomic<bool> draining{false};     ///< new push streams are refused
  Membership* membership = nullptr;      ///< with --etcd, once joined
  PlacementStore* placements = nullptr;  ///< with --etcd: the cluster's shuffles
  /// With --etcd: per shuffle, its shape and which of its partitions this server keeps. A
  /// placement never changes, so it is read from etcd once; dropped when the shuffle is deleted
  /// here.
  struct Kept {
    uint32_t partitions = 0, mappers = 0;
    std::vector<bool> partition;  ///< kept here
    bool any = false;
  };
  mutable std::map<std::string, std::shared_ptr<const Kept>> kept;
  /// With --etcd: shuffles found holding every mapper the cluster decided (ResolvePending).
  mutable std::set<std::string> checked;
};

/// The admin calls' part of the server.
struct AdminDeps {
  std::function<void(std::chrono::milliseconds grace)> drain;  ///< SluiceServer::Drain
  std::chrono::milliseconds drain_grace{30000};                ///< --drain_grace_s
  bool allow_remote = false;                                   ///< --allow_remote_admin
};

class ShuffleServiceImpl final : public v1::ShuffleService::CallbackService {
 public:
  struct Deps {
    ShuffleRegistry* registry;
    WorkerPool* pool;        ///< push work, fetch setup, UNORDERED fetches
    WorkerPool* meta_pool;   ///< the small calls (Create/Get/List/Delete): never behind bulk work
    WorkerPool* merge_pool;  ///< KEY fetches' merges, which can run long
    MemoryBudget* budget;
    PushLimits push;
    FetchDeps fetch;
    Gate* merge_gate;  ///< bounds concurrent KEY merges (each holds up to fan-in frames)
    Watchdog* watchdog;
    StreamLimits streams;
    const NodeState* node;
    AdminDeps admin;
    ServerMetrics* metrics;
    const Authenticator* auth = nullptr;  ///< null: no credentials asked for (--auth_file)
    TenantLimits quotas;                  ///< tenants' quotas where their lines set none
    Tenants* tenants = nullptr;
  };
  explicit ShuffleServiceImpl(Deps deps) : deps_(std::move(deps)) {}

  /// Open streams, counted against StreamLimits.
  struct Counts {
    std::atomic<size_t> push{0};
    std::atomic<size_t> fetch{0};
  };
  const Counts& counts() const { return counts_; }

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

 private:
  // CreateShuffle for `who`: its id qualified, its shuffle quota checked.
  absl::StatusOr<bool> CreateFor(const Identity& who, const v1::CreateShuffleRequest& req);
  // The shuffles `who` has (here; in a cluster, recorded in etcd) that count against its
  // quota when it creates `id` (kept id): 0 if it has `id` already.
  absl::StatusOr<size_t> TenantShuffles(const Identity& who, const std::string& id, bool clustered);
  // DeleteShuffle of a shuffle by the id the server keeps it by.
  absl::Status DeleteKept(const std::string& id);
  // CreateShuffle in a cluster: placed and recorded in etcd, and made here if this server
  // holds any of its partitions.
  absl::StatusOr<bool> CreateInCluster(const ShuffleParams& params, uint32_t replication);
  absl::Status FillPlacement(const std::string& id, v1::Placement* resp);
  // CommitMapper: the winning attempt of the mapper (decided in etcd in a cluster, by this
  // server's own store on its own), applied to this server's store.
  absl::StatusOr<uint64_t> DecideMapper(const std::string& id, uint32_t mapper, uint64_t attempt);

  const Deps deps_;
  Counts counts_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SERVICE_SHUFFLE_SERVICE_H_
