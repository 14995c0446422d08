#include "server/tls_reloader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "rpc/tls.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

// A new memfd holding `content`, or -1 with errno set.
int MemFile(const std::string& content) {
  const int fd = ::memfd_create("sluice-tls", MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      return -1;
    }
    done += static_cast<size_t>(n);
  }
  return fd;
}

// Makes `*fd` (created on the first call) hold `content`: a new memfd is put in its place in
// one step, so a reader opening /proc/self/fd/<fd> sees the old content or the new, whole.
absl::Status Publish(const std::string& content, int* fd) {
  const int fresh = MemFile(content);
  if (fresh < 0) {
    return absl::InternalError(absl::StrCat("memfd for TLS material: ", std::strerror(errno)));
  }
  if (*fd < 0) {
    *fd = fresh;
    return absl::OkStatus();
  }
  const int rc = ::dup3(fresh, *fd, O_CLOEXEC);
  const int saved = errno;
  ::close(fresh);
  if (rc < 0) return absl::InternalError(absl::StrCat("dup3: ", std::strerror(saved)));
  return absl::OkStatus();
}

std::string FdPath(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

}  // namespace

absl::StatusOr<std::unique_ptr<TlsReloader>> TlsReloader::Start(const ServerTlsOptions& options) {
  absl::StatusOr<rpc::ServerTlsMaterial> m = rpc::LoadServerTls(options);
  if (!m.ok()) return m.status();
  std::unique_ptr<TlsReloader> r(new TlsReloader(options));
  if (absl::Status st = Publish(m->identity_pem, &r->identity_fd_); !st.ok()) return st;
  r->identity_path_ = FdPath(r->identity_fd_);
  if (!m->client_ca_pem.empty()) {
    if (absl::Status st = Publish(m->client_ca_pem, &r->ca_fd_); !st.ok()) return st;
    r->ca_path_ = FdPath(r->ca_fd_);
  }
  if (::access(r->identity_path_.c_str(), R_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TLS needs /proc mounted (the server hands gRPC its checked certificates through ",
        r->identity_path_, "): ", std::strerror(errno)));
  }
  r->served_identity_ = std::move(m->identity_pem);
  r->served_ca_ = std::move(m->client_ca_pem);
  r->summary_ = std::move(m->summary);
  TlsReloader* self = r.get();
  r->thread_ = std::thread([self] { self->Loop(); });
  return r;
}

TlsReloader::~TlsReloader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (identity_fd_ >= 0) ::close(identity_fd_);
  if (ca_fd_ >= 0) ::close(ca_fd_);
}

void TlsReloader::Reload() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reload_now_ = true;
  }
  cv_.notify_all();
}

void TlsReloader::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait_for(lock, options_.reload_interval, [this] { return stop_ || reload_now_; });
    if (stop_) return;
    reload_now_ = false;
    lock.unlock();
    Check();
    lock.lock();
  }
}

void TlsReloader::Check() {
  absl::StatusOr<rpc::ServerTlsMaterial> m = rpc::LoadServerTls(options_);
  if (!m.ok()) {
    const std::string error(m.status().message());
    if (error != last_error_) {  // once per problem, not every interval
      spdlog::error(
          "event=tls_reload_failed error=\"{}\" action=\"serving the previous certificate\"",
          error);
      last_error_ = error;
    }
    return;
  }
  last_error_.clear();
  absl::Status st;
  if (m->identity_pem != served_identity_) {
    st = Publish(m->identity_pem, &identity_fd_);
    if (st.ok()) {
      served_identity_ = std::move(m->identity_pem);
      spdlog::info("event=tls_reloaded what=certificate {}", m->summary);
    }
  }
  if (st.ok() && ca_fd_ >= 0 && m->client_ca_pem != served_ca_) {
    st = Publish(m->client_ca_pem, &ca_fd_);
    if (st.ok()) {
      served_ca_ = std::move(m->client_ca_pem);
      spdlog::info("event=tls_reloaded what=client_ca");
    }
  }
  if (!st.ok()) spdlog::error("event=tls_reload_failed error=\"{}\"", std::string(st.message()));
}

}  // namespace sluice
