#include "server/storage/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace sluice::file {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// What a message names: `shown` if given, else the path itself.
const std::string& Shown(const std::string& path, const std::string& shown) {
  return shown.empty() ? path : shown;
}

}  // namespace

absl::Status ErrnoStatus(int err, const std::string& what, const std::string& path) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == EMFILE || err == ENFILE) {
    return absl::ResourceExhaustedError(
        absl::StrCat(msg, " (the server's open files limit is ", OpenFilesLimit(),
                     "; raise it, e.g. ulimit -n or LimitNOFILE, or delete shuffles)"));
  }
  if (err == ENOENT) return absl::NotFoundError(msg);
  // A directory where a file should be (or the other way round) is damage no retry mends.
  if (err == EISDIR) {
    return absl::DataLossError(absl::StrCat(what, " ", path, ": is a directory, not a file"));
  }
  if (err == ENOTDIR) {
    return absl::DataLossError(
        absl::StrCat(what, " ", path, ": a file stands where a directory should be"));
  }
  return absl::InternalError(msg);
}

uint64_t OpenFilesLimit() {
  struct rlimit r;
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  return r.rlim_cur == RLIM_INFINITY ? ~uint64_t{0} : static_cast<uint64_t>(r.rlim_cur);
}

uint64_t RaiseOpenFilesLimit() {
  struct rlimit r;
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &r);
  }
  return OpenFilesLimit();
}

size_t OpenFdCount() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n > 0 ? n - 1 : 0;  // not the listing's own descriptor
}

absl::StatusOr<Fd> OpenForAppend(const std::string& path, const std::string& shown) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open", Shown(path, shown));
  return Fd(fd);
}

absl::StatusOr<Fd> OpenDirectory(const std::string& path, const std::string& shown) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open directory", Shown(path, shown));
  return Fd(fd);
}

absl::StatusOr<Fd> OpenAt(int dir_fd, const std::string& name, const std::string& path) {
  // O_NOATIME: a fetch reads a block at a time, and each read would otherwise check (and
  // now and then write) the file's access time. Only the file's owner may ask for it.
  int fd = ::openat(dir_fd, name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOATIME, 0644);
  if (fd < 0 && errno == EPERM)
    fd = ::openat(dir_fd, name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open", path);
  return Fd(fd);
}

absl::Status SyncFd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return ErrnoStatus(errno, "fsync", path);
  return absl::OkStatus();
}

absl::Status Rename(const std::string& from, const std::string& to, const std::string& shown) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoStatus(errno, "rename", Shown(from, shown));
  }
  return absl::OkStatus();
}

absl::Status PwriteAll(int fd, const std::string& path, uint64_t offset,
                       absl::Span<const uint8_t> a, absl::Span<const uint8_t> b) {
  for (absl::Span<const uint8_t> part : {a, b}) {
    const uint8_t* p = part.data();
    size_t left = part.size();
    while (left > 0) {
      const ssize_t n = ::pwrite(fd, p, left, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "write", path);
      }
      p += n;
      left -= static_cast<size_t>(n);
      offset += static_cast<uint64_t>(n);
    }
  }
  return absl::OkStatus();
}

absl::Status PwritevAll(int fd, const std::string& path, uint64_t offset,
                        absl::Span<const absl::Span<const uint8_t>> pieces) {
  constexpr size_t kMaxIov = IOV_MAX;
  iovec iov[kMaxIov];
  size_t next = 0;  // first piece not yet fully written
  size_t skip = 0;  // bytes of pieces[next] already written
  while (next < pieces.size()) {
    size_t n = 0;
    for (size_t i = next; i < pieces.size() && n < kMaxIov; ++i) {
      const size_t from = i == next ? skip : 0;
      if (pieces[i].size() == from) continue;
      iov[n].iov_base = const_cast<uint8_t*>(pieces[i].data() + from);
      iov[n].iov_len = pieces[i].size() - from;
      ++n;
    }
    if (n == 0) break;
    const ssize_t w = ::pwritev(fd, iov, static_cast<int>(n), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", path);
    }
    offset += static_cast<uint64_t>(w);
    auto left = static_cast<size_t>(w);
    while (next < pieces.size() && left >= pieces[next].size() - skip) {
      left -= pieces[next].size() - skip;
      skip = 0;
      ++next;
    }
    skip += left;
  }
  return absl::OkStatus();
}

absl::Status PreadAll(int fd, const std::string& path, uint64_t offset, size_t n, uint8_t* out) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (r == 0) {
      return absl::DataLossError(
          absl::StrCat("read ", path, ": unexpected end of file at ", offset));
    }
    out += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

namespace {

// A copy out of a mapping that may raise SIGBUS (a page the disk cannot give, or one past a
// file cut shorter since it was mapped) jumps back to its Copy(), which returns an error. Only a
// fault (si_code > 0) inside the range being copied is taken: any other SIGBUS goes where it
// went before this handler was installed (the handler there was, or the default action).
thread_local sigjmp_buf* volatile t_copy_guard = nullptr;
thread_local const uint8_t* volatile t_copy_begin = nullptr;
thread_local const uint8_t* volatile t_copy_end = nullptr;
struct sigaction g_previous_sigbus;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const auto* addr = static_cast<const uint8_t*>(info->si_addr);
  if (sigjmp_buf* guard = t_copy_guard;
      guard != nullptr && info->si_code > 0 && addr >= t_copy_begin && addr < t_copy_end) {
    t_copy_guard = nullptr;
    siglongjmp(*guard, 1);
  }
  const struct sigaction& previous = g_previous_sigbus;
  if (previous.sa_handler == SIG_IGN) {
    if (info->si_code <= 0) return;  // a signal sent, ignored as before; a fault cannot be
  } else if (previous.sa_handler != SIG_DFL) {
    if ((previous.sa_flags & SA_SIGINFO) != 0) {
      previous.sa_sigaction(sig, info, context);
    } else {
      previous.sa_handler(sig);
    }
    return;
  }
  // The default action: a fault runs its access again and ends the process where it was; a
  // signal sent ends it now.
  ::signal(SIGBUS, SIG_DFL);
  if (info->si_code <= 0) ::raise(SIGBUS);
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    // SA_NODEFER: the jump back leaves SIGBUS unblocked without saving the mask at every copy.
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Mapping>> Mapping::Make(int fd, const std::string& path,
                                                       uint64_t length) {
  if (length == 0) return absl::InvalidArgumentError("an empty mapping");
  InstallSigbusHandler();
  void* base = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return ErrnoStatus(errno, "map", path);
  return std::unique_ptr<Mapping>(new Mapping(static_cast<const uint8_t*>(base), length, path));
}

Mapping::~Mapping() { ::munmap(const_cast<uint8_t*>(base_), length_); }

absl::Status Mapping::Copy(uint64_t offset, size_t n, uint8_t* out) const {
  if (offset > length_ || n > length_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("read ", path_, ": ", n, " bytes at ", offset, " are past the mapping"));
  }
  sigjmp_buf guard;
  if (sigsetjmp(guard, 0) != 0) {
    return absl::DataLossError(absl::StrCat("read ", path_, ": ", n, " bytes at ", offset,
                                            " could not be read (SIGBUS: an I/O error, or the "
                                            "file is shorter than it was)"));
  }
  t_copy_begin = base_ + offset;
  t_copy_end = base_ + offset + n;
  t_copy_guard = &guard;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the copy stays between the two
  std::memcpy(out, base_ + offset, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_copy_guard = nullptr;
  return absl::OkStatus();
}

absl::Status SyncData(int fd, const std::string& path) {
  if (::fdatasync(fd) != 0) return ErrnoStatus(errno, "fdatasync", path);
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir, const std::string& shown) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open directory", Shown(dir, shown));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus(err, "fsync directory", Shown(dir, shown));
  return absl::OkStatus();
}

absl::Status Truncate(int fd, const std::string& path, uint64_t size) {
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return ErrnoStatus(errno, "truncate", path);
  return absl::OkStatus();
}

absl::Status PunchHole(int fd, const std::string& path, uint64_t offset, uint64_t len) {
  if (len == 0) return absl::OkStatus();
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(len)) != 0) {
    if (errno == EOPNOTSUPP || errno == ENOSYS) return absl::OkStatus();
    return ErrnoStatus(errno, "punch hole in", path);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "stat", path);
  return static_cast<uint64_t>(st.st_size);
}

absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                 absl::Span<const uint8_t> contents, const std::string& shown) {
  const std::string tmp = absl::StrCat(dir, "/.", name, ".tmp");
  const std::string dst = absl::StrCat(dir, "/", name);
  const std::string shown_tmp = absl::StrCat(Shown(dir, shown), "/.", name, ".tmp");
  {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, "create", shown_tmp);
    Fd owned(fd);
    if (auto st = PwriteAll(fd, shown_tmp, 0, contents); !st.ok()) return st;
    if (::fsync(fd) != 0) return ErrnoStatus(errno, "fsync", shown_tmp);
  }
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    return ErrnoStatus(errno, "rename to", absl::StrCat(Shown(dir, shown), "/", name));
  }
  return SyncDir(dir, shown);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes,
                                     const std::string& shown) {
  const std::string& name = Shown(path, shown);
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return ErrnoStatus(errno, "open", name);
  const Fd fd(raw);
  auto size = FileSize(fd.get(), name);
  if (!size.ok()) return size.status();
  if (*size > max_bytes) {
    return absl::DataLossError(
        absl::StrCat(name, " is ", *size, " bytes, more than the ", max_bytes, " expected"));
  }
  std::string out(*size, '\0');
  if (auto st = PreadAll(fd.get(), name, 0, out.size(), reinterpret_cast<uint8_t*>(out.data()));
      !st.ok()) {
    return st;
  }
  return out;
}

absl::Status MakeDirs(const std::string& dir, const std::string& shown) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), "create directory", Shown(dir, shown));
  return absl::OkStatus();
}

absl::Status RemoveTree(const std::string& dir, const std::string& shown) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), "remove", Shown(dir, shown));
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool ExistsAt(int dir_fd, const std::string& name) {
  struct stat st;
  return ::fstatat(dir_fd, name.c_str(), &st, 0) == 0;
}

}  // namespace sluice::file
