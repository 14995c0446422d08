// TLS settings of the server and of the clients, as plain structs: headers that must not see
// gRPC (the server's options, the client's public header) hold these; rpc/tls.h turns them
// into gRPC credentials at the gRPC edge. docs/security.md explains the choices.
#ifndef SLUICE_RPC_TLS_OPTIONS_H_
#define SLUICE_RPC_TLS_OPTIONS_H_

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace sluice {

/// The server's side: TLS when `cert_file` and `key_file` are set; mutual TLS when
/// `client_ca_file` is set too (a client must then show a certificate that CA signed).
struct ServerTlsOptions {
  std::string cert_file;       ///< PEM: the server's certificate chain, its own first
  std::string key_file;        ///< PEM: its private key
  std::string client_ca_file;  ///< PEM: the CAs client certificates must chain to
  /// How often the three files are looked at again: a rotated certificate is served to new
  /// connections within this time, with no restart.
  std::chrono::seconds reload_interval{10};
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

/// A client's side: TLS when `enabled` or any file or PEM below is set. The `*_pem` fields hold
/// the PEM text itself; ShuffleClient::Connect reads the files into them once.
struct ClientTlsOptions {
  bool enabled = false;
  std::string ca_file;    ///< the CAs the server's certificate must chain to (empty: the system's)
  std::string cert_file;  ///< the client's certificate chain, for servers requiring mTLS
  std::string key_file;   ///< its private key
  /// The name the server's certificate must carry (empty: the host of the address dialled).
  std::string server_name;
  std::string ca_pem, cert_pem, key_pem;
  bool On() const {
    return enabled || !ca_file.empty() || !cert_file.empty() || !key_file.empty() ||
           !server_name.empty() || !ca_pem.empty() || !cert_pem.empty() || !key_pem.empty();
  }
};

namespace rpc {

/// Reads the client's files into its *_pem fields (PEM given directly is kept) and checks them
/// as the server checks its own (rpc/tls.h, LoadServerTls): PEM, valid now, the key the
/// certificate's; a certificate needs its key and the other way round.
absl::Status LoadClientTls(ClientTlsOptions* tls);

/// Whether "host:port" names this machine only: 127.0.0.0/8 (also IPv4-mapped, ::ffff:127.x),
/// ::1 or localhost. A wildcard (0.0.0.0, [::]) or any other name is not.
bool IsLoopbackAddress(std::string_view address);
/// Whether a call's peer, as gRPC names it ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", the same
/// URL-encoded, "unix:/path"), is on this machine.
bool IsLoopbackPeer(std::string_view peer);

/// "sha256:<64 hex digits>" of a bearer token: how a server's --auth_file names it.
std::string TokenHash(const std::string& token);

}  // namespace rpc
}  // namespace sluice

#endif  // SLUICE_RPC_TLS_OPTIONS_H_
