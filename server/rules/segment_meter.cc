#include "server/rules/segment_meter.h"

#include <algorithm>
#include <map>

namespace sluice {

SegmentMeter::SegmentMeter(uint64_t split_bytes, uint32_t slots)
    : split_bytes_(split_bytes),
      slots_(slots),
      chunks_(new std::atomic<Chunk*>[(slots + kChunk - 1) / kChunk]) {
  for (uint32_t c = 0; c < (slots + kChunk - 1) / kChunk; ++c) chunks_[c].store(nullptr);
}

SegmentMeter::~SegmentMeter() {
  for (uint32_t c = 0; c < (slots_ + kChunk - 1) / kChunk; ++c) delete chunks_[c].load();
}

SegmentMeter::Chunk& SegmentMeter::ChunkOf(uint32_t q) {
  std::atomic<Chunk*>& slot = chunks_[q / kChunk];
  if (Chunk* c = slot.load(std::memory_order_acquire)) return *c;
  std::lock_guard<std::mutex> lock(make_mu_);
  if (Chunk* c = slot.load(std::memory_order_acquire)) return *c;
  auto* made = new Chunk();
  slot.store(made, std::memory_order_release);
  return *made;
}

const SegmentMeter::Chunk* SegmentMeter::Find(uint32_t q) const {
  return q < slots_ ? chunks_[q / kChunk].load(std::memory_order_acquire) : nullptr;
}

uint64_t SegmentMeter::ask_bytes() const {
  const uint64_t least = std::min<uint64_t>(split_bytes_ / 8, uint64_t{64} << 20);
  const uint64_t lag = writers_.load(std::memory_order_relaxed) * kWriterLag;
  return split_bytes_ - std::min(split_bytes_ / 2, std::max(least, lag));
}

bool SegmentMeter::Add(uint32_t q, uint64_t bytes) {
  if (q >= slots_ || split_bytes_ == 0) return false;
  Chunk& c = ChunkOf(q);
  const uint32_t i = q % kChunk;
  const uint64_t now = c.bytes[i].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (now < ask_bytes() || c.asked[i].load(std::memory_order_relaxed) != 0) return false;
  uint8_t expected = 0;
  return c.asked[i].compare_exchange_strong(expected, 1);
}

uint64_t SegmentMeter::Bytes(uint32_t q) const {
  const Chunk* c = Find(q);
  return c == nullptr ? 0 : c->bytes[q % kChunk].load(std::memory_order_relaxed);
}

void SegmentMeter::Unask(uint32_t q) {
  if (q < slots_) ChunkOf(q).asked[q % kChunk].store(0);
}

void SegmentMeter::Known(const ShufflePlacement& p) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t k = segments_.size(); k < p.segments.size(); ++k) {
    const auto id = p.num_partitions + static_cast<uint32_t>(k);
    segments_.push_back(Segment{id, p.segments[k].parent, p.replicas[id]});
  }
  // Every stored partition followed by a later segment of its chain is done growing here.
  std::map<uint32_t, uint32_t> last;  // parent -> its chain's last so far
  for (size_t k = 0; k < p.segments.size(); ++k) {
    const uint32_t parent = p.segments[k].parent;
    auto [it, first] = last.emplace(parent, parent);
    if (it->second < slots_) ChunkOf(it->second).asked[it->second % kChunk].store(1);
    it->second = p.num_partitions + static_cast<uint32_t>(k);
  }
  count_.store(static_cast<uint32_t>(segments_.size()), std::memory_order_release);
}

std::vector<SegmentMeter::Segment> SegmentMeter::After(uint32_t told) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (told >= segments_.size()) return {};
  return std::vector<Segment>(segments_.begin() + told, segments_.end());
}

}  // namespace sluice
