#include "rpc/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace sluice::rpc {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

// PEM files are small: anything larger is not one (and is not read whole into memory).
constexpr std::streamsize kMaxPemBytes = 1 << 20;

// Regular files only: opening a FIFO (or a device) would wait for a writer for ever, at the
// start or in the reloader. O_NONBLOCK makes the open itself return; fstat then refuses it.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, path, ": cannot read it (", std::strerror(errno), ")"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(flag, path, ": not a regular file"));
  }
  if (st.st_size > kMaxPemBytes) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(flag, path, ": larger than 1 MiB, so not a PEM file"));
  }
  std::string data(static_cast<size_t>(kMaxPemBytes) + 1, '\0');
  size_t have = 0;
  while (have < data.size()) {
    const ssize_t n = ::read(fd, data.data() + have, data.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(flag, path, ": cannot read it (", std::strerror(err), ")"));
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  ::close(fd);
  if (have > static_cast<size_t>(kMaxPemBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, path, ": larger than 1 MiB, so not a PEM file"));
  }
  data.resize(have);
  return data;
}

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate in `pem`, in order: at least one, and nothing malformed after the last (a
// file caught half-written must not pass as a shorter chain or bundle).
absl::StatusOr<std::vector<X509Ptr>> ParseCerts(const std::string& pem, absl::string_view flag,
                                                const std::string& path) {
  std::vector<X509Ptr> certs;
  BioPtr bio = MemBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) certs.emplace_back(x);
  const unsigned long end = ERR_peek_last_error();  // the end of the input reads as an error
  ERR_clear_error();
  if (ERR_GET_LIB(end) != ERR_LIB_PEM || ERR_GET_REASON(end) != PEM_R_NO_START_LINE) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, path, ": the PEM block after certificate ", certs.size(),
                     " is malformed (a file cut short, or not a certificate)"));
  }
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, path, ": no PEM certificate in it"));
  }
  return certs;
}

// What was checked, written out again: served as is, so that what is served is what was
// checked (not, say, a certificate that came along in the key's file).
std::string ToPem(const std::vector<X509Ptr>& certs, EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (key != nullptr)
    PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  for (const X509Ptr& c : certs) PEM_write_bio_X509(bio.get(), c.get());
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// Never prompts for a passphrase (OpenSSL's default would, on a terminal).
int NoPassphrase(char*, int, int, void*) { return 0; }

std::string TimeText(const ASN1_TIME* t) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string Subject(X509* cert) {
  char buf[256];
  X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof(buf));
  return buf;
}

absl::Status CheckValidNow(X509* cert, absl::string_view flag, const std::string& path) {
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, path, ": the certificate ", Subject(cert),
                                                   " is not valid before ",
                                                   TimeText(X509_get0_notBefore(cert))));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, path, ": the certificate ", Subject(cert),
                                                   " expired on ",
                                                   TimeText(X509_get0_notAfter(cert))));
  }
  return absl::OkStatus();
}

struct CheckedPair {
  std::string pem;      // the key, then the chain, as checked
  std::string summary;  // subject and expiry
  int64_t not_after_unix = 0;
};

int64_t UnixTime(const ASN1_TIME* t) {
  std::tm tm{};
  if (ASN1_TIME_to_tm(t, &tm) != 1) return 0;
  return static_cast<int64_t>(::timegm(&tm));
}

// A certificate chain and its key, as PEM: the first certificate valid now, each signed by the
// next, the key the first's own.
absl::StatusOr<CheckedPair> CheckPair(const std::string& cert_pem, const std::string& cert_path,
                                      absl::string_view cert_flag, const std::string& key_pem,
                                      const std::string& key_path, absl::string_view key_flag) {
  absl::StatusOr<std::vector<X509Ptr>> parsed = ParseCerts(cert_pem, cert_flag, cert_path);
  if (!parsed.ok()) return parsed.status();
  std::vector<X509Ptr>& certs = *parsed;
  for (size_t i = 0; i + 1 < certs.size(); ++i) {
    if (X509_check_issued(certs[i + 1].get(), certs[i].get()) != X509_V_OK) {
      return absl::InvalidArgumentError(absl::StrCat(
          cert_flag, cert_path, ": certificate ", i + 2, " (", Subject(certs[i + 1].get()),
          ") did not sign certificate ", i + 1, " (", Subject(certs[i].get()),
          "): the chain must go from the certificate itself up to its CA"));
    }
  }
  if (absl::Status st = CheckValidNow(certs[0].get(), cert_flag, cert_path); !st.ok()) return st;
  BioPtr bio = MemBio(key_pem);
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_flag, key_path,
        ": no PEM private key in it (an encrypted key cannot be used: give it unencrypted, "
        "readable by this user only)"));
  }
  if (X509_check_private_key(certs[0].get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, key_path, " is not the key of ", cert_flag, cert_path));
  }
  CheckedPair checked;
  checked.pem = ToPem(certs, key.get());
  checked.not_after_unix = UnixTime(X509_get0_notAfter(certs[0].get()));
  checked.summary = absl::StrCat("subject=\"", Subject(certs[0].get()), "\" expires=\"",
                                 TimeText(X509_get0_notAfter(certs[0].get())), "\"");
  return checked;
}

// The CAs of a bundle, written out again as checked.
absl::StatusOr<std::string> CheckCa(const std::string& pem, const std::string& path,
                                    absl::string_view flag) {
  absl::StatusOr<std::vector<X509Ptr>> certs = ParseCerts(pem, flag, path);
  if (!certs.ok()) return certs.status();
  return ToPem(*certs, nullptr);
}

}  // namespace

absl::StatusOr<ServerTlsMaterial> LoadServerTls(const ServerTlsOptions& tls) {
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both");
  }
  absl::StatusOr<std::string> cert = ReadPem(tls.cert_file, "--tls_cert=");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls.key_file, "--tls_key=");
  if (!key.ok()) return key.status();
  absl::StatusOr<CheckedPair> pair =
      CheckPair(*cert, tls.cert_file, "--tls_cert=", *key, tls.key_file, "--tls_key=");
  if (!pair.ok()) return pair.status();
  ServerTlsMaterial m;
  m.identity_pem = std::move(pair->pem);
  m.summary = std::move(pair->summary);
  m.not_after_unix = pair->not_after_unix;
  if (!tls.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(tls.client_ca_file, "--tls_client_ca=");
    if (!ca.ok()) return ca.status();
    absl::StatusOr<std::string> checked = CheckCa(*ca, tls.client_ca_file, "--tls_client_ca=");
    if (!checked.ok()) return checked.status();
    m.client_ca_pem = *std::move(checked);
  }
  return m;
}

std::shared_ptr<grpc::ServerCredentials> ServerTlsCredentials(const std::string& identity_file,
                                                              const std::string& client_ca_file) {
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      identity_file, identity_file, client_ca_file, /*refresh_interval_sec=*/1);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::Status LoadClientTls(ClientTlsOptions* tls) {
  struct File {
    const std::string& path;
    std::string* pem;
    absl::string_view flag;
  };
  for (const File& f : {File{tls->ca_file, &tls->ca_pem, "TLS CA file "},
                        File{tls->cert_file, &tls->cert_pem, "TLS certificate "},
                        File{tls->key_file, &tls->key_pem, "TLS key "}}) {
    if (f.path.empty() || !f.pem->empty()) continue;
    absl::StatusOr<std::string> pem = ReadPem(f.path, f.flag);
    if (!pem.ok()) return pem.status();
    *f.pem = *std::move(pem);
  }
  if (tls->cert_pem.empty() != tls->key_pem.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate and its key go together: give both");
  }
  // PEM given as text has no path: say so instead.
  auto where = [](const std::string& path) { return path.empty() ? "(given as PEM)" : path; };
  if (!tls->cert_pem.empty()) {
    absl::StatusOr<CheckedPair> summary =
        CheckPair(tls->cert_pem, where(tls->cert_file), "TLS certificate ", tls->key_pem,
                  where(tls->key_file), "TLS key ");
    if (!summary.ok()) return summary.status();
  }
  if (!tls->ca_pem.empty()) {
    absl::StatusOr<std::string> ca = CheckCa(tls->ca_pem, where(tls->ca_file), "TLS CA file ");
    if (!ca.ok()) return ca.status();
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const ClientTlsOptions& tls) {
  if (!tls.On()) return grpc::InsecureChannelCredentials();
  // LoadClientTls reads the files first (ShuffleClient::Connect): a CA file not read would
  // mean the system's CAs instead of the one named.
  assert(tls.ca_file.empty() || !tls.ca_pem.empty());
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;
  options.pem_private_key = tls.key_pem;
  options.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(options);
}

std::string TokenHash(const std::string& token) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(token.data(), token.size(), md, &n, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

bool IsLoopbackAddress(std::string_view address) {
  std::string_view host = address;
  if (!host.empty() && host.front() == '[') {  // [v6]:port
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':');
             colon != std::string_view::npos && host.find(':') == colon) {
    host = host.substr(0, colon);  // host:port; an unbracketed "::1:7070" is all host
  }
  if (host == "localhost") return true;
  const std::string h(host);
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

bool IsLoopbackPeer(std::string_view peer) {
  if (peer.substr(0, 5) == "unix:") return true;
  std::string address;
  if (peer.substr(0, 5) == "ipv4:") {
    address = std::string(peer.substr(5));
  } else if (peer.substr(0, 5) == "ipv6:") {
    address = std::string(peer.substr(5));
    for (auto [from, to] : {std::pair<std::string, char>{"%5B", '['}, {"%5D", ']'}}) {
      for (size_t at; (at = address.find(from)) != std::string::npos;) {
        address.replace(at, from.size(), 1, to);
      }
    }
  } else {
    return false;
  }
  return IsLoopbackAddress(address);
}

}  // namespace sluice::rpc
