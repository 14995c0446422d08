#include "server/sluice_server.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/server_interceptor.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "rpc/grpc_glue.h"
#include "rpc/tls.h"
#include "server/storage/file_util.h"
#include "server/metrics/metrics_http.h"
#include "server/metrics_scrape.h"
#include "server/service/shuffle_service.h"
#include "server/security/tenancy.h"
#include "server/security/tls_reloader.h"
#include "spdlog/spdlog.h"

namespace sluice {

struct SluiceServer::Impl {
  ServerOptions options;
  ServerMetrics metrics;  // first in, last out: the service and the stores count into it
  std::unique_ptr<ShuffleRegistry> registry;
  std::unique_ptr<WorkerPool> pool;        // pushes, fetch setup, UNORDERED fetches
  std::unique_ptr<WorkerPool> meta_pool;   // the small calls
  std::unique_ptr<WorkerPool> merge_pool;  // KEY merges
  std::unique_ptr<MemoryBudget> budget;
  std::unique_ptr<Gate> merge_gate;
  std::unique_ptr<Watchdog> watchdog;  // outlives the service's streams
  std::unique_ptr<ShuffleServiceImpl> service;
  NodeState node;
  std::shared_ptr<EtcdClient> etcd;  // with --etcd
  std::unique_ptr<Membership> membership;
  std::unique_ptr<PlacementStore> placements;
  std::unique_ptr<TlsReloader> tls;     // with TLS; outlives `server`, which reads its files
  std::unique_ptr<Authenticator> auth;  // with --auth_file; outlives `server`, which calls it
  Tenants tenants;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;  // with --metrics_listen
  int port = 0;
  bool stopped = false;

  // The drain: asked for once, its deadline only ever brought forward.
  std::mutex drain_mu;
  std::condition_variable drain_cv;
  bool drain_asked = false;
  std::chrono::steady_clock::time_point drain_deadline;

  void Drain(std::chrono::milliseconds grace);

  // --shuffle_ttl_s: deletes shuffles idle that long, until stopped.
  std::mutex ttl_mu;
  std::condition_variable ttl_cv;
  bool ttl_stop = false;
  std::thread ttl_thread;
  void ExpireLoop();

  std::vector<prometheus::MetricFamily> CollectMetrics() const;
};

void SluiceServer::Impl::ExpireLoop() {
  const auto period = std::clamp<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(options.shuffle_ttl) / 4,
      std::chrono::milliseconds(100), std::chrono::seconds(60));
  std::unique_lock<std::mutex> lock(ttl_mu);
  while (!ttl_cv.wait_for(lock, period, [&] { return ttl_stop; })) {
    lock.unlock();
    for (const auto& store : registry->List()) {
      // (An explicit DeleteShuffle may come first: then this one finds nothing.)
      if (store->writers() > 0 || store->idle() < options.shuffle_ttl) continue;
      const std::string id = store->params().shuffle_id;
      const absl::Status st = registry->Delete(id);
      if (st.ok()) {
        spdlog::info("event=expire tenant={} shuffle={} idle_s={} ttl_s={}", TenantField(id), id,
                     std::chrono::duration_cast<std::chrono::seconds>(store->idle()).count(),
                     options.shuffle_ttl.count());
      } else if (!absl::IsNotFound(st)) {
        spdlog::warn("event=expire_failed tenant={} shuffle={} error=\"{}\"", TenantField(id), id,
                     std::string(st.message()));
      }
    }
    lock.lock();
  }
}

SluiceServer::SluiceServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

// The health service's name for readiness: NOT_SERVING while draining ("" stays SERVING while
// the process lives: liveness).
constexpr char kReadinessService[] = "sluice.v1.ShuffleService";

void SluiceServer::Impl::Drain(std::chrono::milliseconds grace) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(drain_mu);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    first = !drain_asked;
    if (first || deadline < drain_deadline) drain_deadline = deadline;
    drain_asked = true;
  }
  drain_cv.notify_all();
  if (!first) return;
  node.draining.store(true);  // new push streams are refused from now on
  if (server != nullptr)
    server->GetHealthCheckService()->SetServingStatus(kReadinessService, false);
  spdlog::info("event=drain grace_ms={} push_streams={} fetch_streams={}", grace.count(),
               service->counts().push.load(), service->counts().fetch.load());
  // Out of the cluster's list: readers go to other replicas, writers are told it is down.
  if (membership != nullptr) membership->Leave();
}

void SluiceServer::Drain(std::chrono::milliseconds grace) { impl_->Drain(grace); }

void SluiceServer::WaitDrained() {
  Impl& i = *impl_;
  std::unique_lock<std::mutex> lock(i.drain_mu);
  i.drain_cv.wait(lock, [&] { return i.drain_asked; });
  const auto start = std::chrono::steady_clock::now();
  // Until nothing has been open for a quiet second (a job's reducers often start a moment
  // after its last commit: they are served), or the grace has passed. Polled: streams end on
  // other threads.
  constexpr auto kQuiet = std::chrono::seconds(1);
  auto idle_since = std::chrono::steady_clock::now();
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (i.service->counts().push.load() + i.service->counts().fetch.load() > 0) idle_since = now;
    if (now - idle_since >= kQuiet || now >= i.drain_deadline) break;
    i.drain_cv.wait_for(lock, std::chrono::milliseconds(50));
  }
  spdlog::info("event=drained waited_ms={} push_streams={} fetch_streams={}",
               std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - start)
                   .count(),
               i.service->counts().push.load(), i.service->counts().fetch.load());
}
SluiceServer::~SluiceServer() { Shutdown(); }

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

// Threads for CreateShuffle, GetShuffle, ListShuffles and DeleteShuffle.
constexpr int kMetaThreads = 2;

int Millis(std::chrono::milliseconds d) { return static_cast<int>(d.count()); }

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

uint64_t NowUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// host:port of the listen address with the port bound; a wildcard host becomes the host name.
std::string AdvertisedAddress(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") host = HostName();
  return absl::StrCat(host, ":", port);
}

// --data_dir's list: one directory per disk, comma-separated.
std::vector<std::string> SplitDataDirs(const std::string& list) {
  std::vector<std::string> out;
  for (absl::string_view d : absl::StrSplit(list, ',')) {
    std::string dir(d);
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    out.push_back(std::move(dir));
  }
  return out;
}

// A duration option in whole seconds within [1 s, 1 day], named by its flag.
absl::Status CheckSeconds(std::chrono::milliseconds d, const char* flag) {
  if (d < std::chrono::seconds(1) || d > std::chrono::hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", d.count() / 1000.0, " is out of range [1, 86400] seconds"));
  }
  return absl::OkStatus();
}

// Every option a server runs on, in range; the error names the flag that sets it.
absl::Status ValidateOptions(const ServerOptions& o) {
  if (o.data_dir.empty())
    return absl::InvalidArgumentError("a data directory is required (--data_dir)");
  std::set<std::string> seen;
  for (const std::string& dir : SplitDataDirs(o.data_dir)) {
    if (dir.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data_dir=", o.data_dir, " has an empty directory in its list"));
    }
    if (!seen.insert(dir).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data_dir=", o.data_dir, " names ", dir, " twice"));
    }
  }
  if (o.limits.max_uncompressed_bytes == 0 || o.limits.max_uncompressed_bytes > kMaxFrameCapBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the frame cap (--max_frame_mb) is ",
                                                   o.limits.max_uncompressed_bytes,
                                                   " bytes; it must be 1 byte to 1 GiB"));
  }
  if (o.limits.max_records == 0)
    return absl::InvalidArgumentError("the record cap must be at least 1");
  if (o.memory_budget_bytes == 0) {
    return absl::InvalidArgumentError("the memory budget (--memory_budget_mb) must not be 0");
  }
  if (o.worker_threads < 1 || o.worker_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_threads=", o.worker_threads, " is out of range [1, 1024]"));
  }
  if (o.merge_fan_in < 2 || o.merge_fan_in > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("--merge_fan_in=", o.merge_fan_in, " is out of range [2, 65536]"));
  }
  if (o.max_frames_per_attempt == 0) {
    return absl::InvalidArgumentError("--max_frames_per_attempt must be at least 1");
  }
  for (const auto& [n, flag] :
       {std::pair<size_t, const char*>{o.max_push_streams, "--max_push_streams"},
        {o.max_fetch_streams, "--max_fetch_streams"},
        {o.max_streams_per_connection, "--max_streams_per_connection"}}) {
    if (n < 1 || n > 1000000) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "=", n, " is out of range [1, 1000000]"));
    }
  }
  if (o.stream_window_bytes > (uint64_t{64} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream_window_mb=", o.stream_window_bytes >> 20, " is out of range [0, 64]"));
  }
  if (auto st = CheckSeconds(o.push_idle_timeout, "--push_idle_timeout_s"); !st.ok()) return st;
  if (auto st = CheckSeconds(o.fetch_stall_timeout, "--fetch_stall_timeout_s"); !st.ok()) {
    return st;
  }
  if (auto st = CheckSeconds(o.connection_idle_timeout, "--connection_idle_timeout_s"); !st.ok()) {
    return st;
  }
  if (o.disk_high_water_pct > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--disk_high_water_pct=", o.disk_high_water_pct, " is out of range [0, 100]"));
  }
  if (o.shuffle_ttl > std::chrono::hours(24 * 365)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shuffle_ttl_s=", o.shuffle_ttl.count(), " is out of range [0, 31536000]"));
  }
  if (o.shuffle_ttl.count() > 0 && !o.etcd_endpoints.empty()) {
    return absl::InvalidArgumentError(
        "--shuffle_ttl_s is for a server on its own: in a cluster, a shuffle idle on one server "
        "may be in use on another; engines delete their shuffles (DeleteShuffle)");
  }
  if (o.drain_grace > std::chrono::hours(24)) {
    return absl::InvalidArgumentError(absl::StrCat("--drain_grace_s=", o.drain_grace.count() / 1000,
                                                   " is out of range [0, 86400]"));
  }
  if (!o.node_id.empty()) {
    if (auto st = ValidateNodeId(o.node_id); !st.ok()) return st;
  }
  if (o.node_lease_ttl < std::chrono::seconds(1) || o.node_lease_ttl > std::chrono::hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_lease_s=", o.node_lease_ttl.count(), " is out of range [1, 3600]"));
  }
  if (!o.etcd_endpoints.empty() &&
      (o.etcd_prefix.empty() || o.etcd_prefix.front() != '/' || o.etcd_prefix.back() != '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_prefix='", o.etcd_prefix, "' must start and end with '/'"));
  }
  return absl::OkStatus();
}

// The listening port's credentials: TLS (its files checked now, so that a bad one fails the
// start naming it, and watched), or plaintext, which leaves this machine only when asked for
// explicitly.
struct Listening {
  std::unique_ptr<TlsReloader> tls;  // with TLS; outlives the credentials reading its files
  std::shared_ptr<grpc::ServerCredentials> credentials;
};
absl::StatusOr<Listening> ListenCredentials(const ServerOptions& o) {
  if (o.tls.enabled()) {
    if (o.plaintext) {
      return absl::InvalidArgumentError("--plaintext and --tls_cert exclude each other");
    }
    if (o.tls.reload_interval < std::chrono::seconds(1) ||
        o.tls.reload_interval > std::chrono::hours(24)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_reload_s=", o.tls.reload_interval.count(), " is out of range [1, 86400]"));
    }
    absl::StatusOr<std::unique_ptr<TlsReloader>> tls = TlsReloader::Start(o.tls);
    if (!tls.ok()) return tls.status();
    spdlog::info("event=tls {} client_certificates={} reload_s={}", (*tls)->summary(),
                 o.tls.client_ca_file.empty() ? "not_requested" : "required",
                 o.tls.reload_interval.count());
    Listening l;
    l.credentials = rpc::ServerTlsCredentials((*tls)->identity_path(), (*tls)->client_ca_path());
    l.tls = *std::move(tls);
    return l;
  }
  if (!o.tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
  }
  if (!rpc::IsLoopbackAddress(o.listen_address)) {
    if (!o.plaintext) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen=", o.listen_address,
          " is reachable from other hosts: give --tls_cert and --tls_key (docs/security.md), or "
          "--plaintext to serve in clear anyway"));
    }
    spdlog::warn(
        "event=plaintext listen={} message=\"serving without TLS on an address other hosts can "
        "reach: anyone on the network can read and change the shuffles' data\"",
        o.listen_address);
  }
  return Listening{nullptr, grpc::InsecureServerCredentials()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<SluiceServer>> SluiceServer::Start(const ServerOptions& options) {
  if (absl::Status st = ValidateOptions(options); !st.ok()) return st;
  absl::StatusOr<Listening> listening = ListenCredentials(options);
  if (!listening.ok()) return listening.status();
  std::unique_ptr<Authenticator> auth;
  if (!options.auth_file.empty()) {
    if (options.auth_reload_interval < std::chrono::seconds(1) ||
        options.auth_reload_interval > std::chrono::hours(24)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth_reload_s=", options.auth_reload_interval.count(), " is out of range [1, 86400]"));
    }
    absl::StatusOr<std::unique_ptr<Authenticator>> a =
        Authenticator::Open(options.auth_file, options.auth_reload_interval);
    if (!a.ok()) return a.status();
    auth = *std::move(a);
    spdlog::info("event=auth file={} reload_s={}", options.auth_file,
                 options.auth_reload_interval.count());
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->auth = std::move(auth);
  StoreOptions store_options;
  store_options.fsync = options.fsync;
  store_options.limits = options.limits;
  store_options.commit_sync_seconds = &impl->metrics.commit_sync_seconds;
  std::map<std::string, absl::Status> failed;
  auto registry = ShuffleRegistry::Open(SplitDataDirs(options.data_dir), store_options, &failed);
  if (!registry.ok()) return registry.status();
  impl->registry = std::move(registry).value();
  for (const auto& [id, st] : failed) {
    spdlog::error("event=recovery_failed tenant={} shuffle={} error=\"{}\"", TenantField(id), id,
                  std::string(st.message()));
  }
  impl->pool = std::make_unique<WorkerPool>(options.worker_threads);
  impl->budget = std::make_unique<MemoryBudget>(options.memory_budget_bytes, impl->pool.get());
  impl->registry->set_high_water_pct(options.disk_high_water_pct);
  // Intermediate merge runs live in <data_dir>/tmp of the first healthy data directory; every
  // one is emptied at start.
  for (const auto& d : impl->registry->DataDirs()) {
    if (d.failed.ok()) (void)file::RemoveTree(d.path + "/tmp");
  }
  const std::string tmp_dir = impl->registry->TmpDir();
  if (auto st = file::RemoveTree(tmp_dir); !st.ok()) return st;
  if (auto st = file::MakeDirs(tmp_dir); !st.ok()) return st;
  MergeOptions merge;
  merge.fan_in = options.merge_fan_in;
  merge.tmp_dir = tmp_dir;
  merge.limits = StoredFrameLimits(options.limits);  // it reads and rewrites committed data
  // Merges have their own threads, one per merge slot, and the small calls theirs, so that
  // neither long merges nor heavy pushes make a CreateShuffle wait.
  const size_t merges = options.max_concurrent_merges != 0
                            ? options.max_concurrent_merges
                            : static_cast<size_t>(options.worker_threads);
  impl->merge_pool = std::make_unique<WorkerPool>(static_cast<int>(std::min<size_t>(merges, 64)));
  // Each merge plans its decoded frames within an equal share of the budget.
  merge.memory_limit = std::max<uint64_t>(options.memory_budget_bytes / merges, 1);
  merge.limit_name = absl::StrCat("--memory_budget_mb=", options.memory_budget_bytes >> 20,
                                  " shared by --max_concurrent_merges=", merges,
                                  "; raise the budget or allow fewer merges");
  impl->meta_pool = std::make_unique<WorkerPool>(kMetaThreads);
  impl->merge_gate = std::make_unique<Gate>(merges, impl->merge_pool.get());
  PushLimits push;
  push.frame = options.limits;
  push.max_frames_per_attempt = options.max_frames_per_attempt;
  FetchDeps fetch{impl->registry.get(), impl->budget.get(), options.limits, merge};
  impl->watchdog = std::make_unique<Watchdog>();
  StreamLimits streams;
  streams.max_push_streams = options.max_push_streams;
  streams.max_fetch_streams = options.max_fetch_streams;
  streams.push_idle_timeout = options.push_idle_timeout;
  streams.fetch_stall_timeout = options.fetch_stall_timeout;
  streams.disk_high_water_pct = options.disk_high_water_pct;
  Impl* self = impl.get();
  AdminDeps admin{[self](std::chrono::milliseconds grace) { self->Drain(grace); },
                  options.drain_grace, options.allow_remote_admin};
  impl->service = std::make_unique<ShuffleServiceImpl>(ShuffleServiceImpl::Deps{
      impl->registry.get(), impl->pool.get(), impl->meta_pool.get(), impl->merge_pool.get(),
      impl->budget.get(), push, fetch, impl->merge_gate.get(), impl->watchdog.get(), streams,
      &impl->node, admin, &impl->metrics, impl->auth.get(),
      TenantLimits{options.tenant_max_shuffles, options.tenant_max_stored_bytes,
                   options.tenant_max_streams},
      &impl->tenants});

  impl->node.clustered = !options.etcd_endpoints.empty();  // before it serves
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  impl->tls = std::move(listening->tls);
  builder.AddListeningPort(options.listen_address, listening->credentials, &impl->port);
  builder.RegisterService(impl->service.get());
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
    counters.push_back(std::make_unique<CallCounterFactory>(&impl->metrics.calls));
    builder.experimental().SetInterceptorCreators(std::move(counters));
  }
  // A push message carries at most 1 MiB of frames or of one large frame's pieces. What the
  // server sends is committed data, which may have been pushed under a larger cap.
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
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
  // What gRPC itself buffers of a stream the server is not reading: a fixed window
  // (--stream_window_mb), not one grown by bandwidth probing to many MiB a stream, which kept
  // a 32 MiB-budget server at 77-121 MiB with 8 pushing mappers (44-47 MiB with 4 MiB;
  // docs/benchmarks.md). 0 keeps gRPC's probing.
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
  impl->server->GetHealthCheckService()->SetServingStatus(kReadinessService, true);
  auto server = std::unique_ptr<SluiceServer>(new SluiceServer(std::move(impl)));
  if (absl::Status st = server->JoinCluster(); !st.ok()) return st;  // (shuts down on error)
  Impl& i = *server->impl_;
  if (options.shuffle_ttl.count() > 0) i.ttl_thread = std::thread([&i] { i.ExpireLoop(); });
  if (!options.metrics_listen.empty()) {
    auto endpoint =
        MetricsEndpoint::Start(options.metrics_listen, [&i] { return i.CollectMetrics(); });
    if (!endpoint.ok()) {
      server->Shutdown();
      return endpoint.status();
    }
    i.metrics_endpoint = std::move(endpoint).value();
  }
  spdlog::info(
      "event=started listen={} port={} data_dir={} shuffles={} memory_budget_mb={} node_id={} "
      "address={} cluster={} metrics_port={}",
      options.listen_address, i.port, options.data_dir, i.registry->List().size(),
      options.memory_budget_bytes >> 20, i.node.node_id, i.node.address,
      i.membership != nullptr ? options.etcd_endpoints : std::string("none"),
      i.metrics_endpoint == nullptr ? 0 : i.metrics_endpoint->port());
  return server;
}

absl::Status SluiceServer::JoinCluster() {
  const ServerOptions& o = impl_->options;
  MembershipOptions mo;
  {
    std::lock_guard<std::mutex> lock(impl_->node.mu);
    impl_->node.node_id = o.node_id.empty() ? HostName() : o.node_id;
    impl_->node.address = o.advertise_address.empty()
                              ? AdvertisedAddress(o.listen_address, impl_->port)
                              : o.advertise_address;
    impl_->node.started_unix_ms = NowUnixMs();
    mo.node_id = impl_->node.node_id;
    mo.address = impl_->node.address;
    mo.started_unix_ms = impl_->node.started_unix_ms;
  }
  if (o.etcd_endpoints.empty()) return absl::OkStatus();
  // Without the lock: calls that come in meanwhile hear "still joining" instead of waiting.
  EtcdOptions eo;
  eo.endpoints = o.etcd_endpoints;
  mo.prefix = o.etcd_prefix;
  mo.lease_ttl = o.node_lease_ttl;
  auto etcd = EtcdClient::Connect(eo);
  if (etcd.ok()) impl_->etcd = std::move(etcd).value();
  absl::StatusOr<std::unique_ptr<Membership>> member =
      etcd.ok() ? Membership::Join(impl_->etcd, mo)
                : absl::StatusOr<std::unique_ptr<Membership>>(etcd.status());
  if (!member.ok()) {
    Shutdown();  // never served as a member: stop
    return absl::Status(member.status().code(),
                        absl::StrCat("could not join the cluster: ", member.status().message()));
  }
  impl_->membership = std::move(member).value();
  impl_->placements = std::make_unique<PlacementStore>(impl_->etcd, o.etcd_prefix);
  std::lock_guard<std::mutex> lock(impl_->node.mu);
  impl_->node.membership = impl_->membership.get();
  impl_->node.placements = impl_->placements.get();
  return absl::OkStatus();
}

int SluiceServer::port() const { return impl_->port; }
const std::string& SluiceServer::node_id() const { return impl_->node.node_id; }
const std::string& SluiceServer::address() const { return impl_->node.address; }

void SluiceServer::Shutdown() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  {
    std::lock_guard<std::mutex> lock(impl_->ttl_mu);
    impl_->ttl_stop = true;
  }
  impl_->ttl_cv.notify_all();
  if (impl_->ttl_thread.joinable()) impl_->ttl_thread.join();
  impl_->metrics_endpoint.reset();  // (scrapes read the pools and the service)
  // Out of the cluster first, so that no one is sent here while the calls in flight finish.
  if (impl_->membership != nullptr) impl_->membership->Leave();
  impl_->server->Shutdown(std::chrono::system_clock::now() + impl_->options.shutdown_grace);
  impl_->server->Wait();
  impl_->merge_pool.reset();  // each runs what is queued, then joins
  impl_->meta_pool.reset();
  impl_->pool.reset();
  spdlog::info("event=stopped port={}", impl_->port);
}

void SluiceServer::ReloadFiles() {
  if (impl_->tls != nullptr) impl_->tls->Reload();
  if (impl_->auth != nullptr) impl_->auth->Reload();
}

int SluiceServer::metrics_port() const {
  return impl_->metrics_endpoint == nullptr ? 0 : impl_->metrics_endpoint->port();
}
std::string SluiceServer::RenderMetrics() const { return MetricsText(impl_->CollectMetrics()); }

std::vector<prometheus::MetricFamily> SluiceServer::Impl::CollectMetrics() const {
  MetricsSources s;
  s.metrics = &metrics;
  s.registry = registry.get();
  s.budget = budget.get();
  s.push_streams = &service->counts().push;
  s.fetch_streams = &service->counts().fetch;
  s.draining = node.draining.load();
  if (tls != nullptr) s.tls_expiry_unix = tls->expiry_unix();
  {
    std::lock_guard<std::mutex> lock(node.mu);
    s.started_unix_ms = node.started_unix_ms;
  }
  return sluice::CollectMetrics(s);
}

uint64_t SluiceServer::memory_parked_total() const { return impl_->budget->parked_total(); }
MemoryBudget& SluiceServer::memory_budget() { return *impl_->budget; }
size_t SluiceServer::open_push_streams() const { return impl_->service->counts().push.load(); }
size_t SluiceServer::open_fetch_streams() const { return impl_->service->counts().fetch.load(); }

}  // namespace sluice
