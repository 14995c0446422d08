#include "server/service/fetch_reactor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/status_macros.h"
#include "rpc/grpc_glue.h"
#include "server/service/call_edge.h"
#include "server/service/stream_phase.h"
#include "server/storage/shuffle_id.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

using v1::FetchRequest;
using v1::FetchResponse;

FetchSpec SpecFromRequest(const FetchRequest& req) {
  FetchSpec spec;
  spec.shuffle_id = req.shuffle_id();
  spec.partition = req.partition_id();
  spec.key_order = req.order() == v1::KEY;
  spec.require_complete = req.require_complete();
  spec.layout = rpc::LayoutFromProto(req.layout());
  spec.uncompressed = req.uncompressed();
  spec.zstd_level = req.zstd_level();
  spec.target_chunk_bytes = req.target_chunk_bytes();
  spec.skip_records = req.skip_records();
  spec.only_mappers.assign(req.only_mappers().begin(), req.only_mappers().end());
  spec.only_attempts.assign(req.only_attempts().begin(), req.only_attempts().end());
  spec.from_key = req.from_key();
  if (req.has_to_key()) spec.to_key = req.to_key();
  return spec;
}

class FetchReactor final : public grpc::ServerWriteReactor<FetchResponse> {
 public:
  FetchReactor(const ServiceDeps& deps, grpc::CallbackServerContext* ctx,
               const FetchRequest* request)
      : deps_(deps),
        ctx_(ctx),
        spec_(SpecFromRequest(*request)),
        report_mappers_(request->report_mappers()),
        report_range_(!request->from_key().empty() || request->has_to_key()),
        placement_epoch_(request->placement_epoch()) {
    absl::StatusOr<CallContext> call = ResolveCaller(deps_, ctx_);
    absl::StatusOr<std::string> id = call.ok() ? call->Kept(spec_.shuffle_id) : call.status();
    if (!id.ok()) {
      Finish(ToCaller(id.status()));
      return;
    }
    spec_.shuffle_id = *std::move(id);
    spec_.tenant = call->tenant();
    call_ = *call;
    auto admitted = StreamAdmission::Enter(StreamKind::kFetch, call_, deps_.admission);
    if (!admitted.ok()) {
      Finish(ToCaller(admitted.status()));
      return;
    }
    admission_ = *std::move(admitted);
    if (spec_.key_order && admission_->BudgetMustWait()) {
      // A merge charges the budget as it goes and never waits once it runs (it would wait on
      // memory it holds): one that has not started yet waits its turn, holding nothing, so
      // that a push waiting for a large frame's room is not passed over by merge after merge.
      admission_->WhenBudgetAllows([this] { SetUp(); });
      return;
    }
    SetUp();
  }

  // Setup reads the store under its locks: keep gRPC threads free of any lock wait. A KEY
  // fetch sets up on the merge pool, where its merge runs: with a slot free it goes on to
  // its first chunk there without another hand-over.
  void SetUp() {
    WorkerPool* setup = spec_.key_order ? deps_.merge_pool : deps_.pool;
    setup->Submit([this] {
      absl::Status st =
          deps_.node->PrepareToServe(spec_.shuffle_id, spec_.partition, placement_epoch_);
      if (!st.ok()) {
        Finish(ToCaller(st));
        return;
      }
      auto session = FetchSession::Make(spec_, deps_.fetch, &cancelled_);
      if (!session.ok()) {
        Finish(ToCaller(session.status()));
        return;
      }
      session_ = std::move(session).value();
      ServerMetrics::Add(deps_.metrics->fetch_stored_bytes, session_->bytes_to_read());
      NextWhenRoom(/*on_pool=*/true);
    });
  }

  // UNORDERED: reads the next stored frame once the budget has room for it and the copy the
  // transport makes of it, so that many fetches (or many stalled readers) cannot take the
  // server past its budget. A merge charges the budget as it goes instead, and never waits
  // once it runs (it would wait on memory it holds): merges are bounded by the merge gate.
  void NextWhenRoom(bool on_pool = false) {
    const uint64_t next = session_->next_frame_bytes();
    if (next == 0) {
      Next();
      return;
    }
    if (on_pool && admission_->TryReserveChargeForReader(2 * next)) {
      Next();  // (no hand-over: a wide shuffle's fetches are mostly one chunk)
      return;
    }
    admission_->ReserveChargeForReader(2 * next, [this] { Next(); });
  }

  void OnWriteDone(bool ok) override {
    const bool stalled = !phase_.Claim();
    deps_.watchdog->Disarm(watch_);
    StopParking();
    if (session_ != nullptr) session_->Sent();  // (none while parked)
    if (!ok || stalled) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          stalled ? absl::StrCat("the reader took no chunk for ",
                                                 Seconds(deps_.timeouts.fetch_stall),
                                                 " s (--fetch_stall_timeout_s)")
                                  : std::string("fetch stream broken")));
      return;
    }
    admission_->ReleaseCharge();  // the transport's copy is gone
    if (spec_.key_order) {
      // Merges run on their own pool so that they never hold up pushes or small calls.
      deps_.merge_pool->Submit([this] { Next(); });
    } else {
      NextWhenRoom();
    }
  }
  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override {
    deps_.watchdog->Disarm(watch_);
    StopParking();
    EndSession();  // returns its budget charges, before the admission its merge slot
    delete this;
  }

 private:
  void EndSession() {
    if (session_ == nullptr) return;
    ServerMetrics::Add(deps_.metrics->merge_passes, session_->merge_passes());
    ServerMetrics::Add(deps_.metrics->merge_spill_bytes, session_->spill_bytes());
    session_.reset();
  }

  // A KEY fetch's chunk is out and its reader has not taken it: after --merge_park_after_s,
  // if another fetch waits for a merge slot, the merge gives its slot and its memory up (the
  // chunk out stays counted), and merges again from where it was once the reader reads. Sooner
  // (kOverSharePark) when its tenant holds more than its share of the slots and a tenant under
  // its share waits: one tenant's stalled readers do not keep another's reads waiting.
  static constexpr std::chrono::milliseconds kOverSharePark{200};
  void ArmPark() {
    std::lock_guard<std::mutex> lock(park_mu_);
    write_pending_ = true;
    stalled_since_ = Watchdog::Clock::now();
    park_watch_ =
        deps_.watchdog->Arm(stalled_since_ + std::min<Watchdog::Clock::duration>(
                                                 kOverSharePark, deps_.timeouts.merge_park),
                            [this] { MaybePark(); });
  }

  // On the watchdog's thread.
  void MaybePark() {
    std::lock_guard<std::mutex> lock(park_mu_);
    park_watch_ = 0;
    if (!write_pending_ || session_ == nullptr) return;
    const auto stalled = Watchdog::Clock::now() - stalled_since_;
    const bool over_share = admission_->OverShareOfMerges();
    if (!over_share && (stalled < deps_.timeouts.merge_park || !admission_->OthersWaitForMerge())) {
      // Not needed yet: look again soon.
      park_watch_ = deps_.watchdog->Arm(Watchdog::Clock::now() + std::chrono::milliseconds(100),
                                        [this] { MaybePark(); });
      return;
    }
    admission_->Recharge(2 * response_.frame().size());  // the chunk out, and its copy
    parked_mappers_ = session_->mappers();
    parked_attempts_ = session_->attempts();
    EndSession();
    admission_->LeaveMerge();
    ServerMetrics::Add(deps_.metrics->merges_parked, 1);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(stalled).count();
    if (over_share) {
      spdlog::info(
          "event=merge_parked tenant={} shuffle={} partition={} records_sent={} reason=\"the "
          "reader took no chunk for {} ms while its tenant held more than its share of merge "
          "slots and another tenant waited for one\"",
          TenantField(spec_.shuffle_id), spec_.shuffle_id, spec_.partition, records_sent_, ms);
    } else {
      spdlog::info(
          "event=merge_parked tenant={} shuffle={} partition={} records_sent={} reason=\"the "
          "reader took no chunk for {} ms while another fetch waited for a merge slot "
          "(--merge_park_after_s)\"",
          TenantField(spec_.shuffle_id), spec_.shuffle_id, spec_.partition, records_sent_, ms);
    }
  }

  // The write is done (or the stream is): no park from now on.
  void StopParking() {
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(park_mu_);
      write_pending_ = false;
      id = park_watch_;
      park_watch_ = 0;
    }
    deps_.watchdog->Disarm(id);  // (a MaybePark running now sees no write pending)
  }

  // A parked KEY fetch's merge again, skipping what its reader was sent, over the same mappers.
  absl::Status Resume() {
    FetchSpec again = spec_;
    again.skip_records = spec_.skip_records + records_sent_;
    again.only_mappers = parked_mappers_;
    again.only_attempts = parked_attempts_;  // (a revocation meanwhile fails it: never mixed)
    SLUICE_ASSIGN_OR_RETURN(session_, FetchSession::Make(again, deps_.fetch, &cancelled_));
    return absl::OkStatus();
  }

  // The credentials again, at most once a second as chunks go: a token taken out of
  // --auth_file ends the fetches it opened too (within --auth_reload_s and a chunk), as it
  // commits none of its pushes.
  absl::Status StillAdmitted() {
    const auto now = std::chrono::steady_clock::now();
    if (now - checked_ < std::chrono::seconds(1)) return absl::OkStatus();
    checked_ = now;
    return CheckCallerAgain(deps_, ctx_, call_, "checked again during the fetch, which was ended");
  }

  void Next() {
    if (absl::Status st = StillAdmitted(); !st.ok()) {
      Finish(ToCaller(st));
      return;
    }
    if (session_ == nullptr) {  // parked: a merge slot first, then the merge again
      if (!admission_->TryEnterMerge()) {
        admission_->EnterMerge([this] { Next(); });
        return;
      }
      if (absl::Status st = Resume(); !st.ok()) {
        Finish(ToCaller(st));
        return;
      }
    }
    if (spec_.key_order && !admission_->TryEnterMerge()) {
      // Wait for a merge slot holding nothing; resume on the pool once admitted.
      admission_->EnterMerge([this] { Next(); });
      return;
    }
    // UNORDERED: of what was reserved for the chunk and its copy, the session takes the chunk.
    if (!spec_.key_order) admission_->Recharge(session_->next_frame_bytes());
    auto more = session_->Next(response_.mutable_frame());
    if (!more.ok()) {
      spdlog::error("event=fetch_failed tenant={} shuffle={} partition={} error=\"{}\"",
                    TenantField(spec_.shuffle_id), spec_.shuffle_id, spec_.partition,
                    std::string(more.status().message()));
      Finish(ToCaller(more.status()));
      return;
    }
    if (!*more) {
      Finish(grpc::Status::OK);
      return;
    }
    // The chunk and the transport's serialised copy of it, until written.
    admission_->Recharge(response_.frame().size());
    CountChunk(response_.frame());
    if (report_range_) {  // with the first chunk only: the range was applied
      report_range_ = false;
      response_.set_key_range(true);
    } else if (response_.key_range()) {
      response_.clear_key_range();
    }
    if (report_mappers_) {  // with the first chunk only
      report_mappers_ = false;
      response_.mutable_mappers()->Add(session_->mappers().begin(), session_->mappers().end());
      response_.mutable_attempts()->Add(session_->attempts().begin(), session_->attempts().end());
    } else if (response_.mappers_size() > 0) {
      response_.clear_mappers();
      response_.clear_attempts();
    }
    // The reader must take the chunk within the stall timeout, or the fetch is cancelled (a
    // stalled write cannot be finished with a status: it never leaves the server).
    phase_.Wait();
    watch_ = deps_.watchdog->Arm(Watchdog::Clock::now() + deps_.timeouts.fetch_stall,
                                 [this] { Expire(); });
    if (session_->last()) {
      // The last chunk goes out with the end of the stream: no OnWriteDone, no hop back to
      // the pool only to learn there is nothing more (a wide shuffle's partitions are mostly
      // one chunk: this saves a third of their thread hand-overs).
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    }
    if (spec_.key_order) ArmPark();
    StartWrite(&response_);
  }

  void CountChunk(const std::string& frame) {
    ServerMetrics& m = *deps_.metrics;
    ServerMetrics::Add(m.fetch_chunks, 1);
    ServerMetrics::Add(m.fetch_bytes, frame.size());
    const auto header = ParseFrameHeader(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size()),
        FrameLimits{kMaxFrameCapBytes, ~uint32_t{0}});
    if (header.ok()) {
      ServerMetrics::Add(m.fetch_records, header->record_count);
      records_sent_ += header->record_count;
    }
  }

  // On the watchdog's thread: the write is still pending. Cancelling completes it (ok=false).
  void Expire() {
    if (!phase_.Expire()) return;
    spdlog::warn(
        "event=fetch_stalled tenant={} shuffle={} partition={} error=\"the reader took no chunk "
        "for {} s (--fetch_stall_timeout_s); fetch cancelled\"",
        TenantField(spec_.shuffle_id), spec_.shuffle_id, spec_.partition,
        Seconds(deps_.timeouts.fetch_stall));
    ctx_->TryCancel();
  }

  const ServiceDeps& deps_;
  grpc::CallbackServerContext* const ctx_;
  FetchSpec spec_;                              // its shuffle id as the server keeps it
  std::unique_ptr<StreamAdmission> admission_;  // null until admitted
  std::atomic<bool> cancelled_{false};
  std::unique_ptr<FetchSession> session_;
  FetchResponse response_;
  bool report_mappers_;             // the first chunk still to carry the session's mappers
  bool report_range_;               // ... and that it read a key range
  const uint32_t placement_epoch_;  // the epoch the reader routes by (0: not said)
  StreamPhase phase_;
  uint64_t watch_ = 0;  // the watchdog entry of the current write
  // Parking (KEY): the merge given up while the reader stalls.
  std::mutex park_mu_;
  bool write_pending_ = false;                 // a chunk is out, its reader has not taken it
  uint64_t park_watch_ = 0;                    // the watchdog entry that looks at it
  Watchdog::Clock::time_point stalled_since_;  // when the chunk out was written
  CallContext call_;                           // the caller it opened with
  std::chrono::steady_clock::time_point checked_ = std::chrono::steady_clock::now();  // creds
  uint64_t records_sent_ = 0;              // in the chunks built so far
  std::vector<uint32_t> parked_mappers_;   // the mappers the merge was over
  std::vector<uint64_t> parked_attempts_;  // and their attempts
};

}  // namespace

grpc::ServerWriteReactor<v1::FetchResponse>* StartFetch(const ServiceDeps& deps,
                                                        grpc::CallbackServerContext* ctx,
                                                        const v1::FetchRequest* request) {
  return new FetchReactor(deps, ctx, request);
}

}  // namespace sluice
