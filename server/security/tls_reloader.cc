#include "server/security/tls_reloader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "rpc/tls.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

// A new memfd holding `content`, or -1 with errno set. Never 0-2 (if those were closed at
// start, a memfd there would become the log).
int MemFile(const std::string& content) {
  const int first = ::memfd_create("sluice-tls", MFD_CLOEXEC);
  if (first < 0) return -1;
  const int fd = ::fcntl(first, F_DUPFD_CLOEXEC, 3);
  ::close(first);
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

// gRPC's watcher takes a file's change by its modification time, to the second: each version
// gets a time a second past the last one's, so that two changes within a second (a SIGHUP
// right after the interval's check) cannot be read as one.
void Stamp(int fd, time_t* last) {
  *last = std::max(::time(nullptr), *last + 1);
  const timespec times[2] = {{*last, 0}, {*last, 0}};
  (void)::futimens(fd, times);
}

// Makes `*fd` (created on the first call) hold `content`: a new memfd is put in its place in
// one step, so a reader opening /proc/self/fd/<fd> sees the old content or the new, whole.
absl::Status Publish(const std::string& content, int* fd, time_t* last) {
  const int fresh = MemFile(content);
  if (fresh < 0) {
    return absl::InternalError(absl::StrCat("memfd for TLS material: ", std::strerror(errno)));
  }
  Stamp(fresh, last);
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
  if (absl::Status st = Publish(m->identity_pem, &r->identity_fd_, &r->stamp_); !st.ok()) return st;
  r->identity_path_ = FdPath(r->identity_fd_);
  if (!m->client_ca_pem.empty()) {
    if (absl::Status st = Publish(m->client_ca_pem, &r->ca_fd_, &r->stamp_); !st.ok()) return st;
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
  r->expiry_unix_.store(m->not_after_unix);
  TlsReloader* self = r.get();
  r->watcher_ = std::make_unique<Periodic>(options.reload_interval, [self] { self->Check(); });
  return r;
}

// The descriptors stay open: gRPC may read them until it lets go of its credentials, which can
// be after the server is gone, and a number closed could be reused by another file. They are
// two per server process.
TlsReloader::~TlsReloader() { watcher_.reset(); }

void TlsReloader::Reload() { watcher_->RunNow(); }

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
    st = Publish(m->identity_pem, &identity_fd_, &stamp_);
    if (st.ok()) {
      served_identity_ = std::move(m->identity_pem);
      expiry_unix_.store(m->not_after_unix);
      reloads_.fetch_add(1);
      spdlog::info("event=tls_reloaded what=certificate {}", m->summary);
    }
  }
  if (st.ok() && ca_fd_ >= 0 && m->client_ca_pem != served_ca_) {
    st = Publish(m->client_ca_pem, &ca_fd_, &stamp_);
    if (st.ok()) {
      served_ca_ = std::move(m->client_ca_pem);
      reloads_.fetch_add(1);
      spdlog::info("event=tls_reloaded what=client_ca");
    }
  }
  if (!st.ok()) spdlog::error("event=tls_reload_failed error=\"{}\"", std::string(st.message()));
}

}  // namespace sluice
