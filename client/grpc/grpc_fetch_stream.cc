#include "client/grpc/grpc_fetch_stream.h"

#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/error_reason.h"

namespace sluice::grpc_client {
namespace {

class GrpcFetchStream final : public FetchStream {
 public:
  GrpcFetchStream(pb::ShuffleService::Stub* stub, grpc::Channel* channel,
                  const ClientOptions& options, pb::FetchRequest request)
      : stub_(stub), channel_(channel), options_(options), request_(std::move(request)) {
    Start();
  }
  ~GrpcFetchStream() override {
    if (!done_) {
      ctx_->TryCancel();
      (void)stream_->Finish();
    }
  }

  absl::StatusOr<bool> Next(const std::string** frame) override {
    if (done_) return false;
    while (!stream_->Read(&response_)) {
      absl::Status st = FromGrpc(stream_->Finish(), options_.server);
      // Nothing received yet and the transport failed it: again once, on a new connection.
      if (!received_ && !restarted_ && DeadConnection(st, started_, options_, channel_, Never())) {
        restarted_ = true;
        Start();
        continue;
      }
      done_ = true;
      if (!st.ok()) return st;
      return false;
    }
    if (!received_ && (!request_.from_key().empty() || request_.has_to_key()) &&
        !response_.key_range()) {
      // A server before key ranges ignores them and sends the whole partition.
      ctx_->TryCancel();
      (void)stream_->Finish();
      done_ = true;
      return absl::FailedPreconditionError(absl::StrCat(
          "the server at ", options_.server,
          " does not read key ranges (from_key, to_key): it runs a version before them; "
          "upgrade it"));
    }
    received_ = true;
    *frame = &response_.frame();
    if (response_.mappers_size() > 0) {
      mappers_.assign(response_.mappers().begin(), response_.mappers().end());
      attempts_.assign(response_.attempts().begin(), response_.attempts().end());
    }
    return true;
  }

  const std::vector<uint32_t>& mappers() const override { return mappers_; }
  const std::vector<uint64_t>& attempts() const override { return attempts_; }

  void Cancel() override { ctx_->TryCancel(); }

 private:
  void Start() {
    started_ = std::chrono::steady_clock::now();
    ctx_ = std::make_unique<grpc::ClientContext>();
    SetStreamDeadline(options_, ctx_.get());
    stream_ = stub_->Fetch(ctx_.get(), request_);
  }

  pb::ShuffleService::Stub* const stub_;
  grpc::Channel* const channel_;  // the GrpcClient's, which outlives its streams
  const ClientOptions& options_;  // the GrpcClient's
  const pb::FetchRequest request_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<pb::FetchResponse>> stream_;
  pb::FetchResponse response_;
  std::vector<uint32_t> mappers_;
  std::vector<uint64_t> attempts_;
  bool done_ = false, received_ = false, restarted_ = false;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace

std::unique_ptr<FetchStream> StartFetchStream(pb::ShuffleService::Stub* stub,
                                              grpc::Channel* channel, const ClientOptions& options,
                                              pb::FetchRequest request) {
  return std::make_unique<GrpcFetchStream>(stub, channel, options, std::move(request));
}

}  // namespace sluice::grpc_client
