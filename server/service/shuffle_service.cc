#include "server/service/shuffle_service.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/rules/split_plan.h"
#include "server/service/call_edge.h"
#include "server/service/fetch_reactor.h"
#include "server/service/push_reactor.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

constexpr uint32_t kMaxPartitionsPerPage = 16384;
constexpr uint32_t kDefaultShufflesPerPage = 1000;
constexpr uint32_t kMaxShufflesPerPage = 10000;

// A shuffle whose recovery failed, as the caller knows it.
void FillDamaged(const CallContext& call, const DamagedShuffle& d, v1::ShuffleInfo* info) {
  info->set_shuffle_id(call.Shown(d.params.shuffle_id));
  info->set_num_partitions(d.params.num_partitions);
  info->set_num_mappers(d.params.num_mappers);
  const auto code = d.reason.code();
  if (code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kNotFound) {
    info->set_damaged(true);
    info->set_damage(std::string(d.reason.message()));
  } else {  // not opened at start (out of descriptors, say): nothing is wrong with its data
    info->set_wedged(true);
    info->set_wedge(std::string(d.reason.message()));
  }
}

// The shuffle's summary, as the caller knows it, and, when `max_partitions` > 0, the details of
// up to that many of its stored partitions from `first` on. `sizes`: its partitions and the
// stored partitions listed (in a cluster, a huge partition's segments follow the partitions;
// PlacementCache::Sizes).
void FillInfo(const CallContext& call, const ShuffleStore& store, uint32_t first,
              uint32_t max_partitions, v1::ShuffleInfo* info, uint32_t hot_keys,
              PlacementCache::Sizes sizes) {
  const ShuffleParams& p = store.params();
  info->set_shuffle_id(call.Shown(p.shuffle_id));
  info->set_num_partitions(sizes.partitions);
  info->set_stored_partitions(sizes.listed);
  info->set_num_mappers(p.num_mappers);
  for (uint32_t m : store.ReportedMappers()) info->add_committed_mappers(m);
  if (store.wedged()) {
    info->set_wedged(true);
    info->set_wedge(std::string(store.WedgedError().message()));
  }
  if (max_partitions == 0) return;
  const uint32_t end =
      static_cast<uint32_t>(std::min<uint64_t>(sizes.listed, uint64_t{first} + max_partitions));
  for (uint32_t i = first; i < end; ++i) {
    const PartitionStats s = store.ReportedStats(i);
    auto* pi = info->add_partitions();
    pi->set_partition_id(i);
    pi->set_records(s.records);
    pi->set_bytes(s.bytes);
    pi->set_frames(s.frames);
    if (const ShuffleStore::MergedStats m = store.Merged(i); m.runs > 0) {
      pi->set_premerged_runs(m.runs);
      pi->set_premerged_mappers(m.mappers);
      pi->set_premerged_bytes(m.bytes);
    }
    if (hot_keys > 0) {
      for (const HotKey& h : store.HotKeys(i, hot_keys)) {
        v1::HotKey* k = pi->add_hot_keys();
        k->set_key(h.key);
        k->set_key_cut(h.cut);
        k->set_records(h.records);
        k->set_bytes(h.bytes);
        k->set_error(h.error);
      }
    }
    if (absl::Status damage = store.PartitionDamage(i); !damage.ok()) {
      pi->set_damaged(true);
      pi->set_damage(std::string(damage.message()));
    }
  }
  info->set_next_partition(end < sizes.listed ? end : 0);
}

// Each data directory's state and space; the node's totals over the healthy ones, each file
// system once. Without `contents` (a tenant asks), not what the directories hold nor why one
// failed: those speak of every tenant's shuffles.
void FillDataDirs(const ShuffleRegistry& registry, bool contents, v1::NodeInfo* resp) {
  std::set<uint64_t> counted;  // file systems (devices)
  const auto dirs = registry.DataDirs();
  for (size_t i = 0; i < dirs.size(); ++i) {
    v1::DataDirStatus* d = resp->add_data_dirs();
    d->set_index(static_cast<uint32_t>(i + 1));
    d->set_failed(!dirs[i].failed.ok());
    if (!dirs[i].failed.ok() && contents) d->set_error(std::string(dirs[i].failed.message()));
    if (contents) {
      d->set_shuffles(static_cast<uint32_t>(dirs[i].shuffles));
      d->set_partitions(dirs[i].partitions);
    }
    if (!dirs[i].space_known) continue;
    d->set_disk_free_bytes(dirs[i].free_bytes);
    d->set_disk_total_bytes(dirs[i].total_bytes);
    if (d->failed() || !counted.insert(dirs[i].device).second) continue;
    resp->set_disk_free_bytes(resp->disk_free_bytes() + d->disk_free_bytes());
    resp->set_disk_total_bytes(resp->disk_total_bytes() + d->disk_total_bytes());
  }
}

void FillNode(const NodeEntry& n, v1::NodeEntry* e) {
  e->set_node_id(n.node_id);
  e->set_address(n.address);
  e->set_started_unix_ms(n.started_unix_ms);
}

}  // namespace

grpc::ServerUnaryReactor* ShuffleServiceImpl::Unary(
    grpc::CallbackServerContext* ctx, std::function<absl::Status(const CallContext&)> handle) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<CallContext> call = ResolveCaller(deps_, ctx);
  if (!call.ok()) {
    reactor->Finish(ToCaller(call.status()));
    return reactor;
  }
  // Store locks may wait on a sync, and the cluster's record is in etcd: off gRPC's threads.
  deps_.meta_pool->Submit([reactor, call = *std::move(call), handle = std::move(handle)] {
    reactor->Finish(ToCaller(handle(call)));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::CreateShuffle(grpc::CallbackServerContext* ctx,
                                                            const v1::CreateShuffleRequest* req,
                                                            v1::CreateShuffleResponse* resp) {
  return Unary(ctx, [this, req, resp](const CallContext& call) -> absl::Status {
    SLUICE_ASSIGN_OR_RETURN(const std::string id, call.Kept(req->shuffle_id()));
    ClusterNode& node = *deps_.node;
    // The tenant's shuffle quota holds until the shuffle is made. In a cluster, the tenant's
    // shuffles recorded there count, wherever they are kept.
    SLUICE_ASSIGN_OR_RETURN(const auto admitted,
                            CreateAdmission::Enter(call, deps_.admission.tenants, node.clustered(),
                                                   [&](const std::string& prefix) {
                                                     return node.decisions().CountForCreate(prefix,
                                                                                            id);
                                                   }));
    SLUICE_ASSIGN_OR_RETURN(
        const bool created,
        node.decisions().Create(ShuffleParams{id, req->num_partitions(), req->num_mappers()},
                                req->replication()));
    resp->set_created(created);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::GetShuffle(grpc::CallbackServerContext* ctx,
                                                         const v1::GetShuffleRequest* req,
                                                         v1::ShuffleInfo* resp) {
  return Unary(ctx, [this, req, resp](const CallContext& call) -> absl::Status {
    SLUICE_ASSIGN_OR_RETURN(const std::string id, call.Kept(req->shuffle_id()));
    SLUICE_RETURN_IF_ERROR(deps_.node->PrepareToServe(id, std::nullopt, req->placement_epoch()));
    if (auto damaged = deps_.registry->FindDamaged(id)) {
      FillDamaged(call, *damaged, resp);
      resp->set_placement_epoch(deps_.node->placements().KnownEpoch(id));
      return absl::OkStatus();
    }
    SLUICE_ASSIGN_OR_RETURN(const auto store, deps_.registry->Get(id));
    const PlacementCache::Sizes sizes =
        deps_.node->placements().SizesOf(id, store->params().num_partitions);
    const uint32_t partitions = sizes.listed;
    if (req->first_partition() >= partitions) {
      return absl::InvalidArgumentError(absl::StrCat("first_partition ", req->first_partition(),
                                                     " is out of range [0, ", partitions, ")"));
    }
    const uint32_t page = req->max_partitions() == 0
                              ? kMaxPartitionsPerPage
                              : std::min(req->max_partitions(), kMaxPartitionsPerPage);
    if (req->hot_keys() > kHotKeysKept) {
      return absl::InvalidArgumentError(absl::StrCat("hot_keys ", req->hot_keys(),
                                                     " is more than the ", kHotKeysKept,
                                                     " a partition's sketch keeps"));
    }
    store->Touch();
    FillInfo(call, *store, req->first_partition(), page, resp, req->hot_keys(), sizes);
    resp->set_placement_epoch(deps_.node->placements().KnownEpoch(id));
    for (v1::PartitionInfo& pi : *resp->mutable_partitions()) {
      const std::vector<uint32_t> lacking =
          deps_.node->decisions().LackingMappers(id, pi.partition_id());
      pi.set_missing_mappers(static_cast<uint32_t>(lacking.size()));
      pi.mutable_lacking_mappers()->Add(lacking.begin(), lacking.end());
      const std::vector<uint32_t> lost = deps_.node->decisions().LostMappers(id, pi.partition_id());
      pi.mutable_lost_mappers()->Add(lost.begin(), lost.end());
      pi.set_not_kept(!deps_.node->placements().KeepsEver(id, pi.partition_id()));
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::ListShuffles(grpc::CallbackServerContext* ctx,
                                                           const v1::ListShufflesRequest* req,
                                                           v1::ListShufflesResponse* resp) {
  return Unary(ctx, [this, req, resp](const CallContext& call) {
    const uint32_t page = req->page_size() == 0 ? kDefaultShufflesPerPage
                                                : std::min(req->page_size(), kMaxShufflesPerPage);
    // A tenant sees its own shuffles only, by the ids it knows them by. One look at the registry
    // lists each shuffle once, whatever opens or closes meanwhile (one more than a page says
    // whether another page follows).
    std::vector<ShuffleRegistry::Listed> listed = deps_.registry->ListPage(
        call.prefix(), call.prefix() + req->page_token(), static_cast<size_t>(page) + 1);
    const bool more = listed.size() > page;
    if (more) listed.pop_back();
    for (const ShuffleRegistry::Listed& l : listed) {
      v1::ShuffleInfo* info = resp->add_shuffles();
      if (l.store != nullptr) {
        FillInfo(call, *l.store, 0, 0, info, 0,
                 deps_.node->placements().SizesOf(l.id, l.store->params().num_partitions));
      } else if (l.damaged.has_value()) {
        FillDamaged(call, *l.damaged, info);
      } else {
        // Not open now: its parameters from its SHUFFLE file, not opened for this. (Gone since:
        // deleted meanwhile, it is not listed.)
        absl::StatusOr<ShuffleParams> params = deps_.registry->ReadParams(l.id);
        if (!params.ok()) {
          resp->mutable_shuffles()->RemoveLast();
          continue;
        }
        info->set_shuffle_id(call.Shown(l.id));
        info->set_num_partitions(params->num_partitions);
        info->set_num_mappers(params->num_mappers);
        info->set_unopened(true);
      }
    }
    if (more) resp->set_next_page_token(call.Shown(listed.back().id));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::DeleteShuffle(grpc::CallbackServerContext* ctx,
                                                            const v1::DeleteShuffleRequest* req,
                                                            v1::DeleteShuffleResponse*) {
  return Unary(ctx, [this, req](const CallContext& call) -> absl::Status {
    SLUICE_ASSIGN_OR_RETURN(const std::string id, call.Kept(req->shuffle_id()));
    return deps_.node->decisions().Delete(id);
  });
}

grpc::ServerReadReactor<v1::PushRequest>* ShuffleServiceImpl::Push(grpc::CallbackServerContext* ctx,
                                                                   v1::PushResponse* resp) {
  return StartPush(deps_, ctx, resp);
}

grpc::ServerBidiReactor<v1::PushRequest, v1::PushReply>* ShuffleServiceImpl::PushFlow(
    grpc::CallbackServerContext* ctx) {
  return StartPushFlow(deps_, ctx);
}

grpc::ServerWriteReactor<v1::FetchResponse>* ShuffleServiceImpl::Fetch(
    grpc::CallbackServerContext* ctx, const v1::FetchRequest* req) {
  return StartFetch(deps_, ctx, req);
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::GetNode(grpc::CallbackServerContext* ctx,
                                                      const v1::GetNodeRequest*,
                                                      v1::NodeInfo* resp) {
  return Unary(ctx, [this, resp](const CallContext& call) {  // statvfs: off-thread
    const ClusterNode& node = *deps_.node;
    const ClusterMembership::Self self = node.membership().self();
    resp->set_node_id(self.node_id);
    resp->set_address(self.address);
    resp->set_started_unix_ms(self.started_unix_ms);
    // Runs with --etcd (before it has joined too: a client that asks then must route by
    // placements, which answer "still joining" until it has).
    resp->set_clustered(node.clustered());
    resp->set_protocol(2);
    resp->set_registered(node.membership().registered());
    resp->set_serving(!node.membership().draining());
    // A tenant's own (the others' are not its business).
    const bool everything = call.prefix().empty();
    FillDataDirs(*deps_.registry, everything, resp);
    resp->set_memory_budget_bytes(deps_.admission.budget->limit());
    resp->set_memory_used_bytes(deps_.admission.budget->used());
    resp->set_shuffles(
        static_cast<uint32_t>(everything ? deps_.registry->open_count() + deps_.registry->unopened()
                                         : deps_.registry->CountWithPrefix(call.prefix())));
    if (everything) {
      uint64_t damaged = 0;
      deps_.registry->ForEachOpen([&](const std::shared_ptr<ShuffleStore>& store) {
        damaged += store->DamagedPartitions().size();
      });
      resp->set_shuffles_unopened(static_cast<uint32_t>(deps_.registry->unopened()));
      resp->set_index_bytes(deps_.registry->index_bytes());
      resp->set_damaged_partitions(static_cast<uint32_t>(damaged));
      if (deps_.metrics != nullptr) resp->set_scrubbed_bytes(deps_.metrics->scrub_bytes.load());
      resp->set_repair_backlog(deps_.node->decisions().MissingTotal());
      resp->set_decommissioning(deps_.node->membership().decommissioning());
      if (deps_.metrics != nullptr) {
        resp->set_repaired_bytes(deps_.metrics->repair_bytes.load());
        resp->set_fetch_stored_bytes(deps_.metrics->fetch_stored_bytes.load());
        resp->set_premerge_read_bytes(deps_.metrics->premerge_read_bytes.load());
        resp->set_premerge_written_bytes(deps_.metrics->premerge_bytes.load());
        resp->set_premerging(deps_.metrics->premerging.load() != 0);
        resp->set_repair_backlog_bytes(deps_.metrics->repair_backlog_bytes.load());
      }
    }
    resp->set_push_streams(static_cast<uint32_t>(deps_.admission.streams->push()));
    resp->set_fetch_streams(static_cast<uint32_t>(deps_.admission.streams->fetch()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::ListNodes(grpc::CallbackServerContext* ctx,
                                                        const v1::ListNodesRequest*,
                                                        v1::ListNodesResponse* resp) {
  return Unary(ctx, [this, resp](const CallContext&) -> absl::Status {  // asks etcd
    SLUICE_ASSIGN_OR_RETURN(const std::vector<NodeEntry> nodes, deps_.node->membership().Nodes());
    for (const NodeEntry& n : nodes) FillNode(n, resp->add_nodes());
    for (const ClusterNode::Absent& a : deps_.node->AbsentNodes()) {
      v1::AbsentNode* out = resp->add_absent();
      out->set_node_id(a.node_id);
      out->set_absent_ms(static_cast<uint64_t>(a.absent.count()));
      out->set_dead(a.dead);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::GetPlacement(grpc::CallbackServerContext* ctx,
                                                           const v1::GetPlacementRequest* req,
                                                           v1::Placement* resp) {
  return Unary(ctx, [this, req, resp](const CallContext& call) -> absl::Status {
    resp->set_shuffle_id(req->shuffle_id());
    SLUICE_ASSIGN_OR_RETURN(const std::string id, call.Kept(req->shuffle_id()));
    SLUICE_ASSIGN_OR_RETURN(const PlacementCache::Placement p,
                            deps_.node->placements().GetPlacement(id, req->known_revision()));
    resp->set_clustered(p.clustered);
    resp->set_revision(p.revision);
    if (p.unchanged) {
      resp->set_unchanged(true);
      return absl::OkStatus();
    }
    resp->set_num_partitions(p.partitions);
    resp->set_num_mappers(p.mappers);
    resp->set_replication(p.replication);
    resp->set_age_ms(static_cast<uint64_t>(p.age.count()));
    resp->set_placement_epoch(p.epoch);
    for (const NodeEntry& n : p.nodes) FillNode(n, resp->add_nodes());
    for (const auto& replicas : p.replicas) {
      auto* r = resp->add_partitions();
      for (uint32_t i : replicas) r->add_nodes(i);
    }
    for (size_t k = 0; k < p.segments.size(); ++k) {
      v1::PlacementSegment* g = resp->add_segments();
      g->set_partition_id(p.partitions + static_cast<uint32_t>(k));
      g->set_parent(p.segments[k].parent);
      for (uint32_t i : p.segments[k].replicas) g->add_nodes(i);
    }
    resp->set_split_bytes(p.split_bytes);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::CommitMapper(grpc::CallbackServerContext* ctx,
                                                           const v1::CommitMapperRequest* req,
                                                           v1::CommitMapperResponse* resp) {
  return Unary(ctx, [this, req, resp](const CallContext& call) -> absl::Status {  // syncs
    SLUICE_ASSIGN_OR_RETURN(const std::string id, call.Kept(req->shuffle_id()));
    SLUICE_ASSIGN_OR_RETURN(const uint64_t winner,
                            deps_.node->decisions().DecideMapper(
                                id, req->mapper_id(), req->attempt_id(), req->placement_epoch()));
    resp->set_winning_attempt(winner);
    resp->set_duplicate(winner != req->attempt_id());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::RevokeMappers(grpc::CallbackServerContext* ctx,
                                                            const v1::RevokeMappersRequest* req,
                                                            v1::RevokeMappersResponse* resp) {
  return Unary(ctx, [this, req, resp](const CallContext& call) -> absl::Status {  // asks etcd
    SLUICE_ASSIGN_OR_RETURN(const std::string id, call.Kept(req->shuffle_id()));
    const std::vector<uint32_t> mappers(req->mappers().begin(), req->mappers().end());
    SLUICE_ASSIGN_OR_RETURN(
        const ClusterDecisions::Revoked revoked,
        deps_.node->decisions().RevokeMappers(id, mappers, req->placement_epoch()));
    resp->set_placement_epoch(revoked.epoch);
    resp->mutable_attempts()->Add(revoked.attempts.begin(), revoked.attempts.end());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::ReviveShuffle(grpc::CallbackServerContext* ctx,
                                                            const v1::ReviveShuffleRequest* req,
                                                            v1::ReviveShuffleResponse* resp) {
  return Unary(ctx, [this, req, resp](const CallContext& call) -> absl::Status {  // asks etcd
    SLUICE_ASSIGN_OR_RETURN(const std::string id, call.Kept(req->shuffle_id()));
    if (req->node_id().empty() || req->node_id().size() > 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("node_id must name a server of the shuffle (1 to 256 bytes), not ",
                       req->node_id().size(), " bytes"));
    }
    SLUICE_ASSIGN_OR_RETURN(const ClusterNode::Revived revived,
                            deps_.node->Revive(id, req->placement_epoch(), req->node_id()));
    resp->set_placement_epoch(revived.epoch);
    resp->set_revived(revived.revived);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::GetSplits(grpc::CallbackServerContext* ctx,
                                                        const v1::GetSplitsRequest* req,
                                                        v1::GetSplitsResponse* resp) {
  return Unary(ctx, [this, req, resp](const CallContext& call) -> absl::Status {
    SLUICE_ASSIGN_OR_RETURN(const std::string id, call.Kept(req->shuffle_id()));
    SLUICE_RETURN_IF_ERROR(
        deps_.node->PrepareToServe(id, req->partition_id(), req->placement_epoch()));
    SLUICE_ASSIGN_OR_RETURN(const auto store, deps_.registry->Get(id));
    if (req->partition_id() >= store->params().num_partitions) {
      return absl::InvalidArgumentError(absl::StrCat("partition ", req->partition_id(),
                                                     " is out of range [0, ",
                                                     store->params().num_partitions, ")"));
    }
    SLUICE_RETURN_IF_ERROR(store->PartitionDamage(req->partition_id()));
    store->Touch();
    SLUICE_ASSIGN_OR_RETURN(
        const SplitPlan plan,
        PlanSplits(store->SampleBlocks(req->partition_id(), kMaxPlanFrames), req->slices()));
    for (const std::string& key : plan.keys) resp->add_split_keys(key);
    resp->mutable_slice_bytes()->Add(plan.slice_bytes.begin(), plan.slice_bytes.end());
    resp->set_partition_bytes(plan.bytes);
    resp->set_frames(plan.frames);
    resp->set_frames_without_bounds(plan.frames_without_bounds);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::Decommission(grpc::CallbackServerContext* ctx,
                                                           const v1::DecommissionRequest*,
                                                           v1::DecommissionResponse* resp) {
  return Unary(ctx, [this, resp](const CallContext& call) -> absl::Status {  // asks etcd, peers
    if (!call.admin()) {
      return absl::PermissionDeniedError(
          "Decommission needs an admin credential (role admin in --auth_file)");
    }
    if (!deps_.admin.allow_remote && !call.local()) {
      return absl::PermissionDeniedError(
          "Decommission is taken only from the server's own host (loopback) unless the server "
          "runs with --allow_remote_admin");
    }
    SLUICE_ASSIGN_OR_RETURN(const DecommissionState state, deps_.admin.decommission());
    resp->set_done(state.done);
    resp->set_shuffles_placed(state.shuffles_placed);
    resp->set_partitions_short(state.partitions_short);
    resp->set_waiting_for(state.waiting_for);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::Drain(grpc::CallbackServerContext* ctx,
                                                    const v1::DrainRequest* req,
                                                    v1::DrainResponse* resp) {
  return Unary(ctx, [this, req, resp](const CallContext& call) -> absl::Status {
    if (!call.admin()) {
      return absl::PermissionDeniedError(
          "Drain needs an admin credential (role admin in --auth_file)");
    }
    if (!deps_.admin.allow_remote && !call.local()) {
      return absl::PermissionDeniedError(
          "Drain is taken only from the server's own host (loopback) unless the server runs with "
          "--allow_remote_admin");
    }
    const std::chrono::milliseconds grace = req->grace_seconds() == 0
                                                ? deps_.admin.drain_grace
                                                : std::chrono::seconds(req->grace_seconds());
    resp->set_push_streams(static_cast<uint32_t>(deps_.admission.streams->push()));
    resp->set_fetch_streams(static_cast<uint32_t>(deps_.admission.streams->fetch()));
    spdlog::info("event=drain_asked peer={} tenant={} grace_ms={}", call.peer(),
                 call.tenant().empty() ? "-" : call.tenant(), grace.count());
    deps_.admin.drain(grace);  // leaves the cluster: asks etcd
    return absl::OkStatus();
  });
}

}  // namespace sluice
