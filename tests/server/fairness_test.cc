// One tenant cannot stop the others (docs/operations.md, "Memory"): on a real server with
// tenants team-a and team-b, team-a holds the memory budget every way a client can without
// sending data (large frames announced and never sent, fetches never read), and team-b's
// pushes still go through in about the time they take alone.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rpc/tls_options.h"
#include "server/runtime/memory_budget.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/frames.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"
#include "tests/harness/temp_dir.h"
#include "tests/harness/wait.h"

namespace sluice::testing {
namespace {

namespace pb = sluice::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr char kTokenA[] = "slc_token-of-tenant-a";
constexpr char kTokenB[] = "slc_token-of-tenant-b";
constexpr uint64_t kBudget = 32 << 20;

class FairnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.path() + "/credentials") << rpc::TokenHash(kTokenA) << " team-a tenant\n"
                                                << rpc::TokenHash(kTokenB) << " team-b tenant\n";
    StartServer([](ServerOptions&) {});
  }

  // A server with both tenants (a 32 MiB budget, 30 s idle pushes, 60 s stalled fetches, then
  // `set`), team-b's client and its shuffle "b" (one partition).
  void StartServer(const std::function<void(ServerOptions&)>& set) {
    server_.reset();
    MiniServerOptions o;
    o.server.auth_file = dir_.path() + "/credentials";
    o.server.memory_budget_bytes = kBudget;
    o.server.push_idle_timeout = seconds(30);
    o.server.fetch_stall_timeout = seconds(60);
    set(o.server);
    ASSERT_OK_AND_ASSIGN(server_, MiniServer::Start(o));
    stub_ = MakeStub(*server_);
    ClientOptions co;
    co.token = kTokenB;
    ASSERT_OK_AND_ASSIGN(b_, server_->Client(co));
    ASSERT_OK(b_->CreateShuffle("b", 1, 0).status());
  }

  std::unique_ptr<grpc::ClientContext> As(const char* token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    return ctx;
  }

  // Team-b's one-record push (a new mapper each time), timed.
  absl::StatusOr<Clock::duration> PushB() {
    const auto start = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(auto w, b_->OpenWriter("b", next_mapper_++, 1, {}));
    SLUICE_RETURN_IF_ERROR(w->Add("key", "value"));
    SLUICE_RETURN_IF_ERROR(w->Close().status());
    return Clock::now() - start;
  }

  // Team-b's pushes while the attack holds: each within `limit` (alone they take milliseconds;
  // without fairness each waits for the attack's streams to time out, 30 s here).
  void ExpectBUnhindered(milliseconds limit) {
    for (int i = 0; i < 5; ++i) {
      absl::StatusOr<Clock::duration> took = PushB();
      ASSERT_OK(took.status());
      EXPECT_LT(*took, limit) << "push " << i << " of team-b took "
                              << std::chrono::duration_cast<milliseconds>(*took).count() << " ms";
    }
  }

  MemoryBudget& budget() { return server_->server()->memory_budget(); }
  // Chunks the server has built for readers (sluice_fetch_chunks_total).
  uint64_t ChunksBuilt() {
    const std::string text = server_->server()->RenderMetrics();
    const std::string name = "\nsluice_fetch_chunks_total ";
    const size_t at = text.find(name);
    EXPECT_NE(at, std::string::npos) << text;
    return at == std::string::npos ? 0 : std::stoull(text.substr(at + name.size()));
  }

  // Team-a's shuffle "a", one partition.
  void CreateA() {
    auto ctx = As(kTokenA);
    pb::CreateShuffleRequest req;
    req.set_shuffle_id("a");
    req.set_num_partitions(1);
    pb::CreateShuffleResponse created;
    ASSERT_TRUE(stub_->CreateShuffle(ctx.get(), req, &created).ok());
  }

  // A push stream of team-a's into "a" for `mapper`, its open message sent, held open in
  // `ctxs`/`streams` (the response in `resp`, which must outlive it).
  void OpenPushA(uint32_t mapper, pb::PushResponse* resp) {
    ctxs_.push_back(As(kTokenA));
    pushes_.push_back(stub_->Push(ctxs_.back().get(), resp));
    pb::PushRequest msg;
    msg.mutable_open()->set_shuffle_id("a");
    msg.mutable_open()->set_mapper_id(mapper);
    msg.mutable_open()->set_attempt_id(1);
    ASSERT_TRUE(pushes_.back()->Write(msg));
  }

  // Commits the last push stream opened with `frames` one-record frames, and ends it.
  void CommitLastPushA(int frames) {
    pb::PushRequest msg;
    msg.mutable_commit()->set_frame_count(frames);
    msg.mutable_commit()->set_record_count(frames);
    ASSERT_TRUE(pushes_.back()->Write(msg));
    pushes_.back()->WritesDone();
    ASSERT_TRUE(pushes_.back()->Finish().ok());
    pushes_.pop_back();
    ctxs_.pop_back();
  }

  // `n` fetches of team-a's of "a" partition 0 in `order`, started and not read.
  void OpenFetchesA(int n, pb::Order order) {
    pb::FetchRequest req;
    req.set_shuffle_id("a");
    req.set_partition_id(0);
    req.set_order(order);
    for (int i = 0; i < n; ++i) {
      ctxs_.push_back(As(kTokenA));
      readers_.push_back(stub_->Fetch(ctxs_.back().get(), req));
    }
    ASSERT_TRUE(Eventually(
        [&] { return server_->server()->open_fetch_streams() == static_cast<size_t>(n); }));
  }

  // Team-a: 3 mappers of 8 records of 512 KiB each (12 MiB: more than a reader's window) in
  // its partition 0, keys k00..k23; team-b: one record.
  void PushKeyData() {
    CreateA();
    for (uint32_t m = 0; m < 3; ++m) {
      pb::PushResponse resp;
      OpenPushA(m, &resp);
      for (int i = 0; i < 8; ++i) {
        std::mt19937_64 rng(m * 100 + i);
        std::string value(512 << 10, '\0');
        for (char& c : value) c = static_cast<char>(rng());  // (zstd cannot shrink it)
        const int k = i * 3 + static_cast<int>(m);
        Rows rows = {{absl::StrCat(k < 10 ? "k0" : "k", k), value}};
        ASSERT_TRUE(WriteFrame(pushes_.back().get(), 0, EncodeRows(rows)));
      }
      CommitLastPushA(8);
    }
    ASSERT_OK(PushB().status());
  }

  // A server with 2 merge slots and `park_after` as --merge_park_after_s; PushKeyData; then two
  // KEY fetches of team-a's that take both slots, their first chunks out, never read.
  void HoldBothMergeSlotsA(std::chrono::seconds park_after) {
    StartServer([park_after](ServerOptions& o) {
      o.memory_budget_bytes = 64 << 20;
      o.max_concurrent_merges = 2;
      o.merge_park_after = park_after;
    });
    PushKeyData();
    const uint64_t chunks = ChunksBuilt();
    OpenFetchesA(2, pb::KEY);
    // Both merges hold their slots once each has built its first chunk.
    ASSERT_TRUE(Eventually([&] { return ChunksBuilt() >= chunks + 2; }));
  }

  // How long team-b's KEY read of its record takes.
  Clock::duration KeyReadB() {
    const auto start = Clock::now();
    ReaderOptions ro;
    ro.order = FetchOrder::kKey;
    auto r = b_->OpenReader("b", 0, ro);
    EXPECT_OK(r.status());
    if (!r.ok()) return Clock::duration::max();
    Record rec;
    size_t n = 0;
    while (true) {
      absl::StatusOr<bool> more = (*r)->Next(&rec);
      EXPECT_OK(more.status());
      if (!more.ok() || !*more) break;
      ++n;
    }
    EXPECT_EQ(n, 1u);
    return Clock::now() - start;
  }

  // Team-a's open fetches read now: every record once, in key order.
  void ExpectAReadsEveryRecordInOrder() {
    for (auto& reader : readers_) {
      std::vector<std::string> keys;
      pb::FetchResponse chunk;
      while (reader->Read(&chunk)) {
        for (const auto& [key, value] : DecodeRows(chunk.frame())) {
          keys.push_back(key);
          EXPECT_EQ(value.size(), size_t{512} << 10);
        }
      }
      ASSERT_TRUE(reader->Finish().ok());
      ASSERT_EQ(keys.size(), 24u);
      for (int i = 0; i < 24; ++i) EXPECT_EQ(keys[i], absl::StrCat(i < 10 ? "k0" : "k", i));
    }
  }

  TempDir dir_;
  std::unique_ptr<MiniServer> server_;
  std::unique_ptr<pb::ShuffleService::Stub> stub_;
  std::unique_ptr<ShuffleClient> b_;
  uint32_t next_mapper_ = 0;
  // Team-a's calls held open.
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs_;
  std::vector<std::unique_ptr<grpc::ClientWriter<pb::PushRequest>>> pushes_;
  std::vector<std::unique_ptr<grpc::ClientReader<pb::FetchResponse>>> readers_;
};

// Team-a opens 5 push streams and announces an 8 MiB frame on each, then sends no piece: the
// announcements are promised the whole budget (four of them, with their block headers; the
// fifth waits), and team-b's pushes take back what they need of the promises.
TEST_F(FairnessTest, LargeFramesAnnouncedAndNeverSentDoNotStallAnotherTenant) {
  CreateA();
  std::vector<pb::PushResponse> resps(5);
  for (uint32_t i = 0; i < 5; ++i) {
    OpenPushA(i, &resps[i]);
    pb::PushRequest msg;
    msg.mutable_large_frame()->set_partition_id(0);
    msg.mutable_large_frame()->set_frame_size((8 << 20) - 32);  // +32: its block header
    ASSERT_TRUE(pushes_.back()->Write(msg));
  }
  ASSERT_TRUE(Eventually([&] { return budget().used() >= kBudget; }))
      << "the announcements were not promised the budget: the test holds nothing";
  ExpectBUnhindered(milliseconds(2000));
  EXPECT_GT(budget().revoked_total(), 0u);
  for (auto& ctx : ctxs_) ctx->TryCancel();
  for (auto& s : pushes_) (void)s->Finish();
  EXPECT_TRUE(Eventually([&] { return budget().used() == 0; })) << budget().used();
}

// Team-a opens 50 fetches of its ~1 MiB frames and reads none: each waits for room for its
// chunk (and the transport's copy) before it reads it, and what waits on readers leaves a
// quarter of the budget free. Team-b's pushes go through; the budget is never passed.
TEST_F(FairnessTest, FetchesNeverReadStayWithinTheBudgetAndDoNotStallAnotherTenant) {
  CreateA();
  pb::PushResponse pushed;
  OpenPushA(0, &pushed);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(WriteFrame(pushes_.back().get(), 0, RandomValueFrame(1 << 20, i)));
  }
  CommitLastPushA(4);
  // Every fetch started: each one's chunk is out or waits for the budget (which nothing gives
  // back while nobody reads: then the server is still).
  const uint64_t chunks = ChunksBuilt();
  const uint64_t parked = server_->server()->memory_parked_total();
  OpenFetchesA(50, pb::UNORDERED);
  ASSERT_TRUE(Eventually([&] {
    return ChunksBuilt() - chunks + server_->server()->memory_parked_total() - parked >= 50;
  }));
  ASSERT_GE(budget().used(), kBudget / 4);
  // (Three quarters of the budget, to the framing bytes of the chunks out.)
  EXPECT_LE(budget().used(), kBudget * 3 / 4 + (64 << 10)) << "readers that do not read filled it";
  ExpectBUnhindered(milliseconds(2000));
  // With team-b active, team-a's readers take no more (they are past its share).
  EXPECT_LE(budget().used_by("team-a"), kBudget * 3 / 4 + (64 << 10));
  // They read now, all at once (as 50 reducers would): every one gets its 4 frames. (Read one
  // after another, a reader's next chunk could wait for room behind the other 49 fetches'
  // chunks, which wait for readers that are not reading yet: until --fetch_stall_timeout_s.)
  std::vector<std::thread> reading;
  std::vector<int> got(readers_.size(), 0);
  std::vector<char> finished(readers_.size(), 0);
  for (size_t i = 0; i < readers_.size(); ++i) {
    reading.emplace_back([&, i] {
      pb::FetchResponse chunk;
      while (readers_[i]->Read(&chunk)) ++got[i];
      finished[i] = readers_[i]->Finish().ok() ? 1 : 0;
    });
  }
  for (auto& t : reading) t.join();
  for (size_t i = 0; i < readers_.size(); ++i) {
    EXPECT_EQ(got[i], 4) << "reader " << i;
    EXPECT_TRUE(finished[i]) << "reader " << i;
  }
  EXPECT_TRUE(Eventually([&] { return budget().used() == 0; })) << budget().used();
}

// Team-a's two KEY fetches hold both merge slots and read nothing: after --merge_park_after_s
// each gives its slot and merge memory to the fetch that waits (team-b's), then, once its
// reader reads, merges again from where it was: every record comes once, in key order.
TEST_F(FairnessTest, KeyFetchesNeverReadGiveTheirMergeSlotsToOthersAndResumeWhereTheyWere) {
  HoldBothMergeSlotsA(seconds(1));
  // Team-b's KEY read waits for a slot until a stalled fetch parks, not for the stall timeout
  // (60 s).
  EXPECT_LT(KeyReadB(), seconds(10)) << "team-b's KEY fetch waited behind readers that do not read";
  ExpectAReadsEveryRecordInOrder();
}

// The same with a long --merge_park_after_s: team-a holds both slots, more than its share (one
// of two) while team-b waits, so its stalled merges park within a fraction of a second (they
// used to hold team-b's read for the whole --merge_park_after_s, 2 s by default).
TEST_F(FairnessTest, ATenantOverItsShareOfMergeSlotsParksItsStalledMergesAtOnce) {
  HoldBothMergeSlotsA(seconds(30));
  EXPECT_LT(KeyReadB(), seconds(3)) << "team-b's KEY read waited for --merge_park_after_s";
  ExpectAReadsEveryRecordInOrder();
}

}  // namespace
}  // namespace sluice::testing
