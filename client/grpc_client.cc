// The gRPC client: ShuffleClient's calls, and the PushStream and FetchStream the transport-free
// writer and reader run on (client/transport.h). The only client file that sees gRPC.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/frame_stream_reader.h"
#include "client/partitioned_writer.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "codec/status_macros.h"
#include "rpc/error_reason.h"
#include "rpc/grpc_glue.h"
#include "rpc/tls.h"
#include "sluice/v1/shuffle.grpc.pb.h"

namespace sluice {
namespace {

namespace pb = sluice::v1;

// What a push message holds before it is sent: small frames share one; a frame larger than
// this goes alone, in pieces (a server reads no larger message).
constexpr size_t kPushMessageBytes = rpc::kPushPayloadBytes;
// A frame's own bytes in a message, past its payload (field tags and lengths).
constexpr size_t kFrameOverhead = 16;

// The server's status as it sent it; a failure of the transport (no server answered it)
// saying which server could not be reached.
absl::Status FromGrpc(const grpc::Status& st, const std::string& server) {
  absl::Status s = rpc::FromGrpcStatus(st);
  if (s.ok() || IsFromServer(s)) return s;
  if (s.code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(
        absl::StrCat("server unreachable at ", server, ": ", s.message()));
  }
  return s;
}

// A call that failed in the transport, the server not having answered it (a dead connection to
// a server that restarted, say): sent again once on a new connection, where the call may be
// sent again (every unary call but Drain is idempotent; a push stream that has sent only its
// open message, a fetch that has received nothing).
// A hung server is not such a failure: keepalive finds it only after keepalive_timeout, and a
// call sent to it again would hang again. So a call is sent again only if the transport failed
// it sooner than keepalive could have (a dead connection fails at once: reset, broken pipe).
bool TransportFailed(const absl::Status& st) {
  return absl::IsUnavailable(st) && !IsFromServer(st);
}
//
// Sooner than keepalive is not enough on its own (a call sent while a ping was already out
// fails early too), so a call is sent again only once a new connection is made at once: a
// restarted server completes the handshake in milliseconds, a hung one never does.
constexpr std::chrono::seconds kReconnectBound{1};
bool DeadConnection(const absl::Status& st, std::chrono::steady_clock::time_point sent,
                    const ClientOptions& options, grpc::Channel* channel,
                    std::chrono::system_clock::time_point deadline) {
  if (!TransportFailed(st) ||
      std::chrono::steady_clock::now() - sent >= options.keepalive_timeout) {
    return false;
  }
  return channel->WaitForConnected(
      std::min(deadline, std::chrono::system_clock::now() + kReconnectBound));
}
std::chrono::system_clock::time_point Never() {
  return std::chrono::system_clock::time_point::max();
}

std::vector<PartitionStatsInfo::HotKey> HotKeysFromProto(const pb::PartitionInfo& p) {
  std::vector<PartitionStatsInfo::HotKey> out;
  for (const pb::HotKey& h : p.hot_keys()) {
    out.push_back(
        PartitionStatsInfo::HotKey{h.key(), h.key_cut(), h.records(), h.bytes(), h.error()});
  }
  return out;
}

PartitionStatsInfo FromProto(const pb::PartitionInfo& p) {
  return PartitionStatsInfo{p.records(),
                            p.bytes(),
                            p.frames(),
                            p.damaged(),
                            p.damage(),
                            p.missing_mappers(),
                            std::vector<uint32_t>(p.lost_mappers().begin(), p.lost_mappers().end()),
                            HotKeysFromProto(p),
                            p.premerged_runs(),
                            p.premerged_mappers()};
}

ShuffleStatus FromProto(const pb::ShuffleInfo& info) {
  ShuffleStatus s;
  s.shuffle_id = info.shuffle_id();
  s.num_partitions = info.num_partitions();
  s.num_mappers = info.num_mappers();
  s.committed_mappers.assign(info.committed_mappers().begin(), info.committed_mappers().end());
  for (const auto& p : info.partitions()) {
    s.partitions.push_back(FromProto(p));
  }
  s.placement_epoch = info.placement_epoch();
  s.damaged = info.damaged();
  s.damage = info.damage();
  s.wedged = info.wedged();
  s.wedge = info.wedge();
  s.unopened = info.unopened();
  return s;
}

// The token goes only where it cannot be read on the way: over TLS, or to this machine.
bool SendsToken(const ClientOptions& options) {
  return !options.token.empty() && (options.tls.On() || rpc::IsLoopbackAddress(options.server));
}

void SetStreamDeadline(const ClientOptions& options, grpc::ClientContext* ctx) {
  if (SendsToken(options)) ctx->AddMetadata("authorization", "Bearer " + options.token);
  if (options.stream_deadline.count() > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() + options.stream_deadline);
  }
}

class GrpcPushStream final : public PushStream {
 public:
  // `flow`: PushFlow (each frames or piece message sent within credit the server granted);
  // else Push.
  GrpcPushStream(pb::ShuffleService::Stub* stub, const ClientOptions& options, bool prepare,
                 bool flow)
      : server_(options.server), prepare_(prepare) {
    SetStreamDeadline(options, &ctx_);
    if (flow) {
      flow_ = stub->PushFlow(&ctx_);
    } else {
      stream_ = stub->Push(&ctx_, &response_);
    }
  }
  ~GrpcPushStream() override {
    if (!finished_) {
      ctx_.TryCancel();
      (void)Finish();
    }
  }

  // The server sends its headers once it has taken the stream (admitted it): waiting for them
  // tells at once a stream refused, or one on a dead connection, before anything is sent.
  absl::Status Open(const std::string& id, uint32_t mapper, uint64_t attempt, uint32_t epoch,
                    bool await_headers) {
    if (await_headers) {
      if (flow_ != nullptr) {
        flow_->WaitForInitialMetadata();
      } else {
        stream_->WaitForInitialMetadata();
      }
    }
    pb::PushRequest open;
    open.mutable_open()->set_shuffle_id(id);
    open.mutable_open()->set_mapper_id(mapper);
    open.mutable_open()->set_attempt_id(attempt);
    open.mutable_open()->set_placement_epoch(epoch);
    if (!Send(open, /*within_credit=*/false)) return WriteFailed();
    return absl::OkStatus();
  }

  std::string* NewFrame(uint32_t partition) override {
    next_.set_partition_id(partition);
    next_.mutable_frame()->clear();
    return next_.mutable_frame();
  }

  // Small frames share a message (a wide writer's thousands of tiny frames cost a few
  // messages, not a message each); a message is sent once it holds kPushMessageBytes, or
  // before a frame that would take it past that, or at the commit.
  absl::Status SendFrame() override {
    const size_t size = next_.frame().size() + kFrameOverhead;
    if (pending_bytes_ > 0 && pending_bytes_ + size > kPushMessageBytes) {
      if (absl::Status st = SendPending(); !st.ok()) return st;
    }
    if (size > kPushMessageBytes) return SendLargeFrame();
    msg_.mutable_frames()->add_frames()->Swap(&next_);  // (next_ gets a recycled element)
    pending_bytes_ += size;
    // PushFlow's first message goes with its first frame: its credit tells the writer of the
    // huge partitions' segments made so far (docs/cluster.md) before it fills a message more.
    if (pending_bytes_ >= kPushMessageBytes || (flow_ != nullptr && !credited_)) {
      return SendPending();
    }
    return absl::OkStatus();
  }

  absl::Status SendCommit(uint64_t frames, uint64_t records) override {
    if (pending_bytes_ > 0) {
      if (absl::Status st = SendPending(); !st.ok()) return st;
    }
    pb::PushRequest commit;
    commit.mutable_commit()->set_frame_count(frames);
    commit.mutable_commit()->set_record_count(records);
    commit.mutable_commit()->set_prepare(prepare_);
    if (!Send(commit, /*within_credit=*/false)) return WriteFailed();
    if (flow_ != nullptr) {
      flow_->WritesDone();
    } else {
      stream_->WritesDone();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<WriteResult> FinishCommit() override {
    if (absl::Status st = Finish(); !st.ok()) return st;
    if (prepare_ && !response_.prepared() && !response_.duplicate()) {
      // A server that does not know the prepare (an earlier version) committed the attempt
      // outright: its replicas could now disagree on the mapper's winner.
      return absl::FailedPreconditionError(
          absl::StrCat("server ", server_,
                       " committed the attempt instead of preparing it: it predates "
                       "cluster mode's commit protocol; upgrade it"));
    }
    WriteResult r;
    r.duplicate = response_.duplicate();
    r.frames = response_.frames();
    r.records = response_.records();
    r.bytes = response_.bytes();
    return r;
  }

  void Cancel() override { ctx_.TryCancel(); }
  std::vector<SegmentNotice> TakeSegments() override {
    std::vector<SegmentNotice> out;
    out.swap(segments_);
    return out;
  }

 private:
  absl::Status Finish() {
    if (finished_) return absl::FailedPreconditionError("the push stream has ended");
    finished_ = true;
    if (flow_ != nullptr) {
      pb::PushReply reply;  // the commit's response comes last
      while (flow_->Read(&reply)) {
        if (reply.has_done()) response_ = reply.done();
      }
      return FromGrpc(flow_->Finish(), server_);
    }
    return FromGrpc(stream_->Finish(), server_);
  }
  // Writes `m`; with PushFlow, a frames message (`within_credit`) first asks for credit for
  // its size and waits for it (granted once the server's memory budget has room).
  bool Send(const pb::PushRequest& m, bool within_credit) {
    if (flow_ == nullptr) return stream_->Write(m);
    if (within_credit) {
      const uint64_t size = m.ByteSizeLong();
      pb::PushRequest ask;
      ask.mutable_ask()->set_bytes(size);
      if (!flow_->Write(ask) || !AwaitCredit(size)) return false;
      credit_ -= size;
      credited_ = true;
    }
    return flow_->Write(m);
  }
  // Reads credit replies until `n` bytes are granted; false once the stream ended (Finish says
  // why).
  bool AwaitCredit(uint64_t n) {
    pb::PushReply reply;
    while (credit_ < n) {
      if (!flow_->Read(&reply)) return false;
      credit_ += reply.credit();
      for (const auto& g : reply.segments()) {
        segments_.push_back(
            SegmentNotice{g.partition_id(), g.parent(),
                          std::vector<uint32_t>(g.nodes().begin(), g.nodes().end())});
      }
    }
    return true;
  }
  absl::Status SendPending() {
    const bool ok = Send(msg_, /*within_credit=*/true);
    msg_.mutable_frames()->mutable_frames()->Clear();  // keeps the elements for reuse
    pending_bytes_ = 0;
    return ok ? absl::OkStatus() : WriteFailed();
  }
  // A frame over a message: its size first (the server reserves that much memory before it
  // reads on), then its bytes in pieces of a message each.
  absl::Status SendLargeFrame() {
    const std::string& frame = next_.frame();
    pb::PushRequest msg;
    msg.mutable_large_frame()->set_partition_id(next_.partition_id());
    msg.mutable_large_frame()->set_frame_size(frame.size());
    if (!Send(msg, /*within_credit=*/false)) return WriteFailed();
    // PushFlow: its pieces go once the server has promised the frame's memory, which it says
    // with credit for the frame's size.
    if (flow_ != nullptr && !AwaitCredit(frame.size())) return WriteFailed();
    std::string* piece = msg.mutable_piece()->mutable_data();
    for (size_t at = 0; at < frame.size(); at += kPushMessageBytes) {
      piece->assign(frame, at, std::min(kPushMessageBytes, frame.size() - at));
      if (flow_ != nullptr) credit_ -= piece->size();
      if (!Send(msg, /*within_credit=*/false)) return WriteFailed();
    }
    std::string().swap(*next_.mutable_frame());  // not kept for the small frames that follow
    return absl::OkStatus();
  }
  // After a failed write: the server's reason for ending the stream (a rejected frame, say).
  absl::Status WriteFailed() {
    absl::Status st = Finish();
    if (st.ok()) return absl::UnavailableError(absl::StrCat("push stream to ", server_, " broke"));
    return st;
  }

  const std::string server_;
  const bool prepare_;
  grpc::ClientContext ctx_;
  pb::PushResponse response_;
  pb::PushRequest msg_;                                          // the frames not sent yet
  pb::PartitionFrame next_;                                      // the frame being encoded
  size_t pending_bytes_ = 0;                                     // in msg_
  std::unique_ptr<grpc::ClientWriter<pb::PushRequest>> stream_;  // Push
  std::unique_ptr<grpc::ClientReaderWriter<pb::PushRequest, pb::PushReply>> flow_;  // PushFlow
  uint64_t credit_ = 0;                  // granted and not used (PushFlow)
  std::vector<SegmentNotice> segments_;  // told with credit, not taken yet
  bool credited_ = false;                // a frames message was granted credit (PushFlow)
  bool finished_ = false;
};

class GrpcFetchStream final : public FetchStream {
 public:
  GrpcFetchStream(pb::ShuffleService::Stub* stub, grpc::Channel* channel,
                  const ClientOptions& options, pb::FetchRequest request)
      : stub_(stub), channel_(channel), options_(options), request_(std::move(request)) {
    Start();
  }
  ~GrpcFetchStream() override {
    if (!done_) {
      ctx_->TryCancel();
      (void)stream_->Finish();
    }
  }

  absl::StatusOr<bool> Next(const std::string** frame) override {
    if (done_) return false;
    while (!stream_->Read(&response_)) {
      absl::Status st = FromGrpc(stream_->Finish(), options_.server);
      // Nothing received yet and the transport failed it: again once, on a new connection.
      if (!received_ && !restarted_ && DeadConnection(st, started_, options_, channel_, Never())) {
        restarted_ = true;
        Start();
        continue;
      }
      done_ = true;
      if (!st.ok()) return st;
      return false;
    }
    if (!received_ && (!request_.from_key().empty() || request_.has_to_key()) &&
        !response_.key_range()) {
      // A server before key ranges ignores them and sends the whole partition.
      ctx_->TryCancel();
      (void)stream_->Finish();
      done_ = true;
      return absl::FailedPreconditionError(absl::StrCat(
          "the server at ", options_.server,
          " does not read key ranges (from_key, to_key): it runs a version before them; "
          "upgrade it"));
    }
    received_ = true;
    *frame = &response_.frame();
    if (response_.mappers_size() > 0) {
      mappers_.assign(response_.mappers().begin(), response_.mappers().end());
      attempts_.assign(response_.attempts().begin(), response_.attempts().end());
    }
    return true;
  }

  const std::vector<uint32_t>& mappers() const override { return mappers_; }
  const std::vector<uint64_t>& attempts() const override { return attempts_; }

  void Cancel() override { ctx_->TryCancel(); }

 private:
  void Start() {
    started_ = std::chrono::steady_clock::now();
    ctx_ = std::make_unique<grpc::ClientContext>();
    SetStreamDeadline(options_, ctx_.get());
    stream_ = stub_->Fetch(ctx_.get(), request_);
  }

  pb::ShuffleService::Stub* const stub_;
  grpc::Channel* const channel_;  // the GrpcClient's, which outlives its streams
  const ClientOptions& options_;  // the GrpcClient's
  const pb::FetchRequest request_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<pb::FetchResponse>> stream_;
  pb::FetchResponse response_;
  std::vector<uint32_t> mappers_;
  std::vector<uint64_t> attempts_;
  bool done_ = false, received_ = false, restarted_ = false;
  std::chrono::steady_clock::time_point started_;
};

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
      auto stream = std::make_unique<GrpcPushStream>(stub_.get(), options_, prepare,
                                                     options_.push_credit && protocol >= 2);
      st = stream->Open(id, mapper, attempt, epoch, /*await_headers=*/protocol >= 1);
      if (st.ok()) return std::unique_ptr<PushStream>(std::move(stream));
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
    return std::make_unique<GrpcFetchStream>(stub_.get(), channel_.get(), options_, std::move(req));
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

std::unique_ptr<ServerLink> ConnectServer(const ClientOptions& options) {
  return std::make_unique<GrpcClient>(options);
}

}  // namespace sluice
