#include "cluster/membership.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

std::string EncodeNode(const std::string& address, uint64_t started_unix_ms) {
  return nlohmann::json{{"address", address}, {"started_unix_ms", started_unix_ms}}.dump();
}

// The registration's fields; false if `value` is not one (written by something else).
bool DecodeNode(const std::string& value, NodeEntry* out) {
  const nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("address") || !j["address"].is_string()) return false;
  out->address = j["address"].get<std::string>();
  out->started_unix_ms = j.contains("started_unix_ms") && j["started_unix_ms"].is_number_unsigned()
                             ? j["started_unix_ms"].get<uint64_t>()
                             : 0;
  return true;
}

}  // namespace

absl::Status ValidateNodeId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 128;
  for (char c : id) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "node id '", id, "' must be 1 to 128 letters, digits, '.', '_' or '-' (--node_id)"));
}

Membership::Membership(std::shared_ptr<EtcdClient> etcd, MembershipOptions options)
    : etcd_(std::move(etcd)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Join(std::shared_ptr<EtcdClient> etcd,
                                                             MembershipOptions options) {
  if (absl::Status st = ValidateNodeId(options.node_id); !st.ok()) return st;
  if (options.address.empty()) return absl::InvalidArgumentError("no address to register");
  if (options.lease_ttl.count() < 1) {
    return absl::InvalidArgumentError("the registration lease's TTL must be at least 1 s");
  }
  std::unique_ptr<Membership> m(new Membership(std::move(etcd), std::move(options)));
  // An earlier registration at another address gets one TTL (and a second) to expire.
  const auto give_up =
      std::chrono::steady_clock::now() + m->options_.lease_ttl + std::chrono::seconds(1);
  if (absl::Status st = m->Register(give_up); !st.ok()) return st;
  m->renewer_ = std::thread([raw = m.get()] { raw->RenewLoop(); });
  return m;
}

absl::Status Membership::Register(std::chrono::steady_clock::time_point give_up) {
  auto lease = etcd_->GrantLease(options_.lease_ttl);
  if (!lease.ok()) return lease.status();
  const std::string value = EncodeNode(options_.address, options_.started_unix_ms);
  bool waited = false;
  for (;;) {
    auto created = etcd_->CreateIfAbsent(Key(), value, *lease);
    if (!created.ok()) {
      (void)etcd_->RevokeLease(*lease);
      return created.status();
    }
    NodeEntry other;
    const bool same_address = !created->created && DecodeNode(created->kv.value, &other) &&
                              other.address == options_.address;
    if (created->created || same_address) {
      // Ours now; at the same address, this is the same server restarted: the key moves to the
      // new lease at once instead of after the old one's TTL.
      if (same_address) {
        if (absl::Status st = etcd_->Put(Key(), value, *lease); !st.ok()) {
          (void)etcd_->RevokeLease(*lease);
          return st;
        }
      }
      lease_ = *lease;
      registered_.store(true);
      (void)etcd_->Delete(RestartingKey(options_.node_id));  // back (if it drained to restart)
      spdlog::info("event=registered node_id={} address={} lease_ttl_s={}", options_.node_id,
                   options_.address, options_.lease_ttl.count());
      return absl::OkStatus();
    }
    if (std::chrono::steady_clock::now() >= give_up) {
      (void)etcd_->RevokeLease(*lease);
      return absl::FailedPreconditionError(
          absl::StrCat("node id '", options_.node_id, "' is registered by a live server at ",
                       other.address, " (its registration was still renewed after ",
                       options_.lease_ttl.count(), " s); give each server its own --node_id"));
    }
    if (!waited) {
      spdlog::warn("event=node_id_taken node_id={} by={} waiting_s={}", options_.node_id,
                   other.address, options_.lease_ttl.count() + 1);
      waited = true;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return leaving_; })) {
      (void)etcd_->RevokeLease(*lease);
      return absl::CancelledError("the server is leaving");
    }
  }
}

void Membership::RenewLoop() {
  auto last_renewed = std::chrono::steady_clock::now();
  const auto period = std::max<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.lease_ttl) / 3,
      std::chrono::milliseconds(100));
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return leaving_; })) {
    lock.unlock();
    absl::Status st = etcd_->KeepAlive(lease_);
    if (st.code() == absl::StatusCode::kNotFound) {
      // The lease expired (etcd was out of reach past the TTL): register again.
      registered_.store(false);
      spdlog::warn("event=registration_lost node_id={} error=\"{}\"", options_.node_id,
                   std::string(st.message()));
      st =
          Register(std::chrono::steady_clock::now() + options_.lease_ttl + std::chrono::seconds(1));
    }
    if (st.ok()) {
      last_renewed = std::chrono::steady_clock::now();
    } else {
      if (std::chrono::steady_clock::now() - last_renewed > options_.lease_ttl) {
        registered_.store(false);
      }
      spdlog::warn("event=renew_failed node_id={} error=\"{}\"", options_.node_id,
                   std::string(st.message()));
    }
    lock.lock();
  }
}

void Membership::Leave(bool restarting) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (leaving_) return;
    leaving_ = true;
  }
  cv_.notify_all();
  if (renewer_.joinable()) renewer_.join();
  if (restarting && registered_.load()) {
    // (Before the registration goes: a writer that finds it gone finds it restarting.)
    auto lease = etcd_->GrantLease(options_.restart_grace);
    absl::Status st = lease.status();
    if (lease.ok()) st = etcd_->Put(RestartingKey(options_.node_id), "", *lease);
    if (!st.ok()) {
      spdlog::warn("event=restarting_not_said node_id={} error=\"{}\"", options_.node_id,
                   std::string(st.message()));
    }
  }
  if (registered_.exchange(false)) {
    if (absl::Status st = etcd_->RevokeLease(lease_); !st.ok()) {
      spdlog::warn("event=leave_failed node_id={} error=\"{}\"", options_.node_id,
                   std::string(st.message()));
    } else {
      spdlog::info("event=left node_id={}", options_.node_id);
    }
  }
}

Membership::~Membership() { Leave(); }

absl::StatusOr<bool> Membership::Restarting(const std::string& node_id) const {
  auto kv = etcd_->Get(RestartingKey(node_id));
  if (!kv.ok()) return kv.status();
  return kv->has_value();
}

absl::StatusOr<std::vector<NodeEntry>> Membership::Nodes(std::chrono::milliseconds deadline) const {
  const std::string prefix = options_.prefix + "nodes/";
  auto kvs = etcd_->GetPrefix(prefix, deadline);
  if (!kvs.ok()) return kvs.status();
  std::vector<NodeEntry> out;
  for (const EtcdKeyValue& kv : *kvs) {
    NodeEntry e;
    if (!DecodeNode(kv.value, &e)) {
      spdlog::warn("event=bad_node_key key={}", kv.key);
      continue;
    }
    e.node_id = kv.key.substr(prefix.size());
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace sluice
