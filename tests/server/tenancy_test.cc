// Tenants (--auth_file): the id rules and quota lines on their own, the bytes a tenant's stores
// hold as they change, then real servers where tenant B can neither see, read, push to, commit
// in nor delete tenant A's shuffles, an admin sees and deletes everything, quotas refuse what
// passes them (and nothing committed is touched), and reflection can be turned off.
#include "server/security/tenancy.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/frame_encoder.h"
#include "rpc/tls_options.h"
#include "server/storage/shuffle_registry.h"
#include "tests/harness/frames.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice::testing {
namespace {

constexpr char kTokenA[] = "slc_token-of-tenant-a";
constexpr char kTokenB[] = "slc_token-of-tenant-b";
constexpr char kTokenOps[] = "slc_token-of-the-operators";

// A server with tenants team-a and team-b and the operators (admin).
class TenantServerTest : public ::testing::Test {
 protected:
  void StartServer(const std::string& extra_lines, MiniServerOptions o = {}) {
    file_ = dir_.path() + "/credentials";
    std::ofstream(file_) << rpc::TokenHash(kTokenA) << " team-a tenant\n"
                         << rpc::TokenHash(kTokenB) << " team-b tenant\n"
                         << rpc::TokenHash(kTokenOps) << " ops admin\n"
                         << extra_lines;
    o.server.auth_file = file_;
    ASSERT_OK_AND_ASSIGN(server_, MiniServer::Start(o));
  }
  std::unique_ptr<ShuffleClient> Client(const std::string& token) {
    ClientOptions o;
    o.token = token;
    auto c = server_->Client(o);
    EXPECT_OK(c.status());
    return c.ok() ? *std::move(c) : nullptr;
  }
  // Mapper `mapper`'s attempt of shuffle `id`: `n` records of ~`value_bytes` each, spread
  // over partitions 0 and 1.
  static absl::StatusOr<WriteResult> Write(ShuffleClient& c, const std::string& id, uint32_t mapper,
                                           uint64_t attempt, int n, size_t value_bytes = 16) {
    SLUICE_ASSIGN_OR_RETURN(auto w, c.OpenWriter(id, mapper, attempt, {}));
    for (int i = 0; i < n; ++i) {
      std::string value =
          RandomValueFrame(value_bytes, mapper * 1000003 + i).substr(0, value_bytes);
      SLUICE_RETURN_IF_ERROR(w->Add(absl::StrCat("m", mapper, "-", i), value));
    }
    return w->Close();
  }
  // Records of one partition, or the error.
  static absl::StatusOr<size_t> Count(ShuffleClient& c, const std::string& id, uint32_t partition) {
    SLUICE_ASSIGN_OR_RETURN(auto r, c.OpenReader(id, partition, {}));
    size_t n = 0;
    Record rec;
    while (true) {
      SLUICE_ASSIGN_OR_RETURN(bool more, r->Next(&rec));
      if (!more) return n;
      ++n;
    }
  }
  static void ExpectSaysNothingOfA(const absl::Status& st) {
    EXPECT_EQ(st.message().find("team-a"), absl::string_view::npos) << st;
    EXPECT_EQ(st.message().find('~'), absl::string_view::npos) << st;
  }

  TempDir dir_;
  std::string file_;
  std::unique_ptr<MiniServer> server_;
};

TEST_F(TenantServerTest, TenantBCannotSeeReadPushToCommitInOrDeleteTenantAsShuffle) {
  StartServer("");
  auto a = Client(kTokenA);
  auto b = Client(kTokenB);
  auto ops = Client(kTokenOps);
  ASSERT_OK(a->CreateShuffle("job", 2, 2).status());
  ASSERT_OK(Write(*a, "job", 0, 1, 50).status());

  // Not there for B, whichever way it asks; nothing B is told names A or A's prefix.
  ASSERT_OK_AND_ASSIGN(auto listed, b->ListShuffles());
  EXPECT_TRUE(listed.empty());
  for (absl::Status st :
       {b->GetShuffle("job").status(), Count(*b, "job", 0).status(), b->DeleteShuffle("job"),
        b->GetPlacement("job").status(), Write(*b, "job", 1, 7, 5).status()}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
    ExpectSaysNothingOfA(st);
  }
  // The raw name is no way in either.
  absl::Status raw = b->GetShuffle("team-a~job").status();
  EXPECT_EQ(raw.code(), absl::StatusCode::kInvalidArgument) << raw;
  // B's forged commit of A's mapper 1 (the bare CommitMapper call, then a whole push) took
  // nothing: A's own commit of mapper 1 is the first, not a duplicate.
  {
    auto stub = MakeStub(*server_);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kTokenB));
    v1::CommitMapperRequest req;
    req.set_shuffle_id("job");
    req.set_mapper_id(1);
    req.set_attempt_id(9);
    v1::CommitMapperResponse resp;
    grpc::Status st = stub->CommitMapper(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  }
  ASSERT_OK_AND_ASSIGN(WriteResult mine, Write(*a, "job", 1, 1, 50));
  EXPECT_FALSE(mine.duplicate);
  // B may use the same name: its own shuffle, apart from A's.
  ASSERT_OK(b->CreateShuffle("job", 4, 1).status());
  ASSERT_OK(Write(*b, "job", 0, 1, 10).status());
  ASSERT_OK_AND_ASSIGN(ShuffleStatus as, a->GetShuffle("job"));
  EXPECT_EQ(as.shuffle_id, "job");
  EXPECT_EQ(as.num_partitions, 2u);
  ASSERT_OK_AND_ASSIGN(size_t a0, Count(*a, "job", 0));
  ASSERT_OK_AND_ASSIGN(size_t a1, Count(*a, "job", 1));
  EXPECT_EQ(a0 + a1, 100u);
  ASSERT_OK_AND_ASSIGN(ShuffleStatus bs, b->GetShuffle("job"));
  EXPECT_EQ(bs.num_partitions, 4u);
  // A's errors speak of its own ids, without the prefix.
  absl::Status again = a->CreateShuffle("job", 3, 2).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.message().find("shuffle 'job'"), absl::string_view::npos) << again;
  ExpectSaysNothingOfA(again);

  // The operators see both, by their full names, and may delete either.
  ASSERT_OK_AND_ASSIGN(auto all, ops->ListShuffles());
  std::vector<std::string> ids;
  for (const ShuffleStatus& s : all) ids.push_back(s.shuffle_id);
  EXPECT_EQ(ids, (std::vector<std::string>{"team-a~job", "team-b~job"}));
  ASSERT_OK(ops->DeleteShuffle("team-b~job"));
  EXPECT_EQ(b->GetShuffle("job").status().code(), absl::StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(ShuffleStatus still, a->GetShuffle("job"));
  EXPECT_EQ(still.committed_mappers.size(), 2u);
  // And a tenant's node view counts its own shuffles only, and says nothing of what the data
  // directories hold (every tenant's shuffles).
  ASSERT_OK_AND_ASSIGN(NodeStatus node, b->GetNode());
  EXPECT_EQ(node.shuffles, 0u);
  ASSERT_OK_AND_ASSIGN(NodeStatus node_a, a->GetNode());
  EXPECT_EQ(node_a.shuffles, 1u);
  ASSERT_EQ(node_a.data_dirs.size(), 1u);
  EXPECT_EQ(node_a.data_dirs[0].shuffles, 0u);
  ASSERT_OK_AND_ASSIGN(NodeStatus node_ops, ops->GetNode());
  EXPECT_EQ(node_ops.data_dirs[0].shuffles, 1u);
}

TEST_F(TenantServerTest, ListingsPageThroughATenantsOwnShufflesOnly) {
  StartServer("");
  auto a = Client(kTokenA);
  auto b = Client(kTokenB);
  for (const char* id : {"x1", "x2", "x3"}) ASSERT_OK(a->CreateShuffle(id, 1, 1).status());
  for (const char* id : {"a0", "x15", "zz"}) ASSERT_OK(b->CreateShuffle(id, 1, 1).status());
  auto stub = MakeStub(*server_);
  std::vector<std::string> seen;
  std::string token;
  do {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kTokenA));
    v1::ListShufflesRequest req;
    req.set_page_size(1);
    req.set_page_token(token);
    v1::ListShufflesResponse resp;
    grpc::Status st = stub->ListShuffles(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    for (const auto& s : resp.shuffles()) seen.push_back(s.shuffle_id());
    token = resp.next_page_token();
  } while (!token.empty() && seen.size() < 10);
  EXPECT_EQ(seen, (std::vector<std::string>{"x1", "x2", "x3"}));
}

TEST_F(TenantServerTest, ShuffleQuotaRefusesTheNextShuffleOnly) {
  StartServer("quota team-a shuffles=2\n");
  auto a = Client(kTokenA);
  auto b = Client(kTokenB);
  ASSERT_OK(a->CreateShuffle("s1", 1, 1).status());
  ASSERT_OK(a->CreateShuffle("s2", 1, 1).status());
  absl::Status st = a->CreateShuffle("s3", 1, 1).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("its quota (shuffles"), absl::string_view::npos) << st;
  // Asking again for one it has is no new shuffle; others' shuffles do not count.
  ASSERT_OK_AND_ASSIGN(bool created, a->CreateShuffle("s2", 1, 1));
  EXPECT_FALSE(created);
  for (int i = 0; i < 3; ++i) ASSERT_OK(b->CreateShuffle(absl::StrCat("b", i), 1, 1).status());
  ASSERT_OK(a->DeleteShuffle("s1"));
  EXPECT_OK(a->CreateShuffle("s3", 1, 1).status());
}

TEST_F(TenantServerTest, StoredBytesQuotaStopsPushesAndKeepsWhatIsCommitted) {
  StartServer("quota team-a stored_mb=1\n");
  auto a = Client(kTokenA);
  auto b = Client(kTokenB);
  auto ops = Client(kTokenOps);
  ASSERT_OK(a->CreateShuffle("s", 2, 4).status());
  // ~400 KiB of incompressible values: under the quota.
  ASSERT_OK(Write(*a, "s", 0, 1, 100, 4000).status());
  ASSERT_OK_AND_ASSIGN(size_t before0, Count(*a, "s", 0));
  ASSERT_OK_AND_ASSIGN(size_t before1, Count(*a, "s", 1));
  // ~800 KiB more would pass it: refused, the attempt discarded.
  absl::Status st = Write(*a, "s", 1, 1, 200, 4000).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("its quota of 1048576"), absl::string_view::npos) << st;
  EXPECT_NE(st.message().find("stored_mb"), absl::string_view::npos) << st;
  ASSERT_OK_AND_ASSIGN(ShuffleStatus s, a->GetShuffle("s"));
  EXPECT_EQ(s.committed_mappers, (std::vector<uint32_t>{0}));
  ASSERT_OK_AND_ASSIGN(size_t after0, Count(*a, "s", 0));
  ASSERT_OK_AND_ASSIGN(size_t after1, Count(*a, "s", 1));
  EXPECT_EQ(after0 + after1, before0 + before1);
  EXPECT_EQ(after0 + after1, 100u);
  // The refused attempt gave its bytes back: a small one fits; other tenants and the operators
  // are not held to team-a's quota.
  EXPECT_OK(Write(*a, "s", 2, 1, 20, 4000).status());
  ASSERT_OK(b->CreateShuffle("s", 2, 1).status());
  EXPECT_OK(Write(*b, "s", 0, 1, 400, 4000).status());
  ASSERT_OK(ops->CreateShuffle("mine", 2, 1).status());
  EXPECT_OK(Write(*ops, "mine", 0, 1, 400, 4000).status());
  // Deleting gives room again.
  ASSERT_OK(a->DeleteShuffle("s"));
  ASSERT_OK(a->CreateShuffle("t", 2, 1).status());
  EXPECT_OK(Write(*a, "t", 0, 1, 200, 4000).status());
}

// An open push stream of `token`'s (opened, not committed), held until destroyed.
struct OpenPush {
  OpenPush(v1::ShuffleService::Stub& stub, const std::string& token, const std::string& id,
           uint32_t mapper) {
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    w = stub.Push(&ctx, &resp);
    v1::PushRequest msg;
    msg.mutable_open()->set_shuffle_id(id);
    msg.mutable_open()->set_mapper_id(mapper);
    msg.mutable_open()->set_attempt_id(1);
    w->Write(msg);
  }
  grpc::Status End() {
    w->WritesDone();
    return w->Finish();
  }
  grpc::ClientContext ctx;
  v1::PushResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::PushRequest>> w;
};

TEST_F(TenantServerTest, ALargeFrameHoldsItsBytesAgainstTheQuotaWhileItArrives) {
  StartServer("quota team-a stored_mb=2\n");
  auto a = Client(kTokenA);
  ASSERT_OK(a->CreateShuffle("s", 1, 2).status());
  const std::string big = RandomValueFrame(1200 << 10, 7);  // sent in pieces: announced first
  auto stub = MakeStub(*server_);
  // The first stream announces its frame and holds it, pieces not sent yet.
  OpenPush first(*stub, kTokenA, "s", 0);
  v1::PushRequest announce;
  announce.mutable_large_frame()->set_partition_id(0);
  announce.mutable_large_frame()->set_frame_size(big.size());
  ASSERT_TRUE(first.w->Write(announce));
  // Taken once the server holds memory for it (the quota bytes are reserved just before).
  ASSERT_TRUE(testing::Eventually([&] {
    auto node = a->GetNode();
    return node.ok() && node->memory_used_bytes >= big.size();
  }));
  // A second announce of 1.2 MiB no longer fits beside it.
  OpenPush probe(*stub, kTokenA, "s", 1);
  probe.w->Write(announce);
  grpc::Status second = probe.End();
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.error_message();
  EXPECT_NE(second.error_message().find("stored_mb"), std::string::npos);
  // The first goes on and commits.
  for (size_t at = 0; at < big.size(); at += 1 << 20) {
    v1::PushRequest piece;
    piece.mutable_piece()->set_data(big.substr(at, 1 << 20));
    ASSERT_TRUE(first.w->Write(piece));
  }
  v1::PushRequest commit;
  commit.mutable_commit()->set_frame_count(1);
  commit.mutable_commit()->set_record_count(1);
  ASSERT_TRUE(first.w->Write(commit));
  grpc::Status committed = first.End();
  ASSERT_TRUE(committed.ok()) << committed.error_message();
  ASSERT_OK_AND_ASSIGN(ShuffleStatus st, a->GetShuffle("s"));
  EXPECT_EQ(st.committed_mappers, (std::vector<uint32_t>{0}));
  // A stream that announces a second frame before the first is whole is refused, and holds
  // nothing after: mapper 1's frame fits in what is left.
  ASSERT_OK(a->DeleteShuffle("s"));
  ASSERT_OK(a->CreateShuffle("s", 1, 2).status());
  {
    OpenPush twice(*stub, kTokenA, "s", 0);
    twice.w->Write(announce);
    twice.w->Write(announce);
    EXPECT_FALSE(twice.End().ok());
  }
  OpenPush third(*stub, kTokenA, "s", 1);
  ASSERT_TRUE(WriteFrame(third.w.get(), 0, big));
  ASSERT_TRUE(third.w->Write(commit));
  grpc::Status fits = third.End();
  EXPECT_TRUE(fits.ok()) << fits.error_message();
}

// A token taken out of the credentials while its push stream is open commits nothing: the
// commit checks the credentials again.
TEST_F(TenantServerTest, ARevokedTokensOpenPushStreamCommitsNothing) {
  StartServer("");
  auto a = Client(kTokenA);
  ASSERT_OK(a->CreateShuffle("job", 1, 1).status());
  auto stub = MakeStub(*server_);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kTokenA));
  v1::PushResponse resp;
  auto w = stub->Push(&ctx, &resp);
  v1::PushRequest msg;
  msg.mutable_open()->set_shuffle_id("job");
  msg.mutable_open()->set_mapper_id(0);
  msg.mutable_open()->set_attempt_id(1);
  ASSERT_TRUE(w->Write(msg));
  ASSERT_TRUE(WriteFrame(w.get(), 0, EncodeRows({{"k", "v"}})));
  // (The stream is in: its credentials were taken at its open.)
  ASSERT_TRUE(Eventually([&] { return server_->server()->open_push_streams() == 1; }));
  // Team-a's token goes; the server reads the file again.
  std::ofstream(file_) << rpc::TokenHash(kTokenB) << " team-b tenant\n"
                       << rpc::TokenHash(kTokenOps) << " ops admin\n";
  server_->server()->ReloadFiles();
  EXPECT_EQ(Client(kTokenA)->GetShuffle("job").status().code(), absl::StatusCode::kUnauthenticated);
  msg.Clear();
  msg.mutable_commit()->set_frame_count(1);
  msg.mutable_commit()->set_record_count(1);
  w->Write(msg);
  w->WritesDone();
  const grpc::Status st = w->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(st.error_message().find("checked again at the commit"), std::string::npos)
      << st.error_message();
  ASSERT_OK_AND_ASSIGN(ShuffleStatus info, Client(kTokenOps)->GetShuffle("team-a~job"));
  EXPECT_TRUE(info.committed_mappers.empty());
}

// The same for a fetch: a revoked token's open fetch is ended with its next chunk after the
// reload, instead of running to its end (the server checks at every chunk here; at most once a
// second by default, which FetchStreamTest checks with its clock).
TEST_F(TenantServerTest, ARevokedTokensOpenFetchIsEnded) {
  MiniServerOptions o;
  o.server.caller_recheck = std::chrono::milliseconds(0);
  StartServer("", o);
  auto a = Client(kTokenA);
  ASSERT_OK(a->CreateShuffle("job", 1, 1).status());
  {
    WriterOptions w;
    w.buffer_bytes = w.frame_bytes = size_t{1} << 20;  // ~1 MiB frames: 8 chunks
    ASSERT_OK_AND_ASSIGN(auto writer, a->OpenWriter("job", 0, 1, w));
    std::mt19937_64 rng(7);
    std::string value(128 << 10, '\0');
    for (int i = 0; i < 256; ++i) {  // 32 MiB that zstd cannot shrink: more than gRPC sends ahead
      for (char& c : value) c = static_cast<char>(rng());
      ASSERT_OK(writer->Add(absl::StrCat("k", i), value));
    }
    ASSERT_OK(writer->Close().status());
  }
  auto stub = MakeStub(*server_);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kTokenA));
  v1::FetchRequest req;
  req.set_shuffle_id("job");
  req.set_partition_id(0);
  auto r = stub->Fetch(&ctx, req);
  v1::FetchResponse chunk;
  ASSERT_TRUE(r->Read(&chunk)) << r->Finish().error_message();
  std::ofstream(file_) << rpc::TokenHash(kTokenB) << " team-b tenant\n"
                       << rpc::TokenHash(kTokenOps) << " ops admin\n";
  server_->server()->ReloadFiles();
  size_t records = DecodeRows(chunk.frame()).size();
  while (r->Read(&chunk)) records += DecodeRows(chunk.frame()).size();
  const grpc::Status st = r->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(st.error_message().find("checked again during the fetch"), std::string::npos)
      << st.error_message();
  EXPECT_LT(records, 256u) << "the fetch ran to its end after its token was revoked";
}

TEST_F(TenantServerTest, StreamQuotaCountsPushesAndFetchesTogether) {
  MiniServerOptions o;
  o.server.tenant_max_streams = 2;  // the flag: team-a has no quota line
  StartServer("", o);
  auto a = Client(kTokenA);
  auto b = Client(kTokenB);
  ASSERT_OK(a->CreateShuffle("s", 1, 8).status());
  ASSERT_OK(Write(*a, "s", 7, 1, 10).status());
  ASSERT_OK(b->CreateShuffle("s", 1, 8).status());
  auto stub = MakeStub(*server_);
  auto p1 = std::make_unique<OpenPush>(*stub, kTokenA, "s", 0);
  auto p2 = std::make_unique<OpenPush>(*stub, kTokenA, "s", 1);
  // Both taken by the server before the third comes (streams start asynchronously).
  ASSERT_TRUE(testing::Eventually([&] {
    auto node = b->GetNode();
    return node.ok() && node->push_streams == 2;
  }));
  OpenPush p3(*stub, kTokenA, "s", 2);
  grpc::Status third = p3.End();
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_NE(third.error_message().find("its quota (streams"), std::string::npos);
  absl::Status fetch = Count(*a, "s", 0).status();
  EXPECT_EQ(fetch.code(), absl::StatusCode::kResourceExhausted) << fetch;
  // Another tenant is not held up by team-a's streams.
  EXPECT_OK(Write(*b, "s", 0, 1, 10).status());
  // One ends: a stream is free again.
  p1->End();
  p1.reset();
  absl::StatusOr<size_t> n;
  for (int i = 0; i < 50; ++i) {  // the server counts the stream out once it is done with it
    n = Count(*a, "s", 0);
    if (n.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_OK(n.status());
  EXPECT_EQ(*n, 10u);
  p2->End();
}

// One call of server reflection (list the services): OK, or the call's error.
grpc::Status ListServicesByReflection(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* t) {
    cq.Next(&tag, &ok);
    EXPECT_EQ(tag, t);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  step(reinterpret_cast<void*>(1));
  const std::string request("\x3a\x00", 2);  // list_services: ""
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1), in;
  call->Write(out, reinterpret_cast<void*>(2));
  step(reinterpret_cast<void*>(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  step(reinterpret_cast<void*>(3));
  while (true) {
    call->Read(&in, reinterpret_cast<void*>(4));
    if (!step(reinterpret_cast<void*>(4))) break;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(reinterpret_cast<void*>(5));
  return status;
}

TEST(ReflectionTest, CanBeTurnedOff) {
  // Child processes: the daemon's flag itself.
  MiniServerOptions off;
  off.child_process = true;
  off.server.reflection = false;
  ASSERT_OK_AND_ASSIGN(auto quiet, MiniServer::Start(off));
  EXPECT_EQ(ListServicesByReflection(quiet->address()).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  MiniServerOptions on;
  on.child_process = true;
  ASSERT_OK_AND_ASSIGN(auto open, MiniServer::Start(on));
  grpc::Status st = ListServicesByReflection(open->address());
  EXPECT_TRUE(st.ok()) << st.error_message();
  // In one process too: one server without it beside one with it.
  MiniServerOptions in_process;
  in_process.server.reflection = false;
  ASSERT_OK_AND_ASSIGN(auto quiet_here, MiniServer::Start(in_process));
  ASSERT_OK_AND_ASSIGN(auto open_here, MiniServer::Start());
  EXPECT_EQ(ListServicesByReflection(quiet_here->address()).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(ListServicesByReflection(open_here->address()).ok());
}

}  // namespace
}  // namespace sluice::testing
