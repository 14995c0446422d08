#include "rpc/grpc_glue.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "rpc/error_reason.h"

namespace sluice::rpc {

grpc::Status ToGrpcStatus(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  v1::ErrorDetail detail;
  detail.set_reason(static_cast<v1::ErrorDetail::Reason>(ReasonOf(st)));
  detail.set_retry_after_ms(static_cast<uint32_t>(
      std::min<int64_t>(RetryAfterOf(st).count(), std::numeric_limits<uint32_t>::max())));
  v1::StatusDetails details;
  details.set_code(static_cast<int32_t>(st.code()));
  details.set_message(std::string(st.message()));
  details.add_details()->PackFrom(detail);
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()),
                      details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& st) {
  if (st.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  v1::StatusDetails details;
  if (st.error_details().empty() || !details.ParseFromString(st.error_details()) ||
      details.code() != static_cast<int32_t>(st.error_code())) {
    return out;
  }
  // A server's answer (the transport sends no details): its reason, if one it names.
  out = FromServer(std::move(out));
  v1::ErrorDetail detail;
  for (const auto& any : details.details()) {
    if (any.UnpackTo(&detail)) break;
  }
  const int reason = detail.reason();
  if (reason > 0 && reason <= static_cast<int>(ErrorReason::kNotCommitted)) {
    out = WithReason(std::move(out), static_cast<ErrorReason>(reason),
                     std::chrono::milliseconds(detail.retry_after_ms()));
  }
  return out;
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
