// What the server's and the client's gRPC edges share, in one place: the mapping between
// absl::Status and grpc::Status, the message size limit both sides set, and the conversions of
// the wire's enums to the codec's. Only .cc files at the gRPC edge include this header (it
// pulls in gRPC and the generated code); nothing below that edge sees a gRPC type.
#ifndef SLUICE_RPC_GRPC_GLUE_H_
#define SLUICE_RPC_GRPC_GLUE_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "codec/frame_format.h"
#include "sluice/v1/shuffle.pb.h"

namespace sluice::rpc {

/// absl and gRPC number their codes alike: the code is kept, the message copied.
grpc::Status ToGrpcStatus(const absl::Status& st);
absl::Status FromGrpcStatus(const grpc::Status& st);

/// The largest gRPC message either side sends or accepts: one frame at the cap, plus framing.
int MaxMessageBytes(const FrameLimits& limits);

v1::FrameLayout LayoutToProto(LayoutChoice layout);
/// Unknown values (a newer client) mean AUTO.
LayoutChoice LayoutFromProto(v1::FrameLayout layout);

}  // namespace sluice::rpc

#endif  // SLUICE_RPC_GRPC_GLUE_H_
