// RunCommand: runs a shell command line (the CLI in the multi-process tests), its stderr with
// its stdout, and returns its exit code (-1: not run or killed by a signal) and output.
#ifndef SLUICE_TESTS_HARNESS_RUN_COMMAND_H_
#define SLUICE_TESTS_HARNESS_RUN_COMMAND_H_

#include <stdio.h>
#include <sys/wait.h>

#include <array>
#include <string>

namespace sluice::testing {

inline int RunCommand(const std::string& command, std::string* out) {
  FILE* f = ::popen((command + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  out->clear();
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out->append(buf.data(), n);
  const int status = ::pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_RUN_COMMAND_H_
