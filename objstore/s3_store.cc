#include "objstore/s3_store.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"

namespace sluice::objstore {

// Easy handles kept for reuse: each keeps its connections alive between calls.
struct S3Store::Pool {
  absl::Mutex mu;
  std::vector<CURL*> free ABSL_GUARDED_BY(mu);
  ~Pool() {
    for (CURL* c : free) curl_easy_cleanup(c);
  }
  CURL* Take() {
    {
      absl::MutexLock lock(&mu);
      if (!free.empty()) {
        CURL* c = free.back();
        free.pop_back();
        curl_easy_reset(c);  // (keeps its live connections)
        return c;
      }
    }
    return curl_easy_init();
  }
  void Give(CURL* c) {
    absl::MutexLock lock(&mu);
    if (free.size() < 64) {
      free.push_back(c);
      return;
    }
    curl_easy_cleanup(c);
  }
};

namespace {

constexpr size_t kMaxAnswerBytes = 64u << 20;  // (what a non-GET answer may be)

struct Request {
  const char* op = "";  // for errors: "PUT", "GET"...
  std::atomic<uint64_t>* counter = nullptr;
  std::string method = "GET";
  std::string url;
  absl::string_view key;
  absl::string_view body;
  std::vector<std::string> headers;
  size_t max_answer = kMaxAnswerBytes;
  bool complete_upload = false;  // (a 200 may carry an <Error>)
};

struct Response {
  long code = 0;
  std::string body;
  std::string etag;
  int64_t content_length = -1;  // (the header's, for HEAD)
  bool overflow = false;
};

struct Upload {
  absl::string_view body;
  size_t at = 0;
};

size_t ReadBody(char* out, size_t size, size_t n, void* user) {
  Upload* u = static_cast<Upload*>(user);
  const size_t len = std::min(size * n, u->body.size() - u->at);
  std::memcpy(out, u->body.data() + u->at, len);
  u->at += len;
  return len;
}

struct Sink {
  Response* response;
  size_t max;
};

size_t WriteBody(char* in, size_t size, size_t n, void* user) {
  Sink* s = static_cast<Sink*>(user);
  if (s->response->body.size() + size * n > s->max) {
    s->response->overflow = true;
    return 0;  // (curl stops: CURLE_WRITE_ERROR)
  }
  s->response->body.append(in, size * n);
  return size * n;
}

size_t Header(char* in, size_t size, size_t n, void* user) {
  absl::string_view line(in, size * n);
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return size * n;
  const absl::string_view name = absl::StripAsciiWhitespace(line.substr(0, colon));
  absl::string_view v = absl::StripAsciiWhitespace(line.substr(colon + 1));
  Response* r = static_cast<Response*>(user);
  if (absl::EqualsIgnoreCase(name, "etag")) {
    absl::ConsumePrefix(&v, "\"");
    absl::ConsumeSuffix(&v, "\"");
    r->etag = std::string(v);
  } else if (absl::EqualsIgnoreCase(name, "content-length")) {
    if (!absl::SimpleAtoi(v, &r->content_length)) r->content_length = -1;
  }
  return size * n;
}

std::once_flag curl_init;

// (libcurl ignores the handle here since 7.82: Debian 12 has 7.88.)
std::string Escape(absl::string_view s) {
  char* e = curl_easy_escape(nullptr, s.data(), static_cast<int>(s.size()));
  std::string out = e == nullptr ? "" : e;
  curl_free(e);
  return out;
}

}  // namespace

std::string MultipartEtag(const std::vector<std::string>& etags) {
  std::string digests;
  for (const std::string& e : etags) {
    if (e.size() != 32) return "";
    for (size_t i = 0; i < 32; i += 2) {
      int byte = 0;
      if (!absl::SimpleHexAtoi(absl::string_view(e).substr(i, 2), &byte)) return "";
      digests.push_back(static_cast<char>(byte));
    }
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(digests.data(), digests.size(), md, &len, EVP_md5(), nullptr) != 1) return "";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppend(&hex, absl::Hex(md[i], absl::kZeroPad2));
  return absl::StrCat(hex, "-", etags.size());
}

namespace {

// What an answer means: done, fail now, or retry.
enum class Verdict { kDone, kFail, kRetry };

}  // namespace

struct S3Store::Call {
  // A request of call `op` (counted in *counter) on `key` (empty: the bucket) with `query`.
  static absl::StatusOr<Request> Make(const S3Store& store, const char* op,
                                      std::atomic<uint64_t>* counter, const char* method,
                                      absl::string_view key, absl::string_view query = "") {
    Request r;
    r.op = op;
    r.counter = counter;
    r.method = method;
    r.key = key;
    SLUICE_ASSIGN_OR_RETURN(r.url, store.KeyUrl(key, query));
    return r;
  }

  // One try of `r`.
  static CURLcode Once(const S3Store& store, CURL* c, const Request& r, Response* out,
                       char* error) {
    const S3Options& o = store.options_;
    curl_easy_setopt(c, CURLOPT_URL, r.url.c_str());
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");  // (never through a proxy from the environment)
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, static_cast<long>(o.connect_timeout_s));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(o.stall_timeout_s));
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    if (!o.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, o.ca_file.c_str());
    const std::string sigv4 = absl::StrCat("aws:amz:", o.region, ":s3");
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, o.credentials.access_key_id.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, o.credentials.secret_access_key.c_str());
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    headers = curl_slist_append(headers, "Expect:");  // (no 100-continue round trip)
    std::string token;
    if (!o.credentials.session_token.empty()) {
      token = "x-amz-security-token: " + o.credentials.session_token;
      headers = curl_slist_append(headers, token.c_str());
    }
    for (const std::string& h : r.headers) headers = curl_slist_append(headers, h.c_str());
    Upload upload{r.body, 0};
    if (r.method == "PUT") {
      curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(c, CURLOPT_READFUNCTION, ReadBody);
      curl_easy_setopt(c, CURLOPT_READDATA, &upload);
      curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    } else if (r.method == "POST") {
      curl_easy_setopt(c, CURLOPT_POST, 1L);
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, r.body.data());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
      headers = curl_slist_append(headers, "Content-Type: application/xml");
    } else if (r.method == "HEAD") {
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (r.method != "GET") {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, r.method.c_str());
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    Sink sink{out, r.max_answer};
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, WriteBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, Header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, out);
    const CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->code);
    curl_slist_free_all(headers);
    if (r.method == "PUT") store.counts_->bytes_sent += upload.at;
    if (r.method == "POST") store.counts_->bytes_sent += r.body.size();
    store.counts_->bytes_received += out->body.size();
    return rc;
  }

  static Verdict Judge(CURLcode rc, const Request& r, const Response& resp, const char* error,
                       std::string* why, absl::StatusCode* code) {
    if (resp.overflow) {
      *why = absl::StrCat("its answer passed ", r.max_answer, " bytes");
      *code = absl::StatusCode::kFailedPrecondition;
      return Verdict::kFail;
    }
    if (rc != CURLE_OK) {
      *why = absl::StrCat(curl_easy_strerror(rc), error[0] != '\0' ? ": " : "", error);
      switch (rc) {
        case CURLE_UNSUPPORTED_PROTOCOL:
        case CURLE_URL_MALFORMAT:
        case CURLE_PEER_FAILED_VERIFICATION:
        case CURLE_SSL_CERTPROBLEM:
        case CURLE_SSL_CACERT_BADFILE:
        case CURLE_LOGIN_DENIED:
          *code = absl::StatusCode::kFailedPrecondition;
          return Verdict::kFail;
        default:
          *code = absl::StatusCode::kUnavailable;
          return Verdict::kRetry;
      }
    }
    const bool success = resp.code >= 200 && resp.code < 300;
    // (A success's body is the object, or XML that is not an error: parsed only where S3 may
    // answer 200 with an <Error>.)
    if (success && !r.complete_upload) return Verdict::kDone;
    const S3Error e = ParseError(resp.body);
    *why = absl::StrCat("HTTP ", resp.code, e.code.empty() ? "" : " " + e.code,
                        e.message.empty() ? "" : " (" + e.message + ")");
    const bool transient = e.code == "SlowDown" || e.code == "InternalError" ||
                           e.code == "RequestTimeout" || e.code == "ServiceUnavailable";
    if (success) {
      if (e.code.empty()) return Verdict::kDone;
      *code = transient ? absl::StatusCode::kUnavailable : absl::StatusCode::kFailedPrecondition;
      return transient ? Verdict::kRetry : Verdict::kFail;
    }
    if (resp.code == 408 || resp.code == 429 || (resp.code >= 500 && resp.code != 501) ||
        transient) {
      *code = absl::StatusCode::kUnavailable;
      return Verdict::kRetry;
    }
    if (resp.code == 404) {
      *code = absl::StatusCode::kNotFound;
    } else if (resp.code == 403) {
      *code = absl::StatusCode::kPermissionDenied;
    } else if (resp.code == 416) {
      *code = absl::StatusCode::kOutOfRange;
    } else {
      *code = absl::StatusCode::kFailedPrecondition;
    }
    return Verdict::kFail;
  }

  static absl::StatusOr<Response> Send(const S3Store& store, const Request& r) {
    const S3Options& o = store.options_;
    thread_local std::minstd_rand jitter(std::random_device{}());
    double backoff = o.backoff_first_s;
    std::string why;
    absl::StatusCode code = absl::StatusCode::kUnavailable;
    for (int attempt = 1;; ++attempt) {
      ++*r.counter;
      if (attempt > 1) ++store.counts_->retries;
      CURL* c = store.pool_->Take();
      if (c == nullptr) return absl::ResourceExhaustedError("object store: curl_easy_init failed");
      Response resp;
      char error[CURL_ERROR_SIZE] = {0};
      const CURLcode rc = Once(store, c, r, &resp, error);
      store.pool_->Give(c);
      const Verdict v = Judge(rc, r, resp, error, &why, &code);
      if (v == Verdict::kDone) return resp;
      if (v == Verdict::kFail || attempt >= o.max_attempts) break;
      std::uniform_real_distribution<double> spread(0.5, 1.0);
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff * spread(jitter)));
      backoff = std::min(backoff * 2, o.backoff_max_s);
    }
    return absl::Status(code,
                        absl::StrCat("object store ", o.Url(), ": ", r.op, " ", r.key, ": ", why,
                                     code == absl::StatusCode::kUnavailable
                                         ? absl::StrCat(" after ", o.max_attempts, " tries")
                                         : ""));
  }
};

S3Store::S3Store(S3Options options)
    : options_(std::move(options)),
      pool_(std::make_unique<Pool>()),
      counts_(std::make_unique<Atomics>()) {}

S3Store::~S3Store() = default;

absl::StatusOr<std::unique_ptr<S3Store>> S3Store::Open(const StoreLocation& where) {
  SLUICE_ASSIGN_OR_RETURN(S3Options o, S3OptionsFromUrl(where.url));
  o.endpoint = where.endpoint;
  o.region = where.region;
  o.ca_file = where.ca_file;
  o.path_style = where.path_style;
  SLUICE_RETURN_IF_ERROR(ResolveFromEnvironment(&o));
  return Make(std::move(o));
}

absl::StatusOr<std::unique_ptr<S3Store>> S3Store::Make(S3Options options) {
  if (options.bucket.empty() || options.endpoint.empty() || options.region.empty() ||
      options.credentials.access_key_id.empty() || options.credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "object store ", options.Url(), ": bucket, endpoint, region and credentials needed"));
  }
  if (!options.prefix.empty() &&
      (options.prefix.back() != '/' ||
       !ValidObjectKey(absl::string_view(options.prefix).substr(0, options.prefix.size() - 1)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "object store prefix '", options.prefix,
        "': letters, digits and \"/-_.~\", ending in '/' (S3OptionsFromUrl makes one)"));
  }
  if (options.max_attempts < 1 || options.backoff_first_s < 0 || options.stall_timeout_s < 1 ||
      options.connect_timeout_s < 1) {
    return absl::InvalidArgumentError("object store: retries and timeouts must be positive");
  }
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  return std::unique_ptr<S3Store>(new S3Store(std::move(options)));
}

void S3Store::set_retries(int max_attempts, double backoff_first_s, double backoff_max_s) {
  options_.max_attempts = std::max(1, max_attempts);
  options_.backoff_first_s = backoff_first_s;
  options_.backoff_max_s = backoff_max_s;
}

absl::StatusOr<std::string> S3Store::KeyUrl(absl::string_view key, absl::string_view query) const {
  if (!key.empty() && !ValidObjectKey(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("object store key '", key, "' may hold letters, digits and \"/-_.\" only"));
  }
  absl::string_view host = options_.endpoint;
  std::string scheme = absl::ConsumePrefix(&host, "https://") ? "https://" : "http://";
  if (scheme == "http://") absl::ConsumePrefix(&host, "http://");
  std::string url = options_.path_style.value_or(true)
                        ? absl::StrCat(scheme, host, "/", options_.bucket, "/")
                        : absl::StrCat(scheme, options_.bucket, ".", host, "/");
  if (!key.empty()) absl::StrAppend(&url, options_.prefix, key);
  if (!query.empty()) absl::StrAppend(&url, "?", query);
  return url;
}

std::string S3Store::Relative(std::string key) const {
  absl::string_view k = key;
  if (absl::ConsumePrefix(&k, options_.prefix)) return std::string(k);
  return key;
}

absl::Status S3Store::Put(absl::string_view key, absl::string_view data) {
  SLUICE_ASSIGN_OR_RETURN(Request r, Call::Make(*this, "PUT", &counts_->put, "PUT", key));
  r.body = data;
  return Call::Send(*this, r).status();
}

absl::StatusOr<std::string> S3Store::Get(absl::string_view key, uint64_t offset,
                                         std::optional<uint64_t> length) {
  SLUICE_ASSIGN_OR_RETURN(Request r, Call::Make(*this, "GET", &counts_->get, "GET", key));
  if (length.has_value() && *length == 0) return std::string();
  if (offset > 0 || length.has_value()) {
    r.headers.push_back(
        absl::StrCat("Range: bytes=", offset, "-",
                     length.has_value() ? absl::StrCat(offset + *length - 1) : std::string()));
  }
  r.max_answer = length.has_value() ? *length : (uint64_t{1} << 40);
  SLUICE_ASSIGN_OR_RETURN(Response resp, Call::Send(*this, r));
  if (length.has_value() && resp.body.size() != *length) {
    return absl::OutOfRangeError(absl::StrCat("object store ", options_.Url(), ": GET ", key,
                                              ": asked ", *length, " bytes from ", offset, ", got ",
                                              resp.body.size()));
  }
  if ((offset > 0 || length.has_value()) && resp.code != 206) {
    return absl::FailedPreconditionError(absl::StrCat(
        "object store ", options_.Url(), ": GET ", key, ": a range read answered HTTP ", resp.code,
        " (the store does not serve ranges)"));
  }
  return std::move(resp.body);
}

absl::StatusOr<ObjectInfo> S3Store::Head(absl::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(Request r, Call::Make(*this, "HEAD", &counts_->head, "HEAD", key));
  SLUICE_ASSIGN_OR_RETURN(Response resp, Call::Send(*this, r));
  if (resp.content_length < 0) {
    return absl::DataLossError(absl::StrCat("object store ", options_.Url(), ": HEAD ", key,
                                            ": no Content-Length in its answer"));
  }
  return ObjectInfo{std::string(key), static_cast<uint64_t>(resp.content_length), resp.etag};
}

absl::Status S3Store::Delete(absl::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(Request r, Call::Make(*this, "DELETE", &counts_->del, "DELETE", key));
  absl::Status st = Call::Send(*this, r).status();
  return absl::IsNotFound(st) ? absl::OkStatus() : st;
}

absl::StatusOr<std::vector<ObjectInfo>> S3Store::List(absl::string_view key_prefix) {
  if (!ValidKeyPrefix(key_prefix)) {
    return absl::InvalidArgumentError(absl::StrCat("object store prefix '", key_prefix, "'"));
  }
  std::vector<ObjectInfo> all;
  std::string token;
  const std::string prefix = absl::StrCat(options_.prefix, key_prefix);
  for (;;) {
    // (query parameters in SigV4's canonical order: sorted by name)
    std::string query = token.empty() ? "" : "continuation-token=" + Escape(token) + "&";
    absl::StrAppend(&query, "list-type=2&max-keys=", list_page_,
                    prefix.empty() ? "" : "&prefix=" + Escape(prefix));
    SLUICE_ASSIGN_OR_RETURN(Request r, Call::Make(*this, "LIST", &counts_->list, "GET", "", query));
    r.key = key_prefix;  // (for errors)
    SLUICE_ASSIGN_OR_RETURN(Response resp, Call::Send(*this, r));
    SLUICE_ASSIGN_OR_RETURN(ObjectList page, ParseListObjects(resp.body));
    for (ObjectInfo& o : page.objects) {
      o.key = Relative(std::move(o.key));
      all.push_back(std::move(o));
    }
    if (!page.truncated) return all;
    token = page.next_token;
  }
}

absl::StatusOr<std::string> S3Store::StartUpload(absl::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(Request r, Call::Make(*this, "CreateMultipartUpload",
                                                &counts_->start_upload, "POST", key, "uploads="));
  SLUICE_ASSIGN_OR_RETURN(Response resp, Call::Send(*this, r));
  return ParseUploadId(resp.body);
}

absl::StatusOr<std::string> S3Store::UploadPart(absl::string_view key, const std::string& upload_id,
                                                int part_number, absl::string_view data) {
  if (part_number < 1 || part_number > kMaxParts) {
    return absl::InvalidArgumentError(
        absl::StrCat("object store: part ", part_number, " of ", key, " (1 to 10,000)"));
  }
  SLUICE_ASSIGN_OR_RETURN(
      Request r,
      Call::Make(*this, "UploadPart", &counts_->upload_part, "PUT", key,
                 absl::StrCat("partNumber=", part_number, "&uploadId=", Escape(upload_id))));
  r.body = data;
  SLUICE_ASSIGN_OR_RETURN(Response resp, Call::Send(*this, r));
  if (resp.etag.empty()) {
    return absl::DataLossError(absl::StrCat("object store ", options_.Url(), ": UploadPart ", key,
                                            " part ", part_number, ": no ETag in its answer"));
  }
  return resp.etag;
}

absl::Status S3Store::CompleteUpload(absl::string_view key, const std::string& upload_id,
                                     const std::vector<std::string>& etags) {
  if (etags.empty() || etags.size() > static_cast<size_t>(kMaxParts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("object store: ", etags.size(), " parts to complete ", key));
  }
  std::string body = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    absl::StrAppend(&body, "<Part><PartNumber>", i + 1, "</PartNumber><ETag>\"", etags[i],
                    "\"</ETag></Part>");
  }
  absl::StrAppend(&body, "</CompleteMultipartUpload>");
  SLUICE_ASSIGN_OR_RETURN(
      Request r, Call::Make(*this, "CompleteMultipartUpload", &counts_->complete_upload, "POST",
                            key, "uploadId=" + Escape(upload_id)));
  r.body = body;
  r.complete_upload = true;
  absl::Status st = Call::Send(*this, r).status();
  if (absl::IsNotFound(st) || absl::IsUnavailable(st)) {
    // A retry after a try that completed it (its answer lost) finds no upload (S3: 404
    // NoSuchUpload; some stores answer 500): the object is there if its ETag is the one these
    // parts make (MD5 of their MD5s, "-" and their count).
    absl::StatusOr<ObjectInfo> there = Head(key);
    if (there.ok() && there->etag == MultipartEtag(etags)) return absl::OkStatus();
  }
  return st;
}

absl::Status S3Store::AbortUpload(absl::string_view key, const std::string& upload_id) {
  SLUICE_ASSIGN_OR_RETURN(
      Request r, Call::Make(*this, "AbortMultipartUpload", &counts_->abort_upload, "DELETE", key,
                            "uploadId=" + Escape(upload_id)));
  absl::Status st = Call::Send(*this, r).status();
  return absl::IsNotFound(st) ? absl::OkStatus() : st;
}

absl::StatusOr<std::vector<UploadInfo>> S3Store::ListUploads(absl::string_view key_prefix) {
  if (!ValidKeyPrefix(key_prefix)) {
    return absl::InvalidArgumentError(absl::StrCat("object store prefix '", key_prefix, "'"));
  }
  std::vector<UploadInfo> all;
  std::string key_marker, id_marker;
  const std::string prefix = absl::StrCat(options_.prefix, key_prefix);
  for (;;) {
    // (query parameters in SigV4's canonical order: sorted by name)
    std::string query = key_marker.empty() ? "" : "key-marker=" + Escape(key_marker) + "&";
    absl::StrAppend(&query, "max-uploads=", list_page_,
                    prefix.empty() ? "" : "&prefix=" + Escape(prefix));
    if (!id_marker.empty()) absl::StrAppend(&query, "&upload-id-marker=", Escape(id_marker));
    absl::StrAppend(&query, "&uploads=");
    SLUICE_ASSIGN_OR_RETURN(Request r, Call::Make(*this, "ListMultipartUploads",
                                                  &counts_->list_uploads, "GET", "", query));
    r.key = key_prefix;  // (for errors)
    SLUICE_ASSIGN_OR_RETURN(Response resp, Call::Send(*this, r));
    SLUICE_ASSIGN_OR_RETURN(UploadList page, ParseListUploads(resp.body));
    for (UploadInfo& u : page.uploads) {
      u.key = Relative(std::move(u.key));
      all.push_back(std::move(u));
    }
    if (!page.truncated) return all;
    key_marker = page.next_key_marker;
    id_marker = page.next_upload_id_marker;
  }
}

S3Counters S3Store::counters() const {
  const Atomics& a = *counts_;
  S3Counters c;
  c.put = a.put;
  c.get = a.get;
  c.head = a.head;
  c.del = a.del;
  c.list = a.list;
  c.start_upload = a.start_upload;
  c.upload_part = a.upload_part;
  c.complete_upload = a.complete_upload;
  c.abort_upload = a.abort_upload;
  c.list_uploads = a.list_uploads;
  c.retries = a.retries;
  c.bytes_sent = a.bytes_sent;
  c.bytes_received = a.bytes_received;
  return c;
}

}  // namespace sluice::objstore
