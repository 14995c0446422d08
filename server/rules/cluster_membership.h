// ClusterMembership: this server's view of its cluster (docs/cluster.md), the part of the
// ClusterNode (cluster_node.h) that knows who is who: the server itself, the cluster's directory
// and record once it has joined, who is registered now (and the last list read, for when etcd is
// down), whether etcd answers, the settle time after an etcd outage, who of the servers of this
// server's shuffles is absent and since when, and whether this server drains or leaves.
//
// etcd down: every call to etcd through this part (and the other parts' calls, which they Note
// here) tells it whether etcd answered; what needs etcd is then UNAVAILABLE naming etcd
// (ErrorReason::kEtcdUnavailable) at once, rather than after etcd's deadline.
//
// Membership settling: after an etcd stall every lease expires at once, and for a moment fewer
// servers (or none) are registered. Settled() holds creates back while a server registered when
// etcd went down has not registered again, for at most Options::settle after etcd came back.
//
//   ClusterMembership members({.clustered = true});
//   members.SetSelf({"n0", "10.0.0.5:7070", now_ms});
//   members.Joined(&directory, &record);
//   SLUICE_ASSIGN_OR_RETURN(auto nodes, members.Nodes());
//
// Thread-safe. Tests drive it with an in-memory directory (tests/harness/fake_cluster.h).
#ifndef SLUICE_SERVER_RULES_CLUSTER_MEMBERSHIP_H_
#define SLUICE_SERVER_RULES_CLUSTER_MEMBERSHIP_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/membership.h"
#include "cluster/placement_store.h"
#include "server/runtime/clock.h"

namespace sluice {

class ClusterMembership {
 public:
  /// Who this server is: its node id, the address it is reached at, when it started.
  struct Self {
    std::string node_id;
    std::string address;
    uint64_t started_unix_ms = 0;
  };
  struct Options {
    /// Runs with --etcd (known before the server serves; Joined comes later).
    bool clustered = false;
    /// How long after an etcd outage a server registered before it, and not again yet, holds
    /// creates back (servers re-register within a third of their lease): two leases.
    std::chrono::milliseconds settle{20000};
    /// How long a read with an answer of its own to fall back on (a remembered placement, the
    /// last list of servers) waits for etcd.
    std::chrono::milliseconds quick_read{1000};
    /// What the parts time by (settle, absence, a placement's age); tests move a fake one.
    const Clock* clock = Clock::Steady();
  };
  /// The cluster as one call sees it: the directory and record (null before Joined) and this
  /// server's id.
  struct View {
    const NodeDirectory* nodes = nullptr;
    PlacementStore* placements = nullptr;
    std::string node_id;
    /// UNAVAILABLE (kJoining) until the server has joined.
    absl::Status Joined() const;
  };

  explicit ClusterMembership(Options options) : options_(options) {}

  void SetSelf(Self self);
  Self self() const;
  bool clustered() const { return options_.clustered; }
  const Options& options() const { return options_; }
  const Clock& clock() const { return *options_.clock; }
  /// How long ago `t` was, by clock().
  std::chrono::milliseconds Since(Clock::time_point t) const;
  /// The cluster's servers and record, once this server has joined (both outlive the node's
  /// use of them: the wiring stops serving before it lets them go).
  void Joined(const NodeDirectory* nodes, PlacementStore* placements);
  /// Whether this server has joined its cluster (false on its own).
  bool joined() const;
  View view() const;
  /// Whether this server's registration is live (false on its own or before it joined).
  bool registered() const;

  /// The cluster's servers: this one alone when on its own; with etcd down, the last list read.
  absl::StatusOr<std::vector<NodeEntry>> Nodes();
  /// Reads the list of servers (briefly), noting who is registered and whether etcd answers,
  /// and which servers are being decommissioned. False when etcd did not answer (or this server
  /// is on its own, or has not joined).
  struct Members {
    std::vector<NodeEntry> live;
    std::vector<std::string> leaving;
    bool judge = false;  ///< this server's registration is live: it may judge the others
  };
  bool ReadMembers(Members* out);
  /// UNAVAILABLE while a server seen within the settle time is not in `live` (or none is).
  absl::Status Settled(const std::vector<NodeEntry>& live) const;
  /// Notes a list of registered servers read now.
  void Seen(const std::vector<NodeEntry>& nodes);
  /// The last list of registered servers read (empty before one was).
  std::vector<NodeEntry> LastMembers() const;
  /// The servers being decommissioned: read now, else as last read.
  std::vector<std::string> Leaving(bool read_now);
  /// Of `nodes`, the ids of those not in `leaving`.
  static std::vector<std::string> Staying(const std::vector<NodeEntry>& nodes,
                                          const std::vector<std::string>& leaving);

  // etcd's health.
  /// Notes what a call to etcd told of etcd (a failure of etcd, or an answer).
  void Note(const absl::Status& st);
  /// UNAVAILABLE naming etcd while etcd is known down (ReadMembers asks it again every second).
  absl::Status EtcdUp() const;
  /// Whether etcd did not answer the last time it was asked.
  bool etcd_down() const { return etcd_down_.load(); }
  /// A call to the record about shuffle `id`: what it told of etcd noted, an error saying which
  /// shuffle (etcd's unavailability speaks of etcd alone).
  template <typename T>
  absl::StatusOr<T> Record(const std::string& id, absl::StatusOr<T> r);

  // Absent servers (of the shuffles this server knows).
  /// Notes which of `placed` (the servers of the shuffles this server knows) are not in `live`,
  /// each since when it was first seen absent (measured afresh once etcd answers again).
  void TrackAbsent(const std::vector<NodeEntry>& live, const std::set<std::string>& placed);
  /// The absent servers and since when, as tracked.
  std::map<std::string, Clock::time_point> Absent() const;

  // Leaving.
  /// A drain refuses new push streams from now on (the service asks draining()).
  void SetDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  /// Records in the cluster that this server is leaving (decommission), so that no create
  /// places on it and every server takes it out of its shuffles' placements. Idempotent.
  absl::Status StartDecommission();
  bool decommissioning() const { return decommissioning_.load(); }

 private:
  const Options options_;
  std::atomic<bool> etcd_down_{false};
  std::atomic<bool> draining_{false};
  std::atomic<bool> decommissioning_{false};
  mutable std::mutex mu_;
  Self self_;                             // guarded by mu_
  const NodeDirectory* nodes_ = nullptr;  // guarded by mu_; set once joined
  PlacementStore* placements_ = nullptr;  // guarded by mu_; set once joined
  // Servers of the known shuffles not registered, since when (as seen here; mu_).
  std::map<std::string, Clock::time_point> absent_;
  // Servers being decommissioned, as last read (mu_).
  std::vector<std::string> leaving_;
  // The last list of registered servers read, and when (mu_); the servers registered when etcd
  // went down, and when it came back (mu_).
  std::vector<NodeEntry> members_;
  Clock::time_point members_at_;
  std::set<std::string> before_outage_;
  Clock::time_point etcd_back_at_;
  // Since when etcd is down, and its last failure (mu_).
  Clock::time_point etcd_down_at_;
  std::string etcd_error_;
};

/// An error of the cluster's record about shuffle `id`, saying which shuffle as its caller knows
/// it (the record's own errors do not name it). etcd's unavailability speaks of etcd alone.
absl::Status AboutShuffle(const std::string& id, const absl::Status& st);

template <typename T>
absl::StatusOr<T> ClusterMembership::Record(const std::string& id, absl::StatusOr<T> r) {
  Note(r.status());
  if (r.ok()) return r;
  return AboutShuffle(id, r.status());
}

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_CLUSTER_MEMBERSHIP_H_
