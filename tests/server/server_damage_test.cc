// The service end to end (a real SluiceServer, the generated gRPC stub) when things go wrong or
// grow: shuffles that fail recovery and payloads damaged on disk (found by a fetch and by the
// scrub), more shuffles than may be open, full disks; and the health service, listing and
// paging.
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "client/shuffle_client.h"
#include "server/sluice_server.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/data_file.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"
#include "tests/server/server_fixture.h"

namespace sluice {
namespace {

using server_test::CommitMsg;
using server_test::Frame;
using server_test::FramesMsg;
using server_test::OpenMsg;
using server_test::Rows;
using server_test::ServerTest;
using testing::MakeStub;
using testing::MiniServer;
using testing::MiniServerOptions;
using testing::StatusIs;
namespace pb = sluice::v1;

// A shuffle that fails recovery must not be stuck (NOT_FOUND to GetShuffle and DeleteShuffle,
// ALREADY_EXISTS to CreateShuffle). It must be visible as damaged, with the reason (and no
// server path in it), answer DATA_LOSS for its data, be deletable, and leave the other
// shuffles alone.
TEST_F(ServerTest, AShuffleThatFailsRecoveryIsReportedDamagedAndCanBeDeleted) {
  ASSERT_OK(Create("good", 1, 0));
  ASSERT_OK(Create("bad", 2, 0));
  pb::PushResponse resp;
  ASSERT_OK(Push("good", 0, 1, 1, 30, &resp));
  ASSERT_OK(Push("bad", 0, 1, 2, 30, &resp));
  server_->Stop().IgnoreError();
  {  // flip a byte of its commit record (below the log's floor): acknowledged commits are lost
    const std::string path = server_->data_dir() + "/shuffles/bad/commits.log";
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    ASSERT_TRUE(f.good()) << path;
    f.seekp(1024 + 12);
    f.put('\x7f');
  }
  RestartServer();
  grpc::Status st;
  const pb::ShuffleInfo info = Info("bad", &st);
  ASSERT_OK(st);
  EXPECT_TRUE(info.damaged());
  EXPECT_EQ(info.shuffle_id(), "bad");
  EXPECT_EQ(info.num_partitions(), 2u);
  EXPECT_NE(info.damage().find("corrupt"), std::string::npos) << info.damage();
  EXPECT_NE(info.damage().find("shuffles/bad/commits.log"), std::string::npos) << info.damage();
  EXPECT_EQ(info.damage().find(server_->data_dir()), std::string::npos) << info.damage();
  {
    grpc::ClientContext ctx;
    pb::ListShufflesResponse list;
    ASSERT_OK(stub_->ListShuffles(&ctx, pb::ListShufflesRequest(), &list));
    ASSERT_EQ(list.shuffles_size(), 2);
    EXPECT_EQ(list.shuffles(0).shuffle_id(), "bad");
    EXPECT_TRUE(list.shuffles(0).damaged());
    EXPECT_FALSE(list.shuffles(1).damaged());
  }
  std::vector<std::string> got;
  EXPECT_THAT(FetchAll("bad", 0, &got), StatusIs(absl::StatusCode::kDataLoss, "damaged"));
  EXPECT_THAT(Push("bad", 1, 1, 2, 5, &resp), StatusIs(absl::StatusCode::kDataLoss, "damaged"));
  EXPECT_THAT(Create("bad", 2, 0), StatusIs(absl::StatusCode::kAlreadyExists, "damaged"));
  // The other shuffle serves as before.
  got.clear();
  ASSERT_OK(FetchAll("good", 0, &got));
  EXPECT_EQ(got, Expected({0}, 0, 30));
  // Deleting it frees the id, for good.
  {
    grpc::ClientContext ctx;
    pb::DeleteShuffleRequest req;
    req.set_shuffle_id("bad");
    pb::DeleteShuffleResponse del;
    ASSERT_OK(stub_->DeleteShuffle(&ctx, req, &del));
  }
  Info("bad", &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  bool created = false;
  ASSERT_OK(Create("bad", 3, 0, &created));
  EXPECT_TRUE(created);
  RestartServer();
  const pb::ShuffleInfo fresh = Info("bad", &st);
  ASSERT_OK(st);
  EXPECT_FALSE(fresh.damaged());
  EXPECT_EQ(fresh.num_partitions(), 3u);
}

// A committed frame's payload damaged on disk: the start does not read it (the shuffle opens and
// serves), the first fetch that reads it fails with DATA_LOSS and marks its partition, whose
// fetches then fail at once naming it; GetShuffle says which partition and why; the other
// partitions serve. The scrub finds such damage in a partition nobody reads.
TEST_F(ServerTest, DamagedPayloadsAreFoundByAFetchAndByTheScrubPartitionByPartition) {
  ASSERT_OK(Create("s", 3, 0));
  pb::PushResponse resp;
  ASSERT_OK(Push("s", 0, 1, 3, 30, &resp));
  ASSERT_OK(Push("s", 1, 1, 3, 30, &resp));
  const std::string path = server_->data_dir() + "/shuffles/s/data";
  auto flip_last_byte_of_block = [&](size_t index) {  // blocks in arrival order
    const auto blocks = testing::DataFileBlocks(path);
    ASSERT_GT(blocks.size(), index) << path;
    testing::PutByte(path, blocks[index].first + 32 + blocks[index].second - 2, '\x01');
  };
  server_->Stop().IgnoreError();
  flip_last_byte_of_block(1);  // mapper 0, partition 1
  MiniServerOptions opts;
  opts.server.scrub_bytes_per_s = 0;  // (the fetch finds it)
  stub_.reset();
  ASSERT_OK(server_->Restart(opts));
  stub_ = MakeStub(*server_);
  grpc::Status st;
  pb::ShuffleInfo info = Info("s", &st);
  ASSERT_OK(st);
  EXPECT_FALSE(info.damaged());
  EXPECT_FALSE(info.partitions(1).damaged());  // nobody has read it yet
  std::vector<std::string> got;
  EXPECT_THAT(FetchAll("s", 1, &got), StatusIs(absl::StatusCode::kDataLoss, "corrupt"));
  got.clear();
  EXPECT_THAT(FetchAll("s", 1, &got),
              StatusIs(absl::StatusCode::kDataLoss, "partition 1 of shuffle 's' is damaged"));
  info = Info("s", &st);
  ASSERT_OK(st);
  EXPECT_TRUE(info.partitions(1).damaged());
  EXPECT_NE(info.partitions(1).damage().find("shuffles/s/data:"), std::string::npos)
      << info.partitions(1).damage();
  EXPECT_EQ(info.partitions(1).damage().find(server_->data_dir()), std::string::npos);
  for (uint32_t p : {0u, 2u}) {
    got.clear();
    ASSERT_OK(FetchAll("s", p, &got));
    EXPECT_EQ(got, Expected({0, 1}, p, 30));
  }

  // Partition 2 damaged, and the scrub running: it finds it with nobody reading.
  server_->Stop().IgnoreError();
  flip_last_byte_of_block(5);  // mapper 1, partition 2
  opts.server.scrub_bytes_per_s = uint64_t{64} << 20;
  stub_.reset();
  ASSERT_OK(server_->Restart(opts));
  stub_ = MakeStub(*server_);
  ASSERT_TRUE(testing::Eventually(
      [&] {
        const pb::ShuffleInfo now = Info("s");
        return now.partitions_size() == 3 && now.partitions(2).damaged();
      },
      std::chrono::seconds(20)))
      << "the scrub did not find the damage";
  info = Info("s", &st);
  EXPECT_NE(info.partitions(2).damage().find("payload checksum mismatch"), std::string::npos)
      << info.partitions(2).damage();
  EXPECT_TRUE(info.partitions(1).damaged());  // (found again by the scrub after the restart)
  EXPECT_FALSE(info.partitions(0).damaged());
  const std::string metrics = server_->server()->RenderMetrics();
  EXPECT_NE(metrics.find("sluice_partitions_damaged_total{found_by=\"scrub\"} 2"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("sluice_damaged_partitions 2"), std::string::npos);
  got.clear();
  EXPECT_THAT(FetchAll("s", 2, &got), StatusIs(absl::StatusCode::kDataLoss, "partition 2"));
  got.clear();
  ASSERT_OK(FetchAll("s", 0, &got));
  EXPECT_EQ(got, Expected({0, 1}, 0, 30));
  grpc::ClientContext ctx;
  pb::NodeInfo node;
  ASSERT_OK(stub_->GetNode(&ctx, pb::GetNodeRequest(), &node));
  EXPECT_EQ(node.damaged_partitions(), 2u);
  EXPECT_GT(node.scrubbed_bytes(), 0u);
  // 6 frames, indexes sized exactly at the start: 32 bytes an entry, and each frame's key bounds
  // (small frames: their least and greatest key, a byte each beside the keys, and a count).
  EXPECT_GE(node.index_bytes(), 6u * (32 + 3));
  EXPECT_LE(node.index_bytes(), 6u * (32 + 3 + 2 * 32));
  EXPECT_EQ(node.shuffles_unopened(), 0u);
}

// More shuffles in use than may be open (--max_open_shuffles=3): pushes, fetches and status
// calls to 12 shuffles from 4 threads at once close idle shuffles and open them again, and
// every record comes back exactly, before and after a restart.
TEST_F(ServerTest, ShufflesBeyondTheOpenLimitCloseAndReopenExactly) {
  MiniServerOptions opts;
  opts.server.max_open_shuffles = 3;
  stub_.reset();
  ASSERT_OK(server_->Restart(opts));
  stub_ = MakeStub(*server_);
  constexpr int kShuffles = 12, kThreads = 4, kMappersEach = 6;
  for (int s = 0; s < kShuffles; ++s) ASSERT_OK(Create("m" + std::to_string(s), 2, 0));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto stub = MakeStub(*server_);
      for (int i = 0; i < kShuffles * kMappersEach / kThreads; ++i) {
        const int n = t + i * kThreads;  // each (shuffle, mapper) once
        const std::string id = "m" + std::to_string(n % kShuffles);
        const uint32_t mapper = static_cast<uint32_t>(n / kShuffles);
        for (int tries = 0;; ++tries) {
          grpc::ClientContext ctx;
          pb::PushResponse resp;
          auto writer = stub->Push(&ctx, &resp);
          writer->Write(OpenMsg(id, mapper, 1));
          for (uint32_t p = 0; p < 2; ++p) writer->Write(FramesMsg(p, Frame(Rows(mapper, p, 20))));
          writer->Write(CommitMsg(2, 40));
          writer->WritesDone();
          const grpc::Status st = writer->Finish();
          if (st.ok()) break;
          if (st.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED || tries > 200) {
            ADD_FAILURE() << st.error_message();
            failures.fetch_add(1);
            break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  auto check = [&](const std::string& when) {
    for (int s = 0; s < kShuffles; ++s) {
      std::vector<uint32_t> mappers;
      for (uint32_t m = 0; m < kMappersEach; ++m) mappers.push_back(m);
      for (uint32_t p = 0; p < 2; ++p) {
        std::vector<std::string> got;
        ASSERT_OK(FetchAll("m" + std::to_string(s), p, &got)) << when;
        EXPECT_EQ(got, Expected(mappers, p, 20)) << when << " shuffle " << s;
      }
    }
  };
  check("while open and closed by turns");
  grpc::ClientContext ctx;
  pb::NodeInfo node;
  ASSERT_OK(stub_->GetNode(&ctx, pb::GetNodeRequest(), &node));
  EXPECT_EQ(node.shuffles(), static_cast<uint32_t>(kShuffles));
  // The limit is soft: the closer brings the open ones back under it once they are idle.
  EXPECT_TRUE(testing::Eventually(
      [&] {
        grpc::ClientContext c;
        pb::NodeInfo n;
        return stub_->GetNode(&c, pb::GetNodeRequest(), &n).ok() &&
               n.shuffles() - n.shuffles_unopened() <= 3;
      },
      std::chrono::seconds(10)));
  stub_.reset();
  ASSERT_OK(server_->Restart(opts));
  stub_ = MakeStub(*server_);
  check("after a restart");
}

TEST_F(ServerTest, HealthServiceSaysServing) {
  // grpc.health.v1.Health/Check with an empty request; SERVING is field 1 = 1 (bytes 08 01).
  grpc::GenericStub generic(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1), response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                    [&done](grpc::Status st) { done.set_value(st); });
  ASSERT_OK(done.get_future().get());
  std::vector<grpc::Slice> slices;
  ASSERT_OK(response.Dump(&slices));
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

TEST_F(ServerTest, ListShufflesListsWhatExists) {
  ASSERT_OK(Create("a", 1, 0));
  ASSERT_OK(Create("b", 2, 5));
  grpc::ClientContext ctx;
  pb::ListShufflesRequest req;
  pb::ListShufflesResponse resp;
  ASSERT_OK(stub_->ListShuffles(&ctx, req, &resp));
  ASSERT_EQ(resp.shuffles_size(), 2);
  EXPECT_EQ(resp.shuffles(1).shuffle_id(), "b");
  EXPECT_EQ(resp.shuffles(1).num_mappers(), 5u);
  EXPECT_TRUE(resp.next_page_token().empty());
}

// ListShuffles and GetShuffle are paged rather than answering everything in one message
// (65,536 partitions' details, every shuffle), and the client reads every page.
TEST_F(ServerTest, ListAndGetArePagedAndTheClientReadsEveryPage) {
  for (int i = 0; i < 25; ++i) ASSERT_OK(Create("s" + std::to_string(100 + i), 1, 0));
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    grpc::ClientContext ctx;
    pb::ListShufflesRequest req;
    req.set_page_size(10);
    req.set_page_token(token);
    pb::ListShufflesResponse resp;
    ASSERT_OK(stub_->ListShuffles(&ctx, req, &resp));
    EXPECT_LE(resp.shuffles_size(), 10);
    for (const auto& info : resp.shuffles()) seen.push_back(info.shuffle_id());
    token = resp.next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(seen.size(), 25u);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(seen[i], "s" + std::to_string(100 + i));

  ASSERT_OK(Create("wide", 40000, 0));
  {
    grpc::ClientContext ctx;
    pb::GetShuffleRequest req;
    req.set_shuffle_id("wide");
    pb::ShuffleInfo info;
    ASSERT_OK(stub_->GetShuffle(&ctx, req, &info));
    EXPECT_EQ(info.partitions_size(), 16384);
    EXPECT_EQ(info.next_partition(), 16384u);
  }
  {
    grpc::ClientContext ctx;
    pb::GetShuffleRequest req;
    req.set_shuffle_id("wide");
    req.set_first_partition(39990);
    req.set_max_partitions(100);
    pb::ShuffleInfo info;
    ASSERT_OK(stub_->GetShuffle(&ctx, req, &info));
    ASSERT_EQ(info.partitions_size(), 10);
    EXPECT_EQ(info.partitions(0).partition_id(), 39990u);
    EXPECT_EQ(info.next_partition(), 0u);
  }
  {
    grpc::ClientContext ctx;
    pb::GetShuffleRequest req;
    req.set_shuffle_id("wide");
    req.set_first_partition(40000);
    pb::ShuffleInfo info;
    EXPECT_EQ(stub_->GetShuffle(&ctx, req, &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  ASSERT_OK_AND_ASSIGN(auto client, server_->Client());
  ASSERT_OK_AND_ASSIGN(ShuffleStatus wide, client->GetShuffle("wide"));
  EXPECT_EQ(wide.partitions.size(), 40000u);
  ASSERT_OK_AND_ASSIGN(auto all, client->ListShuffles());
  EXPECT_EQ(all.size(), 26u);
}

// A data directory on a 3 MiB tmpfs (needs root, as CI has; skipped otherwise).
class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mount_ = dir_.path() + "/small";
    ::mkdir(mount_.c_str(), 0755);
    if (::mount("tmpfs", mount_.c_str(), "tmpfs", 0, "size=3m") != 0) {
      GTEST_SKIP() << "cannot mount a small tmpfs here (needs root): " << std::strerror(errno);
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount(mount_.c_str());
  }
  absl::StatusOr<std::unique_ptr<MiniServer>> StartOnTheSmallDisk() {
    MiniServerOptions opts;
    opts.server.data_dir = mount_;
    return MiniServer::Start(opts);
  }
  static grpc::Status Create(pb::ShuffleService::Stub& stub, const std::string& id) {
    grpc::ClientContext ctx;
    pb::CreateShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_num_partitions(1);
    pb::CreateShuffleResponse resp;
    return stub.CreateShuffle(&ctx, req, &resp);
  }
  // Mapper `mapper` of shuffle "d": `frames` frames of ~200 KB (200 rows each) into partition 0.
  static grpc::Status Push(pb::ShuffleService::Stub& stub, uint32_t mapper, int frames) {
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto writer = stub.Push(&ctx, &resp);
    writer->Write(OpenMsg("d", mapper));
    for (int i = 0; i < frames; ++i) {
      if (!writer->Write(FramesMsg(0, Frame(Rows(mapper, static_cast<uint32_t>(i), 200, 1000))))) {
        break;
      }
    }
    writer->Write(CommitMsg(frames, 200ull * frames));
    writer->WritesDone();
    return writer->Finish();
  }
  static grpc::Status Info(pb::ShuffleService::Stub& stub, const std::string& id,
                           pb::ShuffleInfo* info) {
    grpc::ClientContext ctx;
    pb::GetShuffleRequest req;
    req.set_shuffle_id(id);
    return stub.GetShuffle(&ctx, req, info);
  }

  testing::TempDir dir_;
  std::string mount_;
  bool mounted_ = false;
};

TEST_F(DiskFullTest, FullDiskIsResourceExhaustedAndCommittedDataStays) {
  ASSERT_OK_AND_ASSIGN(auto server, StartOnTheSmallDisk());
  auto stub = MakeStub(*server);
  ASSERT_OK(Create(*stub, "d"));
  ASSERT_TRUE(Push(*stub, 0, 2).ok());   // ~400 KB: fits
  grpc::Status st = Push(*stub, 1, 30);  // ~6 MB: does not
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  // The client is told which file, relative to the data directory; the server's own paths
  // stay in its log.
  EXPECT_NE(st.error_message().find("shuffles/d/"), std::string::npos) << st.error_message();
  EXPECT_EQ(st.error_message().find(mount_), std::string::npos) << st.error_message();
  // The failed attempt's space was given back: a small push fits again.
  EXPECT_OK(Push(*stub, 2, 2));
  pb::ShuffleInfo info;
  ASSERT_OK(Info(*stub, "d", &info));
  ASSERT_EQ(info.committed_mappers_size(), 2);
  EXPECT_EQ(info.partitions(0).records(), 800u);
}

// A server whose only data directory is full starts all the same and serves what it holds:
// committed data must not wait for an operator to free space (it used to refuse to start).
TEST_F(DiskFullTest, AServerStartsOnAFullDiskAndServesWhatItHolds) {
  ASSERT_OK_AND_ASSIGN(auto server, StartOnTheSmallDisk());
  {
    auto stub = MakeStub(*server);
    ASSERT_OK(Create(*stub, "d"));
    ASSERT_OK(Push(*stub, 0, 2));
  }
  const std::string filler = mount_ + "/filler";
  {
    const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    const std::string block(64 << 10, 'x');
    while (::write(fd, block.data(), block.size()) > 0) {
    }
    EXPECT_EQ(errno, ENOSPC);
    ::close(fd);
  }
  ASSERT_OK(server->Restart());
  auto stub = MakeStub(*server);
  pb::ShuffleInfo info;
  ASSERT_OK(Info(*stub, "d", &info));
  ASSERT_EQ(info.committed_mappers_size(), 1);
  EXPECT_EQ(info.partitions(0).records(), 400u);
  uint64_t records = 0;
  {
    grpc::ClientContext ctx;
    pb::FetchRequest req;
    req.set_shuffle_id("d");
    req.set_partition_id(0);
    req.set_order(pb::KEY);
    auto reader = stub->Fetch(&ctx, req);
    pb::FetchResponse resp;
    FrameDecoder dec;
    DecodedFrame frame;
    while (reader->Read(&resp)) {
      ASSERT_OK(dec.Decode(resp.frame(), &frame));
      records += frame.size();
    }
    ASSERT_OK(reader->Finish());
  }
  EXPECT_EQ(records, 400u);
  // New data is refused as on a disk that filled while serving: retry once there is room.
  grpc::Status st = Push(*stub, 1, 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  st = Create(*stub, "e");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  // Space freed: it takes new data again, without a restart (once its look at the disk's
  // space, kept for a moment, is fresh).
  ASSERT_EQ(::unlink(filler.c_str()), 0);
  EXPECT_TRUE(testing::Eventually([&] { return Push(*stub, 2, 2).ok(); }));
  EXPECT_OK(Create(*stub, "e"));
  ASSERT_OK(Info(*stub, "d", &info));
  EXPECT_EQ(info.committed_mappers_size(), 2);
}

}  // namespace
}  // namespace sluice
