#include "client/grpc/grpc_push_stream.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rpc/error_reason.h"

namespace sluice::grpc_client {
namespace {

class GrpcPushStream final : public PushStream {
 public:
  // `flow`: PushFlow (each frames or piece message sent within credit the server granted);
  // else Push.
  GrpcPushStream(pb::ShuffleService::Stub* stub, const ClientOptions& options, bool prepare,
                 bool flow)
      : server_(options.server), prepare_(prepare) {
    SetStreamDeadline(options, &ctx_);
    if (flow) {
      flow_ = stub->PushFlow(&ctx_);
    } else {
      stream_ = stub->Push(&ctx_, &response_);
    }
  }
  ~GrpcPushStream() override {
    if (!finished_) {
      ctx_.TryCancel();
      (void)Finish();
    }
  }

  // The server sends its headers once it has taken the stream (admitted it): waiting for them
  // tells at once a stream refused, or one on a dead connection, before anything is sent.
  absl::Status Open(const std::string& id, uint32_t mapper, uint64_t attempt, uint32_t epoch,
                    bool await_headers) {
    if (await_headers) {
      if (flow_ != nullptr) {
        flow_->WaitForInitialMetadata();
      } else {
        stream_->WaitForInitialMetadata();
      }
    }
    pb::PushRequest open;
    open.mutable_open()->set_shuffle_id(id);
    open.mutable_open()->set_mapper_id(mapper);
    open.mutable_open()->set_attempt_id(attempt);
    open.mutable_open()->set_placement_epoch(epoch);
    if (!Send(open, /*within_credit=*/false)) return WriteFailed();
    return absl::OkStatus();
  }

  std::string* NewFrame(uint32_t partition) override {
    next_.set_partition_id(partition);
    next_.mutable_frame()->clear();
    return next_.mutable_frame();
  }

  // Small frames share a message (a wide writer's thousands of tiny frames cost a few
  // messages, not a message each); a message is sent once it holds kPushMessageBytes, or
  // before a frame that would take it past that, or at the commit.
  absl::Status SendFrame() override {
    const size_t size = next_.frame().size() + kFrameOverhead;
    if (pending_bytes_ > 0 && pending_bytes_ + size > kPushMessageBytes) {
      if (absl::Status st = SendPending(); !st.ok()) return st;
    }
    if (size > kPushMessageBytes) return SendLargeFrame();
    msg_.mutable_frames()->add_frames()->Swap(&next_);  // (next_ gets a recycled element)
    pending_bytes_ += size;
    // PushFlow's first message goes with its first frame: its credit tells the writer of the
    // huge partitions' segments made so far (docs/cluster.md) before it fills a message more.
    if (pending_bytes_ >= kPushMessageBytes || (flow_ != nullptr && !credited_)) {
      return SendPending();
    }
    return absl::OkStatus();
  }

  absl::Status SendCommit(uint64_t frames, uint64_t records) override {
    if (pending_bytes_ > 0) {
      if (absl::Status st = SendPending(); !st.ok()) return st;
    }
    pb::PushRequest commit;
    commit.mutable_commit()->set_frame_count(frames);
    commit.mutable_commit()->set_record_count(records);
    commit.mutable_commit()->set_prepare(prepare_);
    if (!Send(commit, /*within_credit=*/false)) return WriteFailed();
    if (flow_ != nullptr) {
      flow_->WritesDone();
    } else {
      stream_->WritesDone();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<WriteResult> FinishCommit() override {
    if (absl::Status st = Finish(); !st.ok()) return st;
    if (prepare_ && !response_.prepared() && !response_.duplicate()) {
      // A server that does not know the prepare (an earlier version) committed the attempt
      // outright: its replicas could now disagree on the mapper's winner.
      return absl::FailedPreconditionError(
          absl::StrCat("server ", server_,
                       " committed the attempt instead of preparing it: it predates "
                       "cluster mode's commit protocol; upgrade it"));
    }
    WriteResult r;
    r.duplicate = response_.duplicate();
    r.frames = response_.frames();
    r.records = response_.records();
    r.bytes = response_.bytes();
    return r;
  }

  void Cancel() override { ctx_.TryCancel(); }
  std::vector<SegmentNotice> TakeSegments() override {
    std::vector<SegmentNotice> out;
    out.swap(segments_);
    return out;
  }

 private:
  absl::Status Finish() {
    if (finished_) return absl::FailedPreconditionError("the push stream has ended");
    finished_ = true;
    if (flow_ != nullptr) {
      pb::PushReply reply;  // the commit's response comes last
      while (flow_->Read(&reply)) {
        if (reply.has_done()) response_ = reply.done();
      }
      return FromGrpc(flow_->Finish(), server_);
    }
    return FromGrpc(stream_->Finish(), server_);
  }
  // Writes `m`; with PushFlow, a frames message (`within_credit`) first asks for credit for
  // its size and waits for it (granted once the server's memory budget has room).
  bool Send(const pb::PushRequest& m, bool within_credit) {
    if (flow_ == nullptr) return stream_->Write(m);
    if (within_credit) {
      const uint64_t size = m.ByteSizeLong();
      pb::PushRequest ask;
      ask.mutable_ask()->set_bytes(size);
      if (!flow_->Write(ask) || !AwaitCredit(size)) return false;
      credit_ -= size;
      credited_ = true;
    }
    return flow_->Write(m);
  }
  // Reads credit replies until `n` bytes are granted; false once the stream ended (Finish says
  // why).
  bool AwaitCredit(uint64_t n) {
    pb::PushReply reply;
    while (credit_ < n) {
      if (!flow_->Read(&reply)) return false;
      credit_ += reply.credit();
      for (const auto& g : reply.segments()) {
        segments_.push_back(
            SegmentNotice{g.partition_id(), g.parent(),
                          std::vector<uint32_t>(g.nodes().begin(), g.nodes().end())});
      }
    }
    return true;
  }
  absl::Status SendPending() {
    const bool ok = Send(msg_, /*within_credit=*/true);
    msg_.mutable_frames()->mutable_frames()->Clear();  // keeps the elements for reuse
    pending_bytes_ = 0;
    return ok ? absl::OkStatus() : WriteFailed();
  }
  // A frame over a message: its size first (the server reserves that much memory before it
  // reads on), then its bytes in pieces of a message each.
  absl::Status SendLargeFrame() {
    const std::string& frame = next_.frame();
    pb::PushRequest msg;
    msg.mutable_large_frame()->set_partition_id(next_.partition_id());
    msg.mutable_large_frame()->set_frame_size(frame.size());
    if (!Send(msg, /*within_credit=*/false)) return WriteFailed();
    // PushFlow: its pieces go once the server has promised the frame's memory, which it says
    // with credit for the frame's size.
    if (flow_ != nullptr && !AwaitCredit(frame.size())) return WriteFailed();
    std::string* piece = msg.mutable_piece()->mutable_data();
    for (size_t at = 0; at < frame.size(); at += kPushMessageBytes) {
      piece->assign(frame, at, std::min(kPushMessageBytes, frame.size() - at));
      if (flow_ != nullptr) credit_ -= piece->size();
      if (!Send(msg, /*within_credit=*/false)) return WriteFailed();
    }
    std::string().swap(*next_.mutable_frame());  // not kept for the small frames that follow
    return absl::OkStatus();
  }
  // After a failed write: the server's reason for ending the stream (a rejected frame, say).
  absl::Status WriteFailed() {
    absl::Status st = Finish();
    if (st.ok()) return absl::UnavailableError(absl::StrCat("push stream to ", server_, " broke"));
    return st;
  }

  const std::string server_;
  const bool prepare_;
  grpc::ClientContext ctx_;
  pb::PushResponse response_;
  pb::PushRequest msg_;                                          // the frames not sent yet
  pb::PartitionFrame next_;                                      // the frame being encoded
  size_t pending_bytes_ = 0;                                     // in msg_
  std::unique_ptr<grpc::ClientWriter<pb::PushRequest>> stream_;  // Push
  std::unique_ptr<grpc::ClientReaderWriter<pb::PushRequest, pb::PushReply>> flow_;  // PushFlow
  uint64_t credit_ = 0;                  // granted and not used (PushFlow)
  std::vector<SegmentNotice> segments_;  // told with credit, not taken yet
  bool credited_ = false;                // a frames message was granted credit (PushFlow)
  bool finished_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PushStream>> OpenPushStream(
    pb::ShuffleService::Stub* stub, const ClientOptions& options, bool prepare, bool flow,
    const std::string& id, uint32_t mapper, uint64_t attempt, uint32_t epoch, bool await_headers) {
  auto stream = std::make_unique<GrpcPushStream>(stub, options, prepare, flow);
  SLUICE_RETURN_IF_ERROR(stream->Open(id, mapper, attempt, epoch, await_headers));
  return std::unique_ptr<PushStream>(std::move(stream));
}

}  // namespace sluice::grpc_client
