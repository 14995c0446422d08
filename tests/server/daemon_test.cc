// The sluice-server executable as a child process: SIGTERM shuts it down cleanly, and a
// SIGKILL in the middle of pushes loses no acknowledged commit and shows no unacknowledged
// half of one after a restart on the same directory.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/server/test_dir.h"

#ifndef SLUICE_SERVER_BIN
#error "SLUICE_SERVER_BIN must name the sluice-server executable"
#endif

namespace sluice {
namespace {

namespace pb = sluice::v1;

// A sluice-server child process on 127.0.0.1 with a free port.
class Daemon {
 public:
  explicit Daemon(const std::string& data_dir) {
    int out[2];
    if (::pipe(out) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      const std::string dir_flag = "--data_dir=" + data_dir;
      ::execl(SLUICE_SERVER_BIN, SLUICE_SERVER_BIN, dir_flag.c_str(), "--listen=127.0.0.1:0",
              "--log_level=warn", "--worker_threads=2", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    FILE* f = ::fdopen(out[0], "r");
    char line[256] = {};
    if (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
      std::sscanf(line, "listening on port %d", &port_);
    }
    if (f != nullptr) std::fclose(f);
  }
  ~Daemon() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  // Sends `sig` and returns the wait status.
  int Signal(int sig) {
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }
  std::unique_ptr<pb::ShuffleService::Stub> Stub() const {
    return pb::ShuffleService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                           grpc::InsecureChannelCredentials()));
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool reaped_ = false;
};

std::string Frame(uint32_t mapper, uint32_t partition, int n) {
  std::vector<std::string> keys, values;
  for (int i = 0; i < n; ++i) {
    keys.push_back("m" + std::to_string(mapper) + "p" + std::to_string(partition) + "-" +
                   std::to_string(i));
    values.push_back(std::string(64, static_cast<char>('a' + (i + mapper) % 26)));
  }
  std::vector<Record> records;
  for (int i = 0; i < n; ++i) records.push_back(Record{keys[i], values[i]});
  FrameEncoder enc;
  std::string out;
  EXPECT_TRUE(enc.Encode(records, &out).ok());
  return out;
}

constexpr uint32_t kPartitions = 3;
constexpr int kRows = 300;

bool PushOne(pb::ShuffleService::Stub& stub, uint32_t mapper) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::PushResponse resp;
  auto writer = stub.Push(&ctx, &resp);
  pb::PushRequest open;
  open.mutable_open()->set_shuffle_id("k");
  open.mutable_open()->set_mapper_id(mapper);
  open.mutable_open()->set_attempt_id(1);
  if (!writer->Write(open)) {
    writer->Finish();
    return false;
  }
  for (uint32_t p = 0; p < kPartitions; ++p) {
    pb::PushRequest msg;
    auto* f = msg.mutable_frames()->add_frames();
    f->set_partition_id(p);
    f->set_frame(Frame(mapper, p, kRows));
    if (!writer->Write(msg)) break;
  }
  pb::PushRequest commit;
  commit.mutable_commit()->set_frame_count(kPartitions);
  commit.mutable_commit()->set_record_count(kPartitions * kRows);
  writer->Write(commit);
  writer->WritesDone();
  return writer->Finish().ok();
}

TEST(DaemonTest, SigtermShutsDownCleanly) {
  testing::TempDir dir;
  Daemon d(dir.path());
  ASSERT_GT(d.port(), 0);
  auto stub = d.Stub();
  grpc::ClientContext ctx;
  pb::CreateShuffleRequest req;
  req.set_shuffle_id("t");
  req.set_num_partitions(1);
  pb::CreateShuffleResponse resp;
  ASSERT_TRUE(stub->CreateShuffle(&ctx, req, &resp).ok());
  const int status = d.Signal(SIGTERM);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(DaemonTest, KillDashNineMidPushKeepsExactlyTheAcknowledgedCommits) {
  testing::TempDir dir;
  std::set<uint32_t> acked;
  {
    Daemon d(dir.path());
    ASSERT_GT(d.port(), 0);
    auto stub = d.Stub();
    {
      grpc::ClientContext ctx;
      pb::CreateShuffleRequest req;
      req.set_shuffle_id("k");
      req.set_num_partitions(kPartitions);
      pb::CreateShuffleResponse resp;
      ASSERT_TRUE(stub->CreateShuffle(&ctx, req, &resp).ok());
    }
    // Two pushers, mapper ids interleaved, until the server dies under them.
    std::mutex mu;
    std::atomic<bool> stop{false};
    std::vector<std::thread> pushers;
    for (uint32_t t = 0; t < 2; ++t) {
      pushers.emplace_back([&, t] {
        auto my_stub = d.Stub();
        for (uint32_t m = t; !stop.load(); m += 2) {
          if (!PushOne(*my_stub, m)) return;
          std::lock_guard<std::mutex> lock(mu);
          acked.insert(m);
        }
      });
    }
    ::usleep(400000);
    d.Signal(SIGKILL);
    stop.store(true);
    for (auto& t : pushers) t.join();
  }
  ASSERT_FALSE(acked.empty()) << "no commit was acknowledged before the kill";

  Daemon d(dir.path());
  ASSERT_GT(d.port(), 0);
  auto stub = d.Stub();
  grpc::ClientContext ctx;
  pb::GetShuffleRequest req;
  req.set_shuffle_id("k");
  pb::ShuffleInfo info;
  ASSERT_TRUE(stub->GetShuffle(&ctx, req, &info).ok());
  std::set<uint32_t> committed(info.committed_mappers().begin(), info.committed_mappers().end());
  for (uint32_t m : acked) EXPECT_EQ(committed.count(m), 1u) << "acknowledged mapper " << m;
  // At most one commit per pusher can have landed without its acknowledgement.
  EXPECT_LE(committed.size(), acked.size() + 2);
  // Every committed mapper is whole, and nothing else is there.
  for (uint32_t p = 0; p < kPartitions; ++p) {
    grpc::ClientContext fctx;
    pb::FetchRequest freq;
    freq.set_shuffle_id("k");
    freq.set_partition_id(p);
    auto reader = stub->Fetch(&fctx, freq);
    pb::FetchResponse resp;
    FrameDecoder dec;
    DecodedFrame frame;
    size_t records = 0;
    while (reader->Read(&resp)) {
      ASSERT_TRUE(dec.Decode(resp.frame(), &frame).ok());
      records += frame.size();
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(records, committed.size() * kRows) << "partition " << p;
    EXPECT_EQ(info.partitions(p).records(), committed.size() * kRows);
  }
}

}  // namespace
}  // namespace sluice
