// EtcdClient: the few etcd v3 calls cluster mode needs, as values: keys read, written,
// created only if absent (the first writer wins, atomically, whoever asks), and leases that
// keep a key alive only while its owner does. Every call has a deadline; an etcd that cannot
// be reached, or does not answer within that deadline, is UNAVAILABLE naming the endpoints
// (ErrorReason::kEtcdUnavailable: the fault is etcd's, and every server sees the same etcd).
//
//   SLUICE_ASSIGN_OR_RETURN(auto etcd, EtcdClient::Connect({"127.0.0.1:2379"}));
//   SLUICE_ASSIGN_OR_RETURN(EtcdCreate c, etcd->CreateIfAbsent("/sluice/x/winner", "7"));
//   // c.created: ours won; else c.value is the winner's
//
// No gRPC type is visible here (the generated etcd code stays in etcd_client.cc). Thread-safe.
#ifndef SLUICE_CLUSTER_ETCD_CLIENT_H_
#define SLUICE_CLUSTER_ETCD_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice {

struct EtcdOptions {
  /// "host:port" or several, comma-separated (IP literals then: one channel picks a live one).
  std::string endpoints;
  /// Each call's deadline.
  std::chrono::milliseconds deadline{5000};
};

/// One key's value and the revision that last changed it.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

/// What CreateIfAbsent found: `created` if the call created the key; the key's value either way
/// (unless a value guard failed first: then `guard_value_now` holds what its key holds).
struct EtcdCreate {
  bool created = false;
  EtcdKeyValue kv;
  std::optional<std::string> guard_value_now;  ///< "" for a key that does not exist
};

/// A transaction guard: no key that starts with `prefix` was created or changed after
/// `revision` (the revision they were read at). A key deleted since is not seen by it.
struct EtcdRangeGuard {
  std::string prefix;
  int64_t revision = 0;
};

/// A condition on another key: it holds `value` ("": the key does not exist).
struct EtcdValueGuard {
  std::string key;
  std::string value;
};

class EtcdClient {
 public:
  /// Makes the channel (no call yet: an unreachable etcd shows on the first call).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  /// The key's value, or nullopt if it does not exist. A `deadline` (> 0) other than the
  /// client's: a caller that has an answer of its own to fall back on asks briefly.
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(
      std::string_view key, std::chrono::milliseconds deadline = std::chrono::milliseconds(0));
  /// The revision that last changed the key (its value is not read), or 0 if it does not
  /// exist.
  absl::StatusOr<int64_t> ModRevision(
      std::string_view key, std::chrono::milliseconds deadline = std::chrono::milliseconds(0));
  /// Every key that starts with `prefix`, in key order. `revision` (may be null): the store's
  /// revision they were read at.
  absl::StatusOr<std::vector<EtcdKeyValue>> GetPrefix(
      std::string_view prefix, std::chrono::milliseconds deadline = std::chrono::milliseconds(0),
      int64_t* revision = nullptr);
  /// Sets `key` (attached to `lease` if not 0: it goes when the lease does).
  absl::Status Put(std::string_view key, std::string_view value, int64_t lease = 0);
  /// Creates `key` = `value` unless the key exists, in one transaction: of any number of
  /// concurrent callers exactly one creates it, and all of them get the value that won.
  /// With a `guard` key, only while that key exists: NOT_FOUND naming it if it does not.
  /// With `also`, that key is set (to "") in the same transaction when `key` is created.
  /// With a `value_guard`, only while that key holds that value: when it does not and `key`
  /// does not exist, nothing is created and `guard_value_now` says what it holds.
  absl::StatusOr<EtcdCreate> CreateIfAbsent(std::string_view key, std::string_view value,
                                            int64_t lease = 0, std::string_view guard = {},
                                            std::string_view also = {},
                                            const EtcdValueGuard* value_guard = nullptr);
  /// Sets `key` = `value` (and `also` = `also_value`, together) only if `key` was last changed
  /// at `mod_revision`: false, and nothing set, if it changed since or is gone. The key ranges
  /// in `deletes` ([from, to)) are deleted in the same transaction, which with `unchanged` also
  /// requires that no key of its prefix was created or changed after its revision.
  absl::StatusOr<bool> PutIfUnchanged(
      std::string_view key, std::string_view value, int64_t mod_revision,
      std::string_view also = {}, std::string_view also_value = {},
      const std::vector<std::pair<std::string, std::string>>& deletes = {},
      const EtcdRangeGuard* unchanged = nullptr);
  /// Deletes `key`; returns whether it existed.
  absl::StatusOr<bool> Delete(std::string_view key);
  /// Deletes every key that starts with `prefix`; returns how many there were.
  absl::StatusOr<int64_t> DeletePrefix(std::string_view prefix);
  /// Deletes `key` and every key that starts with `key` + "/", in one transaction; returns
  /// whether `key` existed.
  /// With `also`, that key is deleted in the same transaction.
  absl::StatusOr<bool> DeleteWithChildren(std::string_view key, std::string_view also = {});

  /// A new lease that ends `ttl` after its last keep-alive; its id.
  absl::StatusOr<int64_t> GrantLease(std::chrono::seconds ttl);
  /// Refreshes the lease once; NOT_FOUND if it has already expired (its keys are gone).
  absl::Status KeepAlive(int64_t lease);
  /// Ends the lease now, and its keys with it.
  absl::Status RevokeLease(int64_t lease);

  const std::string& endpoints() const;

 private:
  struct Impl;
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The end of the key range that holds exactly the keys starting with `prefix` (etcd's
/// range_end: the prefix with its last byte below 0xff incremented, the rest dropped; "\0",
/// every key, for a prefix of only 0xff bytes).
std::string PrefixRangeEnd(std::string_view prefix);

}  // namespace sluice

#endif  // SLUICE_CLUSTER_ETCD_CLIENT_H_
