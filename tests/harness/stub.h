// A raw gRPC stub on a MiniServer, for tests that speak the wire protocol itself (malformed
// messages, message order, headers of returned frames).
#ifndef SLUICE_TESTS_HARNESS_STUB_H_
#define SLUICE_TESTS_HARNESS_STUB_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "codec/frame_encoder.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/mini_server.h"

namespace sluice::testing {

inline std::unique_ptr<v1::ShuffleService::Stub> MakeStub(const MiniServer& server) {
  return v1::ShuffleService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
}

/// Writes one frame for `partition` to a push stream as a client does: in a frames message, or
/// announced and in pieces when it is larger than a push message (docs/api.md).
inline bool WriteFrame(grpc::ClientWriter<v1::PushRequest>* w, uint32_t partition,
                       const std::string& frame, size_t piece_bytes = size_t{1} << 20) {
  v1::PushRequest msg;
  if (frame.size() + 16 <= piece_bytes) {
    auto* f = msg.mutable_frames()->add_frames();
    f->set_partition_id(partition);
    f->set_frame(frame);
    return w->Write(msg);
  }
  msg.mutable_large_frame()->set_partition_id(partition);
  msg.mutable_large_frame()->set_frame_size(frame.size());
  bool ok = w->Write(msg);
  for (size_t at = 0; ok && at < frame.size(); at += piece_bytes) {
    msg.mutable_piece()->set_data(frame.substr(at, piece_bytes));
    ok = w->Write(msg);
  }
  return ok;
}

/// One committed push by `mapper` of `frames` one-record frames into partition 0 of `id` (keys a
/// permutation of "k0".."k<frames-1>"), `per_message` frames to a push message: the many-tiny-
/// frames shape of a wide shuffle's reducer.
inline grpc::Status PushTinyFrames(v1::ShuffleService::Stub& stub, const std::string& id,
                                   uint32_t mapper, int frames, int per_message) {
  grpc::ClientContext ctx;
  v1::PushResponse resp;
  auto w = stub.Push(&ctx, &resp);
  v1::PushRequest msg;
  msg.mutable_open()->set_shuffle_id(id);
  msg.mutable_open()->set_mapper_id(mapper);
  msg.mutable_open()->set_attempt_id(1);
  bool ok = w->Write(msg);
  msg.Clear();
  FrameEncoder encoder;
  std::string frame;
  for (int i = 0; ok && i < frames; ++i) {
    const std::string key = "k" + std::to_string((i * 2654435761u) % static_cast<unsigned>(frames));
    frame.clear();
    if (!encoder.Encode({Record{key, std::to_string(i)}}, &frame).ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "encode");
    }
    auto* f = msg.mutable_frames()->add_frames();
    f->set_partition_id(0);
    f->set_frame(frame);
    if (msg.frames().frames_size() == per_message || i + 1 == frames) {
      ok = w->Write(msg);
      msg.Clear();
    }
  }
  if (ok) {
    msg.mutable_commit()->set_frame_count(frames);
    msg.mutable_commit()->set_record_count(frames);
    w->Write(msg);
  }
  w->WritesDone();
  return w->Finish();
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_STUB_H_
