// What the server's and the client's gRPC edges share, in one place: the mapping between
// absl::Status and grpc::Status, the message size limit both sides set, and the conversions of
// the wire's enums to the codec's. Only .cc files at the gRPC edge include this header (it
// pulls in gRPC and the generated code); nothing below that edge sees a gRPC type.
#ifndef SLUICE_RPC_GRPC_GLUE_H_
#define SLUICE_RPC_GRPC_GLUE_H_

#include <grpcpp/support/status.h>

#include <cstddef>

#include "absl/status/status.h"
#include "codec/frame_format.h"
#include "sluice/v1/shuffle.pb.h"

namespace sluice::rpc {

/// absl and gRPC number their codes alike: the code is kept, the message copied. A server's
/// status carries an ErrorDetail (its reason, rpc/error_reason.h) in the details; read back,
/// a status with one is marked as the server's answer (IsFromServer), one without came from
/// the transport.
grpc::Status ToGrpcStatus(const absl::Status& st);
absl::Status FromGrpcStatus(const grpc::Status& st);

/// The largest gRPC message a server sends (a fetch chunk): one frame at the cap, plus framing.
int MaxMessageBytes(const FrameLimits& limits);

/// What a push message carries: frames that share a message, or one piece of a larger frame
/// (PushLargeFrame), at most this many bytes of them.
inline constexpr size_t kPushPayloadBytes = size_t{1} << 20;
/// The largest push message a server reads (the payload plus its framing): what a stream may
/// make the server hold before the budget sees it is bounded by this, not by the frame cap.
inline constexpr int kMaxPushMessageBytes = static_cast<int>(kPushPayloadBytes + (64 << 10));

v1::FrameLayout LayoutToProto(LayoutChoice layout);
/// Unknown values (a newer client) mean AUTO.
LayoutChoice LayoutFromProto(v1::FrameLayout layout);

}  // namespace sluice::rpc

#endif  // SLUICE_RPC_GRPC_GLUE_H_
