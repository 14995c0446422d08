// TLS at the gRPC edge, for the server and the clients: checks of certificate and key files
// (so that a bad file fails a start or a Connect naming it, not each handshake later on with
// an opaque error), and the gRPC credentials made from them. Only .cc files at the gRPC edge
// include this header.
//
// The server's credentials watch their files (gRPC's FileWatcherCertificateProvider): a
// certificate replaced on disk is served to new connections within the reload interval, with
// no restart; connections already open keep theirs.
#ifndef SLUICE_RPC_TLS_H_
#define SLUICE_RPC_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/tls_options.h"

namespace sluice::rpc {

/// The server's TLS files, read and checked (LoadServerTls).
struct ServerTlsMaterial {
  std::string identity_pem;    ///< the private key, then the certificate chain
  std::string client_ca_pem;   ///< empty: no client certificates asked for
  std::string summary;         ///< for the log: the certificate's subject and expiry
  int64_t not_after_unix = 0;  ///< when the certificate expires, in Unix seconds
};

/// Reads and checks the server's files: each can be read and holds PEM, the certificate is
/// valid now (not expired, not before its start), the key is the certificate's, the client CA
/// file holds a certificate. Errors name the flag (--tls_cert, --tls_key, --tls_client_ca) and
/// the problem.
absl::StatusOr<ServerTlsMaterial> LoadServerTls(const ServerTlsOptions& tls);

/// TLS credentials over files gRPC reads again every second: `identity_file` holds the key and
/// the certificate chain together (so that a change of both is one change), `client_ca_file`
/// the client CAs (empty: no client certificates asked for; else they are required: mutual
/// TLS). The server keeps these files itself, holding only checked material (TlsReloader).
std::shared_ptr<grpc::ServerCredentials> ServerTlsCredentials(const std::string& identity_file,
                                                              const std::string& client_ca_file);

/// A channel's credentials: TLS from the loaded PEM (the system's CAs when there is no CA), or
/// plaintext when `tls.On()` is false.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const ClientTlsOptions& tls);

}  // namespace sluice::rpc

#endif  // SLUICE_RPC_TLS_H_
