// Flags of the command-line programs (`sluice`, `sluice-bench`): --name=value or --name value;
// a bare --flag means "true". Unknown flags are an error (Check): a typo must not silently run
// something else.
#ifndef SLUICE_CLIENT_CLI_FLAGS_H_
#define SLUICE_CLIENT_CLI_FLAGS_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "client/shuffle_client.h"
#include "rpc/tls_options.h"

namespace sluice::cli {

class Flags {
 public:
  /// Parses argv[first..argc).
  Flags(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        bad_ = a;
        continue;
      }
      a = a.substr(2);
      const auto eq = a.find('=');
      if (eq != std::string::npos) {
        values_[a.substr(0, eq)] = a.substr(eq + 1);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values_[a] = argv[++i];
      } else {
        values_[a] = "true";
      }
    }
  }
  std::string Get(const std::string& name, const std::string& def) {
    used_.insert(name);
    auto it = values_.find(name);
    return it == values_.end() ? def : it->second;
  }
  long long Int(const std::string& name, long long def) {
    return std::atoll(Get(name, std::to_string(def)).c_str());
  }
  double Double(const std::string& name, double def) {
    return std::atof(Get(name, std::to_string(def)).c_str());
  }
  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  /// False (with the reason in *why) for a stray argument or a flag no Get asked for.
  bool Check(std::string* why) const {
    if (!bad_.empty()) {
      *why = "unexpected argument '" + bad_ + "'";
      return false;
    }
    for (const auto& [k, v] : values_) {
      if (used_.count(k) == 0 && k != "help") {
        *why = "unknown flag --" + k;
        return false;
      }
    }
    return true;
  }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> used_;
  std::string bad_;
};

/// The TLS flags of every command that calls a server (docs/security.md): --tls-ca FILE (the
/// CAs the server's certificate must chain to), --tls-cert FILE and --tls-key FILE (a client
/// certificate, for servers requiring mutual TLS), --tls-server-name NAME (the name the server's
/// certificate must carry, if not the host dialled), --tls (TLS with the system's CAs). None of
/// them: plaintext.
inline ClientTlsOptions TlsFlags(Flags& f) {
  ClientTlsOptions tls;
  const std::string on = f.Get("tls", "false");
  if (on != "true" && on != "false") {
    std::fprintf(stderr, "--tls=%s: give --tls (true) or --tls=false\n", on.c_str());
    std::exit(2);
  }
  tls.enabled = on == "true";
  tls.ca_file = f.Get("tls-ca", "");
  tls.cert_file = f.Get("tls-cert", "");
  tls.key_file = f.Get("tls-key", "");
  tls.server_name = f.Get("tls-server-name", "");
  return tls;
}

/// The timeouts of every command that calls a server (docs/api.md, "Timeouts and hung
/// servers"), in seconds: --call-timeout-s (each control call), --keepalive-s and
/// --keepalive-timeout-s (a hung server is found within about their sum; keepalive at least 1).
inline ClientOptions TimeoutFlags(Flags& f) {
  ClientOptions o;
  const auto seconds = [&](const char* name, std::chrono::milliseconds def, double min) {
    const std::string text = f.Get(name, "");
    if (text.empty()) return def;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(v >= min) || v > 86400) {
      std::fprintf(stderr, "--%s=%s: give seconds, %g to 86400\n", name, text.c_str(), min);
      std::exit(2);
    }
    return std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
  };
  o.call_deadline = seconds("call-timeout-s", o.call_deadline, 0.001);
  o.keepalive_time = seconds("keepalive-s", o.keepalive_time, 1);
  o.keepalive_timeout = seconds("keepalive-timeout-s", o.keepalive_timeout, 0.001);
  return o;
}

/// The bearer token for servers that ask for credentials: the first line of --token-file FILE
/// (not on the command line, where `ps` shows it), else $SLUICE_TOKEN; empty if neither.
inline std::string TokenFlag(Flags& f) {
  const std::string file = f.Get("token-file", "");
  if (file.empty()) {
    const char* env = std::getenv("SLUICE_TOKEN");
    return env == nullptr ? "" : env;
  }
  std::ifstream in(file);
  std::string token;
  if (!in || !std::getline(in, token) || token.empty()) {
    std::fprintf(stderr, "--token-file=%s: cannot read a token from it\n", file.c_str());
    std::exit(2);
  }
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  return token;
}

}  // namespace sluice::cli

#endif  // SLUICE_CLIENT_CLI_FLAGS_H_
