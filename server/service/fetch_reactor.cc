#include "server/service/fetch_reactor.h"

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "rpc/grpc_glue.h"
#include "server/rules/fetch_stream.h"
#include "server/service/call_edge.h"

namespace sluice {
namespace {

using v1::FetchRequest;
using v1::FetchResponse;
using Step = FetchStream::Step;

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

// Writes, finishes and cancels as its FetchStream says (server/rules/fetch_stream.h), runs its
// work on the pool a step names, and keeps the watchdog's entries for the stall and park times.
class FetchReactor final : public grpc::ServerWriteReactor<FetchResponse>,
                           private FetchStream::Host {
 public:
  FetchReactor(const ServiceDeps& deps, grpc::CallbackServerContext* ctx,
               const FetchRequest* request)
      : deps_(deps), ctx_(ctx) {
    absl::StatusOr<CallContext> call = ResolveCaller(deps_, ctx_);
    if (!call.ok()) {
      Finish(ToCaller(call.status()));
      return;
    }
    call_ = *std::move(call);
    FetchStreamOptions options;
    options.report_mappers = request->report_mappers();
    options.placement_epoch = request->placement_epoch();
    auto stream = FetchStream::Make(SpecFromRequest(*request), options, call_, deps_, this,
                                    response_.mutable_frame());
    if (!stream.ok()) {
      Finish(ToCaller(stream.status()));
      return;
    }
    stream_ = *std::move(stream);
    Do(stream_->Start());
  }

  void OnWriteDone(bool ok) override {
    deps_.watchdog->Disarm(watch_);
    StopParking();
    Do(stream_->Written(ok));
  }
  void OnCancel() override {
    if (stream_ != nullptr) stream_->Cancel();
  }
  void OnDone() override {
    deps_.watchdog->Disarm(watch_);
    if (stream_ != nullptr) StopParking();
    delete this;  // the session gives back its charges, then its admission
  }

 private:
  // FetchStream::Host.
  void Resume(Step step) override { Do(std::move(step)); }
  absl::Status CheckCaller(absl::string_view then) override {
    return CheckCallerAgain(deps_, ctx_, call_, then);
  }

  void Do(Step step) {
    switch (step.what) {
      case Step::Do::kNothing:
        return;
      case Step::Do::kWork:
        (step.pool == FetchStream::Pool::kMerge ? deps_.merge_pool : deps_.pool)->Submit([this] {
          Do(stream_->Work());
        });
        return;
      case Step::Do::kWrite:
        Write(step);
        return;
      case Step::Do::kFinish:
        Finish(ToCaller(step.status));
        return;
      case Step::Do::kCancel:
        ctx_->TryCancel();  // the write out completes, not ok
        return;
    }
  }

  void Write(const Step& step) {
    const FetchStream::Report& report = stream_->report();
    if (report.key_range) {
      response_.set_key_range(true);
    } else if (response_.key_range()) {
      response_.clear_key_range();
    }
    if (report.mappers != nullptr) {
      response_.mutable_mappers()->Add(report.mappers->begin(), report.mappers->end());
      response_.mutable_attempts()->Add(report.attempts->begin(), report.attempts->end());
    } else if (response_.mappers_size() > 0) {
      response_.clear_mappers();
      response_.clear_attempts();
    }
    watch_ = deps_.watchdog->Arm(step.deadline, [this] { Do(stream_->Expired()); });
    if (step.last) {
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    }
    if (step.park_check.has_value()) {
      std::lock_guard<std::mutex> lock(park_mu_);
      park_watch_ = deps_.watchdog->Arm(*step.park_check, [this] { ParkCheck(); });
    }
    StartWrite(&response_);
  }

  // On the watchdog's thread.
  void ParkCheck() {
    std::lock_guard<std::mutex> lock(park_mu_);
    park_watch_ = 0;
    if (std::optional<Clock::time_point> again = stream_->ParkCheck(); again.has_value()) {
      park_watch_ = deps_.watchdog->Arm(*again, [this] { ParkCheck(); });
    }
  }

  // The write is done (or the stream is): no park from now on.
  void StopParking() {
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(park_mu_);
      stream_->StopParking();
      id = park_watch_;
      park_watch_ = 0;
    }
    deps_.watchdog->Disarm(id);  // (a ParkCheck running now sees no write pending)
  }

  const ServiceDeps& deps_;
  grpc::CallbackServerContext* const ctx_;
  CallContext call_;                     // the caller it opened with
  std::unique_ptr<FetchStream> stream_;  // null until admitted
  FetchResponse response_;               // its frame is the chunk the session builds
  uint64_t watch_ = 0;                   // the watchdog entry of the current write
  std::mutex park_mu_;                   // ParkCheck against StopParking
  uint64_t park_watch_ = 0;              // the watchdog entry of the next park check
};

}  // namespace

grpc::ServerWriteReactor<v1::FetchResponse>* StartFetch(const ServiceDeps& deps,
                                                        grpc::CallbackServerContext* ctx,
                                                        const v1::FetchRequest* request) {
  return new FetchReactor(deps, ctx, request);
}

}  // namespace sluice
