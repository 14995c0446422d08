// What one client may hold on a real server, and for how long without progress: open push
// and fetch streams are counted and capped, a push stream that sends nothing is ended and its
// attempt discarded, a fetch whose reader takes nothing is cancelled and gives back its merge
// slot, and idle connections are closed.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "codec/frame_encoder.h"
#include "server/runtime/memory_budget.h"
#include "server/storage/file_util.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"
#include "tests/harness/temp_dir.h"
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
using testing::StatusIs;

// A frame of `n` records of ~`value_bytes` incompressible bytes each, keys "<tag>-<i>".
std::string BigFrame(const std::string& tag, int n, size_t value_bytes) {
  std::vector<std::string> keys, values;
  uint64_t x = 0x9e3779b97f4a7c15ULL ^ std::hash<std::string>()(tag);
  for (int i = 0; i < n; ++i) {
    keys.push_back(tag + "-" + std::to_string(i));
    std::string v;
    for (size_t k = 0; k < value_bytes; ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      v.push_back(static_cast<char>(x));
    }
    values.push_back(std::move(v));
  }
  std::vector<Record> records;
  for (int i = 0; i < n; ++i) records.push_back(Record{keys[i], values[i]});
  EncodeOptions opts;
  opts.sort_by_key = true;
  FrameEncoder enc(opts);
  std::string out;
  EXPECT_OK(enc.Encode(records, &out));
  return out;
}

class LimitsTest : public ::testing::Test {
 protected:
  void Start(const std::function<void(ServerOptions&)>& set) {
    MiniServerOptions opts;
    set(opts.server);
    ASSERT_OK_AND_ASSIGN(server_, MiniServer::Start(opts));
    stub_ = MakeStub(*server_);
  }

  grpc::Status Create(const std::string& id) {
    grpc::ClientContext ctx;
    pb::CreateShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_num_partitions(1);
    pb::CreateShuffleResponse resp;
    return stub_->CreateShuffle(&ctx, req, &resp);
  }

  // Mapper `mapper` pushes `frames` to partition 0 and commits.
  grpc::Status Push(const std::string& id, uint32_t mapper, const std::vector<std::string>& frames,
                    uint64_t records) {
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto w = stub_->Push(&ctx, &resp);
    w->Write(Open(id, mapper));
    for (const std::string& f : frames) testing::WriteFrame(w.get(), 0, f);
    pb::PushRequest commit;
    commit.mutable_commit()->set_frame_count(frames.size());
    commit.mutable_commit()->set_record_count(records);
    w->Write(commit);
    w->WritesDone();
    return w->Finish();
  }

  static pb::PushRequest Open(const std::string& id, uint32_t mapper) {
    pb::PushRequest open;
    open.mutable_open()->set_shuffle_id(id);
    open.mutable_open()->set_mapper_id(mapper);
    open.mutable_open()->set_attempt_id(1);
    return open;
  }
  static pb::PushRequest Frames(const std::string& frame) {
    pb::PushRequest msg;
    auto* f = msg.mutable_frames()->add_frames();
    f->set_partition_id(0);
    f->set_frame(frame);
    return msg;
  }
  static pb::FetchRequest FetchReq(const std::string& id, bool key_order,
                                   bool uncompressed = true) {
    pb::FetchRequest req;
    req.set_shuffle_id(id);
    req.set_partition_id(0);
    req.set_order(key_order ? pb::KEY : pb::UNORDERED);
    req.set_uncompressed(uncompressed);
    return req;
  }

  // Reads a whole fetch; returns its status and counts the responses.
  grpc::Status FetchAll(const std::string& id, bool key_order, int* responses = nullptr,
                        bool uncompressed = true) {
    grpc::ClientContext ctx;
    auto r = stub_->Fetch(&ctx, FetchReq(id, key_order, uncompressed));
    pb::FetchResponse resp;
    int n = 0;
    while (r->Read(&resp)) ++n;
    if (responses != nullptr) *responses = n;
    return r->Finish();
  }

  pb::ShuffleInfo Info(const std::string& id) {
    grpc::ClientContext ctx;
    pb::GetShuffleRequest req;
    req.set_shuffle_id(id);
    pb::ShuffleInfo info;
    EXPECT_TRUE(stub_->GetShuffle(&ctx, req, &info).ok());
    return info;
  }

  // `mappers` x 12 MiB of incompressible sorted data in partition 0 of `id`: more than the
  // flow-control windows and socket buffers of one stream hold, so a fetch of it that is not
  // read stays open.
  void PushBig(const std::string& id, uint32_t mappers) {
    for (uint32_t m = 0; m < mappers; ++m) {
      std::vector<std::string> frames;
      for (int f = 0; f < 6; ++f) {  // 2 MiB frames: under the stub's 4 MiB receive limit
        frames.push_back(BigFrame("m" + std::to_string(m) + "f" + std::to_string(f), 2048, 1024));
      }
      ASSERT_TRUE(Push(id, m, frames, 6 * 2048).ok());
    }
  }

  std::unique_ptr<MiniServer> server_;
  std::unique_ptr<pb::ShuffleService::Stub> stub_;
};

// Past the disk high-water mark (--disk_high_water_pct) new pushes are refused, naming the mark,
// before the disk is full; committed data still serves; below the mark pushes go on.
TEST(DiskHighWaterTest, NewPushesAreRefusedPastTheMarkAndCommittedDataStillServes) {
  testing::TempDir dir;
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &vfs), 0);
  const double used = 100.0 * (1.0 - static_cast<double>(vfs.f_bavail) / vfs.f_blocks);
  if (used < 2) GTEST_SKIP() << "the test's file system is " << used << "% full: under any mark";
  MiniServerOptions opts;
  opts.server.data_dir = dir.path();
  opts.server.disk_high_water_pct = 0;  // never
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(opts));
  auto write = [&](uint32_t mapper) -> absl::Status {
    SLUICE_ASSIGN_OR_RETURN(auto client, server->Client());
    SLUICE_ASSIGN_OR_RETURN(auto w, client->OpenWriter("d", mapper, 1));
    SLUICE_RETURN_IF_ERROR(w->Add("k" + std::to_string(mapper), "v"));
    return w->Close().status();
  };
  {
    ASSERT_OK_AND_ASSIGN(auto client, server->Client());
    ASSERT_OK(client->CreateShuffle("d", 1, 3).status());
  }
  ASSERT_OK(write(0));
  opts.server.disk_high_water_pct = 1;  // the disk is fuller than that
  ASSERT_OK(server->Restart(opts));
  EXPECT_THAT(write(1), StatusIs(absl::StatusCode::kResourceExhausted,
                                 "past the high-water mark of 1% (--disk_high_water_pct)"));
  ASSERT_OK_AND_ASSIGN(auto client, server->Client());
  ASSERT_OK_AND_ASSIGN(auto reader, client->OpenReader("d", 0));
  Record r;
  ASSERT_OK_AND_ASSIGN(bool more, reader->Next(&r));
  ASSERT_TRUE(more);
  EXPECT_EQ(r.key, "k0");
  opts.server.disk_high_water_pct = 100;  // never
  ASSERT_OK(server->Restart(opts));
  EXPECT_OK(write(1));
}

// --shuffle_ttl_s wired into a server: an idle shuffle goes (ShuffleExpiryTest has the rules,
// with a clock of its own); the flag is refused in a cluster.
TEST(ShuffleTtlTest, AServerDeletesItsIdleShuffles) {
  MiniServerOptions opts;
  opts.server.shuffle_ttl = std::chrono::seconds(1);
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(opts));
  ASSERT_OK_AND_ASSIGN(auto client, server->Client());
  ASSERT_OK(client->CreateShuffle("idle", 1, 0).status());
  // (Listed, not asked about: a status call is a use.)
  EXPECT_TRUE(testing::Eventually([&] {
    auto listed = client->ListShuffles();
    return listed.ok() && listed->empty();
  })) << "still there after 10 s with a lifetime of 1 s";
  testing::TempDir other;
  opts.server.data_dir = other.path();
  opts.server.listen_address = "127.0.0.1:0";
  opts.server.etcd_endpoints = "127.0.0.1:1";
  EXPECT_THAT(SluiceServer::Start(opts.server),
              StatusIs(absl::StatusCode::kInvalidArgument, "--shuffle_ttl_s is for a server"));
}

// An idle push stream (and its uncommitted attempt) must not live forever.
TEST_F(LimitsTest, AnIdlePushStreamIsEndedAndItsAttemptDiscarded) {
  Start([](ServerOptions& o) { o.push_idle_timeout = seconds(1); });
  ASSERT_TRUE(Create("s").ok());
  grpc::ClientContext ctx;
  pb::PushResponse resp;
  auto w = stub_->Push(&ctx, &resp);
  ASSERT_TRUE(w->Write(Open("s", 0)));
  ASSERT_TRUE(w->Write(Frames(BigFrame("a", 10, 100))));
  ASSERT_TRUE(Eventually([&] { return server_->server()->open_push_streams() == 1; }));
  // Idle past the timeout: the server ends the stream and forgets the attempt.
  EXPECT_TRUE(Eventually([&] { return server_->server()->open_push_streams() == 0; }, seconds(5)))
      << "the idle push stream is still open";
  pb::PushRequest commit;
  commit.mutable_commit()->set_frame_count(1);
  commit.mutable_commit()->set_record_count(10);
  w->Write(commit);  // too late
  w->WritesDone();
  const grpc::Status st = w->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  EXPECT_NE(st.error_message().find("--push_idle_timeout_s"), std::string::npos)
      << st.error_message();
  EXPECT_EQ(Info("s").committed_mappers_size(), 0);
  // A stream that keeps sending is never idle, however long it lives.
  std::vector<std::string> frames;
  for (int i = 0; i < 6; ++i) frames.push_back(BigFrame("b" + std::to_string(i), 10, 100));
  grpc::ClientContext ctx2;
  auto w2 = stub_->Push(&ctx2, &resp);
  ASSERT_TRUE(w2->Write(Open("s", 1)));
  for (const std::string& f : frames) {
    std::this_thread::sleep_for(milliseconds(400));
    ASSERT_TRUE(w2->Write(Frames(f)));
  }
  commit.mutable_commit()->set_frame_count(6);
  commit.mutable_commit()->set_record_count(60);
  w2->Write(commit);
  w2->WritesDone();
  ASSERT_TRUE(w2->Finish().ok());
}

// A large frame's reserved memory is held for at most the idle timeout in all: a client that
// trickles its pieces (each in time for the idle timeout) is cut off, and the memory returns.
TEST_F(LimitsTest, ALargeFrameTricklingInIsCutOffAfterTheIdleTimeout) {
  Start([](ServerOptions& o) { o.push_idle_timeout = seconds(1); });
  ASSERT_TRUE(Create("s").ok());
  const std::string frame = BigFrame("t", 4, 1 << 20);  // ~4 MiB: announced, then in pieces
  grpc::ClientContext ctx;
  pb::PushResponse resp;
  auto w = stub_->Push(&ctx, &resp);
  ASSERT_TRUE(w->Write(Open("s", 0)));
  pb::PushRequest msg;
  msg.mutable_large_frame()->set_partition_id(0);
  msg.mutable_large_frame()->set_frame_size(frame.size());
  ASSERT_TRUE(w->Write(msg));
  bool ok = true;
  for (size_t at = 0; ok && at < frame.size(); at += 1000) {
    std::this_thread::sleep_for(milliseconds(300));
    msg.mutable_piece()->set_data(frame.substr(at, 1000));
    ok = w->Write(msg);
  }
  w->WritesDone();
  const grpc::Status st = w->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  EXPECT_NE(st.error_message().find("a large frame took over 1 s"), std::string::npos)
      << st.error_message();
  EXPECT_TRUE(Eventually([&] { return server_->server()->memory_budget().used() == 0; }));
  EXPECT_EQ(Info("s").committed_mappers_size(), 0);
}

// A KEY fetch never read must not hold its merge slot (and budget) forever, with every other
// KEY fetch waiting behind it.
TEST_F(LimitsTest, AStalledReaderIsCancelledAndGivesBackItsMergeSlot) {
  Start([](ServerOptions& o) {
    o.max_concurrent_merges = 1;
    o.fetch_stall_timeout = seconds(1);
  });
  ASSERT_TRUE(Create("big").ok());
  ASSERT_TRUE(Create("small").ok());
  PushBig("big", 4);
  ASSERT_TRUE(Push("small", 0, {BigFrame("s", 100, 10)}, 100).ok());

  grpc::ClientContext stalled_ctx;
  auto stalled = stub_->Fetch(&stalled_ctx, FetchReq("big", /*key_order=*/true));
  pb::FetchResponse first;
  ASSERT_TRUE(stalled->Read(&first));  // it holds the merge slot now, then reads no more
  auto other = std::async(std::launch::async, [&] { return FetchAll("small", true); });
  const bool done = other.wait_for(seconds(20)) == std::future_status::ready;
  stalled_ctx.TryCancel();  // (so that the test ends either way)
  ASSERT_TRUE(done) << "a KEY fetch waited behind a stalled reader";
  EXPECT_TRUE(other.get().ok());
  while (stalled->Read(&first)) {
  }
  EXPECT_EQ(stalled->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Eventually([&] { return server_->server()->open_fetch_streams() == 0; }));
}

// Open push and fetch streams are counted and capped, with an error naming the limit; a slot
// is free again as soon as its stream ends.
TEST_F(LimitsTest, OpenStreamsAreCappedWithANamedError) {
  Start([](ServerOptions& o) {
    o.max_push_streams = 2;
    o.max_fetch_streams = 1;
  });
  ASSERT_TRUE(Create("s").ok());
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientWriter<pb::PushRequest>>> open;
  pb::PushResponse resp;
  for (uint32_t m = 0; m < 2; ++m) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    open.push_back(stub_->Push(ctxs.back().get(), &resp));
    ASSERT_TRUE(open.back()->Write(Open("s", m)));
  }
  ASSERT_TRUE(Eventually([&] { return server_->server()->open_push_streams() == 2; }));
  const grpc::Status third = Push("s", 2, {BigFrame("c", 10, 10)}, 10);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_NE(third.error_message().find("--max_push_streams"), std::string::npos)
      << third.error_message();
  ctxs[0]->TryCancel();
  (void)open[0]->Finish();
  ASSERT_TRUE(Eventually([&] { return server_->server()->open_push_streams() == 1; }));
  EXPECT_TRUE(Push("s", 2, {BigFrame("c", 10, 10)}, 10).ok());

  // Fetches: one held open (not read), the next refused.
  ASSERT_TRUE(Create("big").ok());
  PushBig("big", 3);
  grpc::ClientContext held_ctx;
  auto held = stub_->Fetch(&held_ctx, FetchReq("big", false));
  ASSERT_TRUE(Eventually([&] { return server_->server()->open_fetch_streams() == 1; }));
  const grpc::Status refused = FetchAll("s", false);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("--max_fetch_streams"), std::string::npos)
      << refused.error_message();
  pb::FetchResponse r;
  while (held->Read(&r)) {
  }
  const grpc::Status held_status = held->Finish();
  ASSERT_TRUE(held_status.ok()) << held_status.error_code() << " " << held_status.error_message();
  ASSERT_TRUE(Eventually([&] { return server_->server()->open_fetch_streams() == 0; }));
  int responses = 0;
  EXPECT_TRUE(FetchAll("s", false, &responses).ok());
  EXPECT_EQ(responses, 1);
}

// An idle connection must not stay open forever: the server closes it.
TEST_F(LimitsTest, AnIdleConnectionIsClosed) {
  Start([](ServerOptions& o) { o.connection_idle_timeout = seconds(1); });
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = pb::ShuffleService::NewStub(channel);
  grpc::ClientContext ctx;
  pb::ListShufflesResponse resp;
  ASSERT_TRUE(stub->ListShuffles(&ctx, pb::ListShufflesRequest(), &resp).ok());
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  EXPECT_TRUE(Eventually([&] { return channel->GetState(false) == GRPC_CHANNEL_IDLE; }, seconds(5)))
      << "the server kept an idle connection open";
  grpc::ClientContext again;  // the client reconnects by itself
  EXPECT_TRUE(stub->ListShuffles(&again, pb::ListShufflesRequest(), &resp).ok());
}

// A push the client cancels is logged as cancelled, never as FAILED_PRECONDITION ("ended
// without a commit message"), even when the read fails before OnCancel runs.
TEST_F(LimitsTest, ACancelledPushIsLoggedAsCancelled) {
  Start([](ServerOptions&) {});
  ASSERT_TRUE(Create("s").ok());
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  const std::string frame = BigFrame("a", 10, 10);
  for (uint32_t m = 0; m < 20; ++m) {
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto w = stub_->Push(&ctx, &resp);
    ASSERT_TRUE(w->Write(Open("s", m)));
    ASSERT_TRUE(w->Write(Frames(frame)));
    ASSERT_TRUE(Eventually([&] { return server_->server()->open_push_streams() == 1; }));
    ctx.TryCancel();
    (void)w->Finish();
    ASSERT_TRUE(Eventually([&] { return server_->server()->open_push_streams() == 0; }));
  }
  spdlog::set_default_logger(previous);
  const std::string text = log.str();
  size_t cancelled = 0;
  for (size_t at = 0; (at = text.find("code=CANCELLED", at)) != std::string::npos; ++at) {
    ++cancelled;
  }
  // (A stream cancelled before its open was handled has no attempt to log: how many were
  // depends on timing. What matters: none is logged as anything but CANCELLED.)
  EXPECT_GE(cancelled, 1u) << text;
  EXPECT_EQ(text.find("FAILED_PRECONDITION"), std::string::npos) << text;
}

// A KEY fetch over many tiny frames (the default suite's size; the 1M-frame figure is in
// docs/benchmarks.md) holds a bounded number of files, not one per intermediate pass, and its
// merge does not occupy every worker thread: an unrelated CreateShuffle is answered meanwhile.
TEST_F(LimitsTest, ManyTinyFramesMergeWithBoundedFilesAndDoNotStarveSmallCalls) {
  Start([](ServerOptions& o) {
    o.worker_threads = 1;
    o.merge_fan_in = 2;  // many intermediate passes: the merge runs for a while
  });
  ASSERT_TRUE(Create("tiny").ok());
  constexpr int kFrames = 40000;
  ASSERT_TRUE(testing::PushTinyFrames(*stub_, "tiny", 0, kFrames, 1000).ok());
  const size_t fds_before = file::OpenFdCount();
  std::atomic<bool> fetching{true};
  std::atomic<size_t> max_fds{0};
  std::thread sampler([&] {
    while (fetching.load()) {
      const size_t n = file::OpenFdCount();
      if (n > max_fds.load()) max_fds = n;
      std::this_thread::sleep_for(milliseconds(2));
    }
  });
  auto fetch = std::async(std::launch::async, [&] {
    int responses = 0;
    return FetchAll("tiny", /*key_order=*/true, &responses);
  });
  // The merge's intermediate passes write its scratch file (<data_dir>/tmp/merge-*.runs), which
  // stays until the fetch ends. While it is there, a small call must not queue behind the
  // merge: it is made, and answered, with the merge still running.
  auto merging = [&] {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(server_->data_dir() + "/tmp", ec)) {
      if (e.path().extension() == ".runs") return true;
    }
    return false;
  };
  ASSERT_TRUE(testing::Eventually(merging, std::chrono::seconds(30)));
  ASSERT_TRUE(Create("other").ok());
  EXPECT_TRUE(merging()) << "the merge ended before CreateShuffle was answered";
  EXPECT_TRUE(fetch.get().ok());
  fetching = false;
  sampler.join();
  // Intermediate runs share one scratch file instead of a file each: the descriptors stay
  // bounded whatever the number of runs.
  EXPECT_LE(max_fds.load(), fds_before + 2 * 2 + 8)
      << "fds before " << fds_before << ", at most " << max_fds.load() << " during the merge";
}

// Resident memory of this process now (VmRSS), in MiB.
double RssMb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  double mb = 0;
  while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) mb = std::strtod(line + 6, nullptr) / 1024;
  }
  if (f != nullptr) std::fclose(f);
  return mb;
}

// A frame of one record whose value is `mib` MiB of zeros: tiny on the wire and on disk,
// `mib` MiB once decoded.
std::string ZeroFrame(const std::string& key, size_t mib) {
  FrameEncoder enc;
  std::string out;
  const std::string value(mib << 20, '\0');
  EXPECT_OK(enc.Encode({Record{key, value}}, &out));
  return out;
}

// A KEY merge plans by the frames' declared sizes, not by decoding every run's frame first, so
// frames tiny on the wire cannot take a fetch far past the budget: runs that do not fit its
// share of the budget together are merged in smaller groups through the scratch file, and what
// cannot fit at all fails before it is allocated.
TEST_F(LimitsTest, AKeyMergeStaysWithinItsShareOfTheBudget) {
  Start([](ServerOptions& o) {
    o.memory_budget_bytes = 96ull << 20;
    o.max_concurrent_merges = 1;  // one merge: its share is the whole budget
  });
  // 8 frames of 40 MiB decoded: no two fit together.
  ASSERT_TRUE(Create("huge").ok());
  std::vector<std::string> huge;
  // (Keys going down: frames whose keys follow each other would be one run, read a frame at a
  // time: docs/api.md, "Split reads".)
  for (int i = 0; i < 8; ++i) huge.push_back(ZeroFrame("h" + std::to_string(7 - i), 40));
  ASSERT_TRUE(Push("huge", 0, huge, 8).ok());
  huge.clear();
  huge.shrink_to_fit();
  // 12 frames of 20 MiB: four fit together, so the merge goes by groups.
  ASSERT_TRUE(Create("big").ok());
  std::vector<std::string> big;
  for (int i = 0; i < 12; ++i) big.push_back(ZeroFrame("b" + std::to_string(11 - i), 20));
  ASSERT_TRUE(Push("big", 0, big, 12).ok());
  big.clear();
  big.shrink_to_fit();

  std::atomic<bool> sampling{true};
  std::atomic<double> max_rss{0};
  const double rss_before = RssMb();
  std::thread sampler([&] {
    while (sampling.load()) {
      const double r = RssMb();
      if (r > max_rss.load()) max_rss = r;
      std::this_thread::sleep_for(milliseconds(2));
    }
  });
  grpc::ClientContext ctx;
  auto reader = stub_->Fetch(&ctx, FetchReq("huge", true, /*uncompressed=*/false));
  pb::FetchResponse resp;
  while (reader->Read(&resp)) {
  }
  const grpc::Status refused = reader->Finish();
  int responses = 0;
  const grpc::Status served = FetchAll("big", true, &responses, /*uncompressed=*/false);
  sampling = false;
  sampler.join();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("--memory_budget_mb"), std::string::npos)
      << refused.error_message();
  EXPECT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(responses, 12);  // each 20 MiB record is a chunk of its own
  // The merge holds at most its 96 MiB share, plus one record being encoded, and this process
  // is also the client, holding 20 MiB responses in gRPC's buffers and in protos.
  EXPECT_LT(max_rss.load() - rss_before, 96 + 96) << "the merges went past their budget";
}

}  // namespace
}  // namespace sluice
