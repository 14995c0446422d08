// The `sluice` CLI as a separate process against a real in-process server: push and fetch
// round trips through files, and a small `bench` run that verifies every key's count.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"

#ifndef SLUICE_CLI_BIN
#error "SLUICE_CLI_BIN must name the sluice executable"
#endif

namespace sluice {
namespace {

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MiniServerOptions opts;
    opts.server.data_dir = dir_.path() + "/data";
    ASSERT_OK_AND_ASSIGN(server_, testing::MiniServer::Start(opts));
    address_ = server_->address();
  }

  // Runs `sluice ARGS`; returns its exit code, stdout (and, `errors`, stderr) in *out.
  int Run(const std::string& args, std::string* out = nullptr, bool errors = false) {
    const std::string cmd =
        std::string(SLUICE_CLI_BIN) + " " + args + (errors ? " 2>&1" : " 2>/dev/null");
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return -1;
    std::string text;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
    const int status = ::pclose(p);
    if (out != nullptr) *out = text;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }

  testing::TempDir dir_;
  std::unique_ptr<testing::MiniServer> server_;
  std::string address_;
};

TEST_F(CliTest, JsonLinesRoundTripInKeyOrder) {
  ASSERT_EQ(Run("create --server " + address_ + " --shuffle j --partitions 1 --mappers 2"), 0);
  {
    std::ofstream f(Path("m0.jsonl"));
    f << "{\"word\":\"pear\",\"n\":1}\n{\"word\":\"apple\",\"n\":2}\n";
    std::ofstream g(Path("m1.jsonl"));
    g << "{\"word\":\"fig\",\"n\":3}\n{\"word\":\"apple\",\"n\":4}\n";
  }
  for (int m = 0; m < 2; ++m) {
    ASSERT_EQ(
        Run("push --server " + address_ + " --shuffle j --mapper " + std::to_string(m) +
            " --input " + Path("m" + std::to_string(m) + ".jsonl") + " --key-field word --sort"),
        0);
  }
  std::string out;
  ASSERT_EQ(Run("fetch --server " + address_ + " --shuffle j --partition 0 --order KEY", &out), 0);
  // Keys are the msgpack encodings of "word", ordered bytewise — so the str header (its length)
  // comes first: "fig" (a3...) < "pear" (a4...) < "apple" (a5...). Equal keys by mapper id.
  EXPECT_EQ(out,
            "{\"n\":3,\"word\":\"fig\"}\n{\"n\":1,\"word\":\"pear\"}\n"
            "{\"n\":2,\"word\":\"apple\"}\n{\"n\":4,\"word\":\"apple\"}\n");
  ASSERT_EQ(Run("status --server " + address_ + " --shuffle j", &out), 0);
  EXPECT_NE(out.find("(2 committed)"), std::string::npos) << out;
  // A server on its own keeps every partition.
  EXPECT_NE(out.find("placement: replication 1 over 1 servers\n  server "), std::string::npos)
      << out;
  EXPECT_NE(out.find(" at " + address_ + ": 1 partitions (1 as primary), serving, disk "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(" MiB free\n  partition 0 on "), std::string::npos) << out;
}

// Split reads from the command line: `splits` prints slices, `fetch --from/--to` reads them
// (by JSON keys as push makes them, or by hex), and `status` names a hot key.
TEST_F(CliTest, SplitsAndKeyRangesAndTheHotKey) {
  ASSERT_EQ(Run("create --server " + address_ + " --shuffle s --partitions 1 --mappers 1"), 0);
  {
    std::ofstream f(Path("s.jsonl"));
    for (int i = 0; i < 400; ++i) {
      f << "{\"w\":\"" << (i % 2 == 0 ? std::string("zz") : "w" + std::to_string(i))
        << "\",\"n\":" << i << "}\n";
    }
  }
  ASSERT_EQ(Run("push --server " + address_ + " --shuffle s --mapper 0 --input " + Path("s.jsonl") +
                " --key-field w --sort"),
            0);
  std::string out;
  ASSERT_EQ(Run("splits --server " + address_ + " --shuffle s --partition 0 --n 2", &out), 0);
  EXPECT_NE(out.find("partition 0: "), std::string::npos) << out;
  EXPECT_NE(out.find("slice 0  ~"), std::string::npos) << out;
  // "zz" (200 records) by its JSON key, and nothing else.
  ASSERT_EQ(Run("fetch --server " + address_ + " --shuffle s --partition 0 --from '\"zz\"'" +
                    " --to-hex a27a7a00",
                &out),
            0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 200) << out;
  EXPECT_EQ(out.find("\"w1\""), std::string::npos);
  // A key that is not JSON is refused, naming the flag; a range backwards by the server.
  EXPECT_EQ(Run("fetch --server " + address_ + " --shuffle s --partition 0 --from zz", &out,
                /*errors=*/true),
            1);
  EXPECT_NE(out.find("--from is not a JSON value"), std::string::npos) << out;
  EXPECT_EQ(
      Run("fetch --server " + address_ + " --shuffle s --partition 0 --from-hex 02 --to-hex 01",
          &out, /*errors=*/true),
      1);
  EXPECT_NE(out.find("from_key is after to_key"), std::string::npos) << out;
  ASSERT_EQ(Run("status --server " + address_ + " --shuffle s", &out), 0);
  EXPECT_NE(out.find("hot key \"zz\" (hex a27a7a): 200 records (50.0%)"), std::string::npos) << out;
}

TEST_F(CliTest, MsgpackFilesRoundTripByteForByte) {
  ASSERT_EQ(Run("create --server " + address_ + " --shuffle m --partitions 1"), 0);
  // Two msgpack maps: {"k": 1} and {"k": 2}.
  const std::string input("\x81\xa1k\x01\x81\xa1k\x02", 8);
  {
    std::ofstream f(Path("in.msgpack"), std::ios::binary);
    f << input;
  }
  ASSERT_EQ(Run("push --server " + address_ + " --shuffle m --mapper 0 --format msgpack --input " +
                Path("in.msgpack") + " --key-field k --sort"),
            0);
  ASSERT_EQ(Run("fetch --server " + address_ + " --shuffle m --partition 0 --order KEY " +
                "--format msgpack --output " + Path("out.msgpack")),
            0);
  std::ifstream f(Path("out.msgpack"), std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, input);
}

TEST_F(CliTest, BadInputFailsWithAMessageAndNothingCommits) {
  ASSERT_EQ(Run("create --server " + address_ + " --shuffle b --partitions 1"), 0);
  {
    std::ofstream f(Path("bad.jsonl"));
    f << "{\"word\":\"ok\"}\nnot json\n";
  }
  EXPECT_NE(Run("push --server " + address_ + " --shuffle b --mapper 0 --input " +
                Path("bad.jsonl") + " --key-field word"),
            0);
  std::string out;
  ASSERT_EQ(Run("status --server " + address_ + " --shuffle b", &out), 0);
  EXPECT_NE(out.find("(0 committed)"), std::string::npos) << out;
  EXPECT_NE(Run("frobnicate"), 0);
}

// The exit status says whether a retry can help, as a status code does: 75 for a server that
// cannot be reached (or any retryable failure), 1 for a mistake, 2 for bad usage.
TEST_F(CliTest, TheExitStatusSaysWhetherARetryCanHelp) {
  std::string out;
  EXPECT_EQ(Run("status --server " + address_ + " --shuffle none"), 1);  // NOT_FOUND
  EXPECT_EQ(Run("create --server 127.0.0.1:1 --shuffle x --partitions 1 --call-timeout-s 2"), 75);
  EXPECT_EQ(Run("create --server " + address_ + " --shuffle x --partitions 1 --keepalive-s 0.5"),
            2);
  EXPECT_EQ(Run("create --server " + address_ + " --shuffle x --partitions 1 --call-timeout-s x"),
            2);
  ASSERT_EQ(Run("create --server " + address_ +
                " --shuffle x --partitions 1 --call-timeout-s 5 --keepalive-s 2 "
                "--keepalive-timeout-s 2"),
            0);
}

TEST_F(CliTest, NodesListsTheServerWithItsHealthAndSpace) {
  ASSERT_EQ(Run("create --server " + address_ + " --shuffle n --partitions 2"), 0);
  std::string out;
  ASSERT_EQ(Run("nodes --server " + address_, &out), 0);
  // Without --etcd a server is a cluster of one, its id the host name.
  EXPECT_NE(out.find(" at " + address_ + ": alive, serving, disk "), std::string::npos) << out;
  EXPECT_NE(out.find("MiB free, memory 0 of 256 MiB used, 1 shuffles"), std::string::npos) << out;
}

// A server on its own has nowhere to move its shuffles: decommission says so and fails (not
// retryable); a drain of a server that is not decommissioning does not wait.
TEST_F(CliTest, DecommissionOfAServerOnItsOwnIsRefusedNamingWhy) {
  std::string out;
  EXPECT_EQ(Run("decommission --server " + address_ + " --wait", &out, true), 1);
  EXPECT_NE(out.find("runs on its own"), std::string::npos) << out;
  EXPECT_EQ(Run("decommission --server " + address_ + " --wait=maybe", &out, true), 1);
  EXPECT_NE(out.find("--wait takes no value"), std::string::npos) << out;
}

TEST_F(CliTest, SmallBenchCountsEveryKey) {
  std::string out;
  ASSERT_EQ(Run("bench --server " + address_ +
                    " --shards 3 --items-per-shard 3000 --partitions 2 --keys 500",
                &out),
            0);
  EXPECT_NE(out.find("\"counts_match\": true"), std::string::npos) << out;
  EXPECT_NE(out.find("\"expected_items\": 9000"), std::string::npos) << out;
}

TEST_F(CliTest, BenchWithoutAServerStartsItsOwnSluiceServer) {
  std::string out;
  ASSERT_EQ(Run("bench --shards 2 --items-per-shard 2000 --partitions 3 --keys 100 --order "
                "UNORDERED --data-dir " +
                    Path("bench-data"),
                &out),
            0);
  EXPECT_NE(out.find("\"counts_match\": true"), std::string::npos) << out;
  EXPECT_NE(out.find("\"embedded_server\": true"), std::string::npos) << out;
  // The server was a child process with a memory of its own.
  const auto at = out.find("\"server_peak_rss_mb\": ");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_GT(std::atof(out.c_str() + at + 22), 1.0) << out;
  EXPECT_NE(Run("bench --shards 0"), 0);
  EXPECT_NE(Run("bench --no-such-flag 1"), 0);
}

// A data directory holding a shuffle of an earlier, unreleased layout (one file per
// partition, tests/server/testdata/shuffle_v2): the server starts and serves the others; the
// old shuffle is listed as damaged, naming its layout, reads of it fail, and a delete removes it.
TEST_F(CliTest, AShuffleOfAnEarlierLayoutIsReportedDamagedAndCanBeDeleted) {
  server_.reset();
  const std::string fixture = std::string(SLUICE_TESTDATA_DIR) + "/shuffle_v2";
  const std::string shuffle = dir_.path() + "/data/shuffles/legacy";
  std::filesystem::create_directories(shuffle);
  for (const char* name : {"SHUFFLE", "commits.log", "p0.data", "p1.data", "p2.data"}) {
    std::filesystem::copy_file(fixture + "/" + name, shuffle + "/" + name,
                               std::filesystem::copy_options::overwrite_existing);
  }
  testing::MiniServerOptions opts;
  opts.server.data_dir = dir_.path() + "/data";
  ASSERT_OK_AND_ASSIGN(server_, testing::MiniServer::Start(opts));
  address_ = server_->address();
  std::string out;
  Run("status --server " + address_ + " --shuffle legacy", &out);  // (exits 1: damaged)
  EXPECT_NE(out.find("DAMAGED"), std::string::npos) << out;
  EXPECT_NE(out.find("layout 2"), std::string::npos) << out;
  EXPECT_NE(Run("fetch --server " + address_ + " --shuffle legacy --partition 0 --output -"), 0);
  ASSERT_EQ(Run("delete --server " + address_ + " --shuffle legacy"), 0);
  EXPECT_FALSE(std::filesystem::exists(shuffle));
  ASSERT_EQ(Run("create --server " + address_ + " --shuffle legacy --partitions 3 --mappers 2"), 0);
}

}  // namespace
}  // namespace sluice
