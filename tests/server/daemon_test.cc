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
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "client/shuffle_client.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "rpc/error_reason.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/mini_cluster.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

namespace pb = sluice::v1;

using testing::MakeStub;
using testing::MiniCluster;
using testing::MiniClusterOptions;
using testing::MiniServer;
using testing::MiniServerOptions;
using testing::StatusIs;

// The daemon alone under `prlimit --nofile=<nofile>` on `data_dir` (server 0 of a standalone
// MiniCluster).
absl::StatusOr<std::unique_ptr<MiniCluster>> StartLimited(const std::string& data_dir,
                                                          const std::string& nofile,
                                                          std::vector<std::string> flags = {}) {
  MiniClusterOptions options;
  options.servers = 0;
  options.etcd = false;
  options.nofile = nofile;
  options.flags = {"--log_level=warn"};
  options.flags.insert(options.flags.end(), flags.begin(), flags.end());
  auto cluster = MiniCluster::Start(options);
  if (!cluster.ok()) return cluster.status();
  if (absl::Status st = (*cluster)->Add({}, data_dir).status(); !st.ok()) return st;
  return cluster;
}

// The daemon alone with a budget of `budget_mb` (server 0 of a standalone MiniCluster).
absl::StatusOr<std::unique_ptr<MiniCluster>> StartWithBudget(uint64_t budget_mb) {
  MiniClusterOptions options;
  options.servers = 1;
  options.etcd = false;
  options.flags = {"--log_level=warn", absl::StrCat("--memory_budget_mb=", budget_mb)};
  return MiniCluster::Start(options);
}

// A sluice-server child process on 127.0.0.1 with a free port, on `data_dir`.
std::unique_ptr<MiniServer> StartDaemon(const std::string& data_dir) {
  MiniServerOptions opts;
  opts.child_process = true;
  opts.server.data_dir = data_dir;
  auto server = MiniServer::Start(opts);
  EXPECT_OK(server);
  return server.ok() ? std::move(server).value() : nullptr;
}

// A process's state letter from /proc/<pid>/stat ('T' once stopped), or '?'.
char ProcessState(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  char buf[512] = {};
  const size_t n = f != nullptr ? std::fread(buf, 1, sizeof(buf) - 1, f) : 0;
  if (f != nullptr) std::fclose(f);
  const char* p = n > 0 ? std::strrchr(buf, ')') : nullptr;
  return p != nullptr && p[1] == ' ' ? p[2] : '?';
}

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
  EXPECT_OK(enc.Encode(records, &out));
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

// Runs sluice-server with `flags` (for a server that must refuse to start); its exit status and
// everything it printed.
int RunServer(const std::string& flags, std::string* output) {
  // (A server that does start is stopped after 10 s: the test then fails on its status, 124.)
  const std::string cmd =
      "timeout 10 " + std::string(SLUICE_SERVER_BIN) + " --listen=127.0.0.1:0 " + flags + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Out-of-range flags stop the server at start, naming the flag: --max_frame_mb=4096 must not
// wrap to a cap of 0, nor --memory_budget_mb=0 make every push hang.
TEST(DaemonTest, OutOfRangeFlagsAreRefusedAtStartAndNamed) {
  testing::TempDir dir;
  const std::string data = " --data_dir=" + dir.path();
  for (const char* flag :
       {"--max_frame_mb=4096", "--max_frame_mb=0", "--memory_budget_mb=0", "--worker_threads=0",
        "--merge_fan_in=1", "--max_frames_per_attempt=0", "--log_level=loud",
        "--max_push_streams=0", "--max_fetch_streams=0", "--max_streams_per_connection=0",
        "--push_idle_timeout_s=0", "--push_credit_timeout_s=0", "--stream_window_mb=65",
        "--stream_window_mb=0.01", "--stream_window_mb=-1", "--stream_window_mb=nan",
        "--fetch_stall_timeout_s=0", "--connection_idle_timeout_s=0"}) {
    std::string out;
    EXPECT_EQ(RunServer(flag + data, &out), 2) << flag << ": " << out;
    const std::string name = std::string(flag).substr(0, std::string(flag).find('='));
    EXPECT_NE(out.find(name), std::string::npos) << flag << ": " << out;
    EXPECT_EQ(out.find("listening on port"), std::string::npos) << flag << ": " << out;
  }
  std::string out;
  EXPECT_EQ(RunServer("--max_frame_mb=1024", &out), 2) << out;  // in range, but no --data_dir
  EXPECT_NE(out.find("--data_dir"), std::string::npos) << out;
}

TEST(DaemonTest, SigtermShutsDownCleanly) {
  testing::TempDir dir;
  auto d = StartDaemon(dir.path());
  ASSERT_NE(d, nullptr);
  auto stub = MakeStub(*d);
  grpc::ClientContext ctx;
  pb::CreateShuffleRequest req;
  req.set_shuffle_id("t");
  req.set_num_partitions(1);
  pb::CreateShuffleResponse resp;
  ASSERT_OK(stub->CreateShuffle(&ctx, req, &resp));
  const int status = d->Kill(SIGTERM);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// SIGTERM drains: readiness goes NOT_SERVING (liveness stays SERVING), a new push stream is
// refused with UNAVAILABLE, a push in flight still commits, a fetch in flight is served to its
// end, and then the process exits 0 by itself, well before the grace period.
TEST(DaemonTest, SigtermDrainsWhatIsInFlightThenExitsZero) {
  testing::TempDir dir;
  MiniServerOptions opts;
  opts.child_process = true;
  opts.server.data_dir = dir.path();
  opts.server.drain_grace = std::chrono::seconds(60);
  ASSERT_OK_AND_ASSIGN(auto d, MiniServer::Start(opts));
  ClientOptions copts;
  copts.server = d->address();
  ASSERT_OK_AND_ASSIGN(auto client, ShuffleClient::Connect(copts));
  ASSERT_OK(client->CreateShuffle("d", 1, 3).status());
  const std::string value(1000, 'v');
  {
    ASSERT_OK_AND_ASSIGN(auto w, client->OpenWriter("d", 0, 1));
    for (int i = 0; i < 5000; ++i) ASSERT_OK(w->Add("k" + std::to_string(i), value));
    ASSERT_OK(w->Close().status());
  }
  ASSERT_OK_AND_ASSIGN(int ready, testing::HealthCheck(d->address(), "sluice.v1.ShuffleService"));
  EXPECT_EQ(ready, 1);  // SERVING
  // In flight when the signal comes: a fetch that has read one record, and a push.
  ReaderOptions ropts;
  ropts.chunk_bytes = 16 << 10;
  ASSERT_OK_AND_ASSIGN(auto reader, client->OpenReader("d", 0, ropts));
  Record r;
  ASSERT_OK_AND_ASSIGN(bool more, reader->Next(&r));
  ASSERT_TRUE(more);
  WriterOptions wopts;
  wopts.buffer_bytes = 64 << 10;  // (its frames go out as it writes)
  ASSERT_OK_AND_ASSIGN(auto pushing, client->OpenWriter("d", 1, 1, wopts));
  for (int i = 0; i < 1000; ++i) ASSERT_OK(pushing->Add("p" + std::to_string(i), value));
  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(d->pid(), SIGTERM), 0);
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto h = testing::HealthCheck(d->address(), "sluice.v1.ShuffleService");
        return h.ok() && *h == 2;
      },
      std::chrono::seconds(5)));
  ASSERT_OK_AND_ASSIGN(int alive, testing::HealthCheck(d->address(), ""));
  EXPECT_EQ(alive, 1);  // liveness: SERVING while the process lives
  ASSERT_OK_AND_ASSIGN(NodeStatus node, client->GetNode());
  EXPECT_FALSE(node.serving);
  // A new attempt is refused at its open, saying when to retry; the one in flight commits.
  absl::StatusOr<std::unique_ptr<ShuffleWriter>> late = client->OpenWriter("d", 2, 1);
  EXPECT_THAT(late.status(), StatusIs(absl::StatusCode::kUnavailable, "draining"));
  EXPECT_EQ(ReasonOf(late.status()), ErrorReason::kDraining);
  EXPECT_EQ(RetryAfterOf(late.status()), std::chrono::seconds(2));
  for (int i = 1000; i < 2000; ++i) ASSERT_OK(pushing->Add("p" + std::to_string(i), value));
  ASSERT_OK_AND_ASSIGN(WriteResult committed, pushing->Close());
  EXPECT_EQ(committed.records, 2000u);
  // The fetch goes on to its end.
  int records = 1;
  for (;;) {
    ASSERT_OK_AND_ASSIGN(more, reader->Next(&r));
    if (!more) break;
    ++records;
  }
  EXPECT_EQ(records, 5000);
  reader.reset();
  // Nothing open any more: it exits 0 on its own, long before its 60 s grace.
  ASSERT_TRUE(
      testing::Eventually([&] { return ::kill(d->pid(), 0) != 0 || ProcessState(d->pid()) == 'Z'; },
                          std::chrono::seconds(20)));
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(30));
  const int status = d->Kill(0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The Drain RPC, from the server's own host only (unless --allow_remote_admin).
TEST(DaemonTest, TheDrainCallIsTakenFromLoopbackOnly) {
  ASSERT_OK_AND_ASSIGN(auto d, MiniServer::Start());
  ClientOptions copts;
  copts.server = d->address();
  ASSERT_OK_AND_ASSIGN(auto client, ShuffleClient::Connect(copts));
  ASSERT_OK(client->Drain(0));
  ASSERT_OK_AND_ASSIGN(NodeStatus node, client->GetNode());
  EXPECT_FALSE(node.serving);
}

TEST(DaemonTest, KillDashNineMidPushKeepsExactlyTheAcknowledgedCommits) {
  testing::TempDir dir;
  std::set<uint32_t> acked;
  {
    auto d = StartDaemon(dir.path());
    ASSERT_NE(d, nullptr);
    auto stub = MakeStub(*d);
    {
      grpc::ClientContext ctx;
      pb::CreateShuffleRequest req;
      req.set_shuffle_id("k");
      req.set_num_partitions(kPartitions);
      pb::CreateShuffleResponse resp;
      ASSERT_OK(stub->CreateShuffle(&ctx, req, &resp));
    }
    // Two pushers, mapper ids interleaved, until the server dies under them.
    std::mutex mu;
    std::atomic<bool> stop{false};
    std::vector<std::thread> pushers;
    for (uint32_t t = 0; t < 2; ++t) {
      pushers.emplace_back([&, t] {
        auto my_stub = MakeStub(*d);
        for (uint32_t m = t; !stop.load(); m += 2) {
          if (!PushOne(*my_stub, m)) return;
          std::lock_guard<std::mutex> lock(mu);
          acked.insert(m);
        }
      });
    }
    // Killed once some commits are acknowledged, with the pushers going on.
    EXPECT_TRUE(testing::Eventually([&] {
      std::lock_guard<std::mutex> lock(mu);
      return acked.size() >= 10;
    }));
    d->Kill(SIGKILL);
    stop.store(true);
    for (auto& t : pushers) t.join();
  }
  ASSERT_FALSE(acked.empty()) << "no commit was acknowledged before the kill";

  auto d = StartDaemon(dir.path());
  ASSERT_NE(d, nullptr);
  auto stub = MakeStub(*d);
  grpc::ClientContext ctx;
  pb::GetShuffleRequest req;
  req.set_shuffle_id("k");
  pb::ShuffleInfo info;
  ASSERT_OK(stub->GetShuffle(&ctx, req, &info));
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
      ASSERT_OK(dec.Decode(resp.frame(), &frame));
      records += frame.size();
    }
    ASSERT_OK(reader->Finish());
    EXPECT_EQ(records, committed.size() * kRows) << "partition " << p;
    EXPECT_EQ(info.partitions(p).records(), committed.size() * kRows);
  }
}

// Fetches partition p of shuffle "k" whole; its record count, or -1 when the fetch fails (-2
// when a KEY read is out of key order).
int64_t CountRecords(pb::ShuffleService::Stub& stub, uint32_t p, pb::Order order = pb::UNORDERED) {
  grpc::ClientContext ctx;
  pb::FetchRequest req;
  req.set_shuffle_id("k");
  req.set_partition_id(p);
  req.set_order(order);
  auto reader = stub.Fetch(&ctx, req);
  pb::FetchResponse resp;
  FrameDecoder dec;
  DecodedFrame frame;
  int64_t records = 0;
  std::string last;
  bool ordered = true;
  while (reader->Read(&resp)) {
    if (!dec.Decode(resp.frame(), &frame).ok()) return -1;
    records += static_cast<int64_t>(frame.size());
    for (const Record& r : frame) {
      if (order == pb::KEY && KeyLess(r.key, last)) ordered = false;
      last.assign(r.key);
    }
  }
  if (!reader->Finish().ok()) return -1;
  return ordered ? records : -2;
}

// The start reads the commit log, not the data, and a scrub reads the data while pushes commit
// and the pre-merge merges them: SIGKILL at random moments of all three, again and again on one
// directory, and after each restart every acknowledged commit is there and whole (in both
// orders), nothing else is, and the scrub found no damage.
TEST(DaemonTest, KillsDuringPushesCommitsScrubsAndPremergesKeepExactlyTheAcknowledgedCommits) {
  testing::TempDir dir;
  std::set<uint32_t> acked;
  uint32_t premerged = 0;  // mappers pre-merged runs stood for, over the restarts
  std::mt19937 rng(std::random_device{}());
  uint32_t next_mapper = 0;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    MiniServerOptions opts;
    opts.child_process = true;
    opts.server.data_dir = dir.path();
    opts.server.scrub_bytes_per_s = uint64_t{512} << 20;   // scrubbing all the time
    opts.server.premerge_bytes_per_s = uint64_t{1} << 30;  // merging all the time
    opts.server.premerge_min_runs = 2;
    auto started = MiniServer::Start(opts);
    ASSERT_OK(started);
    std::unique_ptr<MiniServer> d = *std::move(started);
    auto stub = MakeStub(*d);
    if (round == 0) {
      grpc::ClientContext ctx;
      pb::CreateShuffleRequest req;
      req.set_shuffle_id("k");
      req.set_num_partitions(kPartitions);
      pb::CreateShuffleResponse resp;
      ASSERT_OK(stub->CreateShuffle(&ctx, req, &resp));
    } else {
      // What the last round acknowledged is all there, exactly.
      grpc::ClientContext ctx;
      pb::GetShuffleRequest req;
      req.set_shuffle_id("k");
      pb::ShuffleInfo info;
      ASSERT_OK(stub->GetShuffle(&ctx, req, &info));
      std::set<uint32_t> committed(info.committed_mappers().begin(),
                                   info.committed_mappers().end());
      for (uint32_t m : acked) ASSERT_EQ(committed.count(m), 1u) << "acknowledged mapper " << m;
      acked = committed;  // (those that landed unacknowledged are commits from now on)
      for (uint32_t p = 0; p < kPartitions; ++p)
        premerged += info.partitions(p).premerged_mappers();
      // Pushers starve the pre-merge (its merging runs at SCHED_IDLE): before this round's
      // pushes, give it the idle server until it has made a run, so that the kill below finds
      // runs to recover (or to cut in the middle of the next merge). A KEY read would leave the
      // partitions alone: the reads come after.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      for (bool made = false; !made && std::chrono::steady_clock::now() < until;) {
        grpc::ClientContext wctx;
        pb::ShuffleInfo now;
        ASSERT_OK(stub->GetShuffle(&wctx, req, &now));
        for (const auto& p : now.partitions()) made = made || p.premerged_runs() > 0;
        if (!made) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      for (uint32_t p = 0; p < kPartitions; ++p) {
        EXPECT_EQ(CountRecords(*stub, p), static_cast<int64_t>(committed.size()) * kRows);
        EXPECT_EQ(CountRecords(*stub, p, pb::KEY), static_cast<int64_t>(committed.size()) * kRows);
        EXPECT_FALSE(info.partitions(p).damaged()) << info.partitions(p).damage();
      }
    }
    std::mutex mu;
    std::atomic<bool> stop{false};
    std::vector<std::thread> pushers;
    const uint32_t base = next_mapper;
    next_mapper += 100000;
    for (uint32_t t = 0; t < 2; ++t) {
      pushers.emplace_back([&, t] {
        auto my_stub = MakeStub(*d);
        for (uint32_t m = base + t; !stop.load(); m += 2) {
          if (!PushOne(*my_stub, m)) return;
          std::lock_guard<std::mutex> lock(mu);
          acked.insert(m);
        }
      });
    }
    ::usleep(100000 + rng() % 400000);
    d->Kill(SIGKILL);
    stop.store(true);
    for (auto& t : pushers) t.join();
  }
  ASSERT_FALSE(acked.empty());
  MiniServerOptions opts;
  opts.child_process = true;
  opts.server.data_dir = dir.path();
  auto d = MiniServer::Start(opts);
  ASSERT_OK(d);
  auto stub = MakeStub(**d);
  grpc::ClientContext ctx;
  pb::GetShuffleRequest req;
  req.set_shuffle_id("k");
  pb::ShuffleInfo info;
  ASSERT_OK(stub->GetShuffle(&ctx, req, &info));
  std::set<uint32_t> committed(info.committed_mappers().begin(), info.committed_mappers().end());
  for (uint32_t m : acked) EXPECT_EQ(committed.count(m), 1u) << "acknowledged mapper " << m;
  EXPECT_LE(committed.size(), acked.size() + 2);
  for (uint32_t p = 0; p < kPartitions; ++p) {
    EXPECT_EQ(CountRecords(*stub, p), static_cast<int64_t>(committed.size()) * kRows);
    EXPECT_EQ(CountRecords(*stub, p, pb::KEY), static_cast<int64_t>(committed.size()) * kRows);
  }
  EXPECT_GT(premerged, 0u) << "no pre-merged run stood at a restart: the kills missed it";
}

// A server that stops answering (SIGSTOP: its sockets stay open) must not hang a push or a
// fetch forever: the client's keepalive pings find it dead and the call fails with UNAVAILABLE
// within keepalive_time + keepalive_timeout (plus a ping's scheduling).
TEST(DaemonTest, AStoppedServerIsUnavailableWithinTheKeepaliveBound) {
  testing::TempDir dir;
  auto d = StartDaemon(dir.path());
  ASSERT_NE(d, nullptr);
  ClientOptions options;
  options.keepalive_time = std::chrono::seconds(2);
  options.keepalive_timeout = std::chrono::seconds(1);
  options.call_deadline = std::chrono::seconds(5);
  ASSERT_OK_AND_ASSIGN(auto client, d->Client(options));
  ASSERT_OK(client->CreateShuffle("h", 2, 0));
  {  // something to fetch
    ASSERT_OK_AND_ASSIGN(auto w, client->OpenWriter("h", 0, 1));
    for (int i = 0; i < 1000; ++i) ASSERT_OK(w->Add("k" + std::to_string(i), "v"));
    ASSERT_OK(w->Close());
  }
  // A live server accepts the pings: idle between calls for a few pings, the connection stays.
  std::this_thread::sleep_for(std::chrono::milliseconds(4500));
  ASSERT_OK(client->GetShuffle("h"));

  WriterOptions small;
  small.buffer_bytes = 1 << 20;
  ASSERT_OK_AND_ASSIGN(auto writer, client->OpenWriter("h", 1, 1, small));
  // (StopProcess returns once every thread has stopped: a fetch sent while one still ran could
  // be answered in full, a one-chunk fetch being two thread hand-overs.)
  testing::StopProcess(d->pid());
  ASSERT_EQ(ProcessState(d->pid()), 'T') << "the server did not stop";
  ASSERT_OK_AND_ASSIGN(auto reader, client->OpenReader("h", 0, ReaderOptions{}));
  const auto stopped = std::chrono::steady_clock::now();
  auto seconds_since_stop = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  };

  // A push under way: Add blocks once the buffers are full, then the stream breaks.
  auto push = std::async(std::launch::async, [&] {
    const std::string value(1000, 'x');
    for (int i = 0; i < 1000000; ++i) {
      absl::Status st = writer->Add("key" + std::to_string(i), value);
      if (!st.ok()) return st;
    }
    return writer->Close().status();
  });
  // A fetch opened after the stop: its first read waits on the server.
  auto fetch = std::async(std::launch::async, [&] {
    Record r;
    for (;;) {
      auto more = reader->Next(&r);
      if (!more.ok()) return more.status();
      if (!*more) return absl::OkStatus();
    }
  });
  const bool push_done = push.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  const double push_s = seconds_since_stop();
  const bool fetch_done = fetch.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  ASSERT_EQ(::kill(d->pid(), SIGCONT), 0);  // lets a hung call finish, so the test can end
  EXPECT_TRUE(push_done) << "the push hung on a stopped server";
  const absl::Status pushed = push.get();
  EXPECT_THAT(pushed, StatusIs(absl::StatusCode::kUnavailable, ""));
  EXPECT_LT(push_s, 10.0);
  EXPECT_TRUE(fetch_done) << "the fetch hung on a stopped server";
  EXPECT_THAT(fetch.get(), StatusIs(absl::StatusCode::kUnavailable, ""));
}

// Reads the soft and hard open-files limits of process `pid` from /proc.
std::pair<long, long> OpenFilesLimit(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/limits").c_str(), "r");
  char line[256];
  std::pair<long, long> out{-1, -1};
  while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, "Max open files", 14) == 0) {
      std::sscanf(line + 14, "%ld %ld", &out.first, &out.second);
    }
  }
  if (f != nullptr) std::fclose(f);
  return out;
}

// Running out of descriptors, where it does not depend on the storage layout: the server raises
// its soft open-files limit to the hard one at start; with --max_open_shuffles set past what
// the descriptors hold, a CreateShuffle that runs out of them fails with RESOURCE_EXHAUSTED
// naming the limit and leaves no directory behind; the server still starts on that data
// directory; and with the default (derived from the descriptors) shuffles close when idle, so
// creating many more never runs out.
TEST(DaemonTest, OutOfDescriptorsIsResourceExhaustedAndTheServerStillStarts) {
  testing::TempDir dir;
  {
    // Soft 64, hard 4096: the server takes the hard limit.
    ASSERT_OK_AND_ASSIGN(auto server, StartLimited(dir.path(), "64:4096"));
    EXPECT_EQ(OpenFilesLimit(server->pid(0)), (std::pair<long, long>{4096, 4096}));
    ASSERT_OK(server->Stop(0));
  }
  int created = 0;
  {
    // Hard 128 and an open limit the descriptors cannot hold: shuffles that mappers write to
    // (an idle one would close to make room) use descriptors until CreateShuffle cannot get one.
    ASSERT_OK_AND_ASSIGN(auto server,
                         StartLimited(dir.path(), "128:128", {"--max_open_shuffles=100000"}));
    ASSERT_OK_AND_ASSIGN(auto client, server->Client(ClientOptions()));
    std::vector<std::unique_ptr<ShuffleWriter>> writing;
    WriterOptions small;
    small.buffer_bytes = 1;  // every Add is sent; the second waits for the first to be
    absl::Status st;
    for (; created < 500; ++created) {
      const std::string id = "s" + std::to_string(created);
      st = client->CreateShuffle(id, 1, 0).status();
      if (!st.ok()) break;
      auto writer = client->OpenWriter(id, 0, 1, small);
      if (!writer.ok() || !(*writer)->Add("k", "v").ok() || !(*writer)->Add("k", "v").ok()) {
        continue;  // (its store closed for room before its push took it: it failed instead)
      }
      writing.push_back(std::move(writer).value());
    }
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kResourceExhausted, "open files"));
    EXPECT_FALSE(std::filesystem::exists(dir.path() + "/shuffles/s" + std::to_string(created)))
        << "a failed CreateShuffle left its directory behind";
    writing.clear();
    client.reset();
    ASSERT_OK(server->Stop(0));
  }
  ASSERT_GT(created, 10);
  // The same descriptors, the same data directory, the default open limit: the server comes
  // up, lists every shuffle, and takes 300 more without running out.
  ASSERT_OK_AND_ASSIGN(auto server, StartLimited(dir.path(), "128:128"));
  ASSERT_OK_AND_ASSIGN(auto client, server->Client(ClientOptions()));
  ASSERT_OK_AND_ASSIGN(auto all, client->ListShuffles());
  EXPECT_EQ(static_cast<int>(all.size()), created);
  for (int i = 0; i < 300; ++i) {
    ASSERT_OK(client->CreateShuffle("t" + std::to_string(i), 1, 0).status()) << i;
  }
  ASSERT_OK_AND_ASSIGN(all, client->ListShuffles());
  EXPECT_EQ(static_cast<int>(all.size()), created + 300);
  ASSERT_OK(server->Stop(0));
}

// Mappers that each push one large frame at once must not take the server far past its
// budget: large frames travel in pieces of at most a push message, announced with their size,
// and the server reserves that size before it reads a piece.
TEST(DaemonTest, LargeFramesPushedAtOnceStayWithinTheBudget) {
  constexpr int kMappers = 8;
  constexpr size_t kFrameBytes = size_t{12} << 20;
  constexpr uint64_t kBudgetMb = 16;
  ASSERT_OK_AND_ASSIGN(auto server, StartWithBudget(kBudgetMb));
  ASSERT_OK_AND_ASSIGN(auto client, server->Client(ClientOptions()));
  ASSERT_OK(client->CreateShuffle("big", 1, kMappers).status());
  std::string value(kFrameBytes / 2, '\0');  // incompressible: the frame stays ~12 MiB
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i + 8 <= value.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(&value[i], &x, 8);
  }
  std::vector<absl::Status> results(kMappers);
  std::vector<std::thread> mappers;
  for (int m = 0; m < kMappers; ++m) {
    mappers.emplace_back([&, m] {
      WriterOptions w;
      w.buffer_bytes = w.frame_bytes = kFrameBytes + (1 << 20);  // both records in one frame
      auto writer = client->OpenWriter("big", m, 1, w);
      absl::Status st = writer.status();
      if (st.ok()) st = (*writer)->Add(absl::StrCat("a", m), value);
      if (st.ok()) st = (*writer)->Add(absl::StrCat("b", m), value);
      if (st.ok()) st = (*writer)->Close().status();
      results[m] = st;
    });
  }
  for (auto& t : mappers) t.join();
  for (const auto& st : results) EXPECT_OK(st);
  ASSERT_OK_AND_ASSIGN(ShuffleStatus status, client->GetShuffle("big"));
  EXPECT_EQ(status.committed_mappers.size(), static_cast<size_t>(kMappers));
  ASSERT_EQ(status.partitions.size(), 1u);
  EXPECT_EQ(status.partitions[0].records, 2u * kMappers);
  EXPECT_EQ(status.partitions[0].frames, static_cast<uint64_t>(kMappers));
  // The budget, one frame assembled past it (a frame may always go alone) and the process's
  // own ~30 MiB; the pieces wait on the clients until the frame is promised (PushFlow).
#ifndef __SANITIZE_ADDRESS__  // ASan's quarantine keeps freed memory resident on purpose
  const double peak_mb = static_cast<double>(server->process(0)->PeakRssBytes()) / (1 << 20);
  EXPECT_LT(peak_mb, kBudgetMb + 12 + 40) << "budget " << kBudgetMb << " MiB";
#endif
  ASSERT_OK(server->Stop(0));
}

// The server's peak, `mappers` pushing ~1 MiB frames of incompressible values at once under a
// 16 MiB budget, the client with or without credit (PushFlow).
// (`refused`, when not null: the plain streams the budget had no room for, refused saying so.)
double PeakWithMappers(int mappers, bool credit, int* refused = nullptr) {
  constexpr uint64_t kBudgetMb = 16;
  auto server = StartWithBudget(kBudgetMb);
  EXPECT_OK(server.status());
  if (!server.ok()) return 0;
  ClientOptions options;
  options.push_credit = credit;
  auto client = (*server)->Client(options);
  EXPECT_OK(client.status());
  if (!client.ok()) return 0;
  EXPECT_OK((*client)->CreateShuffle("many", 1, static_cast<uint32_t>(mappers)).status());
  std::string value(size_t{1} << 20, '\0');
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i + 8 <= value.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(&value[i], &x, 8);
  }
  std::vector<absl::Status> results(mappers);
  std::vector<std::thread> threads;
  for (int m = 0; m < mappers; ++m) {
    threads.emplace_back([&, m] {
      WriterOptions w;
      w.buffer_bytes = w.frame_bytes = size_t{1} << 20;  // a frame (and a message) a record
      auto writer = (*client)->OpenWriter("many", static_cast<uint32_t>(m), 1, w);
      absl::Status st = writer.status();
      for (int i = 0; st.ok() && i < 2; ++i) {
        st = (*writer)->Add(absl::StrCat("k", m, "-", i), std::string_view(value).substr(i));
      }
      if (st.ok()) st = (*writer)->Close().status();
      results[m] = st;
    });
  }
  for (auto& t : threads) t.join();
  int written = 0;
  for (const auto& st : results) {
    if (refused != nullptr && absl::IsResourceExhausted(st) &&
        absl::StrContains(st.message(), "plain Push stream")) {
      ++*refused;
      continue;
    }
    EXPECT_OK(st);
    ++written;
  }
  auto status = (*client)->GetShuffle("many");
  EXPECT_OK(status.status());
  if (status.ok()) {
    EXPECT_EQ(status->partitions[0].records, 2u * written);
  }
  const double peak_mb = static_cast<double>((*server)->process(0)->PeakRssBytes()) / (1 << 20);
  EXPECT_OK((*server)->Stop(0));
  return peak_mb;
}

// What a server holds of pushes follows its budget, not the number of streams: with PushFlow a
// message is sent only within credit the budget granted, so 16 and 128 mappers at once peak
// within the budget and the same fixed overhead. (With the plain Push stream each stream's
// message in hand and gRPC's window came on top: ~1.5 MiB a stream, 100+ MiB at 128.)
TEST(DaemonTest, ManyPushStreamsStayWithinTheBudgetAndAFixedOverhead) {
#ifdef __SANITIZE_ADDRESS__  // ASan's quarantine keeps freed memory resident on purpose
  GTEST_SKIP() << "resident memory is not measured under ASan";
#endif
  const double few = PeakWithMappers(16, /*credit=*/true);
  const double many = PeakWithMappers(128, /*credit=*/true);
  int refused = 0;
  const double plain = PeakWithMappers(128, /*credit=*/false, &refused);
  const std::string seen = absl::StrCat("16 mappers: ", few, " MiB, 128: ", many,
                                        " MiB (with the plain Push stream: ", plain, " MiB, ",
                                        refused, " of 128 refused for the limit)");
  // The 16 MiB budget, a frame's memory promised past it (one may always go alone), the
  // process's own ~30 MiB with its code, worker threads' decoders and zstd contexts; and the
  // state of a stream pushing, ~0.2 MiB each (gRPC's and ours). A plain Push stream may make
  // the server hold a window and a message past the budget (~1 MiB a stream: 128 took it to
  // ~200 MiB), so at most --max_plain_push_streams (16) are open at once; those past them are
  // refused, saying so.
  EXPECT_LT(many, 16 + 1 + 60 + 128 * 0.25) << seen;
  EXPECT_LT(many - few, (128 - 16) * 0.35) << seen;
  EXPECT_LT(plain, 16 + 1 + 60 + 128 * 0.25) << seen;
}

}  // namespace
}  // namespace sluice
