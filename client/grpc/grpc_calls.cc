#include "client/grpc/grpc_calls.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/error_reason.h"
#include "rpc/tls.h"

namespace sluice::grpc_client {

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
namespace {
constexpr std::chrono::seconds kReconnectBound{1};
}  // namespace
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

namespace {
std::vector<PartitionStatsInfo::HotKey> HotKeysFromProto(const pb::PartitionInfo& p) {
  std::vector<PartitionStatsInfo::HotKey> out;
  for (const pb::HotKey& h : p.hot_keys()) {
    out.push_back(
        PartitionStatsInfo::HotKey{h.key(), h.key_cut(), h.records(), h.bytes(), h.error()});
  }
  return out;
}

}  // namespace

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

}  // namespace sluice::grpc_client
