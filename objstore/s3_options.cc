#include "objstore/s3_options.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice::objstore {
namespace {

bool ValidBucket(absl::string_view b) {
  // S3's rules (3-63 lowercase letters, digits, '-' and '.', starting and ending with a letter
  // or digit); GCS and R2 take a subset of these names too.
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || c == '.')) return false;
  }
  return absl::ascii_isalnum(b.front()) && absl::ascii_isalnum(b.back());
}

// Letters, digits and "/-_.~": what SigV4 leaves unescaped in a canonical URI (and '/'), so a
// key is its own canonical URI. (A shuffle id is of these: a tenant's holds '~'.)
bool ValidKeyText(absl::string_view s) {
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~')) {
      return false;
    }
  }
  return true;
}

// No empty segment, and none that is "." or "..".
bool ValidSegments(absl::string_view s) {
  for (absl::string_view seg : absl::StrSplit(s, '/')) {
    if (seg.empty() || seg == "." || seg == "..") return false;
  }
  return true;
}

// An INI file's sections: name -> key -> value (keys lowercased, values trimmed).
using Ini = std::map<std::string, std::map<std::string, std::string>>;

Ini ParseIni(absl::string_view text) {
  Ini ini;
  std::string section;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = std::string(absl::StripAsciiWhitespace(line.substr(1, line.size() - 2)));
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos || section.empty()) continue;
    ini[section][absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq)))] =
        std::string(absl::StripAsciiWhitespace(line.substr(eq + 1)));
  }
  return ini;
}

std::string Home(const EnvLookup& env) {
  std::optional<std::string> home = env("HOME");
  return home.has_value() ? *home : std::string("/root");
}

std::string Redacted(absl::string_view key_id) {
  if (key_id.size() <= 8) return "…";
  return absl::StrCat(key_id.substr(0, 4), "…", key_id.substr(key_id.size() - 3));
}

}  // namespace

bool ValidObjectKey(absl::string_view key) {
  return !key.empty() && key.size() <= 900 && ValidKeyText(key) && ValidSegments(key);
}

bool ValidKeyPrefix(absl::string_view prefix) {
  if (prefix.empty()) return true;
  absl::ConsumeSuffix(&prefix, "/");
  return ValidObjectKey(prefix);
}

std::string S3Options::Url() const { return absl::StrCat("s3://", bucket, "/", prefix); }

std::string S3Options::DebugString() const {
  return absl::StrCat(Url(), " at ", endpoint.empty() ? "(AWS)" : endpoint, " (region ",
                      region.empty() ? "?" : region,
                      path_style.value_or(false) ? ", path-style" : ", virtual-hosted", ", key id ",
                      Redacted(credentials.access_key_id),
                      credentials.source.empty() ? "" : " from " + credentials.source, ")");
}

absl::StatusOr<S3Options> S3OptionsFromUrl(absl::string_view url) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "s3://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("object store '", url, "': expected s3://bucket[/prefix]"));
  }
  S3Options o;
  const size_t slash = rest.find('/');
  o.bucket = std::string(rest.substr(0, slash));
  if (!ValidBucket(o.bucket)) {
    return absl::InvalidArgumentError(
        absl::StrCat("object store '", url, "': bucket '", o.bucket,
                     "' is not a valid bucket name (3-63 lowercase letters, digits, '-' and '.')"));
  }
  if (slash != absl::string_view::npos) {
    absl::string_view prefix = rest.substr(slash + 1);
    while (absl::ConsumeSuffix(&prefix, "/")) {
    }
    if (!ValidKeyText(prefix) || absl::StrContains(prefix, "//") || absl::StartsWith(prefix, "/") ||
        absl::StrContains(prefix, "..")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "object store '", url, "': the prefix may hold letters, digits and \"/-_.\" only"));
    }
    if (!prefix.empty()) o.prefix = absl::StrCat(prefix, "/");
  }
  return o;
}

absl::Status ResolveS3Options(S3Options* o, const EnvLookup& env, const FileLookup& files) {
  const std::string profile = env("AWS_PROFILE").value_or("default");
  std::optional<std::string> creds_path = env("AWS_SHARED_CREDENTIALS_FILE");
  std::optional<std::string> config_path = env("AWS_CONFIG_FILE");
  const Ini credentials_file =
      ParseIni(files(creds_path.value_or(Home(env) + "/.aws/credentials")).value_or(std::string()));
  const Ini config_file =
      ParseIni(files(config_path.value_or(Home(env) + "/.aws/config")).value_or(std::string()));
  auto from_files = [&](const std::string& key) -> std::optional<std::string> {
    if (auto s = credentials_file.find(profile); s != credentials_file.end()) {
      if (auto v = s->second.find(key); v != s->second.end()) return v->second;
    }
    const std::string section = profile == "default" ? profile : "profile " + profile;
    if (auto s = config_file.find(section); s != config_file.end()) {
      if (auto v = s->second.find(key); v != s->second.end()) return v->second;
    }
    return std::nullopt;
  };

  S3Credentials& c = o->credentials;
  if (c.access_key_id.empty() && c.secret_access_key.empty()) {
    std::optional<std::string> id = env("AWS_ACCESS_KEY_ID");
    std::optional<std::string> secret = env("AWS_SECRET_ACCESS_KEY");
    if (id.has_value() || secret.has_value()) {
      if (!id.has_value() || !secret.has_value() || id->empty() || secret->empty()) {
        return absl::InvalidArgumentError(
            "object store credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set "
            "together");
      }
      c.access_key_id = *id;
      c.secret_access_key = *secret;
      c.session_token = env("AWS_SESSION_TOKEN").value_or("");
      c.source = "environment";
    } else {
      std::optional<std::string> fid = from_files("aws_access_key_id");
      std::optional<std::string> fsecret = from_files("aws_secret_access_key");
      if (fid.has_value() != fsecret.has_value() || (fid.has_value() && fid->empty())) {
        return absl::InvalidArgumentError(
            absl::StrCat("object store credentials: profile '", profile,
                         "' has only one of aws_access_key_id and aws_secret_access_key"));
      }
      if (fid.has_value()) {
        c.access_key_id = *fid;
        c.secret_access_key = *fsecret;
        c.session_token = from_files("aws_session_token").value_or("");
        c.source = absl::StrCat("profile '", profile, "' of the shared files");
      }
    }
  }
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "object store ", o->Url(),
        ": no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in "
        "~/.aws/credentials; GCS: an HMAC key pair)"));
  }
  if (o->region.empty()) {
    o->region =
        env("AWS_REGION")
            .value_or(
                env("AWS_DEFAULT_REGION").value_or(from_files("region").value_or("us-east-1")));
  }
  if (o->endpoint.empty()) {
    o->endpoint = env("AWS_ENDPOINT_URL_S3").value_or(env("AWS_ENDPOINT_URL").value_or(""));
  }
  const bool custom = !o->endpoint.empty();
  if (!custom) o->endpoint = absl::StrCat("https://s3.", o->region, ".amazonaws.com");
  while (!o->endpoint.empty() && o->endpoint.back() == '/') o->endpoint.pop_back();
  absl::string_view host = o->endpoint;
  if (!absl::ConsumePrefix(&host, "https://") && !absl::ConsumePrefix(&host, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("object store endpoint '", o->endpoint, "': expected http(s)://host[:port]"));
  }
  if (host.empty() || absl::StrContains(host, "/") || absl::StrContains(host, "@")) {
    return absl::InvalidArgumentError(absl::StrCat("object store endpoint '", o->endpoint,
                                                   "': expected http(s)://host[:port], no path"));
  }
  if (!o->path_style.has_value()) o->path_style = custom;
  return absl::OkStatus();
}

absl::Status ResolveFromEnvironment(S3Options* options) {
  return ResolveS3Options(
      options,
      [](const std::string& name) -> std::optional<std::string> {
        const char* v = std::getenv(name.c_str());
        if (v == nullptr) return std::nullopt;
        return std::string(v);
      },
      [](const std::string& path) -> std::optional<std::string> {
        std::ifstream in(path);
        if (!in) return std::nullopt;
        std::ostringstream text;
        text << in.rdbuf();
        return text.str();
      });
}

}  // namespace sluice::objstore
