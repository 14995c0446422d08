#include "cluster/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "etcd/etcd_v3.grpc.pb.h"
#include "rpc/error_reason.h"
#include "rpc/grpc_glue.h"

namespace sluice {
namespace {

// etcd could not be reached or did not answer: UNAVAILABLE, and a fault of etcd.
absl::Status Unreachable(const std::string& message) {
  return WithReason(absl::UnavailableError(message), ErrorReason::kEtcdUnavailable);
}

namespace epb = etcdserverpb;

// A gRPC target for the endpoints: one "host:port" as it is; several as one ipv4: target, so
// that the channel moves to another when one fails.
absl::StatusOr<std::string> Target(const std::string& endpoints) {
  if (endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoints given");
  if (endpoints.find(',') == std::string::npos) return endpoints;
  for (absl::string_view part : absl::StrSplit(endpoints, ',')) {
    const size_t colon = part.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("etcd endpoint '", part, "' has no port"));
    }
    int port = 0;
    std::vector<absl::string_view> octets = absl::StrSplit(part.substr(0, colon), '.');
    bool ok = octets.size() == 4 && absl::SimpleAtoi(part.substr(colon + 1), &port) && port > 0 &&
              port < 65536;
    for (absl::string_view o : octets) {
      int v = 0;
      ok = ok && absl::SimpleAtoi(o, &v) && v >= 0 && v <= 255;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint '", part, "': several endpoints must each be an IPv4 address:port"));
    }
  }
  return "ipv4:" + endpoints;
}

EtcdKeyValue FromProto(const epb::KeyValue& kv) {
  return EtcdKeyValue{kv.key(), kv.value(), kv.mod_revision(), kv.lease()};
}

}  // namespace

struct EtcdClient::Impl {
  EtcdOptions options;
  std::unique_ptr<epb::KV::Stub> kv;
  std::unique_ptr<epb::Lease::Stub> lease;

  void Prepare(grpc::ClientContext* ctx,
               std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) const {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      (deadline.count() > 0 ? deadline : options.deadline));
  }
  // Deletes [key, range_end) (just `key` if range_end is empty); how many keys went.
  absl::StatusOr<int64_t> DeleteRange(std::string_view key, const std::string& range_end) const {
    epb::DeleteRangeRequest req;
    req.set_key(std::string(key));
    req.set_range_end(range_end);
    epb::DeleteRangeResponse resp;
    absl::Status st =
        Unary("delete", [&](grpc::ClientContext* ctx) { return kv->DeleteRange(ctx, req, &resp); });
    if (!st.ok()) return st;
    return resp.deleted();
  }
  // One key's Range (or a prefix's), as Get, GetPrefix and ModRevision ask it.
  absl::Status Range(const epb::RangeRequest& req, std::chrono::milliseconds deadline,
                     epb::RangeResponse* resp) const {
    return Unary(
        "get", [&](grpc::ClientContext* ctx) { return kv->Range(ctx, req, resp); }, deadline);
  }
  // One unary call, `rpc(context)`, with the deadline set.
  template <typename Rpc>
  absl::Status Unary(const char* call, Rpc&& rpc,
                     std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) const {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline);
    return Check(rpc(&ctx), call);
  }
  // The call's status, saying which etcd it was about. etcd that cannot be reached or does not
  // answer in time is UNAVAILABLE (never the caller's mistake, and every server sees the same
  // etcd: ErrorReason::kEtcdUnavailable), and so are etcd's own states (FAILED_PRECONDITION:
  // not the leader, a learner; refused credentials); a request etcd refuses as malformed is
  // this code's (INTERNAL).
  absl::Status Check(const grpc::Status& st, const char* call) const {
    if (st.ok()) return absl::OkStatus();
    const absl::Status s = rpc::FromGrpcStatus(st);
    const std::string message =
        absl::StrCat("etcd ", call, " at ", options.endpoints, ": ", s.message());
    switch (s.code()) {
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kOutOfRange:
        return absl::InternalError(message);
      case absl::StatusCode::kNotFound:  // a lease that has expired
      case absl::StatusCode::kAlreadyExists:
        return absl::Status(s.code(), message);
      default:
        return Unreachable(message);
    }
  }
};

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(EtcdOptions options) {
  auto target = Target(options.endpoints);
  if (!target.ok()) return target.status();
  if (options.deadline.count() <= 0) {
    return absl::InvalidArgumentError("the etcd call deadline must be positive");
  }
  auto impl = std::make_unique<Impl>();
  // An etcd that restarts (or a member that comes back) is found again within a second, not
  // after gRPC's default backoff of up to two minutes.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(*target, grpc::InsecureChannelCredentials(), args);
  impl->kv = epb::KV::NewStub(channel);
  impl->lease = epb::Lease::NewStub(channel);
  impl->options = std::move(options);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

const std::string& EtcdClient::endpoints() const { return impl_->options.endpoints; }

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(std::string_view key,
                                                            std::chrono::milliseconds deadline) {
  epb::RangeRequest req;
  req.set_key(std::string(key));
  epb::RangeResponse resp;
  SLUICE_RETURN_IF_ERROR(impl_->Range(req, deadline, &resp));
  if (resp.kvs_size() == 0) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(FromProto(resp.kvs(0)));
}

absl::StatusOr<int64_t> EtcdClient::ModRevision(std::string_view key,
                                                std::chrono::milliseconds deadline) {
  epb::RangeRequest req;
  req.set_key(std::string(key));
  req.set_keys_only(true);
  epb::RangeResponse resp;
  SLUICE_RETURN_IF_ERROR(impl_->Range(req, deadline, &resp));
  return resp.kvs_size() == 0 ? int64_t{0} : resp.kvs(0).mod_revision();
}

absl::StatusOr<std::vector<EtcdKeyValue>> EtcdClient::GetPrefix(std::string_view prefix,
                                                                std::chrono::milliseconds deadline,
                                                                int64_t* revision) {
  epb::RangeRequest req;
  req.set_key(std::string(prefix));
  req.set_range_end(PrefixRangeEnd(prefix));
  epb::RangeResponse resp;
  SLUICE_RETURN_IF_ERROR(impl_->Range(req, deadline, &resp));
  std::vector<EtcdKeyValue> out;
  out.reserve(resp.kvs_size());
  for (const auto& kv : resp.kvs()) out.push_back(FromProto(kv));
  if (revision != nullptr) *revision = resp.header().revision();
  return out;
}

absl::Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  epb::PutRequest req;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  req.set_lease(lease);
  epb::PutResponse resp;
  return impl_->Unary("put",
                      [&](grpc::ClientContext* ctx) { return impl_->kv->Put(ctx, req, &resp); });
}

absl::StatusOr<EtcdCreate> EtcdClient::CreateIfAbsent(std::string_view key, std::string_view value,
                                                      int64_t lease, std::string_view guard,
                                                      std::string_view also,
                                                      const EtcdValueGuard* value_guard) {
  epb::TxnRequest req;
  if (value_guard != nullptr) {  // the other key holds the value (or, for "", does not exist)
    epb::Compare* holds = req.add_compare();
    holds->set_key(value_guard->key);
    holds->set_result(epb::Compare::EQUAL);
    if (value_guard->value.empty()) {
      holds->set_target(epb::Compare::CREATE);
      holds->set_create_revision(0);
    } else {
      holds->set_target(epb::Compare::VALUE);
      holds->set_value(value_guard->value);
    }
  }
  if (!guard.empty()) {  // the guard exists: its creation revision is above 0
    epb::Compare* exists = req.add_compare();
    exists->set_result(epb::Compare::GREATER);
    exists->set_target(epb::Compare::CREATE);
    exists->set_key(std::string(guard));
    exists->set_create_revision(0);
  }
  // The key's creation revision is 0 only while it does not exist.
  epb::Compare* absent = req.add_compare();
  absent->set_result(epb::Compare::EQUAL);
  absent->set_target(epb::Compare::CREATE);
  absent->set_key(std::string(key));
  absent->set_create_revision(0);
  epb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  if (!also.empty()) req.add_success()->mutable_request_put()->set_key(std::string(also));
  req.add_failure()->mutable_request_range()->set_key(std::string(key));
  if (value_guard != nullptr) {
    req.add_failure()->mutable_request_range()->set_key(value_guard->key);
  }
  epb::TxnResponse resp;
  if (absl::Status st = impl_->Unary(
          "create", [&](grpc::ClientContext* ctx) { return impl_->kv->Txn(ctx, req, &resp); });
      !st.ok()) {
    return st;
  }
  EtcdCreate out;
  out.created = resp.succeeded();
  if (out.created) {
    out.kv = EtcdKeyValue{std::string(key), std::string(value), resp.header().revision(), lease};
    return out;
  }
  if (value_guard != nullptr && resp.responses_size() == 2 &&
      resp.responses(0).response_range().kvs_size() == 0) {
    const auto& held = resp.responses(1).response_range();
    const std::string now = held.kvs_size() == 1 ? held.kvs(0).value() : "";
    if (now != value_guard->value) {
      out.guard_value_now = now;
      return out;
    }
  }
  if (!guard.empty() && resp.responses_size() >= 1 &&
      resp.responses(0).response_range().kvs_size() == 0) {
    return absl::NotFoundError(absl::StrCat("etcd create of '", std::string(key), "' at ",
                                            impl_->options.endpoints, ": '", std::string(guard),
                                            "' does not exist"));
  }
  if (resp.responses_size() < 1 || resp.responses(0).response_range().kvs_size() != 1) {
    // The key existed when compared, and was deleted before it could be read: cannot be, in
    // one transaction; say so rather than guess.
    return absl::InternalError(
        absl::StrCat("etcd create of '", std::string(key), "' at ", impl_->options.endpoints,
                     ": the key existed but the transaction did not return it"));
  }
  out.kv = FromProto(resp.responses(0).response_range().kvs(0));
  return out;
}

absl::StatusOr<bool> EtcdClient::PutIfUnchanged(
    std::string_view key, std::string_view value, int64_t mod_revision, std::string_view also,
    std::string_view also_value, const std::vector<std::pair<std::string, std::string>>& deletes,
    const EtcdRangeGuard* unchanged) {
  epb::TxnRequest req;
  epb::Compare* same = req.add_compare();
  same->set_result(epb::Compare::EQUAL);
  same->set_target(epb::Compare::MOD);
  same->set_key(std::string(key));
  same->set_mod_revision(mod_revision);
  if (unchanged != nullptr) {  // every key of the prefix last changed at or before the revision
    epb::Compare* range = req.add_compare();
    range->set_result(epb::Compare::LESS);
    range->set_target(epb::Compare::MOD);
    range->set_key(unchanged->prefix);
    range->set_range_end(PrefixRangeEnd(unchanged->prefix));
    range->set_mod_revision(unchanged->revision + 1);
  }
  epb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  if (!also.empty()) {
    epb::PutRequest* other = req.add_success()->mutable_request_put();
    other->set_key(std::string(also));
    other->set_value(std::string(also_value));
  }
  for (const auto& [from, to] : deletes) {
    epb::DeleteRangeRequest* d = req.add_success()->mutable_request_delete_range();
    d->set_key(from);
    d->set_range_end(to);
  }
  epb::TxnResponse resp;
  if (absl::Status st = impl_->Unary(
          "put", [&](grpc::ClientContext* ctx) { return impl_->kv->Txn(ctx, req, &resp); });
      !st.ok()) {
    return st;
  }
  return resp.succeeded();
}

absl::StatusOr<bool> EtcdClient::Delete(std::string_view key) {
  auto deleted = impl_->DeleteRange(key, "");
  if (!deleted.ok()) return deleted.status();
  return *deleted > 0;
}

absl::StatusOr<int64_t> EtcdClient::DeletePrefix(std::string_view prefix) {
  return impl_->DeleteRange(prefix, PrefixRangeEnd(prefix));
}

absl::StatusOr<bool> EtcdClient::DeleteWithChildren(std::string_view key, std::string_view also) {
  epb::TxnRequest req;  // no compare: both deletes always run, together
  epb::DeleteRangeRequest* self = req.add_success()->mutable_request_delete_range();
  self->set_key(std::string(key));
  const std::string children = std::string(key) + "/";
  epb::DeleteRangeRequest* below = req.add_success()->mutable_request_delete_range();
  below->set_key(children);
  below->set_range_end(PrefixRangeEnd(children));
  if (!also.empty()) req.add_success()->mutable_request_delete_range()->set_key(std::string(also));
  epb::TxnResponse resp;
  if (absl::Status st = impl_->Unary(
          "delete", [&](grpc::ClientContext* ctx) { return impl_->kv->Txn(ctx, req, &resp); });
      !st.ok()) {
    return st;
  }
  return resp.responses_size() > 0 && resp.responses(0).response_delete_range().deleted() > 0;
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(std::chrono::seconds ttl) {
  if (ttl.count() <= 0) return absl::InvalidArgumentError("a lease's TTL must be positive");
  epb::LeaseGrantRequest req;
  req.set_ttl(ttl.count());
  epb::LeaseGrantResponse resp;
  if (absl::Status st = impl_->Unary(
          "lease grant",
          [&](grpc::ClientContext* ctx) { return impl_->lease->LeaseGrant(ctx, req, &resp); });
      !st.ok()) {
    return st;
  }
  if (!resp.error().empty()) {
    return Unreachable(
        absl::StrCat("etcd lease grant at ", impl_->options.endpoints, ": ", resp.error()));
  }
  return resp.id();
}

absl::Status EtcdClient::KeepAlive(int64_t lease) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  auto stream = impl_->lease->LeaseKeepAlive(&ctx);
  epb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  epb::LeaseKeepAliveResponse resp;
  const bool answered = stream->Write(req) && stream->Read(&resp);
  stream->WritesDone();
  if (!answered) {
    ctx.TryCancel();
    const grpc::Status st = stream->Finish();
    if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) {
      return impl_->Check(st, "lease keep-alive");
    }
    return Unreachable(
        absl::StrCat("etcd lease keep-alive at ", impl_->options.endpoints, ": no answer"));
  }
  ctx.TryCancel();  // one round trip is all we want of the stream
  (void)stream->Finish();
  if (resp.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
  }
  return absl::OkStatus();
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  epb::LeaseRevokeRequest req;
  req.set_id(lease);
  epb::LeaseRevokeResponse resp;
  return impl_->Unary("lease revoke", [&](grpc::ClientContext* ctx) {
    return impl_->lease->LeaseRevoke(ctx, req, &resp);
  });
}

std::string PrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // etcd: from the key to the end of the keyspace
}

}  // namespace sluice
