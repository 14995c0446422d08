// What the tests of the cluster node's parts share (tests/server/cluster_*_test.cc,
// placement_cache_test.cc): each "server" is a ClusterNode over a real registry in a temporary
// directory, and they share an in-memory cluster record (tests/harness/fake_cluster.h) in place
// of etcd, and a fake clock the test moves (the settle time, absences, a record's age). No
// process, no socket: the same rules run against a real etcd and real servers in tests/cluster/.
#ifndef SLUICE_TESTS_HARNESS_CLUSTER_FIXTURE_H_
#define SLUICE_TESTS_HARNESS_CLUSTER_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "rpc/error_reason.h"
#include "server/rules/cluster_node.h"
#include "server/storage/shuffle_registry.h"
#include "tests/harness/fake_clock.h"
#include "tests/harness/fake_cluster.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {

/// One server of the test cluster: its data directory, registry and node (timed by `clock`
/// when one is given).
struct Server {
  Server(const std::string& id, bool clustered) : Server(id, ClusterNode::Options{clustered}) {}
  Server(const std::string& id, ClusterNode::Options options, FakeClock* clock = nullptr) {
    auto r = ShuffleRegistry::Open(dir.path(), StoreOptions{});
    EXPECT_OK(r.status());
    registry = *std::move(r);
    if (clock != nullptr) options.clock = clock;
    node = std::make_unique<ClusterNode>(registry.get(), options);
    node->membership().SetSelf({id, id + ":7070", 1});
  }
  TempDir dir;
  std::unique_ptr<ShuffleRegistry> registry;
  std::unique_ptr<ClusterNode> node;
};

/// Prepares (or, `commit`, commits) `attempt` of `mapper` on the server's store of `id`: one
/// record in each partition of `partitions`.
inline void Prepare(Server& s, const std::string& id, uint32_t mapper, uint64_t attempt,
                    const std::vector<uint32_t>& partitions, bool commit = false) {
  ASSERT_OK_AND_ASSIGN(auto store, s.registry->Get(id));
  std::vector<BlockRef> blocks;
  for (uint32_t p : partitions) {
    const std::string frame = EncodeRows({{"k", "m" + std::to_string(mapper)}});
    ASSERT_OK_AND_ASSIGN(BlockRef b, store->Append(mapper, attempt, p, Bytes(frame), 1));
    blocks.push_back(b);
  }
  ASSERT_OK(
      (commit ? store->Commit(mapper, attempt, blocks) : store->Prepare(mapper, attempt, blocks))
          .status());
}

/// What the etcd client answers when etcd cannot be reached.
inline absl::Status EtcdDown() {
  return WithReason(absl::UnavailableError("etcd get at 127.0.0.1:2379: Deadline Exceeded"),
                    ErrorReason::kEtcdUnavailable);
}

/// The partitions of `p` that `node` keeps, and those it does not.
inline std::pair<std::vector<uint32_t>, std::vector<uint32_t>> KeptAndOther(
    const ShufflePlacement& p, const std::string& node) {
  std::vector<uint32_t> kept, other;
  for (uint32_t q = 0; q < p.num_partitions; ++q) {
    bool here = false;
    for (uint32_t i : p.replicas[q]) here = here || p.nodes[i] == node;
    (here ? kept : other).push_back(q);
  }
  return {kept, other};
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_CLUSTER_FIXTURE_H_
