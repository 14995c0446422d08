// A real S3 server for the object-store tests, as a child process on a loopback address and a
// free port, one bucket made at start (docs/object-store.md, "Testing"):
// - kS3rver: npm's `s3rver` (Node.js), which deploy/dev.sh installs in .tools/ of the source
//   tree ($SLUICE_S3RVER names another), its data in a temporary directory that goes with it.
//   It has no AbortMultipartUpload and no ListMultipartUploads.
// - kMoto: `moto_server` (Python's moto, in memory) where the machine has one on PATH
//   ($SLUICE_MOTO_SERVER names another): every multipart call, conditional writes.
//
//   ASSERT_OK_AND_ASSIGN(auto s3, S3Server::Start("sluice-test"));
//   objstore::S3Options o = s3->Options("prefix");  // endpoint, bucket, credentials
#ifndef SLUICE_TESTS_HARNESS_S3_SERVER_H_
#define SLUICE_TESTS_HARNESS_S3_SERVER_H_

#include <gtest/gtest.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "objstore/s3_options.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {

class S3Server {
 public:
  enum Kind { kS3rver, kMoto };
  /// NOT_FOUND when that server is not installed (bash deploy/dev.sh test installs s3rver).
  static absl::StatusOr<std::unique_ptr<S3Server>> Start(const std::string& bucket,
                                                         Kind kind = kS3rver,
                                                         const std::string& host = "127.0.0.1");
  /// Where moto_server is, or "" (this machine has none).
  static std::string MotoBinary();

  Kind kind() const { return kind_; }
  /// Whether it implements AbortMultipartUpload and ListMultipartUploads.
  bool lists_uploads() const { return kind_ == kMoto; }
  ~S3Server();  // SIGKILL, wait, and its directory removed
  S3Server(const S3Server&) = delete;
  S3Server& operator=(const S3Server&) = delete;

  /// http://host:port
  const std::string& endpoint() const { return endpoint_; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  /// Resolved options for its bucket under `prefix` (s3rver's own key pair, path-style).
  objstore::S3Options Options(const std::string& prefix = "") const;
  /// Kills it (-9) if it runs and starts it again on the same port and data.
  absl::Status Restart();
  void Stop();  // SIGKILL and wait

 private:
  S3Server() = default;
  absl::Status Launch();
  TempDir dir_;
  Kind kind_ = kS3rver;
  std::string bin_, host_, bucket_, endpoint_;
  int port_ = 0;
  pid_t pid_ = 0;
};

/// A fault-injecting proxy in front of an S3Server (tests/harness/s3_fault_proxy.py, Debian's
/// python3): requests pass through unless a fault matches them first (an error answer, a 200
/// carrying an <Error>, a stall, a reset), so that retries meet the real server behind.
///
///   ASSERT_OK_AND_ASSIGN(auto proxy, S3FaultProxy::Start(*s3));
///   proxy->Inject(R"({"method": "PUT", "query": "partNumber", "count": 2, "status": 503,
///                     "code": "SlowDown"})");
///   S3Store::Make(proxy->Options("p"));
class S3FaultProxy {
 public:
  static absl::StatusOr<std::unique_ptr<S3FaultProxy>> Start(const S3Server& upstream);
  ~S3FaultProxy();
  S3FaultProxy(const S3FaultProxy&) = delete;
  S3FaultProxy& operator=(const S3FaultProxy&) = delete;

  /// Adds a fault (the JSON the script takes); false if the proxy did not take it.
  bool Inject(const std::string& fault_json);
  /// The faults left and the requests seen, as the script's JSON.
  std::string State() const;
  /// The upstream's options, through the proxy.
  objstore::S3Options Options(const std::string& prefix = "") const;

 private:
  S3FaultProxy(const S3Server& upstream) : upstream_(upstream) {}
  const S3Server& upstream_;
  std::string endpoint_;
  pid_t pid_ = 0;
};

/// The object-store suites' fixture: each test runs on s3rver and on moto_server (skipped where
/// the machine has none), the server started in SetUp.
///
///   class MyTest : public S3ServerTest {};
///   TEST_P(MyTest, ...) { ... s3_->Options("p") ... }
///   INSTANTIATE_TEST_SUITE_P(Servers, MyTest, S3ServerKinds(), S3ServerName);
class S3ServerTest : public ::testing::TestWithParam<S3Server::Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == S3Server::kMoto && S3Server::MotoBinary().empty()) {
      GTEST_SKIP() << "no moto_server on this machine";
    }
    auto s3 = S3Server::Start("sluice-test", GetParam());
    ASSERT_TRUE(s3.ok()) << s3.status();
    s3_ = std::move(s3).value();
  }
  std::unique_ptr<S3Server> s3_;
};

inline auto S3ServerKinds() { return ::testing::Values(S3Server::kS3rver, S3Server::kMoto); }
inline std::string S3ServerName(const ::testing::TestParamInfo<S3Server::Kind>& p) {
  return p.param == S3Server::kMoto ? "Moto" : "S3rver";
}

/// `n` pseudo-random bytes from `seed` (the same for the same seed).
std::string RandomBytes(size_t n, uint32_t seed);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_S3_SERVER_H_
