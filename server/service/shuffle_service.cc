#include "server/service/shuffle_service.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codec/status_macros.h"
#include "rpc/grpc_glue.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

// What a client is told: the status, with paths relative to the data directory, and its
// shuffles by the ids it knows them by.
grpc::Status ToClient(const ShuffleServiceImpl::Deps& deps, const Identity& who,
                      const absl::Status& st) {
  return st.ok() ? grpc::Status::OK
                 : rpc::ToGrpcStatus(ForCaller(who, deps.registry->WithRelativePaths(st)));
}
// Who calls (with --auth_file), or UNAUTHENTICATED; everyone, as an admin, without it.
absl::StatusOr<Identity> Caller(const ShuffleServiceImpl::Deps& deps,
                                const grpc::CallbackServerContext* ctx) {
  if (deps.auth == nullptr) return Identity{};
  absl::string_view authorization;
  const auto& metadata = ctx->client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  std::string cert_name;
  if (auto auth = ctx->auth_context(); auth != nullptr && auth->IsPeerAuthenticated()) {
    const auto names = auth->FindPropertyValues("x509_common_name");
    if (!names.empty()) cert_name.assign(names[0].data(), names[0].size());
  }
  return deps.auth->Authenticate(authorization, cert_name);
}
// The caller, or nullopt once `reactor` (of any kind of call) is finished with the refusal.
template <typename Reactor>
std::optional<Identity> Who(const ShuffleServiceImpl::Deps& deps,
                            const grpc::CallbackServerContext* ctx, Reactor* reactor) {
  absl::StatusOr<Identity> who = Caller(deps, ctx);
  if (who.ok()) return *std::move(who);
  reactor->Finish(rpc::ToGrpcStatus(who.status()));
  return std::nullopt;
}
// The cluster as one call sees it. A clustered server serves before it has joined (the
// port comes first): cluster calls then say so instead of acting as a server on its own.
struct ClusterView {
  bool clustered = false;
  Membership* membership = nullptr;
  PlacementStore* placements = nullptr;
  std::string node_id;

  absl::Status Joined() const {
    if (placements != nullptr) return absl::OkStatus();
    return absl::UnavailableError("the server is still joining its cluster; retry");
  }
};
ClusterView Cluster(const NodeState& node) {
  std::lock_guard<std::mutex> lock(node.mu);
  return ClusterView{node.clustered, node.membership, node.placements, node.node_id};
}

using Kept = std::shared_ptr<const NodeState::Kept>;

Kept KeptOf(const ShufflePlacement& p, const std::string& node_id) {
  auto k = std::make_shared<NodeState::Kept>();
  k->partitions = p.num_partitions;
  k->mappers = p.num_mappers;
  k->partition.assign(p.num_partitions, false);
  for (size_t q = 0; q < p.replicas.size() && q < p.num_partitions; ++q) {
    for (uint32_t i : p.replicas[q]) {
      if (i < p.nodes.size() && p.nodes[i] == node_id) k->partition[q] = k->any = true;
    }
  }
  return k;
}

void Remember(const NodeState& node, const std::string& id, Kept kept) {
  std::lock_guard<std::mutex> lock(node.mu);
  node.kept[id] = std::move(kept);
}

// What this server keeps of shuffle `id`: null on its own (it keeps everything) or for a
// shuffle the cluster has no record of. From memory after the first etcd read.
absl::StatusOr<Kept> KeptPartitions(const ShuffleServiceImpl::Deps& deps, const std::string& id) {
  const ClusterView c = Cluster(*deps.node);
  if (!c.clustered) return Kept();
  {
    std::lock_guard<std::mutex> lock(deps.node->mu);
    if (auto it = deps.node->kept.find(id); it != deps.node->kept.end()) return it->second;
  }
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_ASSIGN_OR_RETURN(auto placed, c.placements->Get(id));
  if (!placed.has_value()) return Kept();  // (not remembered: it may be created later)
  Kept kept = KeptOf(*placed, c.node_id);
  Remember(*deps.node, id, kept);
  return kept;
}

// FAILED_PRECONDITION for a partition a cluster placed on other servers: its data is not here,
// and pushing or reading it here would go unnoticed by every reader and writer that follows
// the placement.
absl::Status CheckKept(const ShuffleServiceImpl::Deps& deps, const Kept& kept,
                       const std::string& id, uint32_t partition) {
  if (kept == nullptr || partition >= kept->partition.size() || kept->partition[partition]) {
    return absl::OkStatus();
  }
  std::lock_guard<std::mutex> lock(deps.node->mu);
  return absl::FailedPreconditionError(
      absl::StrCat("server ", deps.node->node_id, " keeps no replica of partition ", partition,
                   " of shuffle '", id, "' (GetPlacement says which servers do)"));
}

// In a cluster, a server learns of a shuffle from etcd: the first push or fetch of a shuffle
// it has no store for creates the store, if the shuffle is recorded and this server holds any
// of its partitions. On its own, or for a shuffle it has, nothing to do.
absl::Status EnsureLocal(const ShuffleServiceImpl::Deps& deps, const std::string& id) {
  const ClusterView c = Cluster(*deps.node);
  if (!c.clustered || deps.registry->Get(id).ok() || deps.registry->FindDamaged(id)) {
    return absl::OkStatus();
  }
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_ASSIGN_OR_RETURN(Kept kept, KeptPartitions(deps, id));
  if (kept == nullptr) return absl::OkStatus();  // the store's own NOT_FOUND says it
  if (!kept->any) {
    return absl::FailedPreconditionError(absl::StrCat("server ", c.node_id,
                                                      " holds no partition of shuffle '", id,
                                                      "' (GetPlacement says which do)"));
  }
  auto created = deps.registry->Create(ShuffleParams{id, kept->partitions, kept->mappers});
  if (created.ok() && *created) {
    spdlog::info("event=create tenant={} shuffle={} partitions={} mappers={} from=etcd",
                 TenantField(id), id, kept->partitions, kept->mappers);
  }
  return created.status();
}

// In a cluster a prepared attempt becomes visible once its mapper's winner is decided in etcd.
// The decider applies it on its own server; every other server learns the decisions here,
// before it serves the shuffle's data or status (also after a restart: etcd is the truth, the
// servers' logs follow it). One etcd read while anything is pending, none after.
absl::Status ResolvePending(const ShuffleServiceImpl::Deps& deps, const std::string& id) {
  const ClusterView c = Cluster(*deps.node);
  if (!c.clustered) return absl::OkStatus();
  auto store = deps.registry->Get(id);
  if (!store.ok()) return absl::OkStatus();  // the caller's own lookup says why
  const std::vector<uint32_t> pending = (*store)->PendingMappers();
  bool checked = false;
  {
    std::lock_guard<std::mutex> lock(deps.node->mu);
    checked = deps.node->checked.count(id) != 0;
  }
  if (pending.empty() && checked) return absl::OkStatus();
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_ASSIGN_OR_RETURN(auto decided, c.placements->Decisions(id));
  std::vector<std::pair<uint32_t, uint64_t>> winners;
  for (uint32_t m : pending) {
    auto d = decided.find(m);
    if (d == decided.end()) continue;  // not decided yet: stays invisible
    winners.emplace_back(m, d->second);
  }
  SLUICE_RETURN_IF_ERROR((*store)->ResolveAll(winners));
  // Every decided mapper is here now, unless this server lost what it had prepared (its data
  // directory lost or replaced): then it must not serve the shuffle as if it were whole. Once
  // whole, later decisions all come through prepares here (a client decides only once every
  // server of the shuffle prepared), so this is checked once per shuffle and server start.
  std::vector<uint32_t> missing;
  for (const auto& [m, attempt] : decided) {
    if ((*store)->CommittedAttempt(m) != std::optional<uint64_t>(attempt)) missing.push_back(m);
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) {
      absl::StrAppend(&list, i == 0 ? "" : ", ", missing[i]);
    }
    if (missing.size() > 8) absl::StrAppend(&list, ", ...");
    spdlog::error("event=shuffle_incomplete tenant={} shuffle={} missing_mappers={} first=\"{}\"",
                  TenantField(id), id, missing.size(), list);
    return absl::DataLossError(absl::StrCat(
        "server ", c.node_id, " lacks ", missing.size(), " mappers of shuffle '", id,
        "' that the cluster committed (", list,
        "): what it had prepared is gone (its data directory lost or replaced?); read another "
        "replica"));
  }
  std::lock_guard<std::mutex> lock(deps.node->mu);
  deps.node->checked.insert(id);
  return absl::OkStatus();
}

using v1::FetchRequest;
using v1::FetchResponse;
using v1::PushRequest;
using v1::PushResponse;

// Takes a slot of `count` (the server's open `kind` streams) if fewer than `limit` are taken;
// else the RESOURCE_EXHAUSTED that names the limit's flag.
grpc::Status Admit(std::atomic<size_t>* count, size_t limit, const char* kind) {
  size_t n = count->load();
  while (n < limit) {
    if (count->compare_exchange_weak(n, n + 1)) return grpc::Status::OK;
  }
  return grpc::Status(
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      absl::StrCat("the server has ", limit, " ", kind, " streams open, its limit (--max_", kind,
                   "_streams); retry later"));
}

// A new stream of `who`: one of its tenant's streams (Tenants) and one of the server's
// `kind` streams, `count` (Admit): then *open = count and *tenant_counted say what to give back
// when it is done. Else finishes `reactor` with the refusal and returns false, holding neither.
template <typename Reactor>
bool EnterStream(const ShuffleServiceImpl::Deps& deps, const Identity& who,
                 const TenantLimits& limits, std::atomic<size_t>* count, size_t limit,
                 const char* kind, std::atomic<size_t>** open, bool* tenant_counted,
                 Reactor* reactor) {
  if (limits.streams != 0) {
    if (absl::Status st = deps.tenants->Enter(who.tenant, limits.streams); !st.ok()) {
      reactor->Finish(rpc::ToGrpcStatus(st));
      return false;
    }
  }
  if (grpc::Status st = Admit(count, limit, kind); !st.ok()) {
    if (limits.streams != 0) deps.tenants->Leave(who.tenant);
    reactor->Finish(st);
    return false;
  }
  *tenant_counted = limits.streams != 0;
  *open = count;
  return true;
}

std::string Seconds(std::chrono::milliseconds d) {
  return absl::StrCat(std::chrono::duration<double>(d).count());
}

// A stream's wait for progress (the next message, the reader taking a chunk): kWaiting until
// either the event (kBusy) or the watchdog (kExpired) claims it, whichever comes first.
enum Phase : int { kBusy = 0, kWaiting = 1, kExpired = 2 };

// One mapper attempt: open, frames..., commit. Reads one message at a time; each is handled on
// the pool by the PushAttempt, and the next read starts only once it is done and the memory
// budget has room (back-pressure is not reading). A message is at most kMaxPushMessageBytes; a
// frame larger than that is announced with its size (PushLargeFrame), and the size is reserved
// in the budget before its first piece is read, so that no number of streams pushing large
// frames at once takes the server more than a message each past its budget.
class PushReactor final : public grpc::ServerReadReactor<PushRequest> {
 public:
  PushReactor(const ShuffleServiceImpl::Deps& deps, std::atomic<size_t>* streams,
              grpc::CallbackServerContext* ctx, PushResponse* response)
      : deps_(deps), ctx_(ctx), response_(response), attempt_(deps.registry, deps.push) {
    std::optional<Identity> who = Who(deps_, ctx_, this);
    if (!who) return;
    who_ = *std::move(who);
    limits_ = LimitsOf(who_, deps_.quotas);
    if (deps_.node->draining.load()) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the server is draining (shutting down): it takes no new push "
                          "streams; retry the attempt once it is back"));
      return;
    }
    if (!EnterStream(deps_, who_, limits_, streams, deps_.streams.max_push_streams, "push", &open_,
                     &tenant_counted_, this)) {
      return;
    }
    ReadNext();
  }

  void OnReadDone(bool ok) override {
    int waiting = kWaiting;
    const bool ours = phase_.compare_exchange_strong(waiting, kBusy);
    deps_.watchdog->Disarm(watch_);
    if (!ours) return;  // the idle timeout ended the stream (Expire)
    if (!ok) {          // the client closed, cancelled or broke the stream without a commit
      deps_.pool->Submit([this] {
        // OnCancel may come after this read's failure: ask the call itself too.
        Fail(cancelled_.load() || ctx_->IsCancelled()
                 ? absl::CancelledError("push stream cancelled; the attempt was discarded")
                 : absl::FailedPreconditionError(
                       "push stream ended without a commit message; the attempt was discarded"));
      });
      return;
    }
    charged_ = request_.ByteSizeLong();
    deps_.budget->Charge(charged_);
    deps_.pool->Submit([this] { Handle(); });
  }

  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override {
    deps_.watchdog->Disarm(watch_);
    if (open_ != nullptr) open_->fetch_sub(1);
    if (tenant_counted_) deps_.tenants->Leave(who_.tenant);
    if (quota_reserved_ != 0) tenant_bytes_->fetch_sub(static_cast<int64_t>(quota_reserved_));
    delete this;
  }

 private:
  // The tenant's stored-bytes quota, before `more` bytes are written. With `reserve`, the bytes
  // are counted in the tenant's total at once (a large frame's, while its pieces arrive) until
  // ReleaseReserved.
  absl::Status CheckStored(uint64_t more, bool reserve) {
    if (limits_.stored_bytes == 0) return absl::OkStatus();
    if (tenant_bytes_ == nullptr) tenant_bytes_ = deps_.registry->TenantBytes(who_.tenant);
    int64_t have = tenant_bytes_->load();
    while (true) {
      const uint64_t held = have < 0 ? 0 : static_cast<uint64_t>(have);
      if (held + more > limits_.stored_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "tenant '", who_.tenant, "' holds ", held, " bytes on this server; ", more,
            " more would pass its quota of ", limits_.stored_bytes,
            " (stored_mb: its quota line in --auth_file, else --tenant_max_stored_mb); the "
            "attempt was discarded: delete shuffles it no longer needs"));
      }
      if (!reserve) return absl::OkStatus();
      if (tenant_bytes_->compare_exchange_weak(have, have + static_cast<int64_t>(more))) {
        quota_reserved_ = more;
        return absl::OkStatus();
      }
    }
  }

  // Waits for the next message, for at most the idle timeout.
  void ReadNext() {
    phase_.store(kWaiting);
    watch_ = deps_.watchdog->Arm(Watchdog::Clock::now() + deps_.streams.push_idle_timeout,
                                 [this] { Expire(); });
    StartRead(&request_);
  }

  // On the watchdog's thread: no message came in time. The read stays pending (it completes
  // once the stream ends); the attempt is discarded and the stream ended from the pool.
  void Expire() {
    int waiting = kWaiting;
    if (!phase_.compare_exchange_strong(waiting, kExpired)) return;
    deps_.pool->Submit([this] {
      const absl::Status st = absl::DeadlineExceededError(absl::StrCat(
          "push stream idle for ", Seconds(deps_.streams.push_idle_timeout),
          " s waiting for its next message (--push_idle_timeout_s); the attempt was discarded"));
      Fail(st);  // Abort logs it
    });
  }

  void Handle() {
    absl::Status st = cancelled_.load() ? absl::CancelledError("push stream cancelled") : Forward();
    CountTaken();
    deps_.budget->Release(charged_);
    charged_ = 0;
    if (attempt_.large_frame_size() == 0) ReleaseReserved();  // a large frame is complete
    if (!st.ok()) {
      Fail(st);
      return;
    }
    if (committed_) {
      Finish(grpc::Status::OK);
      return;
    }
    if (const uint64_t n = attempt_.large_frame_size(); n > 0) {
      if (reserved_ == 0) {
        // Just announced: its whole size is reserved before any piece of it is read.
        deps_.budget->Reserve(n, [this, n] {
          reserved_ = n;
          large_since_ = std::chrono::steady_clock::now();
          ReadNext();
        });
      } else {
        ReadNext();  // its memory is reserved already: the next piece may come at once
      }
      return;
    }
    deps_.budget->WhenAvailable([this] { ReadNext(); });
  }

  // Gives back what a large frame held while its pieces came: its memory and its quota bytes.
  void ReleaseReserved() {
    deps_.budget->Release(reserved_);
    reserved_ = 0;
    if (quota_reserved_ != 0) tenant_bytes_->fetch_sub(static_cast<int64_t>(quota_reserved_));
    quota_reserved_ = 0;
  }

  // What the attempt took since the last message, into the server's counters.
  void CountTaken() {
    ServerMetrics& m = *deps_.metrics;
    ServerMetrics::Add(m.push_frames, attempt_.frames() - counted_frames_);
    ServerMetrics::Add(m.push_records, attempt_.records() - counted_records_);
    ServerMetrics::Add(m.push_bytes, attempt_.bytes() - counted_bytes_);
    counted_frames_ = attempt_.frames();
    counted_records_ = attempt_.records();
    counted_bytes_ = attempt_.bytes();
  }

  absl::Status Forward() {
    switch (request_.kind_case()) {
      case PushRequest::kOpen: {
        const auto& open = request_.open();
        SLUICE_ASSIGN_OR_RETURN(const std::string id, QualifiedId(who_, open.shuffle_id()));
        Kept kept;
        if (!attempt_.opened()) {
          SLUICE_RETURN_IF_ERROR(EnsureLocal(deps_, id));
          // New pushes stop at the disk high-water mark, before the disk is full: committed
          // data and the pushes already running keep the room left.
          SLUICE_RETURN_IF_ERROR(deps_.registry->CheckRoom(id, deps_.streams.disk_high_water_pct));
          SLUICE_ASSIGN_OR_RETURN(kept, KeptPartitions(deps_, id));
        }
        return attempt_.Open(
            id, open.mapper_id(), open.attempt_id(),
            kept == nullptr ? nullptr
                            : std::shared_ptr<const std::vector<bool>>(kept, &kept->partition));
      }
      case PushRequest::kFrames: {
        frames_.clear();
        uint64_t bytes = 0;
        for (const auto& pf : request_.frames().frames()) {
          frames_.push_back(PushAttempt::Frame{
              pf.partition_id(),
              absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(pf.frame().data()),
                                  pf.frame().size())});
          bytes += kBlockHeaderSize + pf.frame().size();
        }
        SLUICE_RETURN_IF_ERROR(CheckStored(bytes, /*reserve=*/false));
        return attempt_.AddFrames(frames_);
      }
      case PushRequest::kLargeFrame:
        // Reserved once the announce is taken (its size within the cap, no other pending).
        SLUICE_RETURN_IF_ERROR(attempt_.BeginLargeFrame(request_.large_frame().partition_id(),
                                                        request_.large_frame().frame_size()));
        return CheckStored(kBlockHeaderSize + uint64_t{request_.large_frame().frame_size()},
                           /*reserve=*/true);
      case PushRequest::kPiece: {
        // Its reserved memory is held for at most the idle timeout, however the pieces trickle.
        if (reserved_ > 0 &&
            std::chrono::steady_clock::now() - large_since_ > deps_.streams.push_idle_timeout) {
          return absl::DeadlineExceededError(
              absl::StrCat("a large frame took over ", Seconds(deps_.streams.push_idle_timeout),
                           " s to arrive (--push_idle_timeout_s); the attempt was discarded"));
        }
        const std::string& data = request_.piece().data();
        return attempt_.AddPiece(
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
      }
      case PushRequest::kCommit: {
        const bool prepare = request_.commit().prepare();
        if (!prepare && Cluster(*deps_.node).clustered) {
          return absl::FailedPreconditionError(
              "this server is part of a cluster: an attempt is prepared on every server of its "
              "shuffle (a commit message with prepare) and then decided with CommitMapper; use "
              "a client that takes the server list");
        }
        const auto started = std::chrono::steady_clock::now();
        auto summary = attempt_.Commit(request_.commit().frame_count(),
                                       request_.commit().record_count(), prepare);
        if (!summary.ok()) return summary.status();
        deps_.metrics->commit_seconds.Observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
        ServerMetrics::Add(
            summary->duplicate ? deps_.metrics->duplicate_commits : deps_.metrics->commits, 1);
        response_->set_duplicate(summary->duplicate);
        response_->set_prepared(summary->prepared);
        response_->set_frames(summary->frames);
        response_->set_records(summary->records);
        response_->set_bytes(summary->bytes);
        committed_ = true;
        return absl::OkStatus();
      }
      default:
        return absl::InvalidArgumentError("empty push message");
    }
  }

  void Fail(const absl::Status& st) {
    ReleaseReserved();
    if (attempt_.opened()) ServerMetrics::Add(deps_.metrics->aborted_attempts, 1);
    attempt_.Abort(st);
    Finish(ToClient(deps_, who_, st));
  }

  const ShuffleServiceImpl::Deps& deps_;
  Identity who_;
  TenantLimits limits_;                                 // who_'s
  bool tenant_counted_ = false;                         // one of who_'s streams (Tenants)
  std::shared_ptr<std::atomic<int64_t>> tenant_bytes_;  // who_'s stored bytes (with a quota)
  uint64_t quota_reserved_ = 0;          // of tenant_bytes_, for the large frame being received
  std::atomic<size_t>* open_ = nullptr;  // the server's push stream count, once this one counts
  grpc::CallbackServerContext* const ctx_;
  PushResponse* const response_;
  PushRequest request_;
  PushAttempt attempt_;
  std::vector<PushAttempt::Frame> frames_;  // the current message's, for AddFrames
  uint64_t charged_ = 0;                    // the budget the current message holds
  uint64_t reserved_ = 0;  // the budget held for a large frame's pieces (its announced size)
  std::chrono::steady_clock::time_point large_since_;  // when that budget was granted
  std::atomic<bool> cancelled_{false};
  bool committed_ = false;
  std::atomic<int> phase_{kBusy};
  uint64_t watch_ = 0;  // the watchdog entry of the current wait
  uint64_t counted_frames_ = 0, counted_records_ = 0, counted_bytes_ = 0;  // CountTaken
};

FetchSpec SpecFromRequest(const FetchRequest& req) {
  FetchSpec spec;
  spec.shuffle_id = req.shuffle_id();
  spec.partition = req.partition_id();
  spec.key_order = req.order() == v1::KEY;
  spec.require_complete = req.require_complete();
  spec.layout = rpc::LayoutFromProto(req.layout());
  spec.uncompressed = req.uncompressed();
  spec.zstd_level = req.zstd_level();
  spec.target_chunk_bytes = req.target_chunk_bytes();
  spec.skip_records = req.skip_records();
  spec.only_mappers.assign(req.only_mappers().begin(), req.only_mappers().end());
  return spec;
}

// One partition: the FetchSession's frames, one per response, the next prepared on the pool
// while the previous one is on the wire.
class FetchReactor final : public grpc::ServerWriteReactor<FetchResponse> {
 public:
  FetchReactor(const ShuffleServiceImpl::Deps& deps, std::atomic<size_t>* streams,
               grpc::CallbackServerContext* ctx, const FetchRequest* request)
      : deps_(deps),
        ctx_(ctx),
        spec_(SpecFromRequest(*request)),
        report_mappers_(request->report_mappers()) {
    std::optional<Identity> who = Who(deps_, ctx_, this);
    if (!who) return;
    who_ = *std::move(who);
    absl::StatusOr<std::string> id = QualifiedId(who_, spec_.shuffle_id);
    if (!id.ok()) {
      Finish(ToClient(deps_, who_, id.status()));
      return;
    }
    spec_.shuffle_id = *std::move(id);
    if (!EnterStream(deps_, who_, LimitsOf(who_, deps_.quotas), streams,
                     deps_.streams.max_fetch_streams, "fetch", &open_, &tenant_counted_, this)) {
      return;
    }
    if (spec_.key_order && deps_.budget->MustWait()) {
      // A merge charges the budget as it goes and never waits once it runs (it would wait on
      // memory it holds): one that has not started yet waits its turn, holding nothing, so
      // that a push waiting for a large frame's room is not passed over by merge after merge.
      deps_.budget->WhenAvailable([this] { SetUp(); });
      return;
    }
    SetUp();
  }

  // Setup reads the store under its locks: keep gRPC threads free of any lock wait. A KEY
  // fetch sets up on the merge pool, where its merge runs: with a slot free it goes on to
  // its first chunk there without another hand-over.
  void SetUp() {
    WorkerPool* setup = spec_.key_order ? deps_.merge_pool : deps_.pool;
    setup->Submit([this] {
      absl::Status st = EnsureLocal(deps_, spec_.shuffle_id);
      if (st.ok()) {
        auto kept = KeptPartitions(deps_, spec_.shuffle_id);
        st = kept.ok() ? CheckKept(deps_, *kept, spec_.shuffle_id, spec_.partition) : kept.status();
      }
      if (st.ok()) st = ResolvePending(deps_, spec_.shuffle_id);
      if (!st.ok()) {
        Finish(ToClient(deps_, who_, st));
        return;
      }
      auto session = FetchSession::Make(spec_, deps_.fetch, &cancelled_);
      if (!session.ok()) {
        Finish(ToClient(deps_, who_, session.status()));
        return;
      }
      session_ = std::move(session).value();
      Next();
    });
  }

  void OnWriteDone(bool ok) override {
    int waiting = kWaiting;
    const bool stalled = !phase_.compare_exchange_strong(waiting, kBusy);
    deps_.watchdog->Disarm(watch_);
    session_->Sent();
    if (!ok || stalled) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          stalled ? absl::StrCat("the reader took no chunk for ",
                                                 Seconds(deps_.streams.fetch_stall_timeout),
                                                 " s (--fetch_stall_timeout_s)")
                                  : std::string("fetch stream broken")));
      return;
    }
    if (session_->key_order()) {
      // A merge holds its runs' frames while it waits: waiting on the budget could wait on
      // memory this very fetch holds. Merges are bounded by the merge gate instead, and run
      // on their own pool so that they never hold up pushes or small calls.
      deps_.merge_pool->Submit([this] { Next(); });
    } else {
      // An UNORDERED fetch holds nothing now: it reads its next frame once the budget has room,
      // so that many fetches (or many stalled readers) cannot take the server past it.
      deps_.budget->WhenAvailable([this] { Next(); });
    }
  }
  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override {
    deps_.watchdog->Disarm(watch_);
    if (session_ != nullptr) {
      ServerMetrics::Add(deps_.metrics->merge_passes, session_->merge_passes());
      ServerMetrics::Add(deps_.metrics->merge_spill_bytes, session_->spill_bytes());
    }
    session_.reset();  // returns its budget charges
    if (admitted_) deps_.merge_gate->Leave();
    if (open_ != nullptr) open_->fetch_sub(1);
    if (tenant_counted_) deps_.tenants->Leave(who_.tenant);
    delete this;
  }

 private:
  void Next() {
    if (session_->key_order() && !admitted_) {
      if (deps_.merge_gate->TryEnter()) {  // (we are on the merge pool: go on here)
        admitted_ = true;
      } else {
        // Wait for a merge slot holding nothing; resume on the pool once admitted.
        deps_.merge_gate->Enter([this] {
          admitted_ = true;
          Next();
        });
        return;
      }
    }
    auto more = session_->Next(response_.mutable_frame());
    if (!more.ok()) {
      spdlog::error("event=fetch_failed tenant={} shuffle={} partition={} error=\"{}\"",
                    TenantField(spec_.shuffle_id), spec_.shuffle_id, spec_.partition,
                    std::string(more.status().message()));
      Finish(ToClient(deps_, who_, more.status()));
      return;
    }
    if (!*more) {
      Finish(grpc::Status::OK);
      return;
    }
    CountChunk(response_.frame());
    if (report_mappers_) {  // with the first chunk only
      report_mappers_ = false;
      response_.mutable_mappers()->Add(session_->mappers().begin(), session_->mappers().end());
    } else if (response_.mappers_size() > 0) {
      response_.clear_mappers();
    }
    // The reader must take the chunk within the stall timeout, or the fetch is cancelled (a
    // stalled write cannot be finished with a status: it never leaves the server).
    phase_.store(kWaiting);
    watch_ = deps_.watchdog->Arm(Watchdog::Clock::now() + deps_.streams.fetch_stall_timeout,
                                 [this] { Expire(); });
    if (session_->last()) {
      // The last chunk goes out with the end of the stream: no OnWriteDone, no hop back to
      // the pool only to learn there is nothing more (a wide shuffle's partitions are mostly
      // one chunk: this saves a third of their thread hand-overs).
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    }
    StartWrite(&response_);
  }

  void CountChunk(const std::string& frame) {
    ServerMetrics& m = *deps_.metrics;
    ServerMetrics::Add(m.fetch_chunks, 1);
    ServerMetrics::Add(m.fetch_bytes, frame.size());
    const auto header = ParseFrameHeader(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size()),
        FrameLimits{kMaxFrameCapBytes, ~uint32_t{0}});
    if (header.ok()) ServerMetrics::Add(m.fetch_records, header->record_count);
  }

  // On the watchdog's thread: the write is still pending. Cancelling completes it (ok=false).
  void Expire() {
    int waiting = kWaiting;
    if (!phase_.compare_exchange_strong(waiting, kExpired)) return;
    spdlog::warn(
        "event=fetch_stalled tenant={} shuffle={} partition={} error=\"the reader took no chunk "
        "for "
        "{} s (--fetch_stall_timeout_s); fetch cancelled\"",
        TenantField(spec_.shuffle_id), spec_.shuffle_id, spec_.partition,
        Seconds(deps_.streams.fetch_stall_timeout));
    ctx_->TryCancel();
  }

  const ShuffleServiceImpl::Deps& deps_;
  std::atomic<size_t>* open_ = nullptr;  // the server's fetch stream count, once this one counts
  grpc::CallbackServerContext* const ctx_;
  FetchSpec spec_;  // its shuffle id as the server keeps it
  Identity who_;
  bool tenant_counted_ = false;  // one of who_'s streams (Tenants)
  std::atomic<bool> cancelled_{false};
  std::unique_ptr<FetchSession> session_;
  FetchResponse response_;
  bool report_mappers_;    // the first chunk still to carry the session's mappers
  bool admitted_ = false;  // holds a merge slot
  std::atomic<int> phase_{kBusy};
  uint64_t watch_ = 0;  // the watchdog entry of the current write
};

void FillDamaged(const DamagedShuffle& d, v1::ShuffleInfo* info) {
  info->set_shuffle_id(d.params.shuffle_id);
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

constexpr uint32_t kMaxPartitionsPerPage = 16384;
constexpr uint32_t kDefaultShufflesPerPage = 1000;
constexpr uint32_t kMaxShufflesPerPage = 10000;

// The shuffle's summary and, when `max_partitions` > 0, the details of up to that many of its
// partitions from `first` on.
void FillInfo(const ShuffleStore& store, uint32_t first, uint32_t max_partitions,
              v1::ShuffleInfo* info) {
  const ShuffleParams& p = store.params();
  info->set_shuffle_id(p.shuffle_id);
  info->set_num_partitions(p.num_partitions);
  info->set_num_mappers(p.num_mappers);
  for (uint32_t m : store.CommittedMappers()) info->add_committed_mappers(m);
  if (store.wedged()) {
    info->set_wedged(true);
    info->set_wedge(std::string(store.WedgedError().message()));
  }
  if (max_partitions == 0) return;
  const uint32_t end =
      static_cast<uint32_t>(std::min<uint64_t>(p.num_partitions, uint64_t{first} + max_partitions));
  for (uint32_t i = first; i < end; ++i) {
    const PartitionStats s = store.Stats(i);
    auto* pi = info->add_partitions();
    pi->set_partition_id(i);
    pi->set_records(s.records);
    pi->set_bytes(s.bytes);
    pi->set_frames(s.frames);
  }
  info->set_next_partition(end < p.num_partitions ? end : 0);
}

// `info` as `who` knows the shuffle: by its own id, in the messages too.
void ToCaller(const Identity& who, v1::ShuffleInfo* info) {
  if (TenantPrefix(who).empty()) return;
  info->set_shuffle_id(CallerId(who, info->shuffle_id()));
  info->set_damage(ForCaller(who, info->damage()));
  info->set_wedge(ForCaller(who, info->wedge()));
}

}  // namespace

grpc::ServerUnaryReactor* ShuffleServiceImpl::CreateShuffle(grpc::CallbackServerContext* ctx,
                                                            const v1::CreateShuffleRequest* req,
                                                            v1::CreateShuffleResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::optional<Identity> who = Who(deps_, ctx, reactor);
  if (!who) return reactor;
  // Creates directories and syncs: off-thread.
  deps_.meta_pool->Submit([this, reactor, req, resp, who = *std::move(who)] {
    absl::StatusOr<bool> created = CreateFor(who, *req);
    if (created.ok()) resp->set_created(*created);
    reactor->Finish(ToClient(deps_, who, created.status()));
  });
  return reactor;
}

absl::StatusOr<bool> ShuffleServiceImpl::CreateFor(const Identity& who,
                                                   const v1::CreateShuffleRequest& req) {
  SLUICE_ASSIGN_OR_RETURN(std::string id, QualifiedId(who, req.shuffle_id()));
  const ShuffleParams params{id, req.num_partitions(), req.num_mappers()};
  // The tenant's shuffle quota: counted and taken under the tenant's lock, so that its creates
  // racing each other here cannot pass it together. A shuffle it has already does not count
  // again. In a cluster, its shuffles recorded in etcd count, wherever they are kept.
  std::shared_ptr<std::mutex> tenant_mu;
  std::unique_lock<std::mutex> quota_lock;
  const bool clustered = Cluster(*deps_.node).clustered;
  if (const uint64_t limit = LimitsOf(who, deps_.quotas).shuffles; limit != 0) {
    tenant_mu = deps_.tenants->CreateMutex(who.tenant);
    quota_lock = std::unique_lock<std::mutex>(*tenant_mu);
    SLUICE_ASSIGN_OR_RETURN(const size_t have, TenantShuffles(who, id, clustered));
    if (have >= limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant '", who.tenant, "' has ", have, " shuffles",
          clustered ? " in the cluster" : " on this server",
          ", its quota (shuffles: its quota line in --auth_file, else --tenant_max_shuffles); "
          "delete shuffles it no longer needs"));
    }
  }
  if (clustered) return CreateInCluster(params, req.replication());
  auto created = deps_.registry->Create(params);
  if (created.ok() && *created) {
    spdlog::info("event=create tenant={} shuffle={} partitions={} mappers={}", TenantField(id),
                 params.shuffle_id, params.num_partitions, params.num_mappers);
  }
  return created;
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::GetShuffle(grpc::CallbackServerContext* ctx,
                                                         const v1::GetShuffleRequest* req,
                                                         v1::ShuffleInfo* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::optional<Identity> who = Who(deps_, ctx, reactor);
  if (!who) return reactor;
  // Store locks may wait on an fsync: off-thread.
  deps_.meta_pool->Submit([this, reactor, req, resp, who = *std::move(who)] {
    absl::StatusOr<std::string> id = QualifiedId(who, req->shuffle_id());
    absl::Status st = id.status();
    if (st.ok()) st = EnsureLocal(deps_, *id);
    if (st.ok()) st = ResolvePending(deps_, *id);
    if (!st.ok()) {
      reactor->Finish(ToClient(deps_, who, st));
      return;
    }
    if (auto damaged = deps_.registry->FindDamaged(*id)) {
      FillDamaged(*damaged, resp);
      ToCaller(who, resp);
      reactor->Finish(grpc::Status::OK);
      return;
    }
    auto store = deps_.registry->Get(*id);
    if (!store.ok()) {
      reactor->Finish(ToClient(deps_, who, store.status()));
      return;
    }
    const uint32_t partitions = (*store)->params().num_partitions;
    if (req->first_partition() >= partitions) {
      reactor->Finish(ToClient(
          deps_, who,
          absl::InvalidArgumentError(absl::StrCat("first_partition ", req->first_partition(),
                                                  " is out of range [0, ", partitions, ")"))));
      return;
    }
    const uint32_t page = req->max_partitions() == 0
                              ? kMaxPartitionsPerPage
                              : std::min(req->max_partitions(), kMaxPartitionsPerPage);
    (*store)->Touch();
    FillInfo(**store, req->first_partition(), page, resp);
    ToCaller(who, resp);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::ListShuffles(grpc::CallbackServerContext* ctx,
                                                           const v1::ListShufflesRequest* req,
                                                           v1::ListShufflesResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::optional<Identity> who = Who(deps_, ctx, reactor);
  if (!who) return reactor;
  deps_.meta_pool->Submit([this, reactor, req, resp, who = *std::move(who)] {
    const uint32_t page = req->page_size() == 0 ? kDefaultShufflesPerPage
                                                : std::min(req->page_size(), kMaxShufflesPerPage);
    // A tenant sees its own shuffles only, by the ids it knows them by.
    const std::string prefix = TenantPrefix(who);
    const std::string after = prefix + req->page_token();
    auto listed = [&](const std::string& id) { return id > after && absl::StartsWith(id, prefix); };
    // Served and damaged ones, in id order, after the token.
    std::map<std::string, std::shared_ptr<ShuffleStore>> served;
    for (auto& store : deps_.registry->List()) {
      if (listed(store->params().shuffle_id)) served.emplace(store->params().shuffle_id, store);
    }
    std::map<std::string, DamagedShuffle> damaged;
    for (DamagedShuffle& d : deps_.registry->ListDamaged()) {
      if (listed(d.params.shuffle_id)) damaged.emplace(d.params.shuffle_id, std::move(d));
    }
    auto s = served.begin();
    auto d = damaged.begin();
    while ((s != served.end() || d != damaged.end()) &&
           static_cast<uint32_t>(resp->shuffles_size()) < page) {
      v1::ShuffleInfo* info = resp->add_shuffles();
      if (d == damaged.end() || (s != served.end() && s->first < d->first)) {
        FillInfo(*s->second, 0, 0, info);
        ++s;
      } else {
        FillDamaged(d->second, info);
        ++d;
      }
      ToCaller(who, info);
    }
    if (s != served.end() || d != damaged.end()) {
      resp->set_next_page_token(resp->shuffles(resp->shuffles_size() - 1).shuffle_id());
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::DeleteShuffle(grpc::CallbackServerContext* ctx,
                                                            const v1::DeleteShuffleRequest* req,
                                                            v1::DeleteShuffleResponse*) {
  auto* reactor = ctx->DefaultReactor();
  std::optional<Identity> who = Who(deps_, ctx, reactor);
  if (!who) return reactor;
  // Removes files: off-thread.
  deps_.meta_pool->Submit([this, reactor, req, who = *std::move(who)] {
    absl::StatusOr<std::string> id = QualifiedId(who, req->shuffle_id());
    reactor->Finish(ToClient(deps_, who, id.ok() ? DeleteKept(*id) : id.status()));
  });
  return reactor;
}

absl::StatusOr<size_t> ShuffleServiceImpl::TenantShuffles(const Identity& who,
                                                          const std::string& id, bool clustered) {
  if (!clustered) {
    if (deps_.registry->Get(id).ok() || deps_.registry->FindDamaged(id)) return 0;  // has it
    return deps_.registry->TenantShuffles(who.tenant);
  }
  const ClusterView c = Cluster(*deps_.node);
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_ASSIGN_OR_RETURN(auto placed, c.placements->Get(id));
  if (placed.has_value()) return 0;
  return c.placements->CountWithPrefix(TenantPrefix(who));
}

absl::Status ShuffleServiceImpl::DeleteKept(const std::string& id) {
  const ClusterView c = Cluster(*deps_.node);
  bool recorded = false;
  if (c.clustered) {  // its record first: no server makes its store again from etcd
    SLUICE_RETURN_IF_ERROR(c.Joined());
    SLUICE_ASSIGN_OR_RETURN(recorded, c.placements->Delete(id));
    std::lock_guard<std::mutex> lock(deps_.node->mu);
    deps_.node->kept.erase(id);
    deps_.node->checked.erase(id);
  }
  absl::Status st = deps_.registry->Delete(id);
  if (recorded && absl::IsNotFound(st)) st = absl::OkStatus();  // held elsewhere only
  if (st.ok()) spdlog::info("event=delete tenant={} shuffle={}", TenantField(id), id);
  return st;
}

grpc::ServerReadReactor<PushRequest>* ShuffleServiceImpl::Push(grpc::CallbackServerContext* ctx,
                                                               PushResponse* resp) {
  return new PushReactor(deps_, &counts_.push, ctx, resp);
}

grpc::ServerWriteReactor<FetchResponse>* ShuffleServiceImpl::Fetch(grpc::CallbackServerContext* ctx,
                                                                   const FetchRequest* req) {
  return new FetchReactor(deps_, &counts_.fetch, ctx, req);
}

namespace {

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
    if (!dirs[i].failed.ok() && contents) {
      d->set_error(std::string(registry.WithRelativePaths(dirs[i].failed).message()));
    }
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

}  // namespace

grpc::ServerUnaryReactor* ShuffleServiceImpl::GetNode(grpc::CallbackServerContext* ctx,
                                                      const v1::GetNodeRequest*,
                                                      v1::NodeInfo* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::optional<Identity> who = Who(deps_, ctx, reactor);
  if (!who) return reactor;
  deps_.meta_pool->Submit([this, reactor, resp, who = *std::move(who)] {  // statvfs: off-thread
    {
      std::lock_guard<std::mutex> lock(deps_.node->mu);
      resp->set_node_id(deps_.node->node_id);
      resp->set_address(deps_.node->address);
      resp->set_started_unix_ms(deps_.node->started_unix_ms);
      resp->set_clustered(deps_.node->membership != nullptr);
      resp->set_registered(deps_.node->membership != nullptr &&
                           deps_.node->membership->registered());
    }
    resp->set_serving(!deps_.node->draining.load());
    FillDataDirs(*deps_.registry, TenantPrefix(who).empty(), resp);
    resp->set_memory_budget_bytes(deps_.budget->limit());
    resp->set_memory_used_bytes(deps_.budget->used());
    // A tenant's own (the others' are not its business).
    resp->set_shuffles(static_cast<uint32_t>(TenantPrefix(who).empty()
                                                 ? deps_.registry->List().size()
                                                 : deps_.registry->TenantShuffles(who.tenant)));
    resp->set_push_streams(static_cast<uint32_t>(counts_.push.load()));
    resp->set_fetch_streams(static_cast<uint32_t>(counts_.fetch.load()));
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::ListNodes(grpc::CallbackServerContext* ctx,
                                                        const v1::ListNodesRequest*,
                                                        v1::ListNodesResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (!Who(deps_, ctx, reactor)) return reactor;
  deps_.meta_pool->Submit([this, reactor, resp] {  // asks etcd: off-thread
    const ClusterView c = Cluster(*deps_.node);
    Membership* membership = c.membership;
    if (c.clustered && membership == nullptr) {
      reactor->Finish(rpc::ToGrpcStatus(c.Joined()));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(deps_.node->mu);
      if (membership == nullptr) {  // on its own: itself
        v1::NodeEntry* e = resp->add_nodes();
        e->set_node_id(deps_.node->node_id);
        e->set_address(deps_.node->address);
        e->set_started_unix_ms(deps_.node->started_unix_ms);
      }
    }
    if (membership != nullptr) {
      auto nodes = membership->Nodes();
      if (!nodes.ok()) {
        reactor->Finish(rpc::ToGrpcStatus(nodes.status()));
        return;
      }
      for (const NodeEntry& n : *nodes) {
        v1::NodeEntry* e = resp->add_nodes();
        e->set_node_id(n.node_id);
        e->set_address(n.address);
        e->set_started_unix_ms(n.started_unix_ms);
      }
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

absl::StatusOr<bool> ShuffleServiceImpl::CreateInCluster(const ShuffleParams& params,
                                                         uint32_t replication) {
  SLUICE_RETURN_IF_ERROR(ShuffleRegistry::ValidateParams(params));
  const ClusterView c = Cluster(*deps_.node);
  SLUICE_RETURN_IF_ERROR(c.Joined());
  auto nodes = c.membership->Nodes();
  if (!nodes.ok()) return nodes.status();
  std::vector<std::string> ids;
  for (const NodeEntry& n : *nodes) ids.push_back(n.node_id);
  auto placed = c.placements->Create(params.shuffle_id, params.num_partitions, params.num_mappers,
                                     replication, ids);
  if (!placed.ok()) return placed.status();
  const ShufflePlacement& p = placed->placement;
  if (!placed->created &&
      (p.num_partitions != params.num_partitions || p.num_mappers != params.num_mappers ||
       (replication != 0 && replication != p.replication))) {
    return absl::AlreadyExistsError(
        absl::StrCat("shuffle '", params.shuffle_id, "' already exists with ", p.num_partitions,
                     " partitions, ", p.num_mappers, " mappers and replication ", p.replication));
  }
  if (placed->created) {
    spdlog::info(
        "event=create tenant={} shuffle={} partitions={} mappers={} replication={} servers={}",
        TenantField(params.shuffle_id), params.shuffle_id, params.num_partitions,
        params.num_mappers, p.replication, ids.size());
  }
  Kept kept = KeptOf(p, c.node_id);
  Remember(*deps_.node, params.shuffle_id, kept);
  if (kept->any) SLUICE_RETURN_IF_ERROR(deps_.registry->Create(params).status());
  return placed->created;
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::GetPlacement(grpc::CallbackServerContext* ctx,
                                                           const v1::GetPlacementRequest* req,
                                                           v1::Placement* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::optional<Identity> who = Who(deps_, ctx, reactor);
  if (!who) return reactor;
  deps_.meta_pool->Submit([this, reactor, req, resp, who = *std::move(who)] {  // asks etcd
    absl::StatusOr<std::string> id = QualifiedId(who, req->shuffle_id());
    absl::Status st = id.ok() ? FillPlacement(*id, resp) : id.status();
    resp->set_shuffle_id(req->shuffle_id());
    reactor->Finish(ToClient(deps_, who, st));
  });
  return reactor;
}

absl::Status ShuffleServiceImpl::FillPlacement(const std::string& id, v1::Placement* resp) {
  resp->set_shuffle_id(id);
  const ClusterView c = Cluster(*deps_.node);
  if (!c.clustered) {  // on its own: every partition here
    SLUICE_ASSIGN_OR_RETURN(auto store, deps_.registry->Get(id));
    resp->set_num_partitions(store->params().num_partitions);
    resp->set_num_mappers(store->params().num_mappers);
    resp->set_replication(1);
    v1::NodeEntry* self = resp->add_nodes();
    std::lock_guard<std::mutex> lock(deps_.node->mu);
    self->set_node_id(deps_.node->node_id);
    self->set_address(deps_.node->address);
    self->set_started_unix_ms(deps_.node->started_unix_ms);
    for (uint32_t p = 0; p < store->params().num_partitions; ++p) {
      resp->add_partitions()->add_nodes(0);
    }
    return absl::OkStatus();
  }
  SLUICE_RETURN_IF_ERROR(c.Joined());
  SLUICE_ASSIGN_OR_RETURN(auto placed, c.placements->Get(id));
  if (!placed.has_value()) {
    return absl::NotFoundError(absl::StrCat("shuffle '", id, "' not found in the cluster"));
  }
  SLUICE_ASSIGN_OR_RETURN(auto live, c.membership->Nodes());
  resp->set_clustered(true);
  resp->set_num_partitions(placed->num_partitions);
  resp->set_num_mappers(placed->num_mappers);
  resp->set_replication(placed->replication);
  for (const std::string& node_id : placed->nodes) {
    v1::NodeEntry* e = resp->add_nodes();
    e->set_node_id(node_id);
    for (const NodeEntry& n : live) {  // its address now, if it is registered
      if (n.node_id == node_id) {
        e->set_address(n.address);
        e->set_started_unix_ms(n.started_unix_ms);
      }
    }
  }
  for (const auto& replicas : placed->replicas) {
    auto* r = resp->add_partitions();
    for (uint32_t i : replicas) r->add_nodes(i);
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::CommitMapper(grpc::CallbackServerContext* ctx,
                                                           const v1::CommitMapperRequest* req,
                                                           v1::CommitMapperResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::optional<Identity> who = Who(deps_, ctx, reactor);
  if (!who) return reactor;
  // Asks etcd, syncs: off-thread.
  deps_.meta_pool->Submit([this, reactor, req, resp, who = *std::move(who)] {
    absl::StatusOr<std::string> id = QualifiedId(who, req->shuffle_id());
    absl::StatusOr<uint64_t> winner =
        id.ok() ? DecideMapper(*id, req->mapper_id(), req->attempt_id()) : id.status();
    if (winner.ok()) {
      resp->set_winning_attempt(*winner);
      resp->set_duplicate(*winner != req->attempt_id());
    }
    reactor->Finish(ToClient(deps_, who, winner.status()));
  });
  return reactor;
}

absl::StatusOr<uint64_t> ShuffleServiceImpl::DecideMapper(const std::string& id, uint32_t mapper,
                                                          uint64_t attempt) {
  SLUICE_RETURN_IF_ERROR(EnsureLocal(deps_, id));
  SLUICE_ASSIGN_OR_RETURN(auto store, deps_.registry->Get(id));
  if (auto committed = store->CommittedAttempt(mapper)) return *committed;  // decided before
  if (!store->IsPrepared(mapper, attempt)) {
    std::string node;
    {
      std::lock_guard<std::mutex> lock(deps_.node->mu);
      node = deps_.node->node_id;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "attempt ", attempt, " of mapper ", mapper, " of shuffle '", id,
        "' is not prepared on server ", node, ": prepare it on every server of the shuffle first"));
  }
  const ClusterView c = Cluster(*deps_.node);
  uint64_t winner = attempt;  // on its own, the first attempt resolved here wins
  if (c.clustered) {
    SLUICE_RETURN_IF_ERROR(c.Joined());
    SLUICE_ASSIGN_OR_RETURN(winner, c.placements->DecideMapper(id, mapper, attempt));
  }
  auto outcome = store->Resolve(mapper, winner);
  if (!outcome.ok()) {
    if (c.clustered) {
      // Decided all the same: the other servers apply it; this one reports what it could not.
      spdlog::error("event=resolve_failed tenant={} shuffle={} mapper={} winner={} error=\"{}\"",
                    TenantField(id), id, mapper, winner, std::string(outcome.status().message()));
      return winner;
    }
    return outcome.status();
  }
  if (!c.clustered && *outcome == CommitOutcome::kDuplicate) {
    return store->CommittedAttempt(mapper).value_or(winner);
  }
  spdlog::info("event=decide tenant={} shuffle={} mapper={} attempt={} winner={}", TenantField(id),
               id, mapper, attempt, winner);
  return winner;
}

// Whether a call comes from the server's own host: a loopback or Unix-socket peer.
bool FromLoopback(const std::string& peer) {
  return absl::StartsWith(peer, "ipv4:127.") || absl::StartsWith(peer, "ipv6:[::1]") ||
         absl::StartsWith(peer, "ipv6:%5B::1%5D") || absl::StartsWith(peer, "unix:");
}

grpc::ServerUnaryReactor* ShuffleServiceImpl::Drain(grpc::CallbackServerContext* ctx,
                                                    const v1::DrainRequest* req,
                                                    v1::DrainResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  // One look at the credentials: a reload between two could make the second fail.
  const absl::StatusOr<Identity> who = Caller(deps_, ctx);
  if (!who.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(who.status()));
    return reactor;
  }
  if (!who->admin()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                 "Drain needs an admin credential (role admin in --auth_file)"));
    return reactor;
  }
  if (!deps_.admin.allow_remote && !FromLoopback(ctx->peer())) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        "Drain is taken only from the server's own host (loopback) unless the server runs with "
        "--allow_remote_admin"));
    return reactor;
  }
  const std::chrono::milliseconds grace = req->grace_seconds() == 0
                                              ? deps_.admin.drain_grace
                                              : std::chrono::seconds(req->grace_seconds());
  resp->set_push_streams(static_cast<uint32_t>(counts_.push.load()));
  resp->set_fetch_streams(static_cast<uint32_t>(counts_.fetch.load()));
  deps_.meta_pool->Submit([this, reactor, grace] {  // leaves the cluster: asks etcd
    deps_.admin.drain(grace);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace sluice
