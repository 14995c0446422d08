#include "server/service/fetch_reactor.h"

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
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
  return spec;
}

class FetchReactor final : public grpc::ServerWriteReactor<FetchResponse> {
 public:
  FetchReactor(const ServiceDeps& deps, grpc::CallbackServerContext* ctx,
               const FetchRequest* request)
      : deps_(deps),
        ctx_(ctx),
        spec_(SpecFromRequest(*request)),
        report_mappers_(request->report_mappers()) {
    absl::StatusOr<CallContext> call = ResolveCaller(deps_, ctx_);
    absl::StatusOr<std::string> id = call.ok() ? call->Kept(spec_.shuffle_id) : call.status();
    if (!id.ok()) {
      Finish(ToCaller(id.status()));
      return;
    }
    spec_.shuffle_id = *std::move(id);
    auto admitted = StreamAdmission::Enter(StreamKind::kFetch, *call, deps_.admission);
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
      absl::Status st = deps_.node->PrepareToServe(spec_.shuffle_id, spec_.partition);
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
      Next();
    });
  }

  void OnWriteDone(bool ok) override {
    const bool stalled = !phase_.Claim();
    deps_.watchdog->Disarm(watch_);
    session_->Sent();
    if (!ok || stalled) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          stalled ? absl::StrCat("the reader took no chunk for ",
                                                 Seconds(deps_.timeouts.fetch_stall),
                                                 " s (--fetch_stall_timeout_s)")
                                  : std::string("fetch stream broken")));
      return;
    }
    if (session_->key_order()) {
      // A merge holds its runs' frames while it waits: waiting on the budget could wait on
      // memory this very fetch holds. Merges are bounded by the merge gate instead, and run
      // on their own pool so that they never hold up pushes or small calls.
      deps_.merge_pool->Submit([this] { Next(); });
    } else {
      // An UNORDERED fetch holds nothing now: it reads its next frame once the budget has room,
      // so that many fetches (or many stalled readers) cannot take the server past it.
      admission_->WhenBudgetAllows([this] { Next(); });
    }
  }
  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override {
    deps_.watchdog->Disarm(watch_);
    if (session_ != nullptr) {
      ServerMetrics::Add(deps_.metrics->merge_passes, session_->merge_passes());
      ServerMetrics::Add(deps_.metrics->merge_spill_bytes, session_->spill_bytes());
    }
    session_.reset();  // returns its budget charges, before the admission its merge slot
    delete this;
  }

 private:
  void Next() {
    if (session_->key_order() && !admission_->TryEnterMerge()) {
      // Wait for a merge slot holding nothing; resume on the pool once admitted.
      admission_->EnterMerge([this] { Next(); });
      return;
    }
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
    CountChunk(response_.frame());
    if (report_mappers_) {  // with the first chunk only
      report_mappers_ = false;
      response_.mutable_mappers()->Add(session_->mappers().begin(), session_->mappers().end());
    } else if (response_.mappers_size() > 0) {
      response_.clear_mappers();
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
    StartWrite(&response_);
  }

  void CountChunk(const std::string& frame) {
    ServerMetrics& m = *deps_.metrics;
    ServerMetrics::Add(m.fetch_chunks, 1);
    ServerMetrics::Add(m.fetch_bytes, frame.size());
    const auto header = ParseFrameHeader(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size()),
        FrameLimits{kMaxFrameCapBytes, ~uint32_t{0}});
    if (header.ok()) ServerMetrics::Add(m.fetch_records, header->record_count);
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
  bool report_mappers_;  // the first chunk still to carry the session's mappers
  StreamPhase phase_;
  uint64_t watch_ = 0;  // the watchdog entry of the current write
};

}  // namespace

grpc::ServerWriteReactor<v1::FetchResponse>* StartFetch(const ServiceDeps& deps,
                                                        grpc::CallbackServerContext* ctx,
                                                        const v1::FetchRequest* request) {
  return new FetchReactor(deps, ctx, request);
}

}  // namespace sluice
