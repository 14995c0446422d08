// An in-memory cluster record for tests of the node's rules (server/rules/cluster_node.h): the
// placement store and the list of servers a ClusterNode asks, with the same once-for-everyone
// rules as etcd's (the first create of an id places it, the first decision of a mapper wins,
// a decision needs its shuffle recorded), and faults on demand (etcd down: UNAVAILABLE).
//
//   FakePlacementStore record;
//   FakeNodeDirectory nodes({"n0", "n1", "n2"});
//   ClusterNode node(&registry, /*clustered=*/true);
//   node.membership().Joined(&nodes, &record);
#ifndef SLUICE_TESTS_HARNESS_FAKE_CLUSTER_H_
#define SLUICE_TESTS_HARNESS_FAKE_CLUSTER_H_

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/membership.h"
#include "cluster/placement_store.h"
#include "rpc/error_reason.h"

namespace sluice::testing {

class FakePlacementStore final : public PlacementStore {
 public:
  /// Every call fails with `st` until it is OK again (etcd unreachable, say).
  void Fail(absl::Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    fault_ = std::move(st);
  }
  /// Called (outside the record's lock) as RecordObject starts: a test holds racing uploaders
  /// there until all of them have uploaded. Set before the calls.
  std::function<void(const std::string& id, uint32_t partition)> before_record;
  /// Calls made so far (to tell a remembered answer from a read).
  int calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

  absl::StatusOr<Created> Create(const std::string& id, uint32_t partitions, uint32_t mappers,
                                 uint32_t replication, const std::vector<std::string>& nodes,
                                 uint64_t split_bytes = 0) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    if (auto it = shuffles_.find(id); it != shuffles_.end()) return Created{false, it->second};
    auto p = NewPlacement(id, partitions, mappers, replication, nodes, split_bytes);
    if (!p.ok()) return p.status();
    shuffles_[id] = *p;
    return Created{true, *std::move(p)};
  }
  absl::StatusOr<size_t> CountWithPrefix(const std::string& prefix) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    size_t n = 0;
    for (const auto& [id, p] : shuffles_) n += absl::StartsWith(id, prefix) ? 1 : 0;
    return n;
  }
  absl::StatusOr<bool> Delete(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    decisions_.erase(id);
    objects_.erase(id);
    return shuffles_.erase(id) != 0;
  }
  absl::StatusOr<std::optional<ShufflePlacement>> Get(
      const std::string& id, std::chrono::milliseconds = std::chrono::milliseconds(0)) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    auto it = shuffles_.find(id);
    if (it == shuffles_.end()) return std::optional<ShufflePlacement>();
    return std::optional<ShufflePlacement>(it->second);
  }
  absl::StatusOr<MapperDecision> DecideMapper(const std::string& id, uint32_t mapper,
                                              uint64_t attempt, uint32_t epoch) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    auto it = shuffles_.find(id);
    if (it == shuffles_.end()) {
      return absl::NotFoundError("it is not recorded in the cluster (deleted?)");
    }
    auto& decided = decisions_[id];
    if (auto d = decided.find(mapper); d != decided.end()) return d->second;
    if (epoch != it->second.epoch()) {
      return WithReason(
          absl::UnavailableError(absl::StrCat("its placement moved to epoch ", it->second.epoch())),
          ErrorReason::kPlacementChanged);
    }
    return decided.emplace(mapper, MapperDecision{attempt, epoch}).first->second;
  }
  absl::StatusOr<std::map<uint32_t, MapperDecision>> Decisions(
      const std::string& id, std::chrono::milliseconds = std::chrono::milliseconds(0)) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    return decisions_[id];
  }
  absl::StatusOr<std::optional<ShufflePlacement>> AddEpoch(
      const std::string& id, const std::vector<std::string>& removed,
      const std::vector<std::string>& live) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    auto it = shuffles_.find(id);
    if (it == shuffles_.end()) return std::optional<ShufflePlacement>();
    auto next = NextEpoch(it->second, removed, live);
    if (!next.ok()) return next.status();
    it->second = *next;
    return std::optional<ShufflePlacement>(*next);
  }
  absl::StatusOr<std::pair<ShufflePlacement, bool>> Revive(
      const std::string& id, uint32_t seen, const std::string& node,
      const std::vector<std::string>& live) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    auto it = shuffles_.find(id);
    if (it == shuffles_.end()) return absl::NotFoundError("it is not recorded in the cluster");
    auto next = PlanRevive(it->second, seen, node, live);
    if (!next.ok()) return next.status();
    if (!next->has_value()) return std::make_pair(it->second, false);
    it->second = **next;
    return std::make_pair(it->second, true);
  }
  absl::StatusOr<std::pair<std::vector<uint64_t>, ShufflePlacement>> Revoke(
      const std::string& id, const std::vector<uint32_t>& mappers, uint32_t seen) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    auto it = shuffles_.find(id);
    if (it == shuffles_.end()) return absl::NotFoundError("it is not recorded in the cluster");
    auto plan = PlanRevocation(it->second, decisions_[id], mappers, seen);
    if (!plan.ok()) return plan.status();
    if (plan->next.has_value()) {
      it->second = *plan->next;
      for (uint32_t m : mappers) decisions_[id].erase(m);
    }
    return std::make_pair(plan->attempts, it->second);
  }
  absl::StatusOr<std::optional<ShufflePlacement>> AddSegment(
      const std::string& id, uint32_t full, const std::vector<std::string>& live) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    auto it = shuffles_.find(id);
    if (it == shuffles_.end()) return std::optional<ShufflePlacement>();
    auto next = NextSegment(it->second, full, live);
    if (!next.ok()) return next.status();
    it->second = *next;
    return std::optional<ShufflePlacement>(*next);
  }
  absl::Status SetDecommissioning(const std::string& node_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    decommissioning_.insert(node_id);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> Decommissioning() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    return std::vector<std::string>(decommissioning_.begin(), decommissioning_.end());
  }
  absl::StatusOr<std::pair<ObjectRecord, bool>> RecordObject(const std::string& id,
                                                             uint32_t partition,
                                                             const ObjectRecord& record,
                                                             int64_t stale = 0) override {
    if (before_record) before_record(id, partition);
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    if (shuffles_.count(id) == 0) return absl::NotFoundError("not recorded");
    ObjectRecord mine = record;
    mine.revision = ++object_revision_;
    auto [it, created] = objects_[id].emplace(partition, mine);
    if (!created && stale != 0 && it->second.revision == stale) {
      it->second = mine;
      created = true;
    }
    return std::make_pair(it->second, created);
  }
  absl::StatusOr<std::map<uint32_t, ObjectRecord>> Objects(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = Call(); !st.ok()) return st;
    auto it = objects_.find(id);
    return it == objects_.end() ? std::map<uint32_t, ObjectRecord>() : it->second;
  }

 private:
  absl::Status Call() {
    ++calls_;
    return fault_;
  }
  mutable std::mutex mu_;
  absl::Status fault_;
  int calls_ = 0;
  std::map<std::string, ShufflePlacement> shuffles_;
  std::map<std::string, std::map<uint32_t, MapperDecision>> decisions_;
  std::map<std::string, std::map<uint32_t, ObjectRecord>> objects_;
  int64_t object_revision_ = 0;
  std::set<std::string> decommissioning_;
};

class FakeNodeDirectory final : public NodeDirectory {
 public:
  /// Servers `ids`, each at "<id>:7070".
  explicit FakeNodeDirectory(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) nodes_.push_back(NodeEntry{id, id + ":7070", 1});
  }
  void Remove(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
      if (it->node_id == id) {
        nodes_.erase(it);
        return;
      }
    }
  }
  absl::StatusOr<std::vector<NodeEntry>> Nodes(
      std::chrono::milliseconds = std::chrono::milliseconds(0)) const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fault_.ok()) return fault_;
    return nodes_;
  }
  /// Every call fails with `st` until it is OK again (etcd unreachable, say).
  void Fail(absl::Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    fault_ = std::move(st);
  }
  /// Server `id` said it restarts (a drain), or is back (false).
  void SetRestarting(const std::string& id, bool restarting) {
    std::lock_guard<std::mutex> lock(mu_);
    if (restarting) {
      restarting_.insert(id);
    } else {
      restarting_.erase(id);
    }
  }
  absl::StatusOr<bool> Restarting(const std::string& id) const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fault_.ok()) return fault_;
    return restarting_.count(id) != 0;
  }
  /// A server (back) in the list.
  void Add(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    nodes_.push_back(NodeEntry{id, id + ":7070", 1});
  }
  bool registered() const override { return true; }

 private:
  mutable std::mutex mu_;
  absl::Status fault_;
  std::set<std::string> restarting_;
  std::vector<NodeEntry> nodes_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_FAKE_CLUSTER_H_
