// The cluster client's readers (docs/cluster.md, "The client", "Huge partitions"): a
// partition read over its replicas in turn (FailoverReader), a huge partition read as the union
// of its stored partitions (SegmentedReader), and what the client merges of a huge partition's
// stored partitions (its hot keys, its split keys). Transport-free, over ServerLinks.
#ifndef SLUICE_CLIENT_CLUSTER_READERS_H_
#define SLUICE_CLIENT_CLUSTER_READERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/shuffle_client.h"
#include "client/transport.h"

namespace sluice::client_internal {

// A failure the next server (a seed, a replica, a decider) may not have.
bool TryAnother(const absl::Status& st);

// A failure every server would answer alike: etcd's (they share it), or a cluster whose
// membership settles after an etcd outage.
bool EtcdsFault(const absl::Status& st);

// Per node of the placement: whether it keeps any partition.
std::vector<bool> KeepsAny(const PlacementInfo& p);

// A reader of one partition over its replicas, in order.
class FailoverReader final : public ShuffleReader {
 public:
  // `replicas`: the links of the partition's servers, primary first (null: not registered
  // now, named in `missing`).
  // `store` (may be empty): where the read goes on when no replica can serve it (the object
  // tier: ClientOptions::object_store), given the options that resume it there.
  using StoreReader =
      std::function<absl::StatusOr<std::unique_ptr<ShuffleReader>>(const ReaderOptions&)>;
  FailoverReader(std::vector<ServerLink*> replicas, std::vector<std::string> names, std::string id,
                 uint32_t partition, ReaderOptions options, FrameLimits limits,
                 std::function<void(const absl::Status&)> on_failover, StoreReader store = {})
      : replicas_(std::move(replicas)),
        names_(std::move(names)),
        id_(std::move(id)),
        partition_(partition),
        options_(options),
        limits_(limits),
        on_failover_(std::move(on_failover)),
        store_(std::move(store)) {}

  absl::StatusOr<bool> Next(Record* out) override;

  // The committed mappers (and their attempts) the first replica served, once its first
  // record came (empty before).
  const std::vector<uint32_t>& served() const { return served_; }
  const std::vector<uint64_t>& served_attempts() const { return served_attempts_; }

 private:
  // The options a read from the next source starts with: resumed where the last left off.
  ReaderOptions Resumed() const;
  const std::vector<ServerLink*> replicas_;
  const std::vector<std::string> names_;
  const std::string id_;
  const uint32_t partition_;
  const ReaderOptions options_;
  const FrameLimits limits_;
  const std::function<void(const absl::Status&)> on_failover_;
  const StoreReader store_;
  bool from_store_ = false;  // reader_ reads the object store (every replica failed)
  std::unique_ptr<ShuffleReader> reader_;
  FetchStream* stream_ = nullptr;          // reader_'s
  std::vector<uint32_t> served_;           // the mappers the first replica served
  std::vector<uint64_t> served_attempts_;  // and their attempts
  bool revoked_ = false;      // a replica found a decision revoked since the read began
  size_t not_committed_ = 0;  // replicas that counted fewer committed mappers than asked for
  size_t current_ = 0;
  uint64_t returned_ = 0;
  std::vector<std::string> errors_;
};

// The records of a partition whose shuffle splits (docs/cluster.md, "Huge partitions"): the
// union of its stored partitions (the partition, then its segments), each read through its own
// FailoverReader. The partition itself is opened first; once its first replica has said which
// committed mappers (and attempts) it serves, `rest` reads the placement afresh and opens the
// segments for exactly those: every segment holding a frame of them was recorded before the
// frame was pushed, so none is missed, and a mapper committed in between is in none or all.
// UNORDERED: the stored partitions one after the other. KEY: merged by key, a key's records
// from the earlier segment first (each mapper's records of a key keep their order: a writer
// moves to a later segment only). `skip` leaves out the union's first records (a resume).
class SegmentedReader final : public ShuffleReader {
 public:
  using Rest = std::function<absl::StatusOr<std::vector<std::unique_ptr<FailoverReader>>>(
      const std::vector<uint32_t>& mappers, const std::vector<uint64_t>& attempts)>;
  SegmentedReader(std::unique_ptr<FailoverReader> first, bool key_order, uint64_t skip, Rest rest)
      : key_order_(key_order), skip_(skip), rest_(std::move(rest)) {
    parts_.emplace_back();
    parts_[0].reader = std::move(first);
  }

  absl::StatusOr<bool> Next(Record* out) override;

 private:
  struct Part {
    std::unique_ptr<FailoverReader> reader;
    Record head;
    bool more = true;
  };
  // The next record of part `p` into its head.
  absl::Status Advance(Part& p);
  // The union's next record (Next then leaves out the first `skip_`).
  absl::StatusOr<bool> Step(Record* out);

  const bool key_order_;
  uint64_t skip_;
  const Rest rest_;
  std::vector<Part> parts_;
  bool opened_ = false;
  size_t last_ = SIZE_MAX;  // the part whose head was returned last
  size_t current_ = 0;      // UNORDERED: the part being read
};

// A huge partition's hot keys from its stored partitions: one entry a key (summed), heaviest
// first, at most `most`.
void MergeHotKeys(std::vector<PartitionStatsInfo::HotKey>* keys, size_t most);

// One partition's cut keys from its stored partitions' (a huge partition's: docs/cluster.md).
// Each says how many bytes lie between its cuts; the bytes of all below a key are estimated as
// each one's below its cut before the key plus half its slice holding the key, and the merged
// cuts are the candidate keys nearest to each 1/slices of the total. Every key still falls in
// exactly one slice: the slices are key ranges, read from each stored partition.
SplitKeys MergeSplits(const std::vector<SplitKeys>& parts, uint32_t slices);

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CLUSTER_READERS_H_
