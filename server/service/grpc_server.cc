#include "server/service/grpc_server.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/server_interceptor.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_glue.h"
#include "rpc/tls.h"
#include "server/service/shuffle_service.h"
#include "server/storage/shuffle_store.h"

namespace sluice {
namespace {

using grpc::experimental::InterceptionHookPoints;

// The methods calls are counted under: the service's own ("Push"), the health and reflection
// services' ("grpc.health.v1.Health/Check"), and "unknown" for anything else a client sends
// (gRPC hands unknown paths to the interceptor as they came: counting each under its own name
// would let a client grow the server's memory and every scrape without end).
class MethodLabels {
 public:
  MethodLabels() {
    const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
        "sluice.v1.ShuffleService");
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      const std::string& name = service->method(i)->name();
      labels_.emplace("/sluice.v1.ShuffleService/" + name, name);
    }
    for (const char* other : {"grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch",
                              "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}) {
      labels_.emplace(absl::StrCat("/", other), other);
    }
  }
  const std::string& Of(const char* full) const {
    static const std::string kUnknown = "unknown";
    if (full == nullptr) return kUnknown;
    auto it = labels_.find(full);
    return it == labels_.end() ? kUnknown : it->second;
  }

 private:
  std::map<std::string, std::string, std::less<>> labels_;
};

// Counts every finished call by method and the status it ends with (sluice_rpc_handled_total).
class CallCounter final : public grpc::experimental::Interceptor {
 public:
  CallCounter(std::string method, CallCounts* calls) : method_(std::move(method)), calls_(calls) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      calls_->Add(method_, static_cast<int>(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  CallCounts* const calls_;
};

// Takes the reflection plugin out of one server's builder. (Linking gRPC's reflection library
// installs the plugin for every server of the process, whether or not it is asked for.)
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(
        std::remove_if(plugins->begin(), plugins->end(),
                       [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                         return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(
                                    p.get()) != nullptr;
                       }),
        plugins->end());
  }
};

class CallCounterFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCounterFactory(CallCounts* calls) : calls_(calls) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallCounter(labels_.Of(info->method()), calls_);
  }

 private:
  CallCounts* const calls_;
  const MethodLabels labels_;
};

// The most often a client may ping (ClientOptions::keepalive_time must not be shorter).
constexpr int kMinClientPingIntervalMs = 1000;
// The server's own pings find clients that went away without closing their connection.
constexpr int kServerKeepaliveTimeMs = 60000;
constexpr int kServerKeepaliveTimeoutMs = 20000;

int Millis(std::chrono::milliseconds d) { return static_cast<int>(d.count()); }

}  // namespace

struct GrpcServer::Impl {
  std::unique_ptr<ShuffleServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  bool stopped = false;
};

GrpcServer::GrpcServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcServer::~GrpcServer() { Shutdown(std::chrono::system_clock::now()); }

int GrpcServer::port() const { return impl_->port; }

void GrpcServer::SetReady(bool ready) {
  impl_->server->GetHealthCheckService()->SetServingStatus(kReadinessService, ready);
}

void GrpcServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->server->Shutdown(deadline);
  impl_->server->Wait();
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const ServerOptions& options,
                                                              ServiceDeps deps, TlsReloader* tls,
                                                              CallCounts* calls) {
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<ShuffleServiceImpl>(std::move(deps));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // TLS from the files the reloader holds checked (they are replaced only by checked ones).
  builder.AddListeningPort(
      options.listen_address,
      tls != nullptr ? rpc::ServerTlsCredentials(tls->identity_path(), tls->client_ca_path())
                     : grpc::InsecureServerCredentials(),
      &impl->port);
  builder.RegisterService(impl->service.get());
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
    counters.push_back(std::make_unique<CallCounterFactory>(calls));
    builder.experimental().SetInterceptorCreators(std::move(counters));
  }
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  // A push message carries at most 1 MiB of frames or of one large frame's pieces. What the
  // server sends is committed data, which may have been pushed under a larger cap.
  builder.SetMaxReceiveMessageSize(rpc::kMaxPushMessageBytes);
  builder.SetMaxSendMessageSize(rpc::MaxMessageBytes(StoredFrameLimits(options.limits)));
  // Clients ping to find a hung server (ClientOptions::keepalive_time): accept pings as often
  // as once a second, also between calls, instead of answering them with GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinClientPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kServerKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kServerKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             Millis(options.connection_idle_timeout));
  // A connection that says nothing is closed after this, not gRPC's 120 s.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             Millis(options.handshake_timeout));
  // What gRPC itself buffers of a stream the server is not reading: a fixed window
  // (--stream_window_mb) rather than one grown by bandwidth probing to many MiB a stream
  // (docs/operations.md, "Memory"). 0 keeps gRPC's probing.
  if (options.stream_window_bytes != 0) {
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               static_cast<int>(options.stream_window_bytes));
  }
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(options.max_streams_per_connection));
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    return absl::UnavailableError(absl::StrCat("could not listen on ", options.listen_address));
  }
  auto server = std::unique_ptr<GrpcServer>(new GrpcServer(std::move(impl)));
  server->SetReady(true);
  return server;
}

}  // namespace sluice
