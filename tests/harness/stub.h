// A raw gRPC stub on a MiniServer, for tests that speak the wire protocol itself (malformed
// messages, message order, headers of returned frames).
#ifndef SLUICE_TESTS_HARNESS_STUB_H_
#define SLUICE_TESTS_HARNESS_STUB_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/frame_encoder.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/mini_server.h"

namespace sluice::testing {

/// The standard health service's answer (grpc.health.v1.Health/Check) for `service` at
/// `address`: 1 SERVING, 2 NOT_SERVING, or the call's error. The request and response are
/// encoded by hand (Debian packages no health.proto): field 1 of each, a string and an enum.
inline absl::StatusOr<int> HealthCheck(const std::string& address, const std::string& service) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  std::string request;
  if (!service.empty()) {
    request.push_back('\x0a');
    request.push_back(static_cast<char>(service.size()));  // (names under 128 bytes)
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                 [&](grpc::Status st) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(st);
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  std::vector<grpc::Slice> slices;
  (void)out.Dump(&slices);
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.size() >= 2 && bytes[0] == '\x08') return static_cast<int>(bytes[1]);
  return 0;  // UNKNOWN (the default value is not sent)
}

inline std::unique_ptr<v1::ShuffleService::Stub> MakeStub(const MiniServer& server) {
  return v1::ShuffleService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
}

/// Writes one frame for `partition` to a push stream as a client does: in a frames message, or
/// announced and in pieces when it is larger than a push message (docs/api.md). Counts the
/// pieces written in `*pieces` when given.
inline bool WriteFrame(grpc::ClientWriter<v1::PushRequest>* w, uint32_t partition,
                       const std::string& frame, size_t piece_bytes = size_t{1} << 20,
                       std::atomic<int>* pieces = nullptr) {
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
    if (ok && pieces != nullptr) ++*pieces;
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
