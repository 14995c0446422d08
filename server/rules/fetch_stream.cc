#include "server/rules/fetch_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {

absl::StatusOr<std::unique_ptr<FetchStream>> FetchStream::Make(FetchSpec spec,
                                                               FetchStreamOptions options,
                                                               const CallContext& call,
                                                               const StreamDeps& deps, Host* host,
                                                               std::string* chunk) {
  SLUICE_ASSIGN_OR_RETURN(spec.shuffle_id, call.Kept(spec.shuffle_id));
  spec.tenant = call.tenant();
  std::unique_ptr<FetchStream> s(
      new FetchStream(std::move(spec), options, call, deps, host, chunk));
  SLUICE_ASSIGN_OR_RETURN(s->admission_,
                          StreamAdmission::Enter(StreamKind::kFetch, call, deps.admission));
  return s;
}

FetchStream::FetchStream(FetchSpec spec, FetchStreamOptions options, const CallContext& call,
                         const StreamDeps& deps, Host* host, std::string* chunk)
    : spec_(std::move(spec)),
      options_(options),
      call_(call),
      deps_(deps),
      host_(host),
      chunk_(chunk),
      report_range_(!spec_.from_key.empty() || spec_.to_key.has_value()),
      report_mappers_(options.report_mappers),
      checked_(deps.clock->Now()) {}

// Its budget charges go back before the admission gives back its merge slot.
FetchStream::~FetchStream() { EndSession(); }

void FetchStream::EndSession() {
  if (session_ == nullptr) return;
  ServerMetrics::Add(deps_.metrics->merge_passes, session_->merge_passes());
  ServerMetrics::Add(deps_.metrics->merge_spill_bytes, session_->spill_bytes());
  session_.reset();
}

FetchStream::Step FetchStream::Finish(const absl::Status& st) {
  Step step{Step::Do::kFinish};
  step.status = st;
  return step;
}

// Setup reads the store under its locks: it runs on a pool, never on the transport's threads. A
// KEY fetch sets up on the merge pool, where its merge runs: with a slot free it goes on to its
// first chunk there without another hand-over.
FetchStream::Step FetchStream::Start() {
  Step setup{Step::Do::kWork};
  setup.pool = spec_.key_order ? Pool::kMerge : Pool::kFetch;
  if (spec_.key_order && admission_->BudgetMustWait()) {
    // A merge charges the budget as it goes and never waits once it runs (it would wait on
    // memory it holds): one that has not started yet waits its turn, holding nothing, so that a
    // push waiting for a large frame's room is not passed over by merge after merge.
    admission_->WhenBudgetAllows([this, setup] { host_->Resume(setup); });
    return Step{};
  }
  return setup;
}

FetchStream::Step FetchStream::Work() { return set_up_ ? NextChunk() : SetUp(); }

FetchStream::Step FetchStream::SetUp() {
  set_up_ = true;
  absl::Status st =
      deps_.node->PrepareToServe(spec_.shuffle_id, spec_.partition, options_.placement_epoch);
  if (!st.ok()) return Finish(st);
  auto session = FetchSession::Make(spec_, deps_.fetch, &cancelled_);
  if (!session.ok()) return Finish(session.status());
  session_ = *std::move(session);
  ServerMetrics::Add(deps_.metrics->fetch_stored_bytes, session_->bytes_to_read());
  return WhenRoom(/*on_pool=*/true);
}

// UNORDERED: reads the next stored frame once the budget has room for it and the copy the
// transport makes of it, so that many fetches (or many stalled readers) cannot take the server
// past its budget. A merge charges the budget as it goes instead, and never waits once it runs
// (it would wait on memory it holds): merges are bounded by the merge gate.
FetchStream::Step FetchStream::WhenRoom(bool on_pool) {
  const uint64_t next = session_->next_frame_bytes();
  if (next == 0) return NextChunk();
  if (on_pool && admission_->TryReserveChargeForReader(2 * next)) {
    return NextChunk();  // (no hand-over: a wide shuffle's fetches are mostly one chunk)
  }
  admission_->ReserveChargeForReader(2 * next, [this] { host_->Resume(NextChunk()); });
  return Step{};
}

// The credentials again, at most once per caller_recheck as chunks go: a token taken out of
// --auth_file ends the fetches it opened too (within --auth_reload_s and a chunk), as it commits
// none of its pushes.
absl::Status FetchStream::StillAdmitted() {
  const Clock::time_point now = deps_.clock->Now();
  if (now - checked_ < deps_.timeouts.caller_recheck) return absl::OkStatus();
  checked_ = now;
  return host_->CheckCaller("checked again during the fetch, which was ended");
}

// A parked KEY fetch's merge again, skipping what its reader was sent, over the same mappers.
absl::Status FetchStream::Resume() {
  FetchSpec again = spec_;
  again.skip_records = spec_.skip_records + records_sent_;
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    again.only_mappers = parked_mappers_;
    again.only_attempts = parked_attempts_;  // (a revocation meanwhile fails it: never mixed)
    parked_ = false;
  }
  SLUICE_ASSIGN_OR_RETURN(session_, FetchSession::Make(again, deps_.fetch, &cancelled_));
  return absl::OkStatus();
}

FetchStream::Step FetchStream::NextChunk() {
  if (absl::Status st = StillAdmitted(); !st.ok()) return Finish(st);
  if (session_ == nullptr) {  // parked: a merge slot first, then the merge again
    if (!admission_->TryEnterMerge()) {
      admission_->EnterMerge([this] { host_->Resume(NextChunk()); });
      return Step{};
    }
    if (absl::Status st = Resume(); !st.ok()) return Finish(st);
  }
  if (spec_.key_order && !admission_->TryEnterMerge()) {
    // Waits for a merge slot holding nothing; resumes on the pool once admitted.
    admission_->EnterMerge([this] { host_->Resume(NextChunk()); });
    return Step{};
  }
  // UNORDERED: of what was reserved for the chunk and its copy, the session takes the chunk.
  if (!spec_.key_order) admission_->Recharge(session_->next_frame_bytes());
  absl::StatusOr<bool> more = session_->Next(chunk_);
  if (!more.ok()) {
    spdlog::error("event=fetch_failed tenant={} shuffle={} partition={} error=\"{}\"",
                  TenantField(spec_.shuffle_id), spec_.shuffle_id, spec_.partition,
                  std::string(more.status().message()));
    return Finish(more.status());
  }
  if (!*more) return Finish(absl::OkStatus());
  // The chunk and the transport's serialised copy of it, until written.
  admission_->Recharge(chunk_->size());
  CountChunk();
  report_ = Report{};
  report_.key_range = report_range_;  // with the first chunk only: the range was applied
  report_range_ = false;
  if (report_mappers_) {  // with the first chunk only
    report_mappers_ = false;
    report_.mappers = &session_->mappers();
    report_.attempts = &session_->attempts();
  }
  // The reader must take the chunk within the stall timeout, or the fetch is cancelled (a
  // stalled write cannot be finished with a status: it never leaves the server).
  phase_.Wait();
  const Clock::time_point now = deps_.clock->Now();
  Step write{Step::Do::kWrite};
  write.deadline = now + deps_.timeouts.fetch_stall;
  deadline_.store(write.deadline.time_since_epoch().count());
  if (session_->last()) {
    // The last chunk goes out with the end of the stream: no Written, no hop back to the pool
    // only to learn there is nothing more (a wide shuffle's partitions are mostly one chunk:
    // this saves a third of their thread hand-overs).
    write.last = true;
    return write;
  }
  if (spec_.key_order) {
    std::lock_guard<std::mutex> lock(park_mu_);
    write_pending_ = true;
    stalled_since_ = now;
    write.park_check = now + std::min<Clock::duration>(kOverSharePark, deps_.timeouts.merge_park);
  }
  return write;
}

void FetchStream::CountChunk() {
  ServerMetrics& m = *deps_.metrics;
  ServerMetrics::Add(m.fetch_chunks, 1);
  ServerMetrics::Add(m.fetch_bytes, chunk_->size());
  const auto header = ParseFrameHeader(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(chunk_->data()), chunk_->size()),
      FrameLimits{kMaxFrameCapBytes, ~uint32_t{0}});
  if (header.ok()) {
    ServerMetrics::Add(m.fetch_records, header->record_count);
    records_sent_ += header->record_count;
  }
}

FetchStream::Step FetchStream::Written(bool ok) {
  const bool stalled = !phase_.Claim();
  if (session_ != nullptr) session_->Sent();  // (none while parked)
  if (!ok || stalled) {
    return Finish(absl::CancelledError(stalled ? absl::StrCat("the reader took no chunk for ",
                                                              Seconds(deps_.timeouts.fetch_stall),
                                                              " s (--fetch_stall_timeout_s)")
                                               : std::string("fetch stream broken")));
  }
  admission_->ReleaseCharge();  // the transport's copy is gone
  if (spec_.key_order) {
    // Merges run on their own pool so that they never hold up pushes or small calls.
    Step merge{Step::Do::kWork};
    merge.pool = Pool::kMerge;
    return merge;
  }
  return WhenRoom(/*on_pool=*/false);
}

FetchStream::Step FetchStream::Expired() {
  const Clock::time_point deadline{Clock::duration(deadline_.load())};
  if (deps_.clock->Now() < deadline || !phase_.Expire()) return Step{};
  spdlog::warn(
      "event=fetch_stalled tenant={} shuffle={} partition={} error=\"the reader took no chunk "
      "for {} s (--fetch_stall_timeout_s); fetch cancelled\"",
      TenantField(spec_.shuffle_id), spec_.shuffle_id, spec_.partition,
      Seconds(deps_.timeouts.fetch_stall));
  return Step{Step::Do::kCancel};
}

// A KEY fetch's chunk is out and its reader has not taken it: after --merge_park_after_s, if
// another fetch waits for a merge slot, the merge gives its slot and its memory up (the chunk out
// stays counted), and merges again from where it was once the reader reads. Sooner
// (kOverSharePark) when its tenant holds more than its share of the slots and a tenant under its
// share waits: one tenant's stalled readers do not keep another's reads waiting.
std::optional<Clock::time_point> FetchStream::ParkCheck() {
  std::lock_guard<std::mutex> lock(park_mu_);
  if (!write_pending_ || session_ == nullptr) return std::nullopt;
  const Clock::time_point now = deps_.clock->Now();
  const Clock::duration stalled = now - stalled_since_;
  const bool over_share = admission_->OverShareOfMerges();
  if (!over_share && (stalled < deps_.timeouts.merge_park || !admission_->OthersWaitForMerge())) {
    return now + kParkRecheck;  // not needed yet: look again soon
  }
  Park(stalled, over_share);
  return std::nullopt;
}

void FetchStream::Park(Clock::duration stalled, bool over_share) {
  admission_->Recharge(2 * chunk_->size());  // the chunk out, and its copy
  parked_mappers_ = session_->mappers();
  parked_attempts_ = session_->attempts();
  EndSession();
  admission_->LeaveMerge();
  parked_ = true;
  ServerMetrics::Add(deps_.metrics->merges_parked, 1);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(stalled).count();
  spdlog::info(
      "event=merge_parked tenant={} shuffle={} partition={} records_sent={} reason=\"the reader "
      "took no chunk for {} ms while {}\"",
      TenantField(spec_.shuffle_id), spec_.shuffle_id, spec_.partition, records_sent_, ms,
      over_share ? "its tenant held more than its share of merge slots and another tenant "
                   "waited for one"
                 : "another fetch waited for a merge slot (--merge_park_after_s)");
}

void FetchStream::StopParking() {
  std::lock_guard<std::mutex> lock(park_mu_);
  write_pending_ = false;
}

bool FetchStream::parked() const {
  std::lock_guard<std::mutex> lock(park_mu_);
  return parked_;
}

}  // namespace sluice
