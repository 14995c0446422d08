// The Sluice C++ client: one ShuffleClient per server or cluster (it owns the channels, reuse
// it), a ShuffleWriter per mapper attempt, a ShuffleReader per partition. No gRPC types here.
//
// In a cluster (docs/cluster.md) the client routes by the shuffle's placement: a writer sends
// each partition to every server that keeps a replica of it, prepares the attempt on all of
// them and has one server decide it; a reader reads a partition's primary and, when it fails,
// goes on from the next replica where it left off (nothing twice, nothing skipped). A writer
// does not fail over: its attempt fails with UNAVAILABLE naming the server, for the engine to
// retry with a new attempt id (as `sluice bench` does).
//
// Writers and readers use their client's connections: they must not outlive it.
//
//   SLUICE_ASSIGN_OR_RETURN(auto client, sluice::ShuffleClient::Connect({.server = "host:7070"}));
//   SLUICE_RETURN_IF_ERROR(client->CreateShuffle("job", /*partitions=*/8, /*mappers=*/4).status());
//   SLUICE_ASSIGN_OR_RETURN(auto writer, client->OpenWriter("job", /*mapper=*/0, /*attempt=*/1));
//   for (...) SLUICE_RETURN_IF_ERROR(writer->Add(key, value));
//   SLUICE_RETURN_IF_ERROR(writer->Close().status());      // commits; Abort() or ~ discards
//
//   SLUICE_ASSIGN_OR_RETURN(auto reader, client->OpenReader("job", /*partition=*/3, {.order =
//   kKey})); sluice::Record r; while (*reader->Next(&r)) Use(r.key, r.value);
//
// Errors say what happened: UNAVAILABLE "server unreachable at ...", INVALID_ARGUMENT for
// input the server rejected (with its reason), FAILED_PRECONDITION for missing mappers, etc.
// Whether a retry can help is the code's to say (Retryable, rpc/error_reason.h, part of this
// API with ReasonOf and RetryAfterOf; docs/api.md, "Errors and retries"). The client itself
// sends a call again only where nothing of it reached a server (a dead connection), and asks
// servers that timed out after the others for a while (ClientOptions::unhealthy_for); a
// mapper attempt is never retried for the engine, which owns attempts.
#ifndef SLUICE_CLIENT_SHUFFLE_CLIENT_H_
#define SLUICE_CLIENT_SHUFFLE_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/frame_format.h"
#include "rpc/error_reason.h"  // (the errors' reasons: part of the API)
#include "rpc/tls_options.h"

namespace sluice {

struct ClientOptions {
  /// The server, or the servers of a cluster: "host:port", "h1:p1,h2:p2,...", or one DNS name
  /// whose address records are the servers (a Kubernetes headless Service). Any one that
  /// answers is enough: the client learns the rest from it (GetPlacement, ListNodes).
  std::string server = "127.0.0.1:7070";
  /// How long a shuffle's placement (and whether it lives in a cluster) is reused before it is
  /// asked for again; also dropped when a server of it fails. A shuffle deleted and created
  /// again under the same id within this time may be routed by the old one: use fresh ids.
  std::chrono::milliseconds placement_ttl{10000};
  /// Deadline of unary calls; streams use `stream_deadline` (0 = none: a push or fetch may
  /// take as long as it makes progress).
  std::chrono::milliseconds call_deadline{30000};
  std::chrono::milliseconds stream_deadline{0};
  /// Keepalive: the connection is pinged every `keepalive_time`, and a ping unanswered for
  /// `keepalive_timeout` closes it, failing every call on it with UNAVAILABLE. A server that
  /// hangs (stopped, wedged host, dropped network) is so detected within about
  /// keepalive_time + keepalive_timeout. The server accepts pings at most once a second.
  std::chrono::milliseconds keepalive_time{10000};
  std::chrono::milliseconds keepalive_timeout{10000};
  /// A server that timed out, refused the connection or was found hung is tried after the
  /// others for this long (a cluster's control calls go to healthy servers first).
  std::chrono::milliseconds unhealthy_for{30000};
  /// Largest frame the client builds or accepts; must fit the server's --max_frame_mb.
  FrameLimits limits;
  /// TLS to the servers (docs/security.md); plaintext when `tls.On()` is false. Connect reads
  /// the files once and fails naming a file that is missing, not PEM, expired or mismatched.
  ClientTlsOptions tls;
  /// A bearer token for servers that ask for credentials (--auth_file; docs/security.md). It is
  /// sent only over TLS or to a loopback address: Connect refuses a token that would cross the
  /// network in clear.
  std::string token;
  /// Push within credit the server grants from its memory budget (PushFlow), where the server
  /// offers it (NodeInfo.protocol 2): its memory then counts every message before it is sent,
  /// however many streams push at once. false: the plain Push stream (for comparison).
  bool push_credit = true;
  /// The object tier's store, as the servers' --object_store (s3://bucket/prefix), and its
  /// endpoint (empty: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS's): a read that no server
  /// can serve (every replica down, or no server answering at all) is read from the shuffle's
  /// objects instead, where the store holds its manifest (docs/object-store.md, "Reads with no
  /// server"). Credentials as AWS's tools find them. Empty: reads never go to the store.
  std::string object_store;
  std::string object_endpoint;
};

struct PartitionStatsInfo {
  uint64_t records = 0, bytes = 0;
  uint32_t frames = 0;
  /// A fetch or the server's scrub found its committed data damaged (`damage` says where): its
  /// fetches there fail with DATA_LOSS (in a cluster, only when no replica is whole).
  bool damaged = false;
  std::string damage;
  /// In a cluster, from one server: committed mappers its replica lacks (it took the partition
  /// over in a later placement epoch and is not repaired yet); ShuffleClient::GetShuffle
  /// takes a whole replica's counts.
  uint32_t missing_mappers = 0;
  /// In a cluster: mappers of this partition no server holds any more (every replica of every
  /// epoch that held their data is gone for good): see ShuffleStatus::lost_partitions.
  std::vector<uint32_t> lost_mappers;
  /// Asked for (StatusOptions::hot_keys): its heaviest keys by records, heaviest first, summed
  /// over the frames each was the heaviest key of (docs/api.md, "Hot keys").
  struct HotKey {
    std::string key;  ///< its first 32 bytes when `cut`
    bool cut = false;
    uint64_t records = 0, bytes = 0;
    uint64_t error = 0;  ///< records may be up to this many too high
  };
  std::vector<HotKey> hot_keys;
  /// From one server: its background pre-merge's sorted runs of the partition, and the committed
  /// mappers they stand for (docs/storage.md, "Pre-merged runs").
  uint32_t premerged_runs = 0, premerged_mappers = 0;
};
/// What GetShuffle reports beyond the counts.
struct StatusOptions {
  /// Each partition's heaviest keys, at most this many (0 to 8).
  uint32_t hot_keys = 0;
};
/// A partition with committed data no server holds any more (ShuffleStatus::lost_partitions).
struct LostPartition {
  uint32_t partition = 0;
  std::vector<uint32_t> mappers;  ///< whose records of it are gone
};
struct ShuffleStatus {
  std::string shuffle_id;
  uint32_t num_partitions = 0, num_mappers = 0;
  std::vector<uint32_t> committed_mappers;
  std::vector<PartitionStatsInfo> partitions;  // empty in ListShuffles
  /// The server found its committed data damaged at start: `damage` says what; its data calls
  /// fail with DATA_LOSS and DeleteShuffle removes it.
  bool damaged = false;
  std::string damage;
  /// A failed disk write stopped its commits; it reopens itself on a later push (`wedge` says).
  bool wedged = false;
  std::string wedge;
  /// ListShuffles: not open on its server now (its committed mappers are not listed).
  bool unopened = false;
  /// In a cluster: partitions none of whose servers answered (each listed with zero counts).
  /// While they are gone their data cannot be read; if they do not come back, the job must
  /// write the shuffle again under a new id (its mappers' decisions stay with this one).
  std::vector<uint32_t> unavailable_partitions;
  /// In a cluster: partitions with fewer whole replicas answering than the replication (a
  /// server down, damaged, or lacking mappers it took over and has not copied yet:
  /// docs/cluster.md, "Re-replication"). A server this client found unresponsive within
  /// `unhealthy_for` is not asked while another replica answers, and counts as not whole.
  std::vector<uint32_t> under_replicated_partitions;
  /// In a cluster: partitions some of whose committed mappers' records no server holds any
  /// more (every server that held them was taken out of the placement, dead past
  /// --dead_after_s; docs/cluster.md, "Lost partitions"), each with those mappers. Readers of
  /// such a partition wait (INCOMPLETE) and then fail; the records come back only by running
  /// those mappers again into a new shuffle. A decision of this shuffle is never revoked.
  std::vector<LostPartition> lost_partitions;
  /// In a cluster: the placement epoch the counts are for (one server's in GetShuffle on it).
  uint32_t placement_epoch = 0;
};

/// A server of the cluster (ListNodes).
struct NodeAddress {
  std::string node_id;
  std::string address;
  uint64_t started_unix_ms = 0;
};
/// A server of the shuffles a server knows that is not registered now (ListNodes' `absent`).
struct AbsentNode {
  std::string node_id;
  std::chrono::milliseconds absent{0};  ///< not registered for this long, as that server saw it
  bool dead = false;  ///< past --dead_after_s: taken out of its shuffles' placements
};
/// One server's view of itself (GetNode).
struct NodeStatus {
  std::string node_id, address;
  bool serving = false;
  uint64_t disk_free_bytes = 0, disk_total_bytes = 0;
  uint64_t memory_budget_bytes = 0, memory_used_bytes = 0;
  uint32_t shuffles = 0, push_streams = 0, fetch_streams = 0;
  bool clustered = false;   ///< runs with --etcd
  bool registered = false;  ///< and its registration in etcd is live
  uint64_t started_unix_ms = 0;
  /// Re-replication: committed (mapper, partition) pairs its replicas lack and will copy from
  /// other replicas, and the bytes it has copied since its start.
  uint64_t repair_backlog = 0, repaired_bytes = 0;
  uint64_t repair_backlog_bytes = 0;  ///< what the backlog comes to, as its sources say
  /// Stored frame bytes its fetches read since its start (a key range: the frames meeting it).
  uint64_t fetch_stored_bytes = 0;
  /// Bytes its background pre-merge wrote since its start, and whether it is merging now.
  uint64_t premerge_written_bytes = 0;
  bool premerging = false;
  /// A decommission was asked: it takes no new partitions, its replicas move elsewhere.
  bool decommissioning = false;
  /// Its data directories (--data_dir, one per disk), in order.
  struct DataDir {
    uint32_t index = 0;  ///< 1-based
    bool failed = false;
    std::string error;  ///< why it failed
    uint32_t shuffles = 0;
    uint64_t partitions = 0, disk_free_bytes = 0, disk_total_bytes = 0;
  };
  std::vector<DataDir> data_dirs;
};

/// Where a shuffle's partitions live (GetPlacement).
struct PlacementInfo {
  std::string shuffle_id;
  uint32_t num_partitions = 0, num_mappers = 0, replication = 1;
  /// The servers placement chose from; `address` is empty for one not registered now.
  std::vector<NodeAddress> nodes;
  /// Per partition, indexes into `nodes`, primary first.
  std::vector<std::vector<uint32_t>> replicas;
  /// The shuffle lives in a cluster (prepare, then CommitMapper); false: on one server alone.
  bool clustered = false;
  /// 0: read from the cluster's record now. Else etcd could not be reached and the server
  /// answered from the placement it had read this long ago (a placement changes only by a
  /// new epoch, which needs etcd; the addresses are the last it saw registered).
  std::chrono::milliseconds age{0};
  /// The newest placement epoch (0 until a server is taken out; docs/cluster.md, "Placement
  /// epochs"): `replicas` are its. Writers route by it.
  uint32_t epoch = 0;
  /// Huge partitions' further segments, oldest first (docs/cluster.md, "Huge partitions"):
  /// segment k is stored and read as partition num_partitions + k, on `replicas`.
  struct Segment {
    uint32_t parent = 0;
    std::vector<uint32_t> replicas;
  };
  std::vector<Segment> segments;
  uint64_t split_bytes = 0;  ///< 0: its partitions never split
  /// The record's revision in etcd (0 on a server of its own), and, from
  /// GetPlacementIfChanged, whether it is still the one asked about (then nothing else is set).
  uint64_t revision = 0;
  bool unchanged = false;
  /// Partition p's stored partitions: p, then its segments oldest first.
  std::vector<uint32_t> ChainOf(uint32_t p) const {
    std::vector<uint32_t> out{p};
    for (size_t k = 0; k < segments.size(); ++k) {
      if (segments[k].parent == p) out.push_back(num_partitions + static_cast<uint32_t>(k));
    }
    return out;
  }
  /// Stored partition q's replicas (a partition's or a segment's).
  const std::vector<uint32_t>& ReplicasOf(uint32_t q) const {
    return q < num_partitions ? replicas[q] : segments[q - num_partitions].replicas;
  }
};

/// Maps a key to a partition in [0, num_partitions).
using Partitioner = std::function<uint32_t(std::string_view key, uint32_t num_partitions)>;
/// xxh3_64(key) % num_partitions: the default, the way zephyr routes its key bytes.
uint32_t HashPartition(std::string_view key, uint32_t num_partitions);
/// Range partitioning: partition i takes keys in [splits[i-1], splits[i]) (bytewise order);
/// splits.size() + 1 partitions.
Partitioner RangePartitioner(std::vector<std::string> splits);

struct WriterOptions {
  Partitioner partitioner;  ///< default HashPartition
  /// What the writer buffers, all partitions together (1 to 64 GiB); past it the partitions
  /// holding the larger half of it (chosen largest first) are sent (zephyr's OOM-proof rule), while
  /// the rest wait in the next fill. A writer holds at most two fills: one being filled, one
  /// being sent.
  size_t buffer_bytes = 64u << 20;
  /// Sort each flushed buffer by key (for KEY-ordered shuffles: every frame is then a run).
  bool sort_by_key = false;
  LayoutChoice layout = LayoutChoice::kAuto;
  int zstd_level = 3;
  /// Largest frame built from one flush (a bigger flush becomes several frames).
  size_t frame_bytes = 8u << 20;
  /// With sort_by_key, the largest frame instead (when smaller than frame_bytes): a sorted flush
  /// is one run cut into frames this size, so that a key-range read (a slice of a skewed
  /// partition, docs/api.md "Split reads") reads about one frame past its range per run rather
  /// than whole megabytes. Measured neutral for the seed workload (docs/benchmarks.md).
  size_t sorted_frame_bytes = 256u << 10;
};

struct WriteResult {
  bool duplicate = false;  ///< another attempt of this mapper had committed first
  /// In a cluster: the mapper's winning attempt (this one unless `duplicate`); 0 when the
  /// server does not say (one server on its own).
  uint64_t winning_attempt = 0;
  uint64_t frames = 0, records = 0, bytes = 0;
};

/// One mapper attempt. Add() buffers; a full buffer is encoded and sent by a background thread
/// while Add() fills the next (one in flight, then Add() waits). Not thread-safe.
class ShuffleWriter {
 public:
  virtual ~ShuffleWriter() = default;  // without Close(): the attempt is discarded
  virtual absl::Status Add(std::string_view key, std::string_view value) = 0;
  /// Flushes everything and commits. The writer is finished afterwards.
  virtual absl::StatusOr<WriteResult> Close() = 0;
  /// Discards the attempt (nothing becomes visible).
  virtual void Abort() = 0;
};

enum class FetchOrder { kUnordered, kKey };
struct ReaderOptions {
  FetchOrder order = FetchOrder::kUnordered;
  bool require_complete = false;
  LayoutChoice layout = LayoutChoice::kAuto;  ///< of frames a KEY fetch builds
  size_t chunk_bytes = 1u << 20;
  /// Leave out the partition's first records in this order (to resume on another replica).
  uint64_t skip_records = 0;
  /// Only these mappers' records, in increasing order (empty: every committed mapper); a server
  /// that has not committed one of them refuses with ABORTED. The cluster client sets it when
  /// it resumes on another replica, to read exactly the mappers the first one served.
  std::vector<uint32_t> only_mappers;
  /// With only_mappers: the attempt of each that the read began with (empty: any); a server
  /// whose committed attempt of one is another refuses with ABORTED, reason REVOKED (docs/
  /// cluster.md, "Revoking decisions"). The cluster client sets it with only_mappers.
  std::vector<uint64_t> only_attempts;
  /// In a cluster: the placement epoch the reader routes by (the cluster client sets it); a
  /// server that knows an older one reads the shuffle's record first.
  uint32_t placement_epoch = 0;
  /// KEY order only: the records with keys in [from_key, to_key) (no to_key: to the end); the
  /// server reads only the stored frames whose key bounds meet the range (a slice of
  /// ShuffleClient::GetSplits; docs/api.md, "Split reads").
  std::string from_key;
  std::optional<std::string> to_key;
};

/// Keys that cut a partition into slices of nearly equal stored bytes (ShuffleClient::GetSplits).
struct SplitKeys {
  /// Increasing: slice i is the keys in [keys[i-1], keys[i]), the first from the start and the
  /// last to the end. Fewer than asked when the partition cannot be cut finer.
  std::vector<std::string> keys;
  std::vector<uint64_t> slice_bytes;  ///< each slice's stored bytes, as estimated
  uint64_t partition_bytes = 0;
  uint32_t frames = 0, frames_without_bounds = 0;
  /// ReaderOptions for slice i (of keys.size() + 1), KEY order.
  ReaderOptions Slice(size_t i, ReaderOptions base = {}) const;
};

/// One partition's records. Views stay valid until the next call.
class ShuffleReader {
 public:
  virtual ~ShuffleReader() = default;
  /// Sets *out to the next record; false at the end.
  virtual absl::StatusOr<bool> Next(Record* out) = 0;
  /// For KEY order: the next key and all its values (copies).
  absl::StatusOr<bool> NextGroup(std::string* key, std::vector<std::string>* values);

 private:
  bool has_pending_ = false;
  std::string pending_key_, pending_value_;
};

class ShuffleClient {
 public:
  static absl::StatusOr<std::unique_ptr<ShuffleClient>> Connect(const ClientOptions& options);
  virtual ~ShuffleClient() = default;

  /// true if created, false if it already existed with the same arguments. `replication`: in
  /// a cluster, the servers that keep each partition (0 = 2 with two or more servers).
  virtual absl::StatusOr<bool> CreateShuffle(const std::string& id, uint32_t num_partitions,
                                             uint32_t num_mappers, uint32_t replication = 0) = 0;
  absl::StatusOr<ShuffleStatus> GetShuffle(const std::string& id) { return GetShuffle(id, {}); }
  virtual absl::StatusOr<ShuffleStatus> GetShuffle(const std::string& id,
                                                   const StatusOptions& options) = 0;
  virtual absl::StatusOr<std::vector<ShuffleStatus>> ListShuffles() = 0;
  virtual absl::Status DeleteShuffle(const std::string& id) = 0;
  /// The server's node id, address, health and free resources.
  virtual absl::StatusOr<NodeStatus> GetNode() = 0;
  /// The servers of its cluster (itself alone when it runs without etcd), by node id.
  virtual absl::StatusOr<std::vector<NodeAddress>> ListNodes() = 0;
  /// The servers of the shuffles the server knows that are not registered now: suspect, or
  /// dead past its --dead_after_s (docs/cluster.md, "Placement epochs").
  virtual absl::StatusOr<std::vector<AbsentNode>> AbsentNodes() = 0;
  /// Where each partition of the shuffle lives (the same from every server of a cluster).
  virtual absl::StatusOr<PlacementInfo> GetPlacement(const std::string& id) = 0;
  /// GetPlacement, or only `unchanged` (and `revision`) when the record is still at
  /// `known_revision` (a PlacementInfo::revision): what a reader that must know the newest
  /// segments asks. This default asks for the whole placement.
  virtual absl::StatusOr<PlacementInfo> GetPlacementIfChanged(const std::string& id,
                                                              uint64_t known_revision) {
    (void)known_revision;
    return GetPlacement(id);
  }
  /// Drains the server (the first one given, only: a drain is asked of one server;
  /// docs/operations.md): it takes no new pushes, finishes what is in flight within `grace_seconds`
  /// (0 = its --drain_grace_s), then exits. Only from the server's own host unless it runs with
  /// --allow_remote_admin.
  virtual absl::Status Drain(uint32_t grace_seconds) = 0;
  /// How far a decommission is (Decommission).
  struct DecommissionProgress {
    bool done = false;  ///< it may be stopped: no replica would be lost
    uint32_t shuffles_placed = 0, partitions_short = 0;
    std::string waiting_for;
  };
  /// Decommissions the server (the first one given, only; docs/cluster.md, "Decommission"):
  /// it takes no new partitions and its replicas move to other servers. Asked again, it says
  /// how far that is; `done`: a stop loses nothing. Admin.
  virtual absl::StatusOr<DecommissionProgress> Decommission() = 0;
  /// What RevokeMappers did.
  struct Revocation {
    uint32_t placement_epoch = 0;    ///< the epoch that revoked them: new attempts push in it
    std::vector<uint64_t> attempts;  ///< the attempts revoked, one per mapper asked
  };
  /// In a cluster: revokes the winning decisions of `mappers` of the shuffle, as its status at
  /// `placement_epoch` (ShuffleStatus::placement_epoch) showed them, so that the engine re-runs
  /// them into the same shuffle: typically the mappers of its lost partitions (docs/cluster.md,
  /// "Revoking decisions"). Decided once in the cluster's record; returns once every registered
  /// server of the shuffle has applied it (UNAVAILABLE naming those that did not: retry, a
  /// repeat revokes nothing new). ABORTED when the placement moved since `placement_epoch`
  /// (read the status again); FAILED_PRECONDITION for a mapper not committed, and on a server on
  /// its own.
  virtual absl::StatusOr<Revocation> RevokeMappers(const std::string& id,
                                                   const std::vector<uint32_t>& mappers,
                                                   uint32_t placement_epoch) = 0;
  /// What ReviveShuffle did.
  struct Revive {
    uint32_t placement_epoch = 0;  ///< the newest epoch now: retry the attempt routed by it
    bool revived = false;          ///< this call made it
  };
  /// In a cluster: a writer routed by `placement_epoch` could not reach server `node_id` of the
  /// shuffle (no answer); the server asked takes it out with a new epoch at once, decided once
  /// (docs/cluster.md, "Revive"). The cluster client does this itself when a writer's server
  /// does not answer. UNAVAILABLE when it cannot now (retry; the grace takes the server out).
  virtual absl::StatusOr<Revive> ReviveShuffle(const std::string& id, uint32_t placement_epoch,
                                               const std::string& node_id) = 0;
  /// Keys cutting `partition` into at most `slices` (1 to 4,096) slices of nearly equal stored
  /// bytes, planned by a server that keeps it from its frames' key bounds (no data is read).
  /// Read each slice with OpenReader(..., keys.Slice(i)).
  virtual absl::StatusOr<SplitKeys> GetSplits(const std::string& id, uint32_t partition,
                                              uint32_t slices, uint32_t placement_epoch = 0) = 0;
  /// Asks the server for the partition count, then opens the attempt's push stream.
  virtual absl::StatusOr<std::unique_ptr<ShuffleWriter>> OpenWriter(
      const std::string& id, uint32_t mapper, uint64_t attempt,
      const WriterOptions& options = {}) = 0;
  virtual absl::StatusOr<std::unique_ptr<ShuffleReader>> OpenReader(
      const std::string& id, uint32_t partition, const ReaderOptions& options = {}) = 0;
};

}  // namespace sluice

#endif  // SLUICE_CLIENT_SHUFFLE_CLIENT_H_
