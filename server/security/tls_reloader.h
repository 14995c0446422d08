// The server's TLS files, watched (docs/security.md, "Rotation"). Every `reload_interval`, and
// on Reload() (SIGHUP), the operator's files are read and checked again (rpc/tls.h,
// LoadServerTls); a new set that passes replaces the one served, in one step, and is logged
// (event=tls_reloaded); one that fails is logged once (event=tls_reload_failed, naming the
// problem) and the previous set is served on. So a rotation caught half-way (a new certificate
// beside the old key), an expired certificate or a truncated file never reaches a handshake.
//
// gRPC reads the served set from files this class keeps in memory, never on disk: memfds at
// /proc/self/fd/N. The key and the chain share one of them, and a change replaces a file's
// content at once (dup3 of a new memfd onto N, with a modification time a second past the
// last), so gRPC cannot read a key of one certificate with another.
#ifndef SLUICE_SERVER_SECURITY_TLS_RELOADER_H_
#define SLUICE_SERVER_SECURITY_TLS_RELOADER_H_

#include <atomic>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rpc/tls_options.h"
#include "server/runtime/periodic.h"

namespace sluice {

class TlsReloader {
 public:
  /// Reads and checks the files (an error names the flag and the problem) and starts watching.
  static absl::StatusOr<std::unique_ptr<TlsReloader>> Start(const ServerTlsOptions& options);
  ~TlsReloader();
  TlsReloader(const TlsReloader&) = delete;
  TlsReloader& operator=(const TlsReloader&) = delete;

  /// What gRPC reads: the key and chain served, and the client CAs (empty path: none).
  const std::string& identity_path() const { return identity_path_; }
  const std::string& client_ca_path() const { return ca_path_; }
  /// The served certificate's subject and expiry, for the log.
  const std::string& summary() const { return summary_; }
  /// Looks at the files now (SIGHUP) instead of at the next interval; returns once looked at.
  void Reload();
  /// When the certificate served expires, in Unix seconds (a metric: alert before it).
  int64_t expiry_unix() const { return expiry_unix_.load(std::memory_order_relaxed); }
  /// Sets of files taken since the start (a certificate pair or client CAs replaced; a metric:
  /// a rotation is served once it counts).
  uint64_t reloads() const { return reloads_.load(std::memory_order_relaxed); }

 private:
  explicit TlsReloader(const ServerTlsOptions& options) : options_(options) {}
  void Check();

  const ServerTlsOptions options_;
  int identity_fd_ = -1, ca_fd_ = -1;
  std::string identity_path_, ca_path_, summary_;
  std::string served_identity_, served_ca_;  // what the memfds hold (the watcher's thread only)
  std::string last_error_;                   // logged already (the watcher's thread only)
  time_t stamp_ = 0;                         // the memfds' last modification time
  std::atomic<int64_t> expiry_unix_{0};
  std::atomic<uint64_t> reloads_{0};
  std::unique_ptr<Periodic> watcher_;  // runs Check
};

}  // namespace sluice

#endif  // SLUICE_SERVER_SECURITY_TLS_RELOADER_H_
