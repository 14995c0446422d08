#include "server/service/call_edge.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_glue.h"
#include "rpc/tls_options.h"

namespace sluice {

absl::StatusOr<CallContext> ResolveCaller(const ServiceDeps& deps,
                                          const grpc::CallbackServerContext* ctx) {
  absl::string_view authorization;
  std::string cert_name;
  if (deps.auth != nullptr) {
    const auto& metadata = ctx->client_metadata();
    if (auto it = metadata.find("authorization"); it != metadata.end()) {
      authorization = absl::string_view(it->second.data(), it->second.size());
    }
    if (auto auth = ctx->auth_context(); auth != nullptr && auth->IsPeerAuthenticated()) {
      const auto names = auth->FindPropertyValues("x509_common_name");
      if (!names.empty()) cert_name.assign(names[0].data(), names[0].size());
    }
  }
  std::string peer = ctx->peer();
  const bool local = rpc::IsLoopbackPeer(peer);
  return CallContext::Resolve(deps.auth, deps.quotas, authorization, cert_name, std::move(peer),
                              local);
}

absl::Status CheckCallerAgain(const ServiceDeps& deps, const grpc::CallbackServerContext* ctx,
                              const CallContext& opened, absl::string_view then) {
  if (deps.auth == nullptr) return absl::OkStatus();
  absl::StatusOr<CallContext> now = ResolveCaller(deps, ctx);
  if (!now.ok()) {
    return absl::Status(now.status().code(), absl::StrCat(now.status().message(), " (", then, ")"));
  }
  if (now->tenant() != opened.tenant() || now->admin() != opened.admin()) {
    return absl::PermissionDeniedError(
        absl::StrCat("the credentials this stream opened with have changed (", then, ")"));
  }
  return absl::OkStatus();
}

grpc::Status ToCaller(const absl::Status& st) { return rpc::ToGrpcStatus(st); }

}  // namespace sluice
