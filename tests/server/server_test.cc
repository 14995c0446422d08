// The service end to end: a real SluiceServer on 127.0.0.1:0 with a real temporary data
// directory, called through the generated gRPC stub.
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "server/runtime/memory_budget.h"
#include "server/sluice_server.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/data_file.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/parked_threads.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"
#include "tests/harness/wait.h"

namespace sluice {
namespace {

using testing::MakeStub;
using testing::MiniServer;
using testing::MiniServerOptions;
using testing::StatusIs;
namespace pb = sluice::v1;

// Records of mapper m for partition p: keys "m<m>-p<p>-<i>", values with `pad` extra bytes.
std::vector<std::pair<std::string, std::string>> Rows(uint32_t m, uint32_t p, int n,
                                                      size_t pad = 0) {
  std::vector<std::pair<std::string, std::string>> rows;
  uint64_t x = 0x9e3779b97f4a7c15ULL * (m + 1) + p;
  for (int i = 0; i < n; ++i) {
    std::string v = "v" + std::to_string(i);
    for (size_t k = 0; k < pad; ++k) {  // incompressible padding
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      v.push_back(static_cast<char>('a' + x % 26));
    }
    rows.emplace_back("m" + std::to_string(m) + "-p" + std::to_string(p) + "-" + std::to_string(i),
                      std::move(v));
  }
  return rows;
}

std::string Frame(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::vector<Record> records;
  for (const auto& [k, v] : rows) records.push_back(Record{k, v});
  FrameEncoder enc;
  std::string out;
  EXPECT_OK(enc.Encode(records, &out));
  return out;
}

pb::PushRequest OpenMsg(const std::string& id, uint32_t mapper, uint64_t attempt = 1) {
  pb::PushRequest open;
  open.mutable_open()->set_shuffle_id(id);
  open.mutable_open()->set_mapper_id(mapper);
  open.mutable_open()->set_attempt_id(attempt);
  return open;
}

pb::PushRequest FramesMsg(uint32_t partition, std::string frame) {
  pb::PushRequest msg;
  auto* f = msg.mutable_frames()->add_frames();
  f->set_partition_id(partition);
  f->set_frame(std::move(frame));
  return msg;
}

pb::PushRequest CommitMsg(uint64_t frames, uint64_t records) {
  pb::PushRequest commit;
  commit.mutable_commit()->set_frame_count(frames);
  commit.mutable_commit()->set_record_count(records);
  return commit;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  void StartServer(uint64_t budget = 256ull << 20, size_t fan_in = 64,
                   uint32_t max_frame_bytes = kDefaultMaxUncompressedBytes, size_t merges = 0) {
    MiniServerOptions opts;
    opts.server.max_concurrent_merges = merges;
    opts.server.limits.max_uncompressed_bytes = max_frame_bytes;
    opts.server.memory_budget_bytes = budget;
    opts.server.merge_fan_in = fan_in;
    opts.server.max_frames_per_attempt = max_frames_per_attempt_;
    // (These tests push through the plain Push stub, 36 streams at once in one of them.)
    opts.server.max_plain_push_streams = 64;
    if (server_ == nullptr) {
      ASSERT_OK_AND_ASSIGN(server_, MiniServer::Start(opts));
    } else {
      stub_.reset();
      ASSERT_OK(server_->Restart(opts));
    }
    stub_ = MakeStub(*server_);
  }
  // The same data directory, a new server process state.
  void RestartServer(uint64_t budget = 256ull << 20, size_t fan_in = 64,
                     uint32_t max_frame_bytes = kDefaultMaxUncompressedBytes, size_t merges = 0) {
    StartServer(budget, fan_in, max_frame_bytes, merges);
  }

  // One attempt made of the given frames (all for partition 0).
  grpc::Status PushFrames(const std::string& id, uint32_t mapper,
                          const std::vector<std::string>& frames, uint64_t records) {
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto writer = stub_->Push(&ctx, &resp);
    writer->Write(OpenMsg(id, mapper, 1));
    for (const std::string& frame : frames) {
      writer->Write(FramesMsg(0, frame));
    }
    writer->Write(CommitMsg(frames.size(), records));
    writer->WritesDone();
    return writer->Finish();
  }

  // Partition 0 in KEY order, records in stream order, plus the frames' headers.
  grpc::Status FetchKeyOrder(const std::string& id,
                             std::vector<std::pair<std::string, std::string>>* out,
                             std::vector<FrameHeader>* headers = nullptr,
                             pb::FrameLayout layout = pb::LAYOUT_AUTO, bool uncompressed = false,
                             uint32_t chunk = 0) {
    grpc::ClientContext ctx;
    pb::FetchRequest req;
    req.set_shuffle_id(id);
    req.set_partition_id(0);
    req.set_order(pb::KEY);
    req.set_layout(layout);
    req.set_uncompressed(uncompressed);
    req.set_target_chunk_bytes(chunk);
    auto reader = stub_->Fetch(&ctx, req);
    pb::FetchResponse resp;
    FrameDecoder dec;
    DecodedFrame frame;
    while (reader->Read(&resp)) {
      EXPECT_OK(dec.Decode(resp.frame(), &frame));
      if (headers != nullptr) headers->push_back(frame.header());
      for (const Record& r : frame) out->emplace_back(std::string(r.key), std::string(r.value));
    }
    return reader->Finish();
  }

  grpc::Status Create(const std::string& id, uint32_t partitions, uint32_t mappers,
                      bool* created = nullptr) {
    grpc::ClientContext ctx;
    pb::CreateShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_num_partitions(partitions);
    req.set_num_mappers(mappers);
    pb::CreateShuffleResponse resp;
    grpc::Status st = stub_->CreateShuffle(&ctx, req, &resp);
    if (created != nullptr) *created = resp.created();
    return st;
  }

  // One attempt: open, one message per partition, commit with the true (or given) counts.
  grpc::Status Push(const std::string& id, uint32_t mapper, uint64_t attempt, uint32_t partitions,
                    int rows_per_partition, pb::PushResponse* resp, int64_t frame_count = -1,
                    size_t pad = 0) {
    grpc::ClientContext ctx;
    auto writer = stub_->Push(&ctx, resp);
    writer->Write(OpenMsg(id, mapper, attempt));
    for (uint32_t p = 0; p < partitions; ++p) {
      if (!writer->Write(FramesMsg(p, Frame(Rows(mapper, p, rows_per_partition, pad))))) break;
    }
    writer->Write(CommitMsg(frame_count >= 0 ? frame_count : partitions,
                            static_cast<uint64_t>(partitions) * rows_per_partition));
    writer->WritesDone();
    return writer->Finish();
  }

  // All records of a partition, sorted, as "key=value".
  grpc::Status FetchAll(const std::string& id, uint32_t partition, std::vector<std::string>* out,
                        bool require_complete = false) {
    grpc::ClientContext ctx;
    pb::FetchRequest req;
    req.set_shuffle_id(id);
    req.set_partition_id(partition);
    req.set_order(pb::UNORDERED);
    req.set_require_complete(require_complete);
    auto reader = stub_->Fetch(&ctx, req);
    pb::FetchResponse resp;
    FrameDecoder dec;
    DecodedFrame frame;
    while (reader->Read(&resp)) {
      EXPECT_OK(dec.Decode(resp.frame(), &frame));
      for (const Record& r : frame) out->push_back(std::string(r.key) + "=" + std::string(r.value));
    }
    std::sort(out->begin(), out->end());
    return reader->Finish();
  }

  pb::ShuffleInfo Info(const std::string& id, grpc::Status* st = nullptr) {
    grpc::ClientContext ctx;
    pb::GetShuffleRequest req;
    req.set_shuffle_id(id);
    pb::ShuffleInfo info;
    grpc::Status s = stub_->GetShuffle(&ctx, req, &info);
    if (st != nullptr) *st = s;
    return info;
  }

  static std::vector<std::string> Expected(std::vector<uint32_t> mappers, uint32_t p, int n) {
    std::vector<std::string> out;
    for (uint32_t m : mappers) {
      for (const auto& [k, v] : Rows(m, p, n)) out.push_back(k + "=" + v);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  uint64_t max_frames_per_attempt_ = uint64_t{1} << 20;
  std::unique_ptr<MiniServer> server_;
  std::unique_ptr<pb::ShuffleService::Stub> stub_;
};

TEST_F(ServerTest, CreateIsIdempotentAndConflictsAreNamed) {
  bool created = false;
  ASSERT_OK(Create("s1", 4, 3, &created));
  EXPECT_TRUE(created);
  ASSERT_OK(Create("s1", 4, 3, &created));
  EXPECT_FALSE(created);
  grpc::Status st = Create("s1", 5, 3);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_NE(st.error_message().find("4 partitions"), std::string::npos) << st.error_message();
  EXPECT_EQ(Create("../etc", 1, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Create("zero", 0, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServerTest, PushedRecordsComeBackFromEveryPartition) {
  ASSERT_OK(Create("s", 4, 3));
  std::vector<std::thread> mappers;
  for (uint32_t m = 0; m < 3; ++m) {
    mappers.emplace_back([this, m] {
      pb::PushResponse resp;
      grpc::Status st = Push("s", m, 1, 4, 100, &resp);
      EXPECT_OK(st);
      EXPECT_FALSE(resp.duplicate());
      EXPECT_EQ(resp.records(), 400u);
    });
  }
  for (auto& t : mappers) t.join();
  for (uint32_t p = 0; p < 4; ++p) {
    std::vector<std::string> got;
    ASSERT_OK(FetchAll("s", p, &got, /*require_complete=*/true));
    EXPECT_EQ(got, Expected({0, 1, 2}, p, 100)) << "partition " << p;
  }
  const auto info = Info("s");
  EXPECT_EQ(info.committed_mappers_size(), 3);
  EXPECT_EQ(info.partitions(2).records(), 300u);
}

TEST_F(ServerTest, SecondCommittedAttemptIsADuplicate) {
  ASSERT_OK(Create("s", 2, 0));
  pb::PushResponse first, second;
  ASSERT_OK(Push("s", 7, 1, 2, 10, &first));
  ASSERT_OK(Push("s", 7, 2, 2, 10, &second));
  EXPECT_FALSE(first.duplicate());
  EXPECT_TRUE(second.duplicate());
  std::vector<std::string> got;
  ASSERT_OK(FetchAll("s", 1, &got));
  EXPECT_EQ(got, Expected({7}, 1, 10));  // once, not twice
}

// PushFlow: a frames message goes only within credit asked for and granted; the commit's
// response comes as the last reply.
TEST_F(ServerTest, PushFlowSendsWithinCreditAndSaysWhenAClientDoesNot) {
  ASSERT_OK(Create("s", 1, 0));
  const std::string frame = Frame(Rows(3, 0, 10));
  auto ask = [](uint64_t bytes) {
    pb::PushRequest m;
    m.mutable_ask()->set_bytes(bytes);
    return m;
  };
  {  // The rule kept: ask, get the credit, send; the commit answered as on Push.
    grpc::ClientContext ctx;
    auto stream = stub_->PushFlow(&ctx);
    ASSERT_TRUE(stream->Write(OpenMsg("s", 3)));
    const pb::PushRequest frames = FramesMsg(0, frame);
    ASSERT_TRUE(stream->Write(ask(frames.ByteSizeLong())));
    pb::PushReply reply;
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.credit(), frames.ByteSizeLong());
    ASSERT_TRUE(stream->Write(frames));
    ASSERT_TRUE(stream->Write(CommitMsg(1, 10)));
    stream->WritesDone();
    ASSERT_TRUE(stream->Read(&reply));
    ASSERT_TRUE(reply.has_done());
    EXPECT_EQ(reply.done().records(), 10u);
    EXPECT_FALSE(stream->Read(&reply));
    ASSERT_OK(stream->Finish());
  }
  // A frames message without credit, or past it: INVALID_ARGUMENT, the attempt discarded.
  for (const bool asks : {false, true}) {
    grpc::ClientContext ctx;
    auto stream = stub_->PushFlow(&ctx);
    ASSERT_TRUE(stream->Write(OpenMsg("s", 4)));
    if (asks) {
      ASSERT_TRUE(stream->Write(ask(10)));
      pb::PushReply reply;
      ASSERT_TRUE(stream->Read(&reply));
      EXPECT_EQ(reply.credit(), 10u);
    }
    stream->Write(FramesMsg(0, frame));
    stream->Write(CommitMsg(1, 10));
    stream->WritesDone();
    pb::PushReply reply;
    while (stream->Read(&reply)) {
    }
    const grpc::Status st = stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find(asks ? "with 10 bytes of credit" : "with 0 bytes of credit"),
              std::string::npos)
        << st.error_message();
  }
  // An ask past a message's size; an ask on Push.
  {
    grpc::ClientContext ctx;
    auto stream = stub_->PushFlow(&ctx);
    ASSERT_TRUE(stream->Write(OpenMsg("s", 5)));
    stream->Write(ask(uint64_t{64} << 20));
    stream->WritesDone();
    pb::PushReply reply;
    while (stream->Read(&reply)) {
    }
    const grpc::Status st = stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("an ask for 67108864 bytes"), std::string::npos)
        << st.error_message();
  }
  // A large frame: its size granted once its memory is promised, then its pieces within it.
  {
    grpc::ClientContext ctx;
    auto stream = stub_->PushFlow(&ctx);
    ASSERT_TRUE(stream->Write(OpenMsg("s", 7)));
    pb::PushRequest announce;
    announce.mutable_large_frame()->set_partition_id(0);
    announce.mutable_large_frame()->set_frame_size(frame.size());
    ASSERT_TRUE(stream->Write(announce));
    pb::PushReply reply;
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.credit(), frame.size());
    pb::PushRequest piece;
    piece.mutable_piece()->set_data(frame.substr(0, 10));
    ASSERT_TRUE(stream->Write(piece));
    piece.mutable_piece()->set_data(frame.substr(10));
    ASSERT_TRUE(stream->Write(piece));
    piece.mutable_piece()->set_data("x");  // one byte past its size
    stream->Write(piece);
    stream->WritesDone();
    while (stream->Read(&reply)) {
    }
    const grpc::Status st = stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("1-byte push message came with 0 bytes of credit"),
              std::string::npos)
        << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto writer = stub_->Push(&ctx, &resp);
    writer->Write(OpenMsg("s", 6));
    writer->Write(ask(10));
    writer->WritesDone();
    const grpc::Status st = writer->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("PushFlow"), std::string::npos) << st.error_message();
  }
  ASSERT_EQ(Info("s").committed_mappers_size(), 1);  // mapper 3's only
}

// Credit a client asked for and does not use goes back after --push_credit_timeout_s: a client
// that asks and sends nothing does not hold the budget for the whole push idle timeout.
TEST(PushFlowTest, UnusedCreditGoesBackAfterItsTimeout) {
  MiniServerOptions opts;
  opts.server.push_credit_timeout = std::chrono::seconds(1);
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(opts));
  auto stub = MakeStub(*server);
  {
    grpc::ClientContext ctx;
    pb::CreateShuffleRequest req;
    req.set_shuffle_id("s");
    req.set_num_partitions(1);
    pb::CreateShuffleResponse resp;
    ASSERT_OK(stub->CreateShuffle(&ctx, req, &resp));
  }
  MemoryBudget& budget = server->server()->memory_budget();
  grpc::ClientContext ctx;
  auto stream = stub->PushFlow(&ctx);
  ASSERT_TRUE(stream->Write(OpenMsg("s", 0)));
  pb::PushRequest ask;
  ask.mutable_ask()->set_bytes(100000);
  ASSERT_TRUE(stream->Write(ask));
  pb::PushReply reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.credit(), 100000u);
  EXPECT_EQ(budget.used(), 200000u) << "the message and gRPC's copy of it";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(stream->Read(&reply));
  const grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  EXPECT_NE(st.error_message().find("--push_credit_timeout_s"), std::string::npos)
      << st.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(testing::Eventually([&] { return budget.used() == 0; })) << budget.used();
}

TEST_F(ServerTest, ConcurrentCommitsAndRacingAttemptsEachCommitOnce) {
  // 12 mappers, 3 racing attempts each, all at once: commits are written in groups, and for
  // each mapper exactly one attempt wins, the others are told they are duplicates.
  ASSERT_OK(Create("g", 2, 12));
  std::vector<std::thread> threads;
  std::vector<pb::PushResponse> resp(36);
  std::vector<grpc::Status> st(36);
  for (int i = 0; i < 36; ++i) {
    threads.emplace_back(
        [&, i] { st[i] = Push("g", static_cast<uint32_t>(i % 12), 1 + i / 12, 2, 20, &resp[i]); });
  }
  for (auto& t : threads) t.join();
  std::vector<int> winners(12, 0);
  for (int i = 0; i < 36; ++i) {
    ASSERT_TRUE(st[i].ok()) << i << ": " << st[i].error_message();
    if (!resp[i].duplicate()) ++winners[i % 12];
  }
  for (int m = 0; m < 12; ++m) EXPECT_EQ(winners[m], 1) << "mapper " << m;
  std::vector<uint32_t> all(12);
  for (uint32_t m = 0; m < 12; ++m) all[m] = m;
  for (int round = 0; round < 2; ++round) {  // and the same after a restart
    for (uint32_t p = 0; p < 2; ++p) {
      std::vector<std::string> got;
      ASSERT_OK(FetchAll("g", p, &got, /*require_complete=*/true));
      EXPECT_EQ(got, Expected(all, p, 20));
    }
    RestartServer();
  }
}

TEST_F(ServerTest, StreamsThatEndWithoutCommitLeaveNothing) {
  ASSERT_OK(Create("s", 2, 0));
  {  // closed without a commit message
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto writer = stub_->Push(&ctx, &resp);
    writer->Write(OpenMsg("s", 1));
    writer->Write(FramesMsg(0, Frame(Rows(1, 0, 10))));
    writer->WritesDone();
    grpc::Status st = writer->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(st.error_message().find("without a commit"), std::string::npos);
  }
  {  // cancelled by the client mid-stream
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto writer = stub_->Push(&ctx, &resp);
    writer->Write(OpenMsg("s", 2));
    writer->Write(FramesMsg(1, Frame(Rows(2, 1, 10))));
    ctx.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_EQ(Info("s").committed_mappers_size(), 0);
  for (uint32_t p = 0; p < 2; ++p) {
    std::vector<std::string> got;
    ASSERT_OK(FetchAll("s", p, &got));
    EXPECT_TRUE(got.empty());
  }
}

TEST_F(ServerTest, BadInputIsRejectedWithANamedErrorAndOthersKeepWorking) {
  ASSERT_OK(Create("s", 2, 4));
  pb::PushResponse good;
  ASSERT_OK(Push("s", 0, 1, 2, 20, &good));

  pb::PushResponse resp;
  grpc::Status st = Push("nope", 0, 1, 2, 5, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  st = Push("s", 9, 1, 2, 5, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("mapper 9"), std::string::npos) << st.error_message();
  st = Push("s", 1, 1, 3, 5, &resp);  // a third partition in a 2-partition shuffle
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("partition 2"), std::string::npos) << st.error_message();
  st = Push("s", 1, 1, 2, 5, &resp, /*frame_count=*/7);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("commit says 7 frames"), std::string::npos)
      << st.error_message();
  {  // a corrupt frame
    grpc::ClientContext ctx;
    auto writer = stub_->Push(&ctx, &resp);
    writer->Write(OpenMsg("s", 2));
    std::string frame = Frame(Rows(2, 0, 5));
    frame[frame.size() - 1] ^= 1;
    writer->Write(FramesMsg(0, frame));
    writer->WritesDone();
    st = writer->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("frame 0 for partition 0"), std::string::npos)
        << st.error_message();
  }
  {  // a second open message
    grpc::ClientContext ctx;
    auto writer = stub_->Push(&ctx, &resp);
    writer->Write(OpenMsg("s", 3));
    writer->Write(OpenMsg("s", 3));
    writer->WritesDone();
    st = writer->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("second open"), std::string::npos);
  }
  // Committed data untouched, and the server still takes pushes.
  std::vector<std::string> got;
  ASSERT_OK(FetchAll("s", 0, &got));
  EXPECT_EQ(got, Expected({0}, 0, 20));
  ASSERT_OK(Push("s", 1, 2, 2, 20, &resp));
  EXPECT_EQ(Info("s").committed_mappers_size(), 2);
}

TEST_F(ServerTest, RequireCompleteSaysHowManyMappersAreMissing) {
  ASSERT_OK(Create("s", 1, 3));
  pb::PushResponse resp;
  ASSERT_OK(Push("s", 1, 1, 1, 5, &resp));
  std::vector<std::string> got;
  grpc::Status st = FetchAll("s", 0, &got, /*require_complete=*/true);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("2 of 3 mappers"), std::string::npos) << st.error_message();
  got.clear();
  EXPECT_OK(FetchAll("s", 0, &got, /*require_complete=*/false));
  EXPECT_EQ(got.size(), 5u);
}

TEST_F(ServerTest, RequireCompleteWithoutAMapperCountIsRefusedNotIgnored) {
  ASSERT_OK(Create("open-ended", 1, 0));
  pb::PushResponse resp;
  ASSERT_OK(Push("open-ended", 1, 1, 1, 5, &resp));
  std::vector<std::string> got;
  grpc::Status st = FetchAll("open-ended", 0, &got, /*require_complete=*/true);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("num_mappers = 0"), std::string::npos) << st.error_message();
  got.clear();
  EXPECT_OK(FetchAll("open-ended", 0, &got));
  EXPECT_EQ(got.size(), 5u);
}

TEST_F(ServerTest, FetchZstdLevelsAreBounded) {
  ASSERT_OK(Create("z", 1, 1));
  pb::PushResponse resp;
  ASSERT_OK(Push("z", 0, 1, 1, 50, &resp));
  for (uint32_t level : {9u, 10u, 22u, 4000000000u}) {
    grpc::ClientContext ctx;
    pb::FetchRequest req;
    req.set_shuffle_id("z");
    req.set_order(pb::KEY);
    req.set_zstd_level(level);
    auto reader = stub_->Fetch(&ctx, req);
    pb::FetchResponse r;
    size_t frames = 0;
    while (reader->Read(&r)) ++frames;
    grpc::Status st = reader->Finish();
    if (level <= 9) {
      EXPECT_OK(st);
      EXPECT_GT(frames, 0u);
    } else {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << level;
      EXPECT_NE(st.error_message().find("out of range [1, 9]"), std::string::npos)
          << st.error_message();
    }
  }
}

TEST_F(ServerTest, AttemptsPastTheFrameLimitAreRefusedAndNothingIsKept) {
  max_frames_per_attempt_ = 3;
  RestartServer();
  ASSERT_OK(Create("f", 1, 2));
  const std::string frame = Frame(Rows(0, 0, 2));
  grpc::Status st = PushFrames("f", 0, {frame, frame, frame, frame}, 8);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("--max_frames_per_attempt"), std::string::npos)
      << st.error_message();
  EXPECT_TRUE(PushFrames("f", 1, {frame, frame, frame}, 6).ok());  // at the limit: fine
  const pb::ShuffleInfo info = Info("f");
  ASSERT_EQ(info.committed_mappers_size(), 1);
  EXPECT_EQ(info.committed_mappers(0), 1u);
  EXPECT_EQ(info.partitions(0).frames(), 3u);
}

TEST_F(ServerTest, CommittedDataSurvivesARestart) {
  ASSERT_OK(Create("s", 3, 0));
  pb::PushResponse resp;
  ASSERT_OK(Push("s", 4, 1, 3, 50, &resp));
  ASSERT_OK(Push("s", 5, 1, 3, 50, &resp));
  RestartServer();
  const auto info = Info("s");
  EXPECT_EQ(info.committed_mappers_size(), 2);
  for (uint32_t p = 0; p < 3; ++p) {
    std::vector<std::string> got;
    ASSERT_OK(FetchAll("s", p, &got));
    EXPECT_EQ(got, Expected({4, 5}, p, 50));
  }
  // The recovered mapper still counts: a retry is a duplicate.
  ASSERT_OK(Push("s", 4, 2, 3, 50, &resp));
  EXPECT_TRUE(resp.duplicate());
}

TEST_F(ServerTest, DeletedShufflesAreGone) {
  ASSERT_OK(Create("s", 1, 0));
  pb::PushResponse resp;
  ASSERT_OK(Push("s", 0, 1, 1, 5, &resp));
  grpc::ClientContext ctx;
  pb::DeleteShuffleRequest req;
  req.set_shuffle_id("s");
  pb::DeleteShuffleResponse del;
  ASSERT_OK(stub_->DeleteShuffle(&ctx, req, &del));
  grpc::Status st;
  Info("s", &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  std::vector<std::string> got;
  EXPECT_EQ(FetchAll("s", 0, &got).error_code(), grpc::StatusCode::NOT_FOUND);
  RestartServer();
  Info("s", &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  // The id is free again, with nothing of the old shuffle in it.
  bool created = false;
  ASSERT_OK(Create("s", 2, 0, &created));
  EXPECT_TRUE(created);
  const auto info = Info("s", &st);
  ASSERT_OK(st);
  EXPECT_EQ(info.committed_mappers_size(), 0);
  EXPECT_EQ(info.partitions(0).records(), 0u);
}

TEST_F(ServerTest, AbsurdPartitionCountsAreRefused) {
  grpc::Status st = Create("huge", 1u << 20, 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("1 to 65536"), std::string::npos) << st.error_message();
}

// A 10,000-character id is INVALID_ARGUMENT naming its length on every call, not gRPC's
// RESOURCE_EXHAUSTED "metadata size exceeds limit" for a message that echoed it whole.
TEST_F(ServerTest, AnOverlongIdIsInvalidArgumentOnEveryCall) {
  const std::string id(10000, 'x');
  std::vector<grpc::Status> got;
  got.push_back(Create(id, 1, 0));
  {
    grpc::ClientContext ctx;
    pb::GetShuffleRequest req;
    req.set_shuffle_id(id);
    pb::ShuffleInfo resp;
    got.push_back(stub_->GetShuffle(&ctx, req, &resp));
  }
  {
    grpc::ClientContext ctx;
    pb::DeleteShuffleRequest req;
    req.set_shuffle_id(id);
    pb::DeleteShuffleResponse resp;
    got.push_back(stub_->DeleteShuffle(&ctx, req, &resp));
  }
  {
    grpc::ClientContext ctx;
    pb::FetchRequest req;
    req.set_shuffle_id(id);
    auto r = stub_->Fetch(&ctx, req);
    pb::FetchResponse chunk;
    while (r->Read(&chunk)) {
    }
    got.push_back(r->Finish());
  }
  {
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto w = stub_->Push(&ctx, &resp);
    w->Write(OpenMsg(id, 0));
    w->WritesDone();
    got.push_back(w->Finish());
  }
  for (const grpc::Status& st : got) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("10000 characters"), std::string::npos) << st.error_message();
  }
}

TEST_F(ServerTest, AFullMemoryBudgetSlowsPushesDownInsteadOfFailingThem) {
  RestartServer(/*budget=*/64 << 10);  // 64 KiB; each push message is ~100 KiB
  ASSERT_OK(Create("s", 4, 0));
  // The budget starts full (as if other streams held it) and empties once all four pushes
  // wait for it; then they all go through. (Without this, whether two messages were ever in
  // memory at once depended on how fast the server stored them.)
  MemoryBudget& budget = server_->server()->memory_budget();
  budget.Charge("", 1 << 20);
  const uint64_t parked = budget.parked_total();
  std::vector<std::thread> mappers;
  for (uint32_t m = 0; m < 4; ++m) {
    mappers.emplace_back([this, m] {
      pb::PushResponse resp;
      grpc::Status st = Push("s", m, 1, 4, 1000, &resp, -1, /*pad=*/100);
      EXPECT_OK(st);
    });
  }
  const bool all_waited = testing::Eventually([&] { return budget.parked_total() >= parked + 4; });
  budget.Release("", 1 << 20);
  for (auto& t : mappers) t.join();
  EXPECT_TRUE(all_waited) << budget.parked_total() - parked << " of 4 pushes waited";
  std::vector<std::string> got;
  ASSERT_OK(FetchAll("s", 3, &got));
  EXPECT_EQ(got.size(), 4000u);
}

// Large frames on the wire: a push message is at most 1 MiB of frames (a larger one is
// refused by its size before the server holds it); a larger frame is announced, and no piece
// of it is read until its whole size fits in the budget; a stream that ends in the middle of
// one gives its reservation back.
TEST_F(ServerTest, LargeFramesWaitForTheirWholeSizeAndGiveItBackWhenTheStreamEnds) {
  RestartServer(/*budget=*/8 << 20);
  ASSERT_OK(Create("s", 1, 0));
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  std::string value(3 << 20, '\0');
  for (char& c : value) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  const std::string frame = Frame({{"big", value}});
  ASSERT_GT(frame.size(), 3u << 20);
  MemoryBudget& budget = server_->server()->memory_budget();
  {  // In one message, as a client of the earlier protocol sent it: refused by its size.
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto w = stub_->Push(&ctx, &resp);
    w->Write(OpenMsg("s", 0));
    w->Write(FramesMsg(0, frame));
    w->WritesDone();
    const grpc::Status st = w->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  }
  {  // Announced while 6 of the 8 MiB are taken: it waits, holding nothing, then goes through.
    budget.Charge("", 6 << 20);
    const uint64_t parked = budget.parked_total();
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto w = stub_->Push(&ctx, &resp);
    ASSERT_TRUE(w->Write(OpenMsg("s", 1)));
    // Pieces of 256 KiB: the first ones fit in the stream's window (--stream_window_mb, 1 MiB),
    // so they are sent to the server whether it reads them or not.
    std::atomic<int> pieces_sent{0};
    std::thread pusher(
        [&] { EXPECT_TRUE(testing::WriteFrame(w.get(), 0, frame, 256 << 10, &pieces_sent)); });
    const bool waiting = testing::Eventually(
        [&] { return budget.parked_total() > parked && pieces_sent.load() >= 1; });
    // Then until the server has done all it would do with what it was sent: every thread of
    // this process asleep and staying so. A stream that read on into the frame before its
    // promise holds a piece of it then.
    const bool settled = waiting && testing::Eventually([] {
                           return testing::ThreadsParked(testing::OtherThreads());
                         });
    const uint64_t used = budget.used();
    budget.Release("", 6 << 20);
    pusher.join();
    ASSERT_TRUE(waiting) << "the large frame did not wait for the budget";
    ASSERT_TRUE(settled) << "the server did not settle";
    EXPECT_EQ(used, uint64_t{6} << 20) << "a piece was read before the frame fitted";
    pb::PushRequest commit;
    commit.mutable_commit()->set_frame_count(1);
    commit.mutable_commit()->set_record_count(1);
    ASSERT_TRUE(w->Write(commit));
    w->WritesDone();
    ASSERT_OK(w->Finish());
    EXPECT_FALSE(resp.duplicate());
  }
  {  // Cancelled after its first piece: the reservation comes back.
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto w = stub_->Push(&ctx, &resp);
    ASSERT_TRUE(w->Write(OpenMsg("s", 2)));
    pb::PushRequest msg;
    msg.mutable_large_frame()->set_partition_id(0);
    msg.mutable_large_frame()->set_frame_size(frame.size());
    ASSERT_TRUE(w->Write(msg));
    msg.mutable_piece()->set_data(frame.substr(0, 1 << 20));
    ASSERT_TRUE(w->Write(msg));
    ASSERT_TRUE(testing::Eventually([&] { return budget.used() >= frame.size(); }));
    ctx.TryCancel();
    (void)w->Finish();
    ASSERT_TRUE(testing::Eventually([&] { return budget.used() == 0; }))
        << budget.used() << " bytes still charged";
  }
  std::vector<std::string> got;
  ASSERT_OK(FetchAll("s", 0, &got));
  EXPECT_EQ(got.size(), 1u);
}

// Mapper m's frames: `frames` frames of `n` records, keys drawn from a small range (so keys
// repeat within and across mappers), values "m<m>-<arrival>". Odd frames are sorted by the
// encoder, even ones are left unsorted.
std::vector<std::string> KeyedFrames(uint32_t m, int frames, int n) {
  std::vector<std::string> out;
  uint64_t x = 0x9e3779b97f4a7c15ULL * (m + 3);
  int arrival = 0;
  for (int f = 0; f < frames; ++f) {
    std::vector<std::string> keys, values;
    for (int i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      keys.push_back("key" + std::to_string(x % 97));
      values.push_back("m" + std::to_string(m) + "-" + std::to_string(arrival++));
    }
    std::vector<Record> records;
    for (int i = 0; i < n; ++i) records.push_back(Record{keys[i], values[i]});
    EncodeOptions opts;
    opts.sort_by_key = f % 2 == 1;
    FrameEncoder enc(opts);
    std::string frame;
    EXPECT_OK(enc.Encode(records, &frame));
    out.push_back(frame);
  }
  return out;
}

TEST_F(ServerTest, KeyOrderMergesEveryRunStably) {
  for (size_t fan_in : {size_t{64}, size_t{3}}) {
    RestartServer(256ull << 20, fan_in);
    const std::string id = "k" + std::to_string(fan_in);
    ASSERT_OK(Create(id, 1, 0));
    std::vector<std::pair<std::string, std::string>> expected;
    // Expected stream: every record, stable-sorted by key over (mapper, frame, position).
    std::vector<std::tuple<std::string, uint32_t, size_t, std::string>> rows;
    for (uint32_t m : {3u, 0u, 2u, 1u}) {  // pushed out of mapper order
      const auto frames = KeyedFrames(m, 5, 40);
      ASSERT_OK(PushFrames(id, m, frames, 5 * 40));
      // Re-derive (key, value) in stored order by decoding what we pushed.
      FrameDecoder dec;
      DecodedFrame frame;
      size_t seq = 0;
      for (const std::string& f : frames) {
        ASSERT_OK(dec.Decode(f, &frame));
        std::vector<size_t> idx(frame.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        std::stable_sort(idx.begin(), idx.end(),
                         [&](size_t a, size_t b) { return KeyLess(frame[a].key, frame[b].key); });
        for (size_t i : idx) {
          rows.emplace_back(std::string(frame[i].key), m, seq++, std::string(frame[i].value));
        }
      }
    }
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      const int c = CompareKeys(std::get<0>(a), std::get<0>(b));
      if (c != 0) return c < 0;
      if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) < std::get<1>(b);
      return std::get<2>(a) < std::get<2>(b);
    });
    for (const auto& r : rows) expected.emplace_back(std::get<0>(r), std::get<3>(r));
    std::vector<std::pair<std::string, std::string>> got;
    ASSERT_OK(FetchKeyOrder(id, &got));
    EXPECT_EQ(got, expected) << "fan-in " << fan_in;
  }
}

TEST_F(ServerTest, KeyOrderUsesTheRequestedLayoutAndChunkSize) {
  ASSERT_OK(Create("s", 1, 0));
  ASSERT_OK(PushFrames("s", 0, KeyedFrames(0, 3, 200), 600));
  std::vector<std::pair<std::string, std::string>> got;
  std::vector<FrameHeader> headers;
  ASSERT_TRUE(FetchKeyOrder("s", &got, &headers, pb::LAYOUT_OPAQUE, /*uncompressed=*/true,
                            /*chunk=*/2000)
                  .ok());
  EXPECT_EQ(got.size(), 600u);
  EXPECT_GT(headers.size(), 3u);  // ~14 bytes a record, 2000-byte chunks
  for (const FrameHeader& h : headers) {
    EXPECT_EQ(h.layout, Layout::kOpaque);
    EXPECT_EQ(h.compression, Compression::kNone);
    EXPECT_TRUE(h.sorted_by_key());
  }
  for (size_t i = 1; i < got.size(); ++i) EXPECT_FALSE(KeyLess(got[i].first, got[i - 1].first));
}

TEST_F(ServerTest, TenThousandRunsAreMergedWithinTheFanIn) {
  RestartServer(256ull << 20, /*fan_in=*/64);
  ASSERT_OK(Create("many", 1, 0));
  // One attempt of 10,000 one-record frames: 10,000 runs, 157 times the fan-in.
  std::vector<std::string> frames;
  for (int i = 0; i < 10000; ++i) {
    const std::string key = "k" + std::to_string((i * 7919) % 10000);
    const std::string value = std::to_string(i);
    FrameEncoder enc;
    std::string frame;
    ASSERT_OK(enc.Encode({Record{key, value}}, &frame));
    frames.push_back(std::move(frame));
  }
  ASSERT_OK(PushFrames("many", 0, frames, 10000));
  std::vector<std::pair<std::string, std::string>> got;
  ASSERT_OK(FetchKeyOrder("many", &got));
  ASSERT_EQ(got.size(), 10000u);
  for (size_t i = 1; i < got.size(); ++i) ASSERT_FALSE(KeyLess(got[i].first, got[i - 1].first));
}

TEST_F(ServerTest, KeyFetchesBeyondTheMergeLimitWaitTheirTurn) {
  RestartServer(256ull << 20, 64, kDefaultMaxUncompressedBytes, /*merges=*/1);
  for (int s = 0; s < 4; ++s) {
    const std::string id = "q" + std::to_string(s);
    ASSERT_OK(Create(id, 1, 0));
    ASSERT_OK(PushFrames(id, 0, KeyedFrames(0, 4, 300), 1200));
  }
  std::vector<std::thread> readers;
  std::atomic<int> ok{0};
  for (int s = 0; s < 4; ++s) {
    readers.emplace_back([this, s, &ok] {
      std::vector<std::pair<std::string, std::string>> got;
      if (FetchKeyOrder("q" + std::to_string(s), &got).ok() && got.size() == 1200) ++ok;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(ok.load(), 4);
}

TEST_F(ServerTest, FramesOverTheSizeCapAreRejected) {
  RestartServer(256ull << 20, 64, /*max_frame_bytes=*/4096);
  ASSERT_OK(Create("s", 1, 0));
  FrameEncoder enc;  // (the client's own cap is the default 64 MiB)
  std::string frame;
  ASSERT_OK(enc.Encode({Record{"k", std::string(10000, 'x')}}, &frame));
  grpc::Status st = PushFrames("s", 0, {frame}, 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("exceeds the cap of 4096"), std::string::npos)
      << st.error_message();
}

// An uncompressed OPAQUE frame of one record whose payload is exactly `payload` bytes.
std::string FrameWithPayload(size_t payload, char fill) {
  EncodeOptions opts;
  opts.layout = LayoutChoice::kOpaque;
  opts.compression = Compression::kNone;
  FrameEncoder enc(opts);
  std::string value(payload, fill), frame;
  for (;;) {  // the record's length prefix takes a few bytes: shrink the value by what is over
    frame.clear();
    EXPECT_OK(enc.Encode({Record{"k", value}}, &frame));
    const size_t got = frame.size() - kFrameHeaderSize;
    if (got <= payload) {
      EXPECT_EQ(got, payload);
      return frame;
    }
    value.resize(value.size() - (got - payload));
  }
}

// A frame whose payload is within 32 bytes of the cap is accepted and committed, though its
// block (frame header included) is then over the cap. Recovery must never refuse committed
// data (the shuffle's, other mappers' included) because of a limit that applies to new input:
// not at the next start, and not after the cap is lowered across a restart.
TEST_F(ServerTest, AFrameAtTheCapSurvivesRestartsAndALowerCap) {
  constexpr uint32_t kCap = 1 << 20;
  RestartServer(256ull << 20, 64, kCap);
  ASSERT_OK(Create("cap", 1, 3));
  const std::string big = FrameWithPayload(kCap - 8, 'x');
  ASSERT_GT(big.size(), kCap);  // the block that stores it is over the cap
  FrameDecoder dec;
  DecodedFrame decoded;
  ASSERT_OK(dec.Decode(big, &decoded));
  const size_t big_value = decoded[0].value.size();
  ASSERT_OK(PushFrames("cap", 0, {big}, 1));
  ASSERT_OK(PushFrames("cap", 1, {Frame(Rows(1, 0, 20))}, 20));
  const auto check = [&](const char* when) {
    grpc::Status st;
    const pb::ShuffleInfo info = Info("cap", &st);
    ASSERT_OK(st) << when;
    EXPECT_EQ(info.committed_mappers_size(), 2) << when;
    std::vector<std::string> got;
    ASSERT_OK(FetchAll("cap", 0, &got)) << when;
    EXPECT_EQ(got.size(), 21u) << when;
    std::vector<std::pair<std::string, std::string>> merged;
    ASSERT_OK(FetchKeyOrder("cap", &merged)) << when;
    ASSERT_EQ(merged.size(), 21u) << when;
    EXPECT_EQ(merged[0].first, "k") << when;  // sorts first
    EXPECT_TRUE(merged[0].second == std::string(big_value, 'x')) << when;
  };
  check("before a restart");
  RestartServer(256ull << 20, 64, kCap);
  check("after a restart");
  RestartServer(256ull << 20, 64, kCap / 16);  // the operator lowers the cap
  check("after a restart with a lower cap");
  // The lower cap applies to new input.
  EXPECT_THAT(PushFrames("cap", 2, {FrameWithPayload(kCap / 8, 'y')}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds the cap"));
}

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

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

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
