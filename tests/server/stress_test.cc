// Heavy campaigns on the server's limits, behind the `stress` label (`bash deploy/dev.sh stress`;
// the default suite has smaller versions in limits_test.cc): a thousand idle push streams on one
// connection, hundreds of idle connections, a KEY fetch over 262,144 tiny frames. Each checks
// that the server lets go of what was left idle and that its descriptors stay bounded.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/storage/file_util.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

namespace pb = sluice::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Eventually;
using testing::MakeStub;
using testing::MiniServer;
using testing::MiniServerOptions;

std::unique_ptr<MiniServer> Start(const std::function<void(ServerOptions&)>& set) {
  MiniServerOptions opts;
  set(opts.server);
  auto server = MiniServer::Start(opts);
  EXPECT_OK(server);
  return server.ok() ? std::move(server).value() : nullptr;
}

void Create(pb::ShuffleService::Stub& stub, const std::string& id) {
  grpc::ClientContext ctx;
  pb::CreateShuffleRequest req;
  req.set_shuffle_id(id);
  req.set_num_partitions(1);
  pb::CreateShuffleResponse resp;
  ASSERT_TRUE(stub.CreateShuffle(&ctx, req, &resp).ok());
}

pb::PushRequest Open(uint32_t mapper) {
  pb::PushRequest open;
  open.mutable_open()->set_shuffle_id("s");
  open.mutable_open()->set_mapper_id(mapper);
  open.mutable_open()->set_attempt_id(1);
  return open;
}

// A thousand push streams on one connection open an attempt each and go quiet: all of them
// end after the idle timeout, and one past --max_push_streams is refused at once.
TEST(StressTest, AThousandIdlePushStreamsAreAllEnded) {
  auto server = Start([](ServerOptions& o) {
    o.push_idle_timeout = seconds(2);
    o.max_push_streams = 1000;
    o.max_plain_push_streams = 1000;  // (the plain Push stub's streams: 16 by default)
  });
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(*server);
  Create(*stub, "s");
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<pb::PushResponse>> resps;
  std::vector<std::unique_ptr<grpc::ClientWriter<pb::PushRequest>>> writers;
  for (uint32_t m = 0; m < 1000; ++m) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    resps.push_back(std::make_unique<pb::PushResponse>());
    writers.push_back(stub->Push(ctxs.back().get(), resps.back().get()));
    ASSERT_TRUE(writers.back()->Write(Open(m)));
  }
  ASSERT_TRUE(
      Eventually([&] { return server->server()->open_push_streams() == 1000; }, seconds(30)));
  {
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto extra = stub->Push(&ctx, &resp);
    extra->Write(Open(5000));
    extra->WritesDone();
    EXPECT_EQ(extra->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  EXPECT_TRUE(Eventually([&] { return server->server()->open_push_streams() == 0; }, seconds(30)))
      << server->server()->open_push_streams() << " push streams still open";
  for (auto& w : writers) {
    w->WritesDone();
    EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
}

// Hundreds of client connections that made one call and went quiet are closed by the server,
// and its descriptors come back.
TEST(StressTest, HundredsOfIdleConnectionsAreClosed) {
  auto server = Start([](ServerOptions& o) { o.connection_idle_timeout = seconds(2); });
  ASSERT_NE(server, nullptr);
  const size_t fds_before = file::OpenFdCount();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < 400; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection each
    channels.push_back(
        grpc::CreateCustomChannel(server->address(), grpc::InsecureChannelCredentials(), args));
    auto stub = pb::ShuffleService::NewStub(channels.back());
    grpc::ClientContext ctx;
    pb::ListShufflesResponse resp;
    ASSERT_TRUE(stub->ListShuffles(&ctx, pb::ListShufflesRequest(), &resp).ok());
  }
  const size_t fds_connected = file::OpenFdCount();
  EXPECT_GE(fds_connected, fds_before + 400);
  EXPECT_TRUE(Eventually(
      [&] {
        for (auto& c : channels) {
          if (c->GetState(false) != GRPC_CHANNEL_IDLE) return false;
        }
        return true;
      },
      seconds(20)))
      << "some idle connections stayed open";
  EXPECT_TRUE(Eventually([&] { return file::OpenFdCount() < fds_before + 40; }, seconds(10)))
      << "descriptors: " << fds_before << " before, " << fds_connected << " connected, "
      << file::OpenFdCount() << " after the idle timeout";
}

// 262,144 one-record frames in one partition, read back in key order with bounded descriptors.
TEST(StressTest, AKeyFetchOverAQuarterMillionTinyFrames) {
  auto server = Start([](ServerOptions&) {});
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(*server);
  Create(*stub, "s");
  constexpr int kFrames = 262144;
  ASSERT_TRUE(testing::PushTinyFrames(*stub, "s", 0, kFrames, 4096).ok());
  const size_t fds_before = file::OpenFdCount();
  size_t max_fds = 0, records = 0;
  grpc::ClientContext ctx;
  pb::FetchRequest req;
  req.set_shuffle_id("s");
  req.set_partition_id(0);
  req.set_order(pb::KEY);
  auto r = stub->Fetch(&ctx, req);
  pb::FetchResponse resp;
  while (r->Read(&resp)) {
    max_fds = std::max(max_fds, file::OpenFdCount());
    ++records;
  }
  ASSERT_TRUE(r->Finish().ok());
  EXPECT_GT(records, 0u);
  EXPECT_LE(max_fds, fds_before + 8);
}

}  // namespace
}  // namespace sluice
