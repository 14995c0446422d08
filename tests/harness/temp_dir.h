// A fresh temporary directory per test, removed afterwards.
#ifndef SLUICE_TESTS_HARNESS_TEMP_DIR_H_
#define SLUICE_TESTS_HARNESS_TEMP_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <string>

namespace sluice::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "sluice-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_TEMP_DIR_H_
