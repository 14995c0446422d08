// sluice-server's accept4 and close, in place of libc's for the whole process (the executable's
// definitions come first in the dynamic linker's order, and the link exports them): gRPC's
// listener accepts through the ConnectionGuard, and a counted connection is forgotten when its
// descriptor is closed. Only the daemon links this file; without an installed guard both calls
// go straight to the kernel.
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "server/net/connection_guard.h"

extern "C" int accept4(int fd, sockaddr* addr, socklen_t* addr_len, int flags) {
  if (sluice::ConnectionGuard* guard = sluice::ConnectionGuard::installed()) {
    return guard->Accept(fd, addr, addr_len, flags);
  }
  return static_cast<int>(::syscall(SYS_accept4, fd, addr, addr_len, flags));
}

extern "C" int close(int fd) {
  if (sluice::ConnectionGuard* guard = sluice::ConnectionGuard::installed()) guard->Closed(fd);
  return static_cast<int>(::syscall(SYS_close, fd));
}
