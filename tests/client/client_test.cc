// The client library against a real in-process server on 127.0.0.1:0.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "client/shuffle_client.h"
#include "server/storage/file_util.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"

namespace sluice {
namespace {

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(server_, testing::MiniServer::Start());
    ASSERT_OK_AND_ASSIGN(client_, server_->Client());
  }

  std::vector<std::pair<std::string, std::string>> ReadAll(const std::string& id, uint32_t p,
                                                           ReaderOptions opts = {}) {
    auto reader = client_->OpenReader(id, p, opts);
    EXPECT_OK(reader);
    std::vector<std::pair<std::string, std::string>> out;
    Record r;
    for (;;) {
      auto more = (*reader)->Next(&r);
      EXPECT_OK(more);
      if (!more.ok() || !*more) break;
      out.emplace_back(std::string(r.key), std::string(r.value));
    }
    return out;
  }

  std::unique_ptr<testing::MiniServer> server_;
  std::unique_ptr<ShuffleClient> client_;
};

TEST_F(ClientTest, BudgetFlushesKeepEveryRecordAndRoutesByHash) {
  ASSERT_TRUE(*client_->CreateShuffle("s", 4, 1));
  WriterOptions wopts;
  wopts.buffer_bytes = 64 << 10;  // forces many flushes of the largest buffer
  auto writer = client_->OpenWriter("s", 0, 1, wopts);
  ASSERT_OK(writer);
  for (int i = 0; i < 20000; ++i) {
    ASSERT_OK((*writer)->Add("key" + std::to_string(i), "value" + std::to_string(i)));
  }
  auto result = (*writer)->Close();
  ASSERT_OK(result);
  EXPECT_EQ(result->records, 20000u);
  EXPECT_GT(result->frames, 8u);  // flushed several times per partition
  size_t total = 0;
  for (uint32_t p = 0; p < 4; ++p) {
    for (const auto& [k, v] : ReadAll("s", p)) {
      EXPECT_EQ(HashPartition(k, 4), p);
      EXPECT_EQ(v, "value" + k.substr(3));
      ++total;
    }
  }
  EXPECT_EQ(total, 20000u);
}

TEST_F(ClientTest, RecordsOfEverySizeSurviveTheChunkedBuffers) {
  // A 64 KiB budget over 4 partitions buffers in 4 KiB chunks: records from empty to 3x a
  // chunk, in both orders, must come back byte for byte.
  for (bool key_order : {false, true}) {
    const std::string id = key_order ? "sized-key" : "sized";
    ASSERT_TRUE(*client_->CreateShuffle(id, 4, 1));
    WriterOptions wopts;
    wopts.buffer_bytes = 64 << 10;
    wopts.sort_by_key = key_order;
    auto writer = client_->OpenWriter(id, 0, 1, wopts);
    ASSERT_OK(writer);
    std::multiset<std::pair<std::string, std::string>> sent;
    for (int i = 0; i < 3000; ++i) {
      const size_t len = i % 97 == 0 ? 12000 + i : (i % 5 == 0 ? 0 : i % 300);
      std::string key = "k" + std::to_string(i % 257);
      std::string value(len, static_cast<char>('a' + i % 26));
      ASSERT_OK((*writer)->Add(key, value));
      sent.emplace(std::move(key), std::move(value));
    }
    ASSERT_OK((*writer)->Close());
    std::multiset<std::pair<std::string, std::string>> got;
    ReaderOptions ropts;
    ropts.order = key_order ? FetchOrder::kKey : FetchOrder::kUnordered;
    for (uint32_t p = 0; p < 4; ++p) {
      std::string last;
      for (auto& kv : ReadAll(id, p, ropts)) {
        if (key_order) {
          EXPECT_FALSE(KeyLess(kv.first, last));
        }
        last = kv.first;
        got.insert(std::move(kv));
      }
    }
    EXPECT_TRUE(got == sent) << "order " << key_order;
  }
}

TEST_F(ClientTest, ManyPartitionsStillFlushLargeFrames) {
  // 2,000 partitions share a 4 MiB budget: records of all partitions fill it together, and each
  // flush sends one frame per partition it holds, so frames stay many records long: 200,000
  // records of up to 49 bytes (with 56 bytes each of entry and view, ~21 MB) are 6 fills, at
  // most 12,000 frames of ~17 records.
  ASSERT_TRUE(*client_->CreateShuffle("wide", 2000, 1));
  WriterOptions wopts;
  wopts.buffer_bytes = 4 << 20;
  auto writer = client_->OpenWriter("wide", 0, 1, wopts);
  ASSERT_OK(writer);
  const std::string value(40, 'v');
  for (int i = 0; i < 200000; ++i) {
    ASSERT_OK((*writer)->Add("key" + std::to_string(i), value));
  }
  auto result = (*writer)->Close();
  ASSERT_OK(result);
  EXPECT_EQ(result->records, 200000u);
  EXPECT_LE(result->frames, 12000u) << "flushes too small";
  auto status = client_->GetShuffle("wide");
  ASSERT_OK(status);
  uint64_t total = 0;
  for (const auto& p : status->partitions) total += p.records;
  EXPECT_EQ(total, 200000u);
}

// A wide shuffle (thousands of partitions, each mapper a few records in each) costs what its
// bytes cost. The server holds two descriptors for it, not one per partition written (4,096
// here), every record comes back in key order from the partition its key hashes to, and a
// restart on the same directory recovers all of it.
TEST_F(ClientTest, AWideShuffleCostsTwoDescriptorsAndComesBackWhole) {
  constexpr uint32_t kPartitions = 4096, kMappers = 24;
  constexpr int kRecords = 3000;  // per mapper: under one record per partition
  const size_t fds_before = file::OpenFdCount();
  ASSERT_TRUE(*client_->CreateShuffle("wide", kPartitions, kMappers));
  for (uint32_t m = 0; m < kMappers; ++m) {
    WriterOptions wopts;
    wopts.sort_by_key = true;
    wopts.buffer_bytes = 256 << 10;  // several flushes of many small partitions
    auto writer = client_->OpenWriter("wide", m, 1, wopts);
    ASSERT_OK(writer);
    for (int i = 0; i < kRecords; ++i) {
      ASSERT_OK((*writer)->Add("k" + std::to_string((i * 7919 + m * 104729) % 50000),
                               "m" + std::to_string(m) + "-" + std::to_string(i)));
    }
    ASSERT_OK((*writer)->Close());
  }
  EXPECT_LE(file::OpenFdCount(), fds_before + 4) << "descriptors grew with the partitions";
  auto check = [&](uint32_t step) {
    size_t total = 0;
    for (uint32_t p = 0; p < kPartitions; p += step) {
      ReaderOptions ropts;
      ropts.order = FetchOrder::kKey;
      ropts.require_complete = true;
      const auto records = ReadAll("wide", p, ropts);
      for (size_t i = 0; i < records.size(); ++i) {
        EXPECT_EQ(HashPartition(records[i].first, kPartitions), p);
        if (i > 0) {
          EXPECT_LE(records[i - 1].first, records[i].first) << "partition " << p;
        }
      }
      total += records.size();
    }
    return total;
  };
  EXPECT_EQ(check(1), size_t{kMappers} * kRecords);
  ASSERT_OK(server_->Restart());
  ASSERT_OK_AND_ASSIGN(client_, server_->Client());
  auto status = client_->GetShuffle("wide");
  ASSERT_OK(status);
  EXPECT_EQ(status->committed_mappers.size(), kMappers);
  uint64_t stored = 0;
  for (const auto& p : status->partitions) stored += p.records;
  EXPECT_EQ(stored, uint64_t{kMappers} * kRecords);
  EXPECT_GT(check(16), 0u);
}

// A reader that lost its replica resumes on another with skip_records: a partition's order is
// the same wherever it is read (KEY: key, mapper, arrival; UNORDERED: mapper, arrival), so the
// rest comes back once, whether the skip ends between stored frames or inside one.
TEST_F(ClientTest, SkipRecordsResumesAPartitionWhereAReaderLeftOff) {
  ASSERT_OK(client_->CreateShuffle("r", 1, 3).status());
  for (uint32_t m = 0; m < 3; ++m) {
    WriterOptions w;
    w.buffer_bytes = w.frame_bytes = 4 << 10;  // many small frames per mapper
    ASSERT_OK_AND_ASSIGN(auto writer, client_->OpenWriter("r", m, 1, w));
    for (int i = 0; i < 500; ++i) {
      const int k = (i * 7919 + static_cast<int>(m) * 13) % 611;
      ASSERT_OK(
          writer->Add("k" + std::to_string(k), "m" + std::to_string(m) + "-" + std::to_string(i)));
    }
    ASSERT_OK(writer->Close().status());
  }
  for (FetchOrder order : {FetchOrder::kUnordered, FetchOrder::kKey}) {
    ReaderOptions opts;
    opts.order = order;
    const auto all = ReadAll("r", 0, opts);
    ASSERT_EQ(all.size(), 1500u);
    for (uint64_t skip : {1u, 7u, 499u, 500u, 750u, 1499u, 1500u}) {
      opts.skip_records = skip;
      const auto rest = ReadAll("r", 0, opts);
      EXPECT_EQ(rest, decltype(all)(all.begin() + static_cast<std::ptrdiff_t>(skip), all.end()))
          << "skip " << skip << (order == FetchOrder::kKey ? " KEY" : " UNORDERED");
    }
    opts.skip_records = 1501;
    ASSERT_OK_AND_ASSIGN(auto reader, client_->OpenReader("r", 0, opts));
    Record r;
    EXPECT_THAT(reader->Next(&r),
                testing::StatusIs(absl::StatusCode::kOutOfRange,
                                  "skip_records 1501 is past the partition's 1500"));
  }
}

TEST_F(ClientTest, KeyOrderAndGroupBy) {
  ASSERT_TRUE(*client_->CreateShuffle("g", 2, 3));
  for (uint32_t m = 0; m < 3; ++m) {
    WriterOptions wopts;
    wopts.sort_by_key = true;
    wopts.buffer_bytes = 16 << 10;
    auto writer = client_->OpenWriter("g", m, 1, wopts);
    ASSERT_OK(writer);
    for (int i = 0; i < 3000; ++i) {
      ASSERT_OK((*writer)->Add("k" + std::to_string((i * 31 + m) % 500), std::to_string(m)));
    }
    ASSERT_OK((*writer)->Close());
  }
  std::map<std::string, size_t> counts;
  size_t groups = 0;
  for (uint32_t p = 0; p < 2; ++p) {
    ReaderOptions ropts;
    ropts.order = FetchOrder::kKey;
    ropts.require_complete = true;
    auto reader = client_->OpenReader("g", p, ropts);
    ASSERT_OK(reader);
    std::string key, last;
    std::vector<std::string> values;
    for (;;) {
      auto more = (*reader)->NextGroup(&key, &values);
      ASSERT_OK(more);
      if (!*more) break;
      EXPECT_TRUE(groups == 0 || p == 1 || KeyLess(last, key));
      EXPECT_TRUE(std::is_sorted(values.begin(), values.end()));  // mapper 0, 1, 2: stable
      counts[key] += values.size();
      last = key;
      ++groups;
    }
  }
  EXPECT_EQ(counts.size(), 500u);
  EXPECT_EQ(groups, 500u);
  size_t total = 0;
  for (const auto& [k, c] : counts) total += c;
  EXPECT_EQ(total, 9000u);
}

TEST_F(ClientTest, AbortAndDestructionDiscard) {
  ASSERT_TRUE(*client_->CreateShuffle("a", 1, 0));
  {
    auto writer = client_->OpenWriter("a", 0, 1);
    ASSERT_OK(writer);
    ASSERT_OK((*writer)->Add("k", "v"));
    (*writer)->Abort();
  }
  {
    auto writer = client_->OpenWriter("a", 1, 1);
    ASSERT_OK(writer);
    ASSERT_OK((*writer)->Add("k", "v"));
  }  // destroyed without Close
  auto status = client_->GetShuffle("a");
  ASSERT_OK(status);
  EXPECT_TRUE(status->committed_mappers.empty());
  EXPECT_TRUE(ReadAll("a", 0).empty());
}

TEST_F(ClientTest, RangePartitionerSendsKeysToTheirRange) {
  ASSERT_TRUE(*client_->CreateShuffle("r", 3, 0));
  WriterOptions wopts;
  wopts.partitioner = RangePartitioner({"m", "f"});  // [..f) [f..m) [m..)
  auto writer = client_->OpenWriter("r", 0, 1, wopts);
  ASSERT_OK(writer);
  for (const char* k : {"apple", "fig", "grape", "melon", "zucchini", "f", "m"}) {
    ASSERT_OK((*writer)->Add(k, ""));
  }
  ASSERT_OK((*writer)->Close());
  auto keys = [&](uint32_t p) {
    std::vector<std::string> out;
    for (const auto& [k, v] : ReadAll("r", p)) out.push_back(k);
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(keys(0), (std::vector<std::string>{"apple"}));
  EXPECT_EQ(keys(1), (std::vector<std::string>{"f", "fig", "grape"}));
  EXPECT_EQ(keys(2), (std::vector<std::string>{"m", "melon", "zucchini"}));
}

TEST_F(ClientTest, ErrorsSayWhatHappened) {
  ClientOptions nowhere;
  nowhere.server = "127.0.0.1:1";  // nothing listens there
  nowhere.call_deadline = std::chrono::milliseconds(2000);
  auto dead = ShuffleClient::Connect(nowhere);
  ASSERT_OK(dead);
  auto st = (*dead)->CreateShuffle("x", 1, 0);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(st.status().message().find("server unreachable at 127.0.0.1:1"),
            absl::string_view::npos)
      << st.status();

  EXPECT_EQ(client_->OpenWriter("missing", 0, 1).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(*client_->CreateShuffle("c", 1, 2));
  ReaderOptions ropts;
  ropts.require_complete = true;
  auto reader = client_->OpenReader("c", 0, ropts);
  ASSERT_OK(reader);
  Record r;
  auto more = (*reader)->Next(&r);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(more.status().message().find("2 of 2 mappers"), absl::string_view::npos);
}

}  // namespace
}  // namespace sluice
