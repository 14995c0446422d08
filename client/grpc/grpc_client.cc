// The gRPC client: ShuffleClient's calls over one server's channel (ConnectServer). Its push and
// fetch streams, which the transport-free writer and reader run on (client/transport.h), are in
// grpc_push_stream.cc and grpc_fetch_stream.cc, what they share in grpc_calls.h. client/grpc/ is
// the only part of the client that sees gRPC.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/frame_stream_reader.h"
#include "client/grpc/grpc_calls.h"
#include "client/grpc/grpc_fetch_stream.h"
#include "client/grpc/grpc_push_stream.h"
#include "client/partitioned_writer.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "rpc/error_reason.h"
#include "rpc/grpc_glue.h"
#include "rpc/tls.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {
namespace grpc_client {
namespace {

class GrpcClient final : public ShuffleClient, public ServerLink {
 public:
  explicit GrpcClient(const ClientOptions& options) : options_(options) {
    grpc::ChannelArguments args;
    const int max = rpc::MaxMessageBytes(options.limits);
    args.SetMaxReceiveMessageSize(max);
    args.SetMaxSendMessageSize(max);
    // Keepalive pings find a hung server (ClientOptions), also while a call only receives
    // (a fetch) or the connection is idle between calls.
    if (options.keepalive_time.count() > 0) {
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(options.keepalive_time.count()));
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                  static_cast<int>(options.keepalive_timeout.count()));
      args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
      args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    }
    if (!options.tls.server_name.empty()) args.SetSslTargetNameOverride(options.tls.server_name);
    channel_ =
        grpc::CreateCustomChannel(options.server, rpc::ChannelCredentials(options.tls), args);
    stub_ = pb::ShuffleService::NewStub(channel_);
  }

  absl::StatusOr<bool> CreateShuffle(const std::string& id, uint32_t num_partitions,
                                     uint32_t num_mappers, uint32_t replication) override {
    pb::CreateShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_num_partitions(num_partitions);
    req.set_num_mappers(num_mappers);
    req.set_replication(replication);
    pb::CreateShuffleResponse resp;
    absl::Status st =
        Unary([&](grpc::ClientContext* ctx) { return stub_->CreateShuffle(ctx, req, &resp); });
    if (!st.ok()) return st;
    return resp.created();
  }

  // Every page of the partitions' details (the server sends at most 16,384 a call).
  using ShuffleClient::GetShuffle;
  absl::StatusOr<ShuffleStatus> GetShuffle(const std::string& id,
                                           const StatusOptions& options) override {
    ShuffleStatus out;
    uint32_t next = 0;
    do {
      pb::GetShuffleRequest req;
      req.set_shuffle_id(id);
      req.set_first_partition(next);
      req.set_hot_keys(options.hot_keys);
      pb::ShuffleInfo info;
      absl::Status st =
          Unary([&](grpc::ClientContext* ctx) { return stub_->GetShuffle(ctx, req, &info); });
      if (!st.ok()) return st;
      if (next == 0) {
        out = FromProto(info);
      } else {
        for (const auto& p : info.partitions()) {
          out.partitions.push_back(FromProto(p));
        }
      }
      next = info.next_partition();
    } while (next != 0);
    return out;
  }

  // Every page of the list.
  absl::StatusOr<std::vector<ShuffleStatus>> ListShuffles() override {
    std::vector<ShuffleStatus> out;
    std::string token;
    do {
      pb::ListShufflesRequest req;
      req.set_page_token(token);
      pb::ListShufflesResponse resp;
      absl::Status st =
          Unary([&](grpc::ClientContext* ctx) { return stub_->ListShuffles(ctx, req, &resp); });
      if (!st.ok()) return st;
      for (const auto& info : resp.shuffles()) out.push_back(FromProto(info));
      token = resp.next_page_token();
    } while (!token.empty());
    return out;
  }

  absl::StatusOr<NodeStatus> GetNode() override {
    pb::NodeInfo info;
    absl::Status st = Unary(
        [&](grpc::ClientContext* ctx) { return stub_->GetNode(ctx, pb::GetNodeRequest(), &info); });
    if (!st.ok()) return st;
    NodeStatus n;
    n.node_id = info.node_id();
    n.address = info.address();
    n.serving = info.serving();
    n.disk_free_bytes = info.disk_free_bytes();
    n.disk_total_bytes = info.disk_total_bytes();
    n.memory_budget_bytes = info.memory_budget_bytes();
    n.memory_used_bytes = info.memory_used_bytes();
    n.shuffles = info.shuffles();
    n.push_streams = info.push_streams();
    n.fetch_streams = info.fetch_streams();
    n.clustered = info.clustered();
    n.registered = info.registered();
    n.started_unix_ms = info.started_unix_ms();
    n.repair_backlog = info.repair_backlog();
    n.repaired_bytes = info.repaired_bytes();
    n.fetch_stored_bytes = info.fetch_stored_bytes();
    n.premerge_written_bytes = info.premerge_written_bytes();
    n.premerging = info.premerging();
    n.repair_backlog_bytes = info.repair_backlog_bytes();
    n.decommissioning = info.decommissioning();
    for (const auto& d : info.data_dirs()) {
      n.data_dirs.push_back(NodeStatus::DataDir{d.index(), d.failed(), d.error(), d.shuffles(),
                                                d.partitions(), d.disk_free_bytes(),
                                                d.disk_total_bytes()});
    }
    return n;
  }

  absl::StatusOr<std::vector<AbsentNode>> AbsentNodes() override {
    pb::ListNodesResponse resp;
    absl::Status st = Unary([&](grpc::ClientContext* ctx) {
      return stub_->ListNodes(ctx, pb::ListNodesRequest(), &resp);
    });
    if (!st.ok()) return st;
    std::vector<AbsentNode> out;
    for (const auto& a : resp.absent()) {
      out.push_back(AbsentNode{a.node_id(), std::chrono::milliseconds(a.absent_ms()), a.dead()});
    }
    return out;
  }

  absl::StatusOr<std::vector<NodeAddress>> ListNodes() override {
    pb::ListNodesResponse resp;
    absl::Status st = Unary([&](grpc::ClientContext* ctx) {
      return stub_->ListNodes(ctx, pb::ListNodesRequest(), &resp);
    });
    if (!st.ok()) return st;
    std::vector<NodeAddress> out;
    for (const auto& e : resp.nodes()) {
      out.push_back(NodeAddress{e.node_id(), e.address(), e.started_unix_ms()});
    }
    return out;
  }

  absl::StatusOr<PlacementInfo> GetPlacement(const std::string& id) override {
    return GetPlacementIfChanged(id, 0);
  }

  absl::StatusOr<PlacementInfo> GetPlacementIfChanged(const std::string& id,
                                                      uint64_t known_revision) override {
    pb::GetPlacementRequest req;
    req.set_shuffle_id(id);
    req.set_known_revision(known_revision);
    pb::Placement resp;
    absl::Status st =
        Unary([&](grpc::ClientContext* ctx) { return stub_->GetPlacement(ctx, req, &resp); });
    if (!st.ok()) return st;
    PlacementInfo p;
    p.revision = resp.revision();
    if (resp.unchanged()) {
      if (known_revision == 0 || resp.revision() != known_revision) {
        return absl::UnavailableError(
            absl::StrCat("server ", options_.server, " said the placement of shuffle '", id,
                         "' is unchanged at revision ", resp.revision(),
                         ", not the one asked about (", known_revision, ")"));
      }
      p.shuffle_id = id;
      p.unchanged = true;
      return p;
    }
    p.shuffle_id = resp.shuffle_id();
    p.num_partitions = resp.num_partitions();
    p.num_mappers = resp.num_mappers();
    p.replication = resp.replication();
    p.clustered = resp.clustered();
    p.age = std::chrono::milliseconds(resp.age_ms());
    p.epoch = resp.placement_epoch();
    for (const auto& e : resp.nodes()) {
      p.nodes.push_back(NodeAddress{e.node_id(), e.address(), e.started_unix_ms()});
    }
    for (const auto& r : resp.partitions())
      p.replicas.emplace_back(r.nodes().begin(), r.nodes().end());
    // Segments (a server's bytes: checked, so that no reader or writer indexes past them).
    for (const auto& g : resp.segments()) {
      const uint32_t expected = p.num_partitions + static_cast<uint32_t>(p.segments.size());
      if (g.partition_id() != expected || g.parent() >= p.num_partitions || g.nodes().empty() ||
          std::any_of(g.nodes().begin(), g.nodes().end(),
                      [&](uint32_t n) { return n >= p.nodes.size(); })) {
        return absl::UnavailableError(absl::StrCat(
            "server ", options_.server, " gave a malformed placement of shuffle '", id,
            "': segment ", g.partition_id(), " of partition ", g.parent(), " does not follow its ",
            p.segments.size(), " segments or names no known server"));
      }
      p.segments.push_back(PlacementInfo::Segment{
          g.parent(), std::vector<uint32_t>(g.nodes().begin(), g.nodes().end())});
    }
    p.split_bytes = resp.split_bytes();
    return p;
  }

  absl::StatusOr<SplitKeys> GetSplits(const std::string& id, uint32_t partition, uint32_t slices,
                                      uint32_t placement_epoch) override {
    pb::GetSplitsRequest req;
    req.set_shuffle_id(id);
    req.set_partition_id(partition);
    req.set_slices(slices);
    req.set_placement_epoch(placement_epoch);
    pb::GetSplitsResponse resp;
    absl::Status st =
        Unary([&](grpc::ClientContext* ctx) { return stub_->GetSplits(ctx, req, &resp); });
    if (!st.ok()) return st;
    SplitKeys out;
    out.keys.assign(resp.split_keys().begin(), resp.split_keys().end());
    out.slice_bytes.assign(resp.slice_bytes().begin(), resp.slice_bytes().end());
    out.partition_bytes = resp.partition_bytes();
    out.frames = resp.frames();
    out.frames_without_bounds = resp.frames_without_bounds();
    return out;
  }

  absl::StatusOr<Revocation> RevokeMappers(const std::string& id,
                                           const std::vector<uint32_t>& mappers,
                                           uint32_t placement_epoch) override {
    pb::RevokeMappersRequest req;
    req.set_shuffle_id(id);
    req.mutable_mappers()->Add(mappers.begin(), mappers.end());
    req.set_placement_epoch(placement_epoch);
    pb::RevokeMappersResponse resp;
    absl::Status st =
        Unary([&](grpc::ClientContext* ctx) { return stub_->RevokeMappers(ctx, req, &resp); });
    if (!st.ok()) return st;
    return Revocation{resp.placement_epoch(),
                      std::vector<uint64_t>(resp.attempts().begin(), resp.attempts().end())};
  }

  absl::StatusOr<Revive> ReviveShuffle(const std::string& id, uint32_t placement_epoch,
                                       const std::string& node_id) override {
    pb::ReviveShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_placement_epoch(placement_epoch);
    req.set_node_id(node_id);
    pb::ReviveShuffleResponse resp;
    absl::Status st =
        Unary([&](grpc::ClientContext* ctx) { return stub_->ReviveShuffle(ctx, req, &resp); });
    if (!st.ok()) return st;
    return Revive{resp.placement_epoch(), resp.revived()};
  }

  absl::StatusOr<uint32_t> CatchUp(const std::string& id, uint32_t epoch) override {
    pb::GetShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_max_partitions(1);
    req.set_placement_epoch(epoch);
    pb::ShuffleInfo info;
    absl::Status st =
        Unary([&](grpc::ClientContext* ctx) { return stub_->GetShuffle(ctx, req, &info); });
    if (!st.ok()) return st;
    return info.placement_epoch();
  }

  absl::StatusOr<DecommissionProgress> Decommission() override {
    pb::DecommissionResponse resp;
    absl::Status st = Unary([&](grpc::ClientContext* ctx) {
      return stub_->Decommission(ctx, pb::DecommissionRequest(), &resp);
    });
    if (!st.ok()) return st;
    return DecommissionProgress{resp.done(), resp.shuffles_placed(), resp.partitions_short(),
                                resp.waiting_for()};
  }

  absl::Status Drain(uint32_t grace_seconds) override {
    pb::DrainRequest req;
    req.set_grace_seconds(grace_seconds);
    pb::DrainResponse resp;
    return Unary([&](grpc::ClientContext* ctx) { return stub_->Drain(ctx, req, &resp); }, nullptr,
                 /*resend=*/false);
  }

  absl::Status DeleteShuffle(const std::string& id) override {
    pb::DeleteShuffleRequest req;
    req.set_shuffle_id(id);
    pb::DeleteShuffleResponse resp;
    bool again = false;
    absl::Status st = Unary(
        [&](grpc::ClientContext* ctx) { return stub_->DeleteShuffle(ctx, req, &resp); }, &again);
    // Sent again after the connection broke: the first may have deleted it.
    if (again && absl::IsNotFound(st)) return absl::OkStatus();
    return st;
  }

  absl::StatusOr<std::unique_ptr<ShuffleWriter>> OpenWriter(const std::string& id, uint32_t mapper,
                                                            uint64_t attempt,
                                                            const WriterOptions& options) override {
    // Only the partition count: not every partition's details (a writer of a wide shuffle
    // would fetch thousands of them).
    uint32_t partitions = 0;
    {
      pb::GetShuffleRequest req;
      req.set_shuffle_id(id);
      req.set_max_partitions(1);
      pb::ShuffleInfo info;
      if (absl::Status st =
              Unary([&](grpc::ClientContext* ctx) { return stub_->GetShuffle(ctx, req, &info); });
          !st.ok()) {
        return st;
      }
      if (info.damaged()) {
        return absl::DataLossError(absl::StrCat("shuffle ", id, " is damaged: ", info.damage()));
      }
      partitions = info.num_partitions();
    }
    auto stream = OpenPush(id, mapper, attempt, /*prepare=*/false, /*epoch=*/0);
    if (!stream.ok()) return stream.status();
    std::vector<std::unique_ptr<PushStream>> streams;
    streams.push_back(std::move(stream).value());
    auto writer =
        PartitionedWriter::Make(partitions, std::move(streams), {}, options, options_.limits);
    if (!writer.ok()) return writer.status();
    return std::unique_ptr<ShuffleWriter>(std::move(writer).value());
  }

  absl::StatusOr<std::unique_ptr<ShuffleReader>> OpenReader(const std::string& id,
                                                            uint32_t partition,
                                                            const ReaderOptions& options) override {
    return std::unique_ptr<ShuffleReader>(
        new FrameStreamReader(OpenFetch(id, partition, options, /*report_mappers=*/false),
                              options_.limits, options_.server));
  }

  // ServerLink: what the cluster client needs of one server.
  ShuffleClient& client() override { return *this; }
  const std::string& address() const override { return options_.server; }

  absl::StatusOr<std::unique_ptr<PushStream>> OpenPush(const std::string& id, uint32_t mapper,
                                                       uint64_t attempt, bool prepare,
                                                       uint32_t epoch) override {
    // A server that sends the stream's headers once it has taken it lets the open wait for
    // them: a refusal or a dead connection is then known before anything is sent. (One before
    // that sends them only at the end: the open does not wait.)
    SLUICE_ASSIGN_OR_RETURN(const uint32_t protocol, ServerProtocol());
    absl::Status st;
    for (int i = 0; i < 2; ++i) {  // again once if the transport failed it before the server did
      const auto sent = std::chrono::steady_clock::now();
      auto stream =
          OpenPushStream(stub_.get(), options_, prepare, options_.push_credit && protocol >= 2, id,
                         mapper, attempt, epoch, /*await_headers=*/protocol >= 1);
      if (stream.ok()) return stream;
      st = stream.status();
      if (!DeadConnection(st, sent, options_, channel_.get(), Never())) return st;
    }
    return st;
  }

  absl::StatusOr<uint64_t> CommitMapper(const std::string& id, uint32_t mapper, uint64_t attempt,
                                        uint32_t epoch) override {
    pb::CommitMapperRequest req;
    req.set_shuffle_id(id);
    req.set_mapper_id(mapper);
    req.set_attempt_id(attempt);
    req.set_placement_epoch(epoch);
    pb::CommitMapperResponse resp;
    absl::Status st =
        Unary([&](grpc::ClientContext* ctx) { return stub_->CommitMapper(ctx, req, &resp); });
    if (!st.ok()) return st;
    return resp.winning_attempt();
  }

  std::unique_ptr<FetchStream> OpenFetch(const std::string& id, uint32_t partition,
                                         const ReaderOptions& options,
                                         bool report_mappers) override {
    pb::FetchRequest req;
    req.set_shuffle_id(id);
    req.set_partition_id(partition);
    req.set_order(options.order == FetchOrder::kKey ? pb::KEY : pb::UNORDERED);
    req.set_require_complete(options.require_complete);
    req.set_layout(rpc::LayoutToProto(options.layout));
    req.set_target_chunk_bytes(static_cast<uint32_t>(options.chunk_bytes));
    req.set_skip_records(options.skip_records);
    req.mutable_only_mappers()->Add(options.only_mappers.begin(), options.only_mappers.end());
    req.mutable_only_attempts()->Add(options.only_attempts.begin(), options.only_attempts.end());
    req.set_placement_epoch(options.placement_epoch);
    req.set_report_mappers(report_mappers);
    req.set_from_key(options.from_key);
    if (options.to_key.has_value()) req.set_to_key(*options.to_key);
    return StartFetchStream(stub_.get(), channel_.get(), options_, std::move(req));
  }

 private:
  // A unary call, `call(context)`: sent again once if a dead connection failed it (*again
  // then), within the one deadline of the call; never a call that must not run twice
  // (`resend` false: Drain, which a restarted server would take as its own).
  template <typename Call>
  absl::Status Unary(Call&& call, bool* again = nullptr, bool resend = true) const {
    const auto deadline = options_.call_deadline.count() > 0
                              ? std::chrono::system_clock::now() + options_.call_deadline
                              : Never();
    absl::Status st;
    for (int i = 0; i < 2; ++i) {
      const auto sent = std::chrono::steady_clock::now();
      grpc::ClientContext ctx;
      if (SendsToken(options_)) ctx.AddMetadata("authorization", "Bearer " + options_.token);
      if (options_.call_deadline.count() > 0) ctx.set_deadline(deadline);
      st = FromGrpc(call(&ctx), options_.server);
      if (!resend || !DeadConnection(st, sent, options_, channel_.get(), deadline)) break;
      if (again != nullptr) *again = true;
    }
    return st;
  }

  // The server's NodeInfo.protocol, asked once (0 for a server too old to say).
  absl::StatusOr<uint32_t> ServerProtocol() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (protocol_.has_value()) return *protocol_;
    }
    pb::NodeInfo info;
    absl::Status st = Unary(
        [&](grpc::ClientContext* ctx) { return stub_->GetNode(ctx, pb::GetNodeRequest(), &info); });
    if (!st.ok() && !absl::IsUnimplemented(st)) return st;
    std::lock_guard<std::mutex> lock(mu_);
    protocol_ = st.ok() ? info.protocol() : 0;
    return *protocol_;
  }

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::ShuffleService::Stub> stub_;
  std::mutex mu_;
  std::optional<uint32_t> protocol_;  // guarded by mu_
};

}  // namespace
}  // namespace grpc_client

std::unique_ptr<ServerLink> ConnectServer(const ClientOptions& options) {
  return std::make_unique<grpc_client::GrpcClient>(options);
}

}  // namespace sluice
