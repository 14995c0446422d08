#include "client/cluster_readers.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "client/frame_stream_reader.h"
#include "rpc/error_reason.h"

namespace sluice::client_internal {

// A failure the next server (a seed, a replica, a decider) may not have.
bool TryAnother(const absl::Status& st) {
  if (ReasonOf(st) == ErrorReason::kNotKept) return true;  // the placement names another
  switch (st.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kResourceExhausted:
      return true;
    default:
      return false;
  }
}

bool EtcdsFault(const absl::Status& st) {
  const ErrorReason r = ReasonOf(st);
  return r == ErrorReason::kEtcdUnavailable || r == ErrorReason::kSettling;
}

std::vector<bool> KeepsAny(const PlacementInfo& p) {
  std::vector<bool> keeps(p.nodes.size(), false);
  for (const auto& r : p.replicas) {
    for (uint32_t n : r) keeps[n] = true;
  }
  for (const auto& g : p.segments) {
    for (uint32_t n : g.replicas) keeps[n] = true;
  }
  return keeps;
}

ReaderOptions FailoverReader::Resumed() const {
  ReaderOptions o = options_;
  // Where the last one left off, over the same mappers (a replica may have learned of a
  // mapper committed since: counting records over another set would skip or repeat).
  o.skip_records = options_.skip_records + returned_;
  if (returned_ > 0 && o.only_mappers.empty()) {
    o.only_mappers = served_;
    o.only_attempts = served_attempts_;  // (a decision revoked since: never mixed)
  }
  return o;
}

absl::StatusOr<bool> FailoverReader::Next(Record* out) {
  for (;;) {
    if (reader_ == nullptr) {
      while (current_ < replicas_.size() && replicas_[current_] == nullptr) {
        errors_.push_back(absl::StrCat(names_[current_], ": not registered now"));
        ++current_;
      }
      if (current_ >= replicas_.size()) {
        const std::string what = absl::StrCat("no replica of partition ", partition_,
                                              " of shuffle '", id_, "' could serve it (", returned_,
                                              " records returned): ", absl::StrJoin(errors_, "; "));
        // A decision revoked since the read began: only a read from the start is exact.
        if (revoked_) return WithReason(absl::AbortedError(what), ErrorReason::kRevoked);
        // Every replica counts fewer committed mappers than the shuffle has: they have not all
        // committed (the engine reads too early), which a retry does not change.
        const size_t asked = static_cast<size_t>(
            std::count_if(replicas_.begin(), replicas_.end(), [](ServerLink* l) { return l; }));
        if (not_committed_ > 0 && not_committed_ == asked) {
          return WithReason(absl::FailedPreconditionError(what), ErrorReason::kNotCommitted);
        }
        if (!store_ || from_store_) return absl::UnavailableError(what);
        // The object tier: the shuffle's objects, from where the replicas left off.
        from_store_ = true;
        absl::StatusOr<std::unique_ptr<ShuffleReader>> stored = store_(Resumed());
        if (!stored.ok()) {
          // (A decision revoked since the read began: read again from the start.)
          const absl::Status st = ReasonOf(stored.status()) == ErrorReason::kRevoked
                                      ? stored.status()
                                      : absl::UnavailableError("");
          return absl::Status(
              st.code(), absl::StrCat(what, "; the object store: ", Describe(stored.status())));
        }
        reader_ = *std::move(stored);
        stream_ = nullptr;
      } else {
        ServerLink* link = replicas_[current_];
        std::unique_ptr<FetchStream> fetch =
            link->OpenFetch(id_, partition_, Resumed(), /*report_mappers=*/served_.empty());
        stream_ = fetch.get();
        reader_ = std::make_unique<FrameStreamReader>(std::move(fetch), limits_, link->address());
      }
    }
    absl::StatusOr<bool> more = reader_->Next(out);
    if (served_.empty() && stream_ != nullptr) {
      served_ = stream_->mappers();
      served_attempts_ = stream_->attempts();
      if (served_attempts_.size() != served_.size()) served_attempts_.clear();  // (older server)
    }
    if (more.ok()) {
      if (*more) ++returned_;
      return more;
    }
    if (from_store_) {
      // (An object gone: a revocation replaced it since the manifest was read; read again.)
      return absl::Status(
          absl::IsNotFound(more.status()) ? absl::StatusCode::kUnavailable : more.status().code(),
          absl::StrCat("partition ", partition_, " of shuffle '", id_, "' from the object store (",
                       returned_, " records returned): ", more.status().message()));
    }
    // (NOT_COMMITTED: this replica may be one taken out of the shuffle that does not know of
    // winners decided since; the next one may.)
    const bool not_committed = ReasonOf(more.status()) == ErrorReason::kNotCommitted;
    if (!TryAnother(more.status()) && !not_committed) return more.status();
    if (not_committed) ++not_committed_;
    revoked_ = revoked_ || ReasonOf(more.status()) == ErrorReason::kRevoked;
    if (returned_ == 0) {  // nothing returned yet: the next replica starts the read afresh
      served_.clear();
      served_attempts_.clear();
    }
    errors_.push_back(absl::StrCat(names_[current_], ": ", Describe(more.status())));
    reader_.reset();
    ++current_;
    if (on_failover_) on_failover_(more.status());
  }
}

absl::StatusOr<bool> SegmentedReader::Next(Record* out) {
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(const bool more, Step(out));
    if (!more) return false;
    if (skip_ == 0) return true;
    --skip_;
  }
}

absl::Status SegmentedReader::Advance(Part& p) {
  SLUICE_ASSIGN_OR_RETURN(p.more, p.reader->Next(&p.head));
  return absl::OkStatus();
}
absl::StatusOr<bool> SegmentedReader::Step(Record* out) {
  if (!opened_) {
    opened_ = true;
    SLUICE_RETURN_IF_ERROR(Advance(parts_[0]));
    SLUICE_ASSIGN_OR_RETURN(auto rest,
                            rest_(parts_[0].reader->served(), parts_[0].reader->served_attempts()));
    for (auto& r : rest) {
      parts_.emplace_back();
      parts_.back().reader = std::move(r);
    }
    if (key_order_) {
      for (size_t k = 1; k < parts_.size(); ++k) SLUICE_RETURN_IF_ERROR(Advance(parts_[k]));
    }
  } else if (last_ < parts_.size()) {  // the record returned last is done with: move on
    SLUICE_RETURN_IF_ERROR(Advance(parts_[last_]));
  }
  if (!key_order_) {
    while (current_ < parts_.size() && !parts_[current_].more) {
      if (++current_ < parts_.size()) SLUICE_RETURN_IF_ERROR(Advance(parts_[current_]));
    }
    last_ = current_;
    if (current_ >= parts_.size()) return false;
    *out = parts_[current_].head;
    return true;
  }
  size_t best = parts_.size();
  for (size_t k = 0; k < parts_.size(); ++k) {
    if (!parts_[k].more) continue;
    if (best == parts_.size() || CompareKeys(parts_[k].head.key, parts_[best].head.key) < 0) {
      best = k;
    }
  }
  last_ = best;
  if (best == parts_.size()) return false;
  *out = parts_[best].head;
  return true;
}

// A huge partition's hot keys from its stored partitions: one entry a key (summed), heaviest
// first, at most `most`.
void MergeHotKeys(std::vector<PartitionStatsInfo::HotKey>* keys, size_t most) {
  std::map<std::pair<std::string, bool>, PartitionStatsInfo::HotKey> by_key;
  for (const auto& k : *keys) {
    auto [it, fresh] = by_key.emplace(std::make_pair(k.key, k.cut), k);
    if (fresh) continue;
    it->second.records += k.records;
    it->second.bytes += k.bytes;
    it->second.error += k.error;
  }
  std::vector<PartitionStatsInfo::HotKey> out;
  for (auto& [key, k] : by_key) out.push_back(std::move(k));
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.records > b.records; });
  out.resize(std::min(out.size(), most));
  *keys = std::move(out);
}

// One partition's cut keys from its stored partitions' (a huge partition's: docs/cluster.md).
// Each says how many bytes lie between its cuts; the bytes of all below a key are estimated as
// each one's below its cut before the key plus half its slice holding the key, and the merged
// cuts are the candidate keys nearest to each 1/slices of the total. Every key still falls in
// exactly one slice: the slices are key ranges, read from each stored partition.
SplitKeys MergeSplits(const std::vector<SplitKeys>& parts, uint32_t slices) {
  SplitKeys out;
  std::vector<std::string> candidates;
  for (const SplitKeys& s : parts) {
    out.partition_bytes += s.partition_bytes;
    out.frames += s.frames;
    out.frames_without_bounds += s.frames_without_bounds;
    candidates.insert(candidates.end(), s.keys.begin(), s.keys.end());
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const std::string& a, const std::string& b) { return CompareKeys(a, b) < 0; });
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  const auto below = [&](const std::string& key) {
    double total = 0;
    for (const SplitKeys& s : parts) {
      size_t i = 0;  // the slice of s holding key
      while (i < s.keys.size() && CompareKeys(s.keys[i], key) <= 0) {
        total += i < s.slice_bytes.size() ? s.slice_bytes[i] : 0;
        ++i;
      }
      if (i < s.slice_bytes.size() && (i == 0 || CompareKeys(s.keys[i - 1], key) != 0)) {
        total += s.slice_bytes[i] / 2.0;
      }
    }
    return total;
  };
  std::vector<double> at;
  for (const std::string& c : candidates) at.push_back(below(c));
  const double total = static_cast<double>(out.partition_bytes);
  size_t next = 0;
  double taken = 0;
  for (uint32_t j = 1; j < slices && next < candidates.size(); ++j) {
    const double goal = total * j / slices;
    size_t best = next;
    for (size_t c = next; c < candidates.size(); ++c) {
      if (std::abs(at[c] - goal) < std::abs(at[best] - goal)) best = c;
      if (at[c] > goal) break;
    }
    if (at[best] <= taken && !out.keys.empty()) continue;  // (no finer cut between)
    out.keys.push_back(candidates[best]);
    out.slice_bytes.push_back(static_cast<uint64_t>(std::max(0.0, at[best] - taken)));
    taken = at[best];
    next = best + 1;
  }
  out.slice_bytes.push_back(static_cast<uint64_t>(std::max(0.0, total - taken)));
  return out;
}

}  // namespace sluice::client_internal
