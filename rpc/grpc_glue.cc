#include "rpc/grpc_glue.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace sluice::rpc {

grpc::Status ToGrpcStatus(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& st) {
  if (st.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
}

int MaxMessageBytes(const FrameLimits& limits) {
  return static_cast<int>(
      std::min<uint64_t>(INT32_MAX, uint64_t{limits.max_uncompressed_bytes} + (1 << 20)));
}

v1::FrameLayout LayoutToProto(LayoutChoice layout) {
  switch (layout) {
    case LayoutChoice::kOpaque:
      return v1::LAYOUT_OPAQUE;
    case LayoutChoice::kMsgpack:
      return v1::LAYOUT_MSGPACK;
    case LayoutChoice::kColumnar:
      return v1::LAYOUT_COLUMNAR;
    case LayoutChoice::kAuto:
      break;
  }
  return v1::LAYOUT_AUTO;
}

LayoutChoice LayoutFromProto(v1::FrameLayout layout) {
  switch (layout) {
    case v1::LAYOUT_OPAQUE:
      return LayoutChoice::kOpaque;
    case v1::LAYOUT_MSGPACK:
      return LayoutChoice::kMsgpack;
    case v1::LAYOUT_COLUMNAR:
      return LayoutChoice::kColumnar;
    default:
      return LayoutChoice::kAuto;
  }
}

}  // namespace sluice::rpc
