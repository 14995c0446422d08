// A raw gRPC stub on a MiniServer, for tests that speak the wire protocol itself (malformed
// messages, message order, headers of returned frames).
#ifndef SLUICE_TESTS_HARNESS_STUB_H_
#define SLUICE_TESTS_HARNESS_STUB_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/mini_server.h"

namespace sluice::testing {

inline std::unique_ptr<v1::ShuffleService::Stub> MakeStub(const MiniServer& server) {
  return v1::ShuffleService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_STUB_H_
