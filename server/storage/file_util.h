// Small POSIX file helpers for server storage: every failure is an absl::Status that names the
// file and the errno text; ENOSPC and EDQUOT become RESOURCE_EXHAUSTED so callers can tell a
// full disk from a broken one. Errors reach clients, which are not told server paths: a
// function working on a descriptor names the file by the `path` it is given (storage gives a
// path relative to its data directory), one working on a path by `shown` when given.
#ifndef SLUICE_SERVER_STORAGE_FILE_UTIL_H_
#define SLUICE_SERVER_STORAGE_FILE_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::file {

/// An owned file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  ~Fd();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// An error status for a failed system call on `path`: RESOURCE_EXHAUSTED for a full disk or no
/// descriptors left, NOT_FOUND for a missing file, DATA_LOSS for a directory where a file should
/// be (or a file where a directory should), INTERNAL otherwise.
absl::Status ErrnoStatus(int err, const std::string& what, const std::string& path);

/// O_RDWR|O_CREAT.
absl::StatusOr<Fd> OpenForAppend(const std::string& path, const std::string& shown = "");
absl::StatusOr<Fd> OpenDirectory(const std::string& path, const std::string& shown = "");
/// O_RDWR|O_CREAT (and O_NOATIME where allowed) of `name` inside the directory `dir_fd`
/// (`path` is for messages). Opening through a directory descriptor keeps writers inside that
/// directory even if it is renamed.
absl::StatusOr<Fd> OpenAt(int dir_fd, const std::string& name, const std::string& path);
absl::Status SyncFd(int fd, const std::string& path);  // fsync (e.g. of a directory fd)
absl::Status Rename(const std::string& from, const std::string& to, const std::string& shown = "");
absl::Status PwriteAll(int fd, const std::string& path, uint64_t offset,
                       absl::Span<const uint8_t> a, absl::Span<const uint8_t> b = {});
/// Writes the pieces back to back from `offset` on, with as few pwritev calls as IOV_MAX
/// allows.
absl::Status PwritevAll(int fd, const std::string& path, uint64_t offset,
                        absl::Span<const absl::Span<const uint8_t>> pieces);
absl::Status PreadAll(int fd, const std::string& path, uint64_t offset, size_t n, uint8_t* out);
absl::Status SyncData(int fd, const std::string& path);  // fdatasync
/// fsync of the directory itself.
absl::Status SyncDir(const std::string& dir, const std::string& shown = "");
absl::Status Truncate(int fd, const std::string& path, uint64_t size);
/// Frees the disk space of [offset, offset+len) and reads it back as zeros; a no-op (OK) on file
/// systems without hole punching.
absl::Status PunchHole(int fd, const std::string& path, uint64_t offset, uint64_t len);
absl::StatusOr<uint64_t> FileSize(int fd, const std::string& path);

/// A read-only, shared mapping of a file's first `length` bytes (it may reach past the file's
/// end: the file may grow into it). Copy() reads from it without a system call; a page the disk
/// cannot give (an I/O error, or a range cut off the file since) is an error of that copy, not
/// the process's SIGBUS.
class Mapping {
 public:
  static absl::StatusOr<std::unique_ptr<Mapping>> Make(int fd, const std::string& path,
                                                       uint64_t length);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint64_t length() const { return length_; }
  /// Copies [offset, offset + n) into `out`; DATA_LOSS naming the file when the range cannot be
  /// read, OUT_OF_RANGE past the mapping.
  absl::Status Copy(uint64_t offset, size_t n, uint8_t* out) const;

 private:
  Mapping(const uint8_t* base, uint64_t length, std::string path)
      : base_(base), length_(length), path_(std::move(path)) {}
  const uint8_t* const base_;
  const uint64_t length_;
  const std::string path_;
};

/// Writes `contents` to `path` atomically and durably: temp file, fsync, rename, fsync dir.
absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                 absl::Span<const uint8_t> contents, const std::string& shown = "");
absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes,
                                     const std::string& shown = "");
absl::Status MakeDirs(const std::string& dir, const std::string& shown = "");
absl::Status RemoveTree(const std::string& dir, const std::string& shown = "");
bool Exists(const std::string& path);
/// Whether `name` exists in the directory `dir_fd`.
bool ExistsAt(int dir_fd, const std::string& name);

/// The process's soft limit of open descriptors (RLIMIT_NOFILE).
uint64_t OpenFilesLimit();
/// Raises the soft limit to the hard one; returns the soft limit now.
uint64_t RaiseOpenFilesLimit();
/// Descriptors this process has open now (a /proc/self/fd listing: for admission checks, not
/// hot paths).
size_t OpenFdCount();

}  // namespace sluice::file

#endif  // SLUICE_SERVER_STORAGE_FILE_UTIL_H_
