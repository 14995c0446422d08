#include "server/sluice_server.h"

#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/placement_store.h"
#include "objstore/s3_options.h"
#include "objstore/s3_store.h"
#include "rpc/error_reason.h"
#include "rpc/grpc_glue.h"
#include "rpc/tls_options.h"
#include "server/metrics/metric_families.h"
#include "server/metrics/metrics_http.h"
#include "server/metrics_scrape.h"
#include "server/net/connection_guard.h"
#include "server/net/listener_probe.h"
#include "server/rules/admission.h"
#include "server/rules/cluster_node.h"
#include "server/rules/evictor.h"
#include "server/rules/premerge.h"
#include "server/rules/repairer.h"
#include "server/rules/scrubber.h"
#include "server/rules/shuffle_expiry.h"
#include "server/rules/uploader.h"
#include "server/runtime/periodic.h"
#include "server/security/auth.h"
#include "server/security/tls_reloader.h"
#include "server/service/grpc_server.h"
#include "server/service/peer_fetcher.h"
#include "server/storage/file_util.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

// Threads for the small calls (CreateShuffle, GetShuffle, ..., CommitMapper).
constexpr int kMetaThreads = 2;
// A probe of the listener waits this long (at most its interval) for its connection to be
// accepted; this many failed probes in a row (at --listener_probe_s apart) mean it is dead.
constexpr std::chrono::seconds kListenerProbeWait{5};
constexpr int kListenerProbeFailures = 3;

uint64_t NowUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// How this server reaches its peers for re-replication (docs/cluster.md, "Re-replication"); an
// error names a flag whose file cannot be used; *off says why it cannot repair (a flag missing).
absl::StatusOr<PeerOptions> PeerAccess(const ServerOptions& o, std::string* off) {
  PeerOptions peer;
  if (o.tls.enabled()) {
    if (o.peer_tls.ca_file.empty()) {
      *off =
          "this server serves TLS and --peer_tls_ca (the CAs of the other servers' "
          "certificates) is not given";
    }
    peer.tls = o.peer_tls;
    peer.tls.enabled = true;
    if (absl::Status st = rpc::LoadClientTls(&peer.tls); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--peer_tls_*: ", st.message()));
    }
  }
  if (!o.auth_file.empty()) {
    if (o.peer_token_file.empty()) {
      // Under mutual TLS the certificate it shows is its credential: a `cn:` line of the other
      // servers' --auth_file makes its name an admin.
      if (o.tls.enabled() && !o.peer_tls.cert_file.empty()) return peer;
      if (off->empty()) {
        *off =
            "this server asks for credentials (--auth_file) and neither --peer_token_file (an "
            "admin's token for the other servers) nor, under mutual TLS, --peer_tls_cert (a "
            "certificate whose name their --auth_file makes an admin) is given";
      }
      return peer;
    }
    SLUICE_ASSIGN_OR_RETURN(std::string token,
                            file::ReadFile(o.peer_token_file, 4096, "--peer_token_file"));
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) {
      token.pop_back();
    }
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer_token_file=", o.peer_token_file, " holds no token"));
    }
    peer.token = std::move(token);
  }
  return peer;
}

// Settings that let others in, said at the start (docs/security.md): a private key other users
// may read, an auth file other users may write (they could make themselves admins), and the
// Drain RPC taken from other hosts with no credentials asked.
void WarnOfUnsafeSettings(const ServerOptions& options) {
  struct stat st;
  if (!options.tls.key_file.empty() && ::stat(options.tls.key_file.c_str(), &st) == 0 &&
      (st.st_mode & S_IRWXO) != 0) {
    spdlog::warn(
        "event=unsafe_file flag=--tls_key file={} mode={:o} message=\"the private key is open to "
        "every user of this host: chmod o-rwx it\"",
        options.tls.key_file, st.st_mode & 07777);
  }
  if (!options.auth_file.empty() && ::stat(options.auth_file.c_str(), &st) == 0 &&
      (st.st_mode & (S_IWOTH | S_IWGRP)) != 0) {
    spdlog::warn(
        "event=unsafe_file flag=--auth_file file={} mode={:o} message=\"other users may write "
        "the credentials (and make themselves admins): chmod go-w it\"",
        options.auth_file, st.st_mode & 07777);
  }
  if (options.allow_remote_admin && options.auth_file.empty()) {
    spdlog::warn(
        "event=unsafe_setting flag=--allow_remote_admin message=\"without --auth_file anyone who "
        "can reach the server can drain it: give --auth_file (admins only may then)\"");
  }
}

// --object_store's store, its credentials resolved as AWS's tools do, and looked at once: a
// bucket that is not there or credentials it refuses stop the start; a store that does not
// answer now is only warned of (uploads wait for it).
absl::StatusOr<std::unique_ptr<objstore::S3Store>> OpenObjectStore(const ServerOptions& o) {
  objstore::StoreLocation where(o.object_store, o.object_endpoint);
  where.region = o.object_region;
  where.ca_file = o.object_ca_file;
  if (o.object_addressing != "auto") where.path_style = o.object_addressing == "path";
  absl::StatusOr<std::unique_ptr<objstore::S3Store>> opened = objstore::S3Store::Open(where);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("--object_store: ", opened.status().message()));
  }
  std::unique_ptr<objstore::S3Store> store = *std::move(opened);
  const objstore::S3Options& so = store->options();
  store->set_retries(2, 0.2, 1);  // (the look at start only)
  absl::StatusOr<std::vector<objstore::ObjectInfo>> look = store->List("sluice-start-check/");
  store->set_retries(so.max_attempts, so.backoff_first_s, so.backoff_max_s);
  if (!look.ok() && !absl::IsUnavailable(look.status())) {
    return absl::Status(look.status().code(),
                        absl::StrCat("--object_store: ", look.status().message()));
  }
  if (!look.ok()) {
    spdlog::warn("event=object_store_down store=\"{}\" error=\"{}\"", so.DebugString(),
                 look.status().ToString());
  }
  spdlog::info("event=object_store store=\"{}\" credentials=\"{}\"", so.DebugString(),
               so.credentials.source);
  return store;
}

}  // namespace

// The parts, in the order they are made; each outlives those made after it that use it.
struct SluiceServer::Impl {
  ServerOptions options;
  ResolvedOptions resolved;             // the defaults worked out (ResolveOptions)
  MergeOptions merge;                   // a KEY fetch's merge (and the pre-merge's, in part)
  ServerMetrics metrics;                // the service and the stores count into it
  std::unique_ptr<TlsReloader> tls;     // with TLS; outlives `grpc`, which reads its files
  std::unique_ptr<Authenticator> auth;  // with --auth_file; outlives `grpc`, which calls it
  std::unique_ptr<ShuffleRegistry> registry;
  std::unique_ptr<WorkerPool> pool;        // pushes, fetch setup, UNORDERED fetches
  std::unique_ptr<WorkerPool> merge_pool;  // KEY merges
  std::unique_ptr<WorkerPool> meta_pool;   // the small calls
  std::unique_ptr<MemoryBudget> budget;
  std::unique_ptr<Gate> merge_gate;
  std::unique_ptr<Watchdog> watchdog;  // outlives the service's streams
  std::unique_ptr<ClusterNode> node;
  std::unique_ptr<OpenStreams> streams;
  Tenants tenants;
  std::shared_ptr<EtcdClient> etcd;  // with --etcd, once joined
  std::unique_ptr<Membership> membership;
  std::unique_ptr<EtcdPlacementStore> placements;
  std::unique_ptr<Periodic> watching;               // ClusterNode::WatchMembers, once joined
  std::unique_ptr<objstore::S3Store> object_store;  // with --object_store
  std::unique_ptr<objstore::RateLimiter> object_rate;
  // With --object_store: made once (by the cluster's join, or the background's start), shared
  // by the repairer and the evictor.
  std::unique_ptr<ObjectSource> object_source;
  std::unique_ptr<GrpcPeerFetcher> peers;  // with --repair_mb_per_s, once joined
  std::unique_ptr<Repairer> repairer;
  std::string repair_off;  // why this server does not repair (set once, before it joins)
  std::unique_ptr<Periodic> repairing;
  std::unique_ptr<GrpcServer> grpc;
  std::unique_ptr<ShuffleExpiry> expiry;  // with --shuffle_ttl_s
  std::unique_ptr<Periodic> expiring;
  std::unique_ptr<Scrubber> scrubber;  // with --scrub_mb_per_s
  std::unique_ptr<Periodic> scrubbing;
  std::unique_ptr<Premerger> premerger;  // with --premerge_mb_per_s
  std::unique_ptr<Periodic> premerging;
  std::unique_ptr<Uploader> uploader;  // with --object_store, once joined
  std::unique_ptr<Periodic> uploading;
  std::unique_ptr<Evictor> evictor;  // with --object_store
  std::unique_ptr<Periodic> evicting;
  std::unique_ptr<Background> opener;  // the shuffles listed at start, opened one by one
  std::unique_ptr<Periodic> closing;   // idle shuffles past --max_open_shuffles, --index_memory_mb
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;  // with --metrics_listen
  // Installed (install_connection_guard) before the port opens; then never destroyed: gRPC's
  // threads close connections' descriptors through it until the process ends.
  ConnectionGuard* connections = nullptr;
  std::unique_ptr<ListenerProbe> probe;  // guarded connections only
  std::unique_ptr<Periodic> probing;
  int probe_failures = 0;                   // in a row (the probe's thread)
  std::atomic<int> listener_accepting{-1};  // 1, 0; -1 not probed
  std::atomic<bool> listener_failed{false};
  bool stopped = false;

  // The drain: asked for once, its deadline only ever brought forward. A drain may be asked for
  // (the Drain RPC) while the server still starts: `serving` and `membership` are set under
  // drain_mu, and what a drain does to them is done when they come.
  std::mutex drain_mu;
  std::condition_variable drain_cv;
  bool drain_asked = false;
  bool serving = false;  // `grpc` is set
  std::chrono::steady_clock::time_point drain_deadline;

  ~Impl() {
    if (connections != nullptr && ConnectionGuard::installed() != connections) delete connections;
  }
  void Drain(std::chrono::milliseconds grace);
  absl::StatusOr<DecommissionState> Decommission();
  // One probe of the listener; the third failure in a row drains the server for a restart.
  void ProbeListener();
  // Start's steps, in order.
  absl::Status OpenFiles();    // TLS and credentials files
  absl::Status OpenStorage();  // the registry over the data directories, tmp emptied
  void MakeRuntime();          // pools, budget, merge gate, watchdog, the cluster node
  absl::Status Serve();        // the service's parts, the connections' guard, the port
  // Names the server and, with --etcd, registers it.
  absl::Status JoinCluster();
  size_t StartBackground();  // opening listed shuffles, scrub, pre-merge, expiry
  std::vector<prometheus::MetricFamily> CollectMetrics() const;
};

SluiceServer::SluiceServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SluiceServer::~SluiceServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<SluiceServer>> SluiceServer::Start(const ServerOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(const ResolvedOptions resolved,
                          ResolveOptions(options, file::OpenFilesLimit()));
  auto impl = std::make_unique<Impl>();
  Impl& i = *impl;
  i.options = options;
  i.resolved = resolved;
  SLUICE_RETURN_IF_ERROR(i.OpenFiles());
  SLUICE_RETURN_IF_ERROR(i.OpenStorage());
  i.MakeRuntime();
  SLUICE_RETURN_IF_ERROR(i.Serve());
  auto server = std::unique_ptr<SluiceServer>(new SluiceServer(std::move(impl)));
  if (absl::Status st = i.JoinCluster(); !st.ok()) {
    server->Shutdown();  // never served as a member: stop
    return st;
  }
  const size_t listed = i.StartBackground();
  if (!options.metrics_listen.empty()) {
    auto endpoint =
        MetricsEndpoint::Start(options.metrics_listen, [&i] { return i.CollectMetrics(); });
    if (!endpoint.ok()) {
      server->Shutdown();
      return endpoint.status();
    }
    i.metrics_endpoint = *std::move(endpoint);
  }
  const ClusterMembership::Self self = i.node->membership().self();
  spdlog::info(
      "event=started listen={} port={} data_dir={} shuffles={} memory_budget_mb={} node_id={} "
      "address={} cluster={} metrics_port={} max_open_shuffles={} max_concurrent_merges={}",
      options.listen_address, i.grpc->port(), options.data_dir, listed + i.registry->open_count(),
      options.memory_budget_bytes >> 20, self.node_id, self.address,
      i.membership != nullptr ? options.etcd_endpoints : std::string("none"),
      i.metrics_endpoint == nullptr ? 0 : i.metrics_endpoint->port(), resolved.max_open_shuffles,
      resolved.merges);
  return server;
}

// The listening port's files first, so that a bad one fails the start naming it.
absl::Status SluiceServer::Impl::OpenFiles() {
  if (options.tls.enabled()) {
    SLUICE_ASSIGN_OR_RETURN(tls, TlsReloader::Start(options.tls));
    spdlog::info("event=tls {} client_certificates={} reload_s={}", tls->summary(),
                 options.tls.client_ca_file.empty() ? "not_requested" : "required",
                 options.tls.reload_interval.count());
  } else if (!rpc::IsLoopbackAddress(options.listen_address)) {
    spdlog::warn(
        "event=plaintext listen={} message=\"serving without TLS on an address other hosts can "
        "reach: anyone on the network can read and change the shuffles' data\"",
        options.listen_address);
  }
  if (!options.auth_file.empty()) {
    SLUICE_ASSIGN_OR_RETURN(auth,
                            Authenticator::Open(options.auth_file, options.auth_reload_interval));
    spdlog::info("event=auth file={} reload_s={}", options.auth_file,
                 options.auth_reload_interval.count());
  }
  WarnOfUnsafeSettings(options);
  if (!options.object_store.empty()) {
    SLUICE_ASSIGN_OR_RETURN(object_store, OpenObjectStore(options));
  }
  return absl::OkStatus();
}

// Storage: every shuffle listed, none opened yet: each opens when first asked for, or in the
// background once the server serves (docs/storage.md, "Recovery").
absl::Status SluiceServer::Impl::OpenStorage() {
  StoreOptions store_options;
  store_options.fsync = options.fsync;
  store_options.limits = options.limits;
  store_options.commit_sync_seconds = &metrics.commit_sync_seconds;
  store_options.on_damaged = [this](const std::string& id, uint32_t partition,
                                    const absl::Status& why, const char* found_by) {
    ServerMetrics::Add(
        std::string_view(found_by) == "scrub" ? metrics.damaged_by_scrub : metrics.damaged_by_fetch,
        1);
    spdlog::error(
        "event=partition_damaged tenant={} shuffle={} partition={} found_by={} error=\"{}\"",
        TenantField(id), id, partition, found_by, std::string(why.message()));
  };
  SLUICE_ASSIGN_OR_RETURN(registry,
                          ShuffleRegistry::Open(SplitDataDirs(options.data_dir), store_options,
                                                ShuffleRegistry::Opening::kLazy));
  registry->set_high_water_pct(options.disk_high_water_pct);
  // Intermediate merge runs live in <data_dir>/tmp of the first healthy data directory; every
  // one is emptied at start.
  for (const auto& d : registry->DataDirs()) {
    if (d.failed.ok()) (void)file::RemoveTree(d.path + "/tmp");
  }
  SLUICE_RETURN_IF_ERROR(file::RemoveTree(registry->TmpDir()));
  return file::MakeDirs(registry->TmpDir());
}

// Threads and budgets. Merges have their own threads, one per merge slot, and the small calls
// theirs, so that neither long merges nor heavy pushes make a CreateShuffle wait.
void SluiceServer::Impl::MakeRuntime() {
  pool = std::make_unique<WorkerPool>(options.worker_threads);
  merge_pool = std::make_unique<WorkerPool>(resolved.merge_threads);
  meta_pool = std::make_unique<WorkerPool>(kMetaThreads);
  budget = std::make_unique<MemoryBudget>(options.memory_budget_bytes, pool.get());
  merge_gate = std::make_unique<Gate>(resolved.merges, merge_pool.get());
  watchdog = std::make_unique<Watchdog>();
  ClusterNode::Options node_options;
  node_options.clustered = resolved.clustered;
  node_options.settle = resolved.settle;
  node_options.dead_after = options.dead_after;
  node_options.revives_per_s = options.revives_per_s;
  node_options.split_bytes = options.partition_split_bytes;
  node = std::make_unique<ClusterNode>(registry.get(), node_options);
  streams = std::make_unique<OpenStreams>(options.max_push_streams, options.max_fetch_streams,
                                          options.max_plain_push_streams);
  merge.fan_in = options.merge_fan_in;
  merge.tmp_dir = registry->TmpDir();
  merge.limits = StoredFrameLimits(options.limits);  // it reads and rewrites committed data
  merge.memory_limit = resolved.merge_memory_bytes;
  merge.limit_name = resolved.merge_limit_name;
}

// The rules the service forwards to, the connections' guard, and the port.
absl::Status SluiceServer::Impl::Serve() {
  ServiceDeps deps;
  deps.registry = registry.get();
  deps.node = node.get();
  deps.pool = pool.get();
  deps.meta_pool = meta_pool.get();
  deps.merge_pool = merge_pool.get();
  deps.admission = AdmissionDeps{&tenants,         streams.get(),  budget.get(),
                                 merge_gate.get(), registry.get(), node.get()};
  deps.push.frame = options.limits;
  deps.push.max_frames_per_attempt = options.max_frames_per_attempt;
  deps.push.disk_high_water_pct = options.disk_high_water_pct;
  deps.push.require_prepare = node->requires_prepare();
  deps.push.max_message_bytes = rpc::kMaxPushMessageBytes;
  deps.fetch = FetchDeps{registry.get(), budget.get(), options.limits, merge};
  deps.watchdog = watchdog.get();
  deps.timeouts =
      StreamTimeouts{options.push_idle_timeout, options.fetch_stall_timeout,
                     options.merge_park_after, options.push_credit_timeout, options.caller_recheck};
  deps.metrics = &metrics;
  deps.auth = auth.get();
  deps.quotas = TenantLimits{options.tenant_max_shuffles, options.tenant_max_stored_bytes,
                             options.tenant_max_streams};
  deps.admin = AdminDeps{[this](std::chrono::milliseconds grace) { Drain(grace); },
                         [this]() -> absl::StatusOr<DecommissionState> { return Decommission(); },
                         options.drain_grace, options.allow_remote_admin};

  // Connections: what one client may hold of them (docs/operations.md, "Connections").
  ConnectionLimits climits;
  climits.descriptor_limit = resolved.descriptor_limit;
  climits.max_connections = resolved.max_connections;
  climits.protect = options.guard_connections;
  climits.max_per_address = resolved.max_connections_per_address;
  connections = new ConnectionGuard(climits);
  if (options.install_connection_guard) ConnectionGuard::Install(connections);
  spdlog::info(
      "event=connection_limits max_connections={} per_address={} descriptors={} "
      "reserved={} handshake_timeout_ms={} guarded={}",
      climits.max_connections, climits.max_per_address, climits.descriptor_limit,
      climits.descriptor_reserve, options.handshake_timeout.count(), options.guard_connections);

  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> started,
                          GrpcServer::Start(options, std::move(deps), tls.get(), &metrics.calls));
  {
    std::lock_guard<std::mutex> lock(drain_mu);
    grpc = std::move(started);
    serving = true;
    if (drain_asked) grpc->SetReady(false);
  }
  if (options.install_connection_guard && options.listener_probe_interval.count() > 0) {
    probe = std::make_unique<ListenerProbe>(
        ListenHost(options.listen_address), grpc->port(), connections,
        std::min<std::chrono::milliseconds>(kListenerProbeWait, options.listener_probe_interval));
    probing =
        std::make_unique<Periodic>(options.listener_probe_interval, [this] { ProbeListener(); });
  }
  return absl::OkStatus();
}

// The shuffles found at start, opened in the background (those asked for first open at once),
// within the open limits; the scrub, the pre-merge and the expiry of idle shuffles. Returns how
// many shuffles were listed.
size_t SluiceServer::Impl::StartBackground() {
  const size_t listed = registry->unopened();
  registry->set_open_limits(resolved.max_open_shuffles, options.index_memory_bytes);
  closing = std::make_unique<Periodic>(
      std::chrono::seconds(1), [this] { registry->CloseIdle(std::chrono::steady_clock::now()); });
  opener = std::make_unique<Background>([this, listed](const std::atomic<bool>& stop) {
    const auto began = std::chrono::steady_clock::now();
    while (!stop.load() && registry->OpenNextListed()) {
    }
    if (listed > 0 && !stop.load()) {
      spdlog::info("event=shuffles_opened count={} seconds={:.3f}", listed,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
    }
  });
  if (options.scrub_bytes_per_s > 0) {
    scrubber = std::make_unique<Scrubber>(registry.get(), options.scrub_bytes_per_s, &metrics);
    scrubbing = std::make_unique<Periodic>(Scrubber::kPeriod,
                                           [this] { scrubber->Run(Scrubber::Clock::now()); });
  }
  if (object_store != nullptr) {
    object_rate = std::make_unique<objstore::RateLimiter>(options.object_bytes_per_s);
    Uploader::Options uo;
    uo.upload.part_bytes = options.object_part_bytes;
    uo.upload.parallel_parts = options.object_parallel_parts;
    uo.upload.limiter = object_rate.get();
    uploader =
        std::make_unique<Uploader>(registry.get(), node.get(), object_store.get(), uo, &metrics);
    uploading = std::make_unique<Periodic>(Uploader::kPeriod, [this] { uploader->Run(); });
    if (object_source == nullptr) {  // (the cluster's join made it first, for the repairer)
      object_source = std::make_unique<ObjectSource>(node.get(), object_store.get(),
                                                     objstore::ReadOptions{}, registry.get());
    }
    evictor =
        std::make_unique<Evictor>(registry.get(), node.get(), object_source.get(), uploader.get(),
                                  Evictor::Options{options.object_evict_pct}, &metrics);
    node->set_evicted_restore([this](const std::string& id, uint32_t q,
                                     const std::vector<std::pair<uint32_t, uint64_t>>& lacking) {
      return evictor->ReadBack(id, q, lacking);
    });
    if (options.object_evict_pct != 0) {
      registry->set_room_maker([this] { return evictor->MakeRoom(); });
      evicting =
          std::make_unique<Periodic>(Evictor::kPeriod, [this] { (void)evictor->MakeRoom(); });
    }
  }
  if (options.premerge_bytes_per_s > 0) {
    PremergeOptions premerge;
    premerge.bytes_per_s = options.premerge_bytes_per_s;
    premerge.min_runs = options.premerge_min_runs;
    premerge.merge = merge;
    // Foreground merges first: one fetch merge's share of the budget, at most a quarter of it.
    premerge.merge.memory_limit = resolved.premerge_memory_bytes;
    premerge.merge.limit_name = "the pre-merge's share of --memory_budget_mb";
    premerge.budget = budget.get();
    // Its merging yields the CPU to every other thread (SCHED_IDLE); not under the store's locks.
    premerge.yield_cpu = [](bool idle) {
      sched_param none{};
      (void)pthread_setschedparam(pthread_self(), idle ? SCHED_IDLE : SCHED_OTHER, &none);
    };
    premerge.disk_mark_pct = resolved.premerge_disk_mark_pct;
    premerger = std::make_unique<Premerger>(registry.get(), premerge, &metrics);
    premerging = std::make_unique<Periodic>(Premerger::kPeriod, [this] { premerger->Run(); });
  }
  if (options.shuffle_ttl.count() > 0) {
    expiry = std::make_unique<ShuffleExpiry>(
        registry.get(), std::chrono::duration_cast<std::chrono::milliseconds>(options.shuffle_ttl));
    expiring = std::make_unique<Periodic>(
        expiry->period(), [this] { expiry->ExpireIdle(ShuffleExpiry::Clock::now()); });
  }
  return listed;
}

absl::Status SluiceServer::Impl::JoinCluster() {
  const ServerOptions& o = options;
  ClusterMembership::Self self;
  self.node_id = o.node_id.empty() ? HostName() : o.node_id;
  self.address = o.advertise_address.empty() ? AdvertisedAddress(o.listen_address, grpc->port())
                                             : o.advertise_address;
  self.started_unix_ms = NowUnixMs();
  node->membership().SetSelf(self);
  if (o.etcd_endpoints.empty()) return absl::OkStatus();
  // (Before it registers: a peer flag whose file cannot be used stops the start.)
  std::string off;
  SLUICE_ASSIGN_OR_RETURN(PeerOptions peer, PeerAccess(o, &off));
  if (o.repair_bytes_per_s == 0) off = "--repair_mb_per_s=0";
  repair_off = off;
  // Calls that come in meanwhile hear "still joining" from the node instead of waiting.
  MembershipOptions mo;
  mo.node_id = self.node_id;
  mo.address = self.address;
  mo.started_unix_ms = self.started_unix_ms;
  mo.prefix = o.etcd_prefix;
  mo.lease_ttl = o.node_lease_ttl;
  EtcdOptions eo;
  eo.endpoints = o.etcd_endpoints;
  auto client = EtcdClient::Connect(eo);
  if (client.ok()) etcd = *std::move(client);
  absl::StatusOr<std::unique_ptr<Membership>> member =
      client.ok() ? Membership::Join(etcd, mo)
                  : absl::StatusOr<std::unique_ptr<Membership>>(client.status());
  if (!member.ok()) {
    return absl::Status(member.status().code(),
                        absl::StrCat("could not join the cluster: ", member.status().message()));
  }
  {
    std::lock_guard<std::mutex> lock(drain_mu);
    membership = *std::move(member);
    if (drain_asked) membership->Leave();  // drained while it joined
  }
  placements = std::make_unique<EtcdPlacementStore>(etcd, o.etcd_prefix);
  // (Before Joined: a joined node's calls use it.)
  peers = std::make_unique<GrpcPeerFetcher>(std::move(peer));
  node->membership().Joined(membership.get(), placements.get());
  node->WatchMembers();  // who is registered now: creates do not place on fewer later
  // A third of the lease, at most a second: an etcd outage is known before a reader waits on
  // it, and a server gone from the list is seen.
  const auto every = std::min<std::chrono::milliseconds>(
      std::chrono::seconds(1),
      std::chrono::duration_cast<std::chrono::milliseconds>(o.node_lease_ttl) / 3);
  watching = std::make_unique<Periodic>(every, [this] { node->WatchMembers(); });
  if (o.repair_bytes_per_s > 0) {
    if (!off.empty()) {
      spdlog::warn("event=repair_off reason=\"{}\"", off);
    } else {
      if (object_store != nullptr && object_source == nullptr) {
        object_source = std::make_unique<ObjectSource>(node.get(), object_store.get(),
                                                       objstore::ReadOptions{}, registry.get());
      }
      repairer = std::make_unique<Repairer>(registry.get(), node.get(), peers.get(),
                                            o.repair_bytes_per_s, &metrics, object_source.get());
      repairing = std::make_unique<Periodic>(std::chrono::seconds(1), [this] { repairer->Run(); });
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DecommissionState> SluiceServer::Impl::Decommission() {
  if (!node->clustered()) {
    return absl::FailedPreconditionError(
        "this server runs on its own (no --etcd): there is nowhere to move its shuffles to");
  }
  if (!node->membership().joined()) {
    return WithReason(absl::UnavailableError("the server is still joining its cluster; retry"),
                      ErrorReason::kJoining);
  }
  if (!repair_off.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("decommission needs re-replication, which this server does not run (",
                     repair_off, "; docs/cluster.md, \"Re-replication\")"));
  }
  SLUICE_RETURN_IF_ERROR(node->membership().StartDecommission());
  return CheckDecommission(registry.get(), node.get(), peers.get());
}

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
  node->membership().SetDraining();  // new push streams are refused from now on
  spdlog::info("event=drain grace_ms={} push_streams={} fetch_streams={}", grace.count(),
               streams->push(), streams->fetch());
  std::lock_guard<std::mutex> lock(drain_mu);
  if (serving) grpc->SetReady(false);
  // Out of the cluster's list: readers go to other replicas, writers are told it is down, and
  // that it restarts (they wait for it rather than revive it).
  if (membership != nullptr) membership->Leave(/*restarting=*/true);
}

void SluiceServer::Drain(std::chrono::milliseconds grace) { impl_->Drain(grace); }

void SluiceServer::Impl::ProbeListener() {
  if (probe->Check()) {
    if (listener_accepting.exchange(1) == 0) spdlog::info("event=listener_accepting");
    probe_failures = 0;
    return;
  }
  listener_accepting.store(0);
  ++probe_failures;
  spdlog::warn("event=listener_probe_failed failures={} error=\"{}\"", probe_failures,
               probe->error());
  if (probe_failures < kListenerProbeFailures || listener_failed.exchange(true)) return;
  // It serves the connections it has, and takes no new one: only a restart brings the listener
  // back. Readiness fails first (the drain), then the process exits 1 for its supervisor.
  spdlog::critical(
      "event=listener_dead failures={} note=\"new connections are not accepted: draining, then "
      "exiting 1 for a restart\"",
      probe_failures);
  Drain(options.drain_grace);
}

bool SluiceServer::listener_failed() const { return impl_->listener_failed.load(); }

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
    if (i.streams->total() > 0) idle_since = now;
    if (now - idle_since >= kQuiet || now >= i.drain_deadline) break;
    i.drain_cv.wait_for(lock, std::chrono::milliseconds(50));
  }
  spdlog::info("event=drained waited_ms={} push_streams={} fetch_streams={}",
               std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - start)
                   .count(),
               i.streams->push(), i.streams->fetch());
}

void SluiceServer::Shutdown() {
  if (impl_ == nullptr || impl_->stopped) return;
  Impl& i = *impl_;
  i.stopped = true;
  i.probing.reset();
  i.expiring.reset();
  i.scrubbing.reset();
  if (i.premerger != nullptr) i.premerger->Stop();
  i.premerging.reset();
  i.opener.reset();
  i.closing.reset();
  if (i.repairer != nullptr) i.repairer->Stop();
  i.repairing.reset();
  if (i.uploader != nullptr) i.uploader->Stop();
  i.uploading.reset();
  if (i.evictor != nullptr) i.evictor->Stop();
  i.evicting.reset();
  i.watching.reset();
  i.metrics_endpoint.reset();  // (scrapes read the pools and the service)
  // Out of the cluster first, so that no one is sent here while the calls in flight finish.
  if (i.membership != nullptr) i.membership->Leave();
  i.grpc->Shutdown(std::chrono::system_clock::now() + i.options.shutdown_grace);
  i.merge_pool.reset();  // each runs what is queued, then joins
  i.meta_pool.reset();
  i.pool.reset();
  spdlog::info("event=stopped port={}", i.grpc->port());
}

int SluiceServer::port() const { return impl_->grpc->port(); }
std::string SluiceServer::node_id() const { return impl_->node->membership().self().node_id; }
std::string SluiceServer::address() const { return impl_->node->membership().self().address; }

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
  s.streams = streams.get();
  s.connections = connections;
  s.listener_accepting = listener_accepting.load();
  s.draining = node->membership().draining();
  if (tls != nullptr) {
    s.tls_expiry_unix = tls->expiry_unix();
    s.tls_reloads = tls->reloads();
  }
  s.object_store = object_store.get();
  s.started_unix_ms = node->membership().self().started_unix_ms;
  return sluice::CollectMetrics(s);
}

uint64_t SluiceServer::memory_parked_total() const { return impl_->budget->parked_total(); }
MemoryBudget& SluiceServer::memory_budget() { return *impl_->budget; }
size_t SluiceServer::open_push_streams() const { return impl_->streams->push(); }
size_t SluiceServer::open_fetch_streams() const { return impl_->streams->fetch(); }

}  // namespace sluice
