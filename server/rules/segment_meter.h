// SegmentMeter: one splittable shuffle's huge partitions as this server sees them
// (docs/cluster.md, "Huge partitions"). It counts the frame bytes stored here for each
// partition and segment, says once when one passes the shuffle's split size (the server then asks
// the record for a further segment), and holds the segments the record has made, for push
// streams to tell their writers. Transport-free and without etcd: ClusterNode asks the record.
//
//   SegmentMeter meter(/*split_bytes=*/1 << 30, /*slots=*/8 + 4096);
//   if (meter.Add(3, frame_bytes)) node.Split(id, 3);   // 3 passed the split size
//   for (const auto& s : meter.After(told)) ...          // the segments a stream has not told
//
// Thread-safe: Add is a relaxed atomic add per partition. The counts take memory in chunks of
// 256 stored partitions, made as they are first counted (a shuffle of 8 partitions and 4,096
// segment slots that never splits holds one chunk, ~2.3 KB).
#ifndef SLUICE_SERVER_RULES_SEGMENT_METER_H_
#define SLUICE_SERVER_RULES_SEGMENT_METER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cluster/placement_store.h"

namespace sluice {

class SegmentMeter {
 public:
  /// A segment of the record: stored partition `id`, a segment of partition `parent`, on
  /// `replicas` (indexes into the placement's nodes, primary first).
  struct Segment {
    uint32_t id = 0, parent = 0;
    std::vector<uint32_t> replicas;
  };
  /// `slots`: the stored partition ids the shuffle may use (ShufflePlacement::slots()).
  SegmentMeter(uint64_t split_bytes, uint32_t slots);
  ~SegmentMeter();
  SegmentMeter(const SegmentMeter&) = delete;
  SegmentMeter& operator=(const SegmentMeter&) = delete;

  uint64_t split_bytes() const { return split_bytes_; }
  /// Adds `bytes` stored here to stored partition `q`. True exactly once for a `q` that is the
  /// last segment of its partition when it reaches ask_bytes() (until Unask): ask for the next
  /// segment.
  bool Add(uint32_t q, uint64_t bytes);
  /// Where the next segment is asked for: before the split size by what the writers pushing
  /// here may still send once it is made (kWriterLag each: they learn of it with the credit
  /// for their next message), at least an eighth of the size (at most 64 MiB of that), at most
  /// half of it.
  uint64_t ask_bytes() const;
  /// What one writer may send to a segment after its next is made: the push message it had
  /// built and the one in flight (1 MiB each), and what reaches the server while the record is
  /// written (measured: ~2.5 MiB a writer at 8 writers on loopback).
  static constexpr uint64_t kWriterLag = uint64_t{3} << 20;
  /// A push stream of the shuffle opened here (Enter) and ended (Leave).
  void Enter() { writers_.fetch_add(1, std::memory_order_relaxed); }
  void Leave() { writers_.fetch_sub(1, std::memory_order_relaxed); }
  /// The bytes counted for `q`.
  uint64_t Bytes(uint32_t q) const;
  /// A split asked for `q` did not happen (etcd did not answer): the next Add past the size
  /// asks again.
  void Unask(uint32_t q);
  /// The record as read now: its segments (those made since are told to writers) and which
  /// stored partitions are no longer the last of their chain (never asked about again).
  void Known(const ShufflePlacement& p);
  /// Segments made so far (a push stream compares it with what it told: one atomic load).
  uint32_t count() const { return count_.load(std::memory_order_acquire); }
  /// Segments after the first `told`, in the order they were made.
  std::vector<Segment> After(uint32_t told) const;

 private:
  static constexpr uint32_t kChunk = 256;
  struct Chunk {
    std::atomic<uint64_t> bytes[kChunk] = {};
    // 0: may ask; 1: asked, or not the last of its chain (a later one was made).
    std::atomic<uint8_t> asked[kChunk] = {};
  };
  // Stored partition q's chunk, made if needed (q < slots_).
  Chunk& ChunkOf(uint32_t q);
  const Chunk* Find(uint32_t q) const;

  const uint64_t split_bytes_;
  const uint32_t slots_;
  std::atomic<uint32_t> writers_{0};
  std::unique_ptr<std::atomic<Chunk*>[]> chunks_;
  std::mutex make_mu_;
  std::atomic<uint32_t> count_{0};
  mutable std::mutex mu_;
  std::vector<Segment> segments_;  // guarded by mu_
};

}  // namespace sluice

#endif  // SLUICE_SERVER_RULES_SEGMENT_METER_H_
