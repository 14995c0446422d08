// The service end to end: a real SluiceServer on 127.0.0.1:0 with a real temporary data
// directory, called through the generated gRPC stub. Here: creating shuffles, pushing and
// committing (Push and PushFlow's credit, racing attempts, bad input, the frame and memory
// limits, large frames), restarts and deletes. (Fetches and KEY order: server_fetch_test.cc;
// damage, the open-shuffle limit, full disks and listing: server_damage_test.cc.)
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server/runtime/memory_budget.h"
#include "server/sluice_server.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/parked_threads.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"
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
namespace pb = sluice::v1;

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

}  // namespace
}  // namespace sluice
