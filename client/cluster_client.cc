// The client of a server list or a cluster (docs/cluster.md): ShuffleClient::Connect. The plain
// calls go to the first given server that answers; writers and readers follow the shuffle's
// placement. Transport-free: each server is a ServerLink (client/transport.h).
//
//   writer: one push stream to every server that keeps a replica of any partition (an empty
//           one too: each must know the attempt is whole for its partitions); each frame goes
//           to every replica of its partition; Close() prepares on every stream, then asks one
//           of the servers (the next on UNAVAILABLE) to decide. No failover: a failed server
//           fails the attempt, and the engine retries it with a new attempt id.
//   reader: the partition's primary; on a failure another replica could avoid (unreachable,
//           hung, damaged, overloaded, or not keeping it: a node renamed at its address) the
//           next replica, told to skip the records already returned. Replicas order a
//           partition alike, so nothing comes twice or is skipped.
//
// Faults (docs/api.md, "Errors and retries"): a server that timed out or could not be reached
// is marked unhealthy for a while and asked after the others; a placement is kept past its TTL
// while no server can give a fresh one (etcd down); an error that is etcd's is not tried on
// the other servers (they share etcd), but for GetPlacement (another server may remember it).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "client/cluster_readers.h"
#include "client/cluster_writer.h"
#include "client/partitioned_writer.h"
#include "client/shuffle_client.h"
#include "client/store_fallback.h"
#include "client/transport.h"
#include "rpc/error_reason.h"
#include "rpc/tls_options.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;
using client_internal::ClusterWriter;
using client_internal::EtcdsFault;
using client_internal::FailoverReader;
using client_internal::KeepsAny;
using client_internal::MergeHotKeys;
using client_internal::MergeSplits;
using client_internal::SegmentedReader;
using client_internal::StoreFallback;
using client_internal::TryAnother;
using client_internal::Unanswered;
using client_internal::WatchedStream;

class ClusterClient final : public ShuffleClient {
 public:
  ClusterClient(ClientOptions options, std::vector<std::string> seeds)
      : options_(std::move(options)),
        seeds_(std::move(seeds)),
        fallback_(StoreFallback::For(options_)) {}

  absl::StatusOr<bool> CreateShuffle(const std::string& id, uint32_t num_partitions,
                                     uint32_t num_mappers, uint32_t replication) override {
    Forget(id);
    return OnSeed<bool>([&](ShuffleClient& c) {
      return c.CreateShuffle(id, num_partitions, num_mappers, replication);
    });
  }
  // In a cluster: each partition's counts from the first of its replicas that answers.
  using ShuffleClient::GetShuffle;
  absl::StatusOr<ShuffleStatus> GetShuffle(const std::string& id,
                                           const StatusOptions& options) override {
    SLUICE_ASSIGN_OR_RETURN(const bool clustered, Clustered());
    if (!clustered) {
      return OnSeed<ShuffleStatus>([&](ShuffleClient& c) { return c.GetShuffle(id, options); });
    }
    SLUICE_ASSIGN_OR_RETURN(const CachedPlacement placed, Placed(id, /*fresh=*/true));
    const PlacementInfo& p = placed.info;
    std::vector<absl::StatusOr<ShuffleStatus>> per_node(
        p.nodes.size(), absl::UnavailableError("not registered now"));
    const std::vector<bool> keeps = KeepsAny(p);
    bool any = false;
    absl::Status last =
        absl::UnavailableError(absl::StrCat("no server of shuffle '", id, "' is registered now"));
    // The servers that answered lately first; one marked unresponsive only if a partition it
    // keeps has no answer yet.
    auto ask = [&](size_t n) {
      const std::string& address = p.nodes[n].address;
      per_node[n] = Link(address)->client().GetShuffle(id, options);
      Mark(address, per_node[n].status());
      if (per_node[n].ok()) {
        any = true;
      } else {
        last = per_node[n].status();
      }
    };
    std::vector<size_t> later;
    for (size_t n = 0; n < p.nodes.size(); ++n) {
      if (!keeps[n] || p.nodes[n].address.empty()) continue;
      if (Unhealthy(p.nodes[n].address)) {
        later.push_back(n);
      } else {
        ask(n);
      }
    }
    for (size_t n : later) {
      bool needed = false;
      for (uint32_t q = 0; q < p.num_partitions + p.segments.size(); ++q) {
        const std::vector<uint32_t>& r = p.ReplicasOf(q);
        if (std::find(r.begin(), r.end(), n) == r.end()) continue;
        if (std::none_of(r.begin(), r.end(), [&](uint32_t m) { return per_node[m].ok(); })) {
          needed = true;
        }
      }
      if (needed) ask(n);
    }
    if (!any) return last;
    ShuffleStatus out;
    out.shuffle_id = id;
    out.num_partitions = p.num_partitions;
    out.num_mappers = p.num_mappers;
    out.placement_epoch = p.epoch;
    out.partitions.resize(p.num_partitions);
    std::set<uint32_t> committed;  // (a replica taken over in a later epoch lacks some)
    for (size_t n = 0; n < p.nodes.size(); ++n) {
      if (!per_node[n].ok()) continue;
      const ShuffleStatus& s = *per_node[n];
      committed.insert(s.committed_mappers.begin(), s.committed_mappers.end());
      const std::string who = absl::StrCat(p.nodes[n].node_id, ": ");
      if (s.damaged) out.damage += (out.damaged ? "; " : "") + who + s.damage;
      if (s.wedged) out.wedge += (out.wedged ? "; " : "") + who + s.wedge;
      out.damaged = out.damaged || s.damaged;
      out.wedged = out.wedged || s.wedged;
    }
    out.committed_mappers.assign(committed.begin(), committed.end());
    for (uint32_t part = 0; part < p.num_partitions; ++part) {
      // A whole replica's counts, else one missing mappers (the fewest), else a damaged one's;
      // a huge partition's summed over its stored partitions (docs/cluster.md).
      const auto rank = [](const PartitionStatsInfo& s) {
        return std::make_pair(s.damaged ? 1 : 0, s.missing_mappers);
      };
      bool found_all = true, whole_all = true;
      std::set<uint32_t> lost;
      PartitionStatsInfo& sum = out.partitions[part];
      for (uint32_t q : p.ChainOf(part)) {
        bool found = false;
        uint32_t whole = 0;
        PartitionStatsInfo best;
        for (uint32_t n : p.ReplicasOf(q)) {
          if (!per_node[n].ok()) continue;
          if (q < p.num_partitions && q >= per_node[n]->partitions.size()) continue;
          // A segment a server does not list it has taken no frame of (it reads the record
          // before it takes the first): its replica is empty, and whole.
          static const PartitionStatsInfo kEmpty;
          const PartitionStatsInfo& here =
              q < per_node[n]->partitions.size() ? per_node[n]->partitions[q] : kEmpty;
          // (A server that has not read the newest epoch yet may not know what it lacks.)
          const bool current = per_node[n]->placement_epoch >= p.epoch;
          if (!here.damaged && here.missing_mappers == 0 && current) ++whole;
          lost.insert(here.lost_mappers.begin(), here.lost_mappers.end());
          if (found && rank(here) >= rank(best)) continue;
          best = here;
          if (here.damaged) best.damage = absl::StrCat(p.nodes[n].node_id, ": ", here.damage);
          found = true;
        }
        found_all = found_all && found;
        whole_all = whole_all && whole >= p.replication;
        if (q == part) {
          sum = std::move(best);
          continue;
        }
        sum.records += best.records;
        sum.bytes += best.bytes;
        sum.frames += best.frames;
        sum.missing_mappers = std::max(sum.missing_mappers, best.missing_mappers);
        if (best.damaged) {
          sum.damage += (sum.damaged ? "; " : "") + best.damage;
          sum.damaged = true;
        }
        sum.hot_keys.insert(sum.hot_keys.end(), best.hot_keys.begin(), best.hot_keys.end());
      }
      if (sum.hot_keys.size() > 1 && p.ChainOf(part).size() > 1)
        MergeHotKeys(&sum.hot_keys, options.hot_keys);
      sum.lost_mappers.assign(lost.begin(), lost.end());
      if (!found_all) out.unavailable_partitions.push_back(part);
      if (!whole_all) out.under_replicated_partitions.push_back(part);
      if (!lost.empty()) {
        out.lost_partitions.push_back(
            LostPartition{part, std::vector<uint32_t>(lost.begin(), lost.end())});
      }
    }
    return out;
  }

  // In a cluster: every server's shuffles, each once (servers that cannot be reached are left
  // out; with R >= 2 another server lists their shuffles).
  absl::StatusOr<std::vector<ShuffleStatus>> ListShuffles() override {
    SLUICE_ASSIGN_OR_RETURN(const bool clustered, Clustered());
    if (!clustered) {
      return OnSeed<std::vector<ShuffleStatus>>([&](ShuffleClient& c) { return c.ListShuffles(); });
    }
    SLUICE_ASSIGN_OR_RETURN(const std::vector<NodeAddress> nodes, ListNodes());
    std::map<std::string, ShuffleStatus> all;
    absl::Status last;
    bool any = false;
    for (const NodeAddress& n : nodes) {
      auto list = Link(n.address)->client().ListShuffles();
      if (!list.ok()) {
        last = list.status();
        continue;
      }
      any = true;
      for (ShuffleStatus& s : *list) all.emplace(s.shuffle_id, std::move(s));
    }
    if (!any) return last;
    std::vector<ShuffleStatus> out;
    for (auto& [id, s] : all) out.push_back(std::move(s));
    return out;
  }

  // In a cluster: the record goes first (the seed removes it from etcd), then each server's copy.
  absl::Status DeleteShuffle(const std::string& id) override {
    SLUICE_ASSIGN_OR_RETURN(const bool clustered, Clustered());
    // (In a cluster, where it lives, asked before its record goes; none if it is not recorded:
    // then the seed's own answer says so.)
    absl::StatusOr<CachedPlacement> placed = absl::NotFoundError("");
    if (clustered) placed = Placed(id);
    Forget(id);
    SLUICE_RETURN_IF_ERROR(OnSeed<bool>([&](ShuffleClient& c) -> absl::StatusOr<bool> {
                             SLUICE_RETURN_IF_ERROR(c.DeleteShuffle(id));
                             return true;
                           }).status());
    if (!placed.ok()) return absl::OkStatus();
    std::vector<std::string> left;
    for (const NodeAddress& n : placed->info.nodes) {
      if (n.address.empty()) {
        left.push_back(absl::StrCat(n.node_id, " (not registered)"));
        continue;
      }
      absl::Status st = Link(n.address)->client().DeleteShuffle(id);
      if (!st.ok() && !absl::IsNotFound(st) && !absl::IsFailedPrecondition(st)) {
        left.push_back(absl::StrCat(n.node_id, " at ", n.address, " (", st.message(), ")"));
      }
    }
    if (left.empty()) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("shuffle '", id, "' is deleted from the cluster, but its copies on ",
                     absl::StrJoin(left, ", "),
                     " remain until deleted there (sluice delete --server ADDRESS --shuffle ID)"));
  }
  absl::StatusOr<NodeStatus> GetNode() override {
    return OnSeed<NodeStatus>([&](ShuffleClient& c) { return c.GetNode(); });
  }
  absl::StatusOr<std::vector<NodeAddress>> ListNodes() override {
    return OnSeed<std::vector<NodeAddress>>([&](ShuffleClient& c) { return c.ListNodes(); });
  }
  absl::StatusOr<std::vector<AbsentNode>> AbsentNodes() override {
    return OnSeed<std::vector<AbsentNode>>([&](ShuffleClient& c) { return c.AbsentNodes(); });
  }
  // The first server given, and no other: a drain is asked of one server.
  absl::StatusOr<DecommissionProgress> Decommission() override {
    return Seed(0).client().Decommission();
  }
  absl::Status Drain(uint32_t grace_seconds) override {
    return Seed(0).client().Drain(grace_seconds);
  }
  // Decided by one server in the record, then every registered server of the shuffle made to
  // read it (each applies the revocation before it answers), so that no reader routed by an
  // older epoch is served a revoked attempt by a server that has not learnt of it.
  absl::StatusOr<Revive> ReviveShuffle(const std::string& id, uint32_t placement_epoch,
                                       const std::string& node_id) override {
    SLUICE_ASSIGN_OR_RETURN(const bool clustered, Clustered());
    if (!clustered) return Seed(0).client().ReviveShuffle(id, placement_epoch, node_id);
    auto r = OnSeed<Revive>(
        [&](ShuffleClient& c) { return c.ReviveShuffle(id, placement_epoch, node_id); });
    if (r.ok()) Forget(id);
    return r;
  }

  absl::StatusOr<Revocation> RevokeMappers(const std::string& id,
                                           const std::vector<uint32_t>& mappers,
                                           uint32_t placement_epoch) override {
    SLUICE_ASSIGN_OR_RETURN(const bool clustered, Clustered());
    if (!clustered) return Seed(0).client().RevokeMappers(id, mappers, placement_epoch);
    SLUICE_ASSIGN_OR_RETURN(const Revocation done, OnSeed<Revocation>([&](ShuffleClient& c) {
                              return c.RevokeMappers(id, mappers, placement_epoch);
                            }));
    Forget(id);
    SLUICE_ASSIGN_OR_RETURN(const CachedPlacement placed, Placed(id, /*fresh=*/true));
    std::vector<std::string> behind;
    absl::Status lasting;  // a server's answer a retry would not change
    for (const NodeAddress& node : placed.info.nodes) {
      if (node.address.empty()) continue;  // not registered: it reads the record when back
      auto known = Link(node.address)->CatchUp(id, done.placement_epoch);
      if (ReasonOf(known.status()) == ErrorReason::kNotKept) continue;  // nothing of it there
      if (known.ok() && *known >= done.placement_epoch) continue;
      if (!known.ok() && !Retryable(known.status()) && lasting.ok()) {
        lasting = absl::Status(known.status().code(),
                               absl::StrCat("the decisions of shuffle '", id,
                                            "' are revoked in the cluster's record (placement "
                                            "epoch ",
                                            done.placement_epoch, ") but ", node.node_id, " at ",
                                            node.address, " answers: ", known.status().message()));
      }
      behind.push_back(
          absl::StrCat(node.node_id, " at ", node.address, ": ",
                       known.ok() ? absl::StrCat("at epoch ", *known) : Describe(known.status())));
    }
    if (!lasting.ok()) return lasting;
    if (!behind.empty()) {
      return absl::UnavailableError(
          absl::StrCat("the decisions of shuffle '", id,
                       "' are revoked in the cluster's record (placement "
                       "epoch ",
                       done.placement_epoch, ") but not every server has applied it yet: ",
                       absl::StrJoin(behind, "; "), "; retry (a repeat revokes nothing new)"));
    }
    return done;
  }
  absl::StatusOr<PlacementInfo> GetPlacement(const std::string& id) override {
    return OnSeed<PlacementInfo>([&](ShuffleClient& c) { return c.GetPlacement(id); }, nullptr,
                                 /*past_etcd=*/true);
  }

  absl::StatusOr<std::unique_ptr<ShuffleWriter>> OpenWriter(const std::string& id, uint32_t mapper,
                                                            uint64_t attempt,
                                                            const WriterOptions& options) override {
    SLUICE_ASSIGN_OR_RETURN(const bool clustered, Clustered());
    if (!clustered) return Seed(0).client().OpenWriter(id, mapper, attempt, options);
    return OpenClusterWriter(id, mapper, attempt, options);
  }

  // Asked of the partition's replicas in order, as a reader would read it.
  absl::StatusOr<SplitKeys> GetSplits(const std::string& id, uint32_t partition, uint32_t slices,
                                      uint32_t placement_epoch) override {
    SLUICE_ASSIGN_OR_RETURN(const bool clustered, Clustered());
    if (!clustered) return Seed(0).client().GetSplits(id, partition, slices, placement_epoch);
    SLUICE_ASSIGN_OR_RETURN(const CachedPlacement placed, PlacedForRead(id));
    const PlacementInfo& p = placed.info;
    if (partition >= p.num_partitions) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition ", partition, " is out of range [0, ", p.num_partitions, ")"));
    }
    const std::vector<uint32_t> chain = p.ChainOf(partition);
    if (chain.size() == 1) return SplitsOfStored(id, p, partition, slices, placement_epoch);
    // A huge partition: each stored partition's cuts, merged by their bytes. Each is asked for
    // 8x the slices (at most 4,096, a server's most): a merged cut falls inside the others'
    // slices, whose bytes are known only whole.
    std::vector<SplitKeys> parts;
    const uint32_t finer = std::min<uint32_t>(4096, std::max<uint32_t>(slices, slices * 8));
    for (uint32_t q : chain) {
      SLUICE_ASSIGN_OR_RETURN(SplitKeys keys, SplitsOfStored(id, p, q, finer, placement_epoch));
      parts.push_back(std::move(keys));
    }
    return MergeSplits(parts, slices);
  }

 private:
  // GetSplits of stored partition q (a partition, or a segment), asked of its replicas in turn.
  absl::StatusOr<SplitKeys> SplitsOfStored(const std::string& id, const PlacementInfo& p,
                                           uint32_t partition, uint32_t slices,
                                           uint32_t placement_epoch) {
    std::vector<std::string> errors;
    for (uint32_t n : p.ReplicasOf(partition)) {
      const NodeAddress& node = p.nodes[n];
      if (node.address.empty()) {
        errors.push_back(absl::StrCat(node.node_id, ": not registered now"));
        continue;
      }
      absl::StatusOr<SplitKeys> keys =
          Link(node.address)
              ->client()
              .GetSplits(id, partition, slices, std::max(placement_epoch, p.epoch));
      if (keys.ok() || !TryAnother(keys.status())) return keys;
      errors.push_back(
          absl::StrCat(node.node_id, " at ", node.address, ": ", Describe(keys.status())));
      if (!EtcdsFault(keys.status())) Forget(id);
    }
    return absl::UnavailableError(
        absl::StrCat("no replica of partition ", partition, " of shuffle '", id,
                     "' could plan its splits: ", absl::StrJoin(errors, "; ")));
  }

 public:
  absl::StatusOr<std::unique_ptr<ShuffleReader>> OpenReader(const std::string& id,
                                                            uint32_t partition,
                                                            const ReaderOptions& options) override {
    // (Every server failed lately: the store first, where it holds the shuffle.)
    const bool down =
        fallback_ != nullptr && std::all_of(seeds_.begin(), seeds_.end(),
                                            [&](const std::string& s) { return Unhealthy(s); });
    return StoreFallback::Or(
        fallback_.get(), down, [&] { return OpenFromServers(id, partition, options); }, id,
        partition, options);
  }

 private:
  absl::StatusOr<std::unique_ptr<ShuffleReader>> OpenFromServers(const std::string& id,
                                                                 uint32_t partition,
                                                                 const ReaderOptions& options) {
    SLUICE_ASSIGN_OR_RETURN(const bool clustered, Clustered());
    if (!clustered) return Seed(0).client().OpenReader(id, partition, options);
    SLUICE_ASSIGN_OR_RETURN(const CachedPlacement placed, Placed(id));
    const PlacementInfo& p = placed.info;
    if (partition >= p.num_partitions) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition ", partition, " is out of range [0, ", p.num_partitions, ")"));
    }
    ReaderOptions routed = options;
    routed.placement_epoch = std::max(options.placement_epoch, p.epoch);
    if (p.split_bytes == 0)
      return std::unique_ptr<ShuffleReader>(OpenStored(id, p, partition, routed));
    // A shuffle whose partitions split: the partition, then its segments (as the record says once
    // the partition's first replica has fixed the mappers read), resumed as one.
    const uint64_t skip = routed.skip_records;
    routed.skip_records = 0;
    return std::unique_ptr<ShuffleReader>(new SegmentedReader(
        OpenStored(id, p, partition, routed), options.order == FetchOrder::kKey, skip,
        [this, id, partition, routed](const std::vector<uint32_t>& mappers,
                                      const std::vector<uint64_t>& attempts)
            -> absl::StatusOr<std::vector<std::unique_ptr<FailoverReader>>> {
          SLUICE_ASSIGN_OR_RETURN(const CachedPlacement now, PlacedForRead(id));
          std::vector<std::unique_ptr<FailoverReader>> out;
          const std::vector<uint32_t> chain = now.info.ChainOf(partition);
          for (size_t k = 1; k < chain.size(); ++k) {
            ReaderOptions o = routed;
            if (o.only_mappers.empty() && !mappers.empty()) {
              o.only_mappers = mappers;
              o.only_attempts = attempts;
            }
            out.push_back(OpenStored(id, now.info, chain[k], o));
          }
          return out;
        }));
  }

  struct CachedPlacement {
    PlacementInfo info;
    size_t seed = 0;  // the seed that gave it
    Clock::time_point at;
  };

  // A reader of stored partition q (a partition, or a segment) over its replicas in order.
  std::unique_ptr<FailoverReader> OpenStored(const std::string& id, const PlacementInfo& p,
                                             uint32_t q, const ReaderOptions& options) {
    std::vector<ServerLink*> replicas;
    std::vector<std::string> names;
    for (uint32_t n : p.ReplicasOf(q)) {
      const NodeAddress& node = p.nodes[n];
      replicas.push_back(node.address.empty() ? nullptr : Link(node.address));
      names.push_back(node.address.empty() ? node.node_id
                                           : absl::StrCat(node.node_id, " at ", node.address));
    }
    return std::make_unique<FailoverReader>(
        std::move(replicas), std::move(names), id, q, options, options_.limits,
        [this, id](const absl::Status& st) {
          if (!EtcdsFault(st)) Forget(id);  // (etcd's fault says nothing of the placement)
        },
        StoreFallback::Of(fallback_.get(), id, q));
  }

  // The placement a read goes by. A shuffle whose partitions split makes segments while it is
  // written, so its record is read now (the segments of every committed mapper are in it:
  // each was recorded before any frame went to it). When etcd cannot give it, every server of
  // the shuffle is asked what it remembers and the longest list of segments is taken: a server
  // that took a segment's frames had read of it. One that is not registered or does not answer
  // might be the only one that knows a segment: then UNAVAILABLE rather than a read that could
  // miss it.
  absl::StatusOr<CachedPlacement> PlacedForRead(const std::string& id) {
    SLUICE_ASSIGN_OR_RETURN(CachedPlacement placed, Placed(id));
    if (placed.info.split_bytes == 0) return placed;
    const Clock::time_point asked = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(placed, Placed(id, /*fresh=*/true));
    if (placed.at >= asked && placed.info.age.count() == 0) return placed;
    // (Servers holding a stored partition now: every segment goes to such a one.)
    const std::vector<bool> holds = KeepsAny(placed.info);
    const std::vector<NodeAddress> nodes = placed.info.nodes;
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (!holds[n]) continue;
      const NodeAddress& node = nodes[n];
      absl::StatusOr<PlacementInfo> theirs = node.address.empty()
                                                 ? absl::UnavailableError("not registered now")
                                                 : Link(node.address)->client().GetPlacement(id);
      if (!theirs.ok()) {
        return absl::UnavailableError(absl::StrCat(
            "etcd did not give the placement of shuffle '", id, "', and server ", node.node_id,
            " could not say which of its huge partitions' segments it knows (",
            Describe(theirs.status()), "): retry once etcd or the server answers"));
      }
      if (theirs->num_partitions == placed.info.num_partitions &&
          theirs->replicas.size() == placed.info.replicas.size() &&
          theirs->nodes.size() >= placed.info.nodes.size() &&
          theirs->segments.size() > placed.info.segments.size()) {
        placed.info = *std::move(theirs);
      }
    }
    return placed;
  }

  // A writer over the placement: one stream per server that keeps any replica.
  absl::StatusOr<std::unique_ptr<ShuffleWriter>> OpenClusterWriter(const std::string& id,
                                                                   uint32_t mapper,
                                                                   uint64_t attempt,
                                                                   const WriterOptions& options) {
    // (A shuffle whose partitions split: the segments it knows; those made since, or while it
    // writes, its streams tell of with their first credit and after.)
    SLUICE_ASSIGN_OR_RETURN(const CachedPlacement placed, Placed(id));
    const PlacementInfo& p = placed.info;
    // One stream per server that keeps any replica, in node order.
    std::vector<int> stream_of_node(p.nodes.size(), -1);
    std::vector<std::unique_ptr<PushStream>> streams;
    std::vector<ClusterWriter::Watched> watched;
    std::vector<ServerLink*> links;
    std::vector<std::vector<uint32_t>> routes(p.num_partitions);
    // The stream of node n, opened on first need; a server that cannot be reached is revived.
    auto stream_to = [&](uint32_t n) -> absl::StatusOr<uint32_t> {
      if (stream_of_node[n] < 0) {
        const NodeAddress& node = p.nodes[n];
        auto link = NodeLink(id, p, n);
        if (!link.ok()) return ReviveAfter(id, p.epoch, p.nodes, node.node_id, "", link.status());
        auto stream = (*link)->OpenPush(id, mapper, attempt, /*prepare=*/true, p.epoch);
        if (!stream.ok()) {
          Forget(id);
          if (Unanswered(stream.status())) {
            return ReviveAfter(id, p.epoch, p.nodes, node.node_id, node.address, stream.status());
          }
          return stream.status();
        }
        auto watch = std::make_unique<WatchedStream>(std::move(stream).value());
        watched.push_back({node.node_id, node.address, watch.get()});
        stream_of_node[n] = static_cast<int>(streams.size());
        streams.push_back(std::move(watch));
        links.push_back(*link);
      }
      return static_cast<uint32_t>(stream_of_node[n]);
    };
    for (uint32_t part = 0; part < p.num_partitions; ++part) {
      for (uint32_t n : p.replicas[part]) {
        SLUICE_ASSIGN_OR_RETURN(const uint32_t s, stream_to(n));
        routes[part].push_back(s);
      }
    }
    // (And every server of a huge partition's segment: an attempt prepares on each server that
    // holds a stored partition, whether or not it sends it frames.)
    for (const PlacementInfo::Segment& g : p.segments) {
      for (uint32_t n : g.replicas) SLUICE_RETURN_IF_ERROR(stream_to(n).status());
    }
    // Any server of the attempt may decide it; the next one if it cannot be reached.
    const uint32_t epoch = p.epoch;
    auto decide = [this, links, id, mapper, attempt, epoch]() -> absl::StatusOr<uint64_t> {
      absl::Status last;
      for (ServerLink* link : links) {
        auto winner = link->CommitMapper(id, mapper, attempt, epoch);
        // (A newer placement epoch ends the tries: every server's decision would find it. etcd
        // not reached does not: the server may be cut off from etcd alone, and while etcd is
        // down for all, each says so at once.)
        if (ReasonOf(winner.status()) == ErrorReason::kPlacementChanged) Forget(id);
        if (winner.ok() || !TryAnother(winner.status()) ||
            ReasonOf(winner.status()) == ErrorReason::kPlacementChanged) {
          return winner;
        }
        last = winner.status();
        if (!EtcdsFault(winner.status())) Forget(id);
      }
      return last;
    };
    // Huge partitions: the segments known now; the streams tell of those made later.
    std::optional<PartitionedWriter::SegmentRouting> segments;
    if (p.split_bytes != 0) {
      segments.emplace();
      segments->stream_of_node = stream_of_node;
      for (size_t k = 0; k < p.segments.size(); ++k) {
        segments->segments.push_back(SegmentNotice{p.num_partitions + static_cast<uint32_t>(k),
                                                   p.segments[k].parent, p.segments[k].replicas});
      }
    }
    auto writer =
        PartitionedWriter::Make(p.num_partitions, std::move(streams), std::move(routes), options,
                                options_.limits, decide, attempt, std::move(segments));
    if (!writer.ok()) return writer.status();
    ClusterWriter::Hooks hooks;
    hooks.forget = [this, id] { Forget(id); };
    hooks.revive = [this, id, epoch, nodes = p.nodes](
                       const std::string& node_id, const std::string& address, absl::Status cause) {
      return ReviveAfter(id, epoch, nodes, node_id, address, std::move(cause));
    };
    return std::unique_ptr<ShuffleWriter>(
        new ClusterWriter(std::move(writer).value(), std::move(watched), std::move(hooks)));
  }

  // A writer routed by placement `p` could not reach server `node_id`: revived (AfterRevive),
  // asked of the seeds, then of the placement's other `nodes` (a client given only the lost
  // server still reaches the others; a writer keeps those, not the whole placement).
  absl::Status ReviveAfter(const std::string& id, uint32_t epoch,
                           const std::vector<NodeAddress>& nodes, const std::string& node_id,
                           const std::string& address, absl::Status cause) {
    Forget(id);
    absl::StatusOr<Revive> r = ReviveShuffle(id, epoch, node_id);
    for (const NodeAddress& other : nodes) {
      if (r.ok() || !TryAnother(r.status()) || EtcdsFault(r.status())) break;
      if (other.node_id == node_id || other.address.empty()) continue;
      r = Link(other.address)->client().ReviveShuffle(id, epoch, node_id);
      Mark(other.address, r.status());
    }
    return client_internal::AfterRevive(id, epoch, node_id, address, std::move(cause), r);
  }

  // The link to `address`, made on first use and kept (each owns a channel).
  ServerLink* Link(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& link = links_[address];
    if (link == nullptr) {
      ClientOptions o = options_;
      o.server = address;
      link = ConnectServer(o);
    }
    return link.get();
  }
  ServerLink& Seed(size_t i) { return *Link(seeds_[i]); }

  // Whether the servers form a cluster (their placements route writers and readers), asked of
  // the first seed that answers, once: a server does not change that without a restart, and
  // the servers of one list are all in one cluster or one server alone. A server too old to
  // answer is on its own.
  absl::StatusOr<bool> Clustered() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (clustered_.has_value()) return *clustered_;
    }
    auto node = OnSeed<NodeStatus>([&](ShuffleClient& c) { return c.GetNode(); });
    bool clustered = false;
    if (node.ok()) {
      clustered = node->clustered;
    } else if (!absl::IsUnimplemented(node.status())) {
      return node.status();
    }
    std::lock_guard<std::mutex> lock(mu_);
    clustered_ = clustered;
    return clustered;
  }

  absl::StatusOr<ServerLink*> NodeLink(const std::string& id, const PlacementInfo& p, uint32_t n) {
    const NodeAddress& node = p.nodes[n];
    if (node.address.empty()) {
      Forget(id);
      return absl::UnavailableError(absl::StrCat("server ", node.node_id, " of shuffle '", id,
                                                 "' is not registered now (down or restarting); "
                                                 "retry the attempt later"));
    }
    return Link(node.address);
  }

  // Calls fn on the seeds in turn until one answers (anything but a failure another server
  // might not have): the healthy ones first, in the order given, then those marked
  // unresponsive. A failure of etcd ends it (every server shares etcd), unless `past_etcd`.
  template <typename T, typename Fn>
  absl::StatusOr<T> OnSeed(Fn fn, size_t* which = nullptr, bool past_etcd = false) {
    std::vector<size_t> order;
    std::vector<size_t> later;
    for (size_t i = 0; i < seeds_.size(); ++i) (Unhealthy(seeds_[i]) ? later : order).push_back(i);
    order.insert(order.end(), later.begin(), later.end());
    absl::StatusOr<T> r = absl::UnavailableError("no server");
    for (size_t k = 0; k < order.size(); ++k) {
      const size_t i = order[k];
      r = fn(Seed(i).client());
      Mark(seeds_[i], r.status());
      if (which != nullptr) *which = i;
      if (r.ok() || !TryAnother(r.status())) return r;
      if (!past_etcd && EtcdsFault(r.status())) return r;
    }
    return r;
  }

  // Whether `address` did not answer lately (asked after the others until the mark ends).
  bool Unhealthy(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = unhealthy_.find(address);
    if (it == unhealthy_.end()) return false;
    if (Clock::now() < it->second) return true;
    unhealthy_.erase(it);
    return false;
  }
  // Notes what a call to `address` told of its health.
  void Mark(const std::string& address, const absl::Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    if (Unanswered(st)) {
      unhealthy_[address] = Clock::now() + options_.unhealthy_for;
    } else {
      unhealthy_.erase(address);
    }
  }

  // The shuffle's placement, from the cache while fresh; past its TTL the one held is kept
  // while no server can give a fresh one (it changes only by a new epoch, made in etcd).
  // `fresh`: asked of a server even within the TTL (a status reports the newest epoch).
  absl::StatusOr<CachedPlacement> Placed(const std::string& id, bool fresh = false) {
    std::optional<CachedPlacement> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = placements_.find(id);
      if (it != placements_.end()) {
        if (!fresh && Clock::now() - it->second.at < options_.placement_ttl) return it->second;
        held = it->second;
      }
    }
    CachedPlacement out;
    // Asked afresh while one read from etcd is held: whether it is still the record is enough
    // (a revision check on the server, not the whole record).
    const uint64_t known =
        fresh && held.has_value() && held->info.age.count() == 0 ? held->info.revision : 0;
    auto info = OnSeed<PlacementInfo>(
        [&](ShuffleClient& c) {
          return known != 0 ? c.GetPlacementIfChanged(id, known) : c.GetPlacement(id);
        },
        &out.seed, /*past_etcd=*/true);
    if (!info.ok()) {
      if (held.has_value() && Retryable(info.status())) return *held;
      return info.status();
    }
    if (info->unchanged) {
      // Current as of now. (The cache keeps its own time: its addresses are read again past
      // the TTL.)
      CachedPlacement same = *held;
      same.at = Clock::now();
      return same;
    }
    out.info = std::move(info).value();
    if (out.info.replicas.size() != out.info.num_partitions) {
      return absl::InternalError(absl::StrCat("the placement of shuffle '", id, "' lists ",
                                              out.info.replicas.size(), " partitions of ",
                                              out.info.num_partitions));
    }
    for (const auto& r : out.info.replicas) {
      if (r.empty() ||
          std::any_of(r.begin(), r.end(), [&](uint32_t n) { return n >= out.info.nodes.size(); })) {
        return absl::InternalError(
            absl::StrCat("the placement of shuffle '", id, "' names a server it does not list"));
      }
    }
    out.at = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    placements_[id] = out;
    return out;
  }
  void Forget(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    placements_.erase(id);
  }

  const ClientOptions options_;
  const std::vector<std::string> seeds_;
  std::unique_ptr<StoreFallback> fallback_;  // with ClientOptions::object_store
  std::mutex mu_;                            // guards the maps
  std::map<std::string, std::unique_ptr<ServerLink>> links_;
  std::map<std::string, CachedPlacement> placements_;
  std::map<std::string, Clock::time_point> unhealthy_;  // address -> until when
  std::optional<bool> clustered_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShuffleClient>> ShuffleClient::Connect(
    const ClientOptions& options) {
  std::vector<std::string> seeds;
  for (absl::string_view s : absl::StrSplit(options.server, ',')) {
    s = absl::StripAsciiWhitespace(s);
    if (!s.empty()) seeds.emplace_back(s);
  }
  if (seeds.empty()) return absl::InvalidArgumentError("no server address");
  ClientOptions with_tls = options;
  if (absl::Status st = rpc::LoadClientTls(&with_tls.tls); !st.ok()) return st;
  if (options.token.size() > 4096)
    return absl::InvalidArgumentError("the token is over 4096 bytes");
  if (std::any_of(options.token.begin(), options.token.end(),
                  [](char c) { return c <= ' ' || c > '~'; })) {
    return absl::InvalidArgumentError(
        "the token has a character other than printable ASCII (a space or a line end?)");
  }
  if (!options.token.empty() && !options.tls.On()) {
    for (const std::string& s : seeds) {
      if (!rpc::IsLoopbackAddress(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat("a token would cross the network in clear to ", s,
                         ": use TLS (a CA file) with it, or a loopback address"));
      }
    }
  }
  return std::unique_ptr<ShuffleClient>(new ClusterClient(with_tls, std::move(seeds)));
}

}  // namespace sluice
