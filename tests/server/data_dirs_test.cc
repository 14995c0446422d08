// Several data directories (--data_dir=A,B,C; one per disk): new shuffles spread over them by
// partitions held, every one is recovered at start, and a directory whose disk fails (here: a
// tmpfs remounted read-only, then read-only from the start) is reported by GetNode, the metrics
// and the log, takes no new shuffles, and leaves the others serving.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "server/sluice_server.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice {
namespace {

using testing::MiniServer;
using testing::MiniServerOptions;
using testing::StatusIs;

absl::Status Write(ShuffleClient& client, const std::string& id, uint32_t mapper, int n) {
  SLUICE_ASSIGN_OR_RETURN(auto w, client.OpenWriter(id, mapper, 1));
  for (int i = 0; i < n; ++i) {
    SLUICE_RETURN_IF_ERROR(w->Add(id + "-" + std::to_string(i), std::string(50, 'v')));
  }
  return w->Close().status();
}

absl::StatusOr<uint64_t> Count(ShuffleClient& client, const std::string& id, uint32_t parts) {
  uint64_t n = 0;
  for (uint32_t p = 0; p < parts; ++p) {
    SLUICE_ASSIGN_OR_RETURN(auto reader, client.OpenReader(id, p));
    Record r;
    for (;;) {
      SLUICE_ASSIGN_OR_RETURN(bool more, reader->Next(&r));
      if (!more) break;
      ++n;
    }
  }
  return n;
}

bool Holds(const std::string& dir, const std::string& id) {
  return std::filesystem::is_directory(dir + "/shuffles/" + id);
}

TEST(DataDirsTest, ShufflesSpreadOverTheDirectoriesAndAllComeBackAfterARestart) {
  testing::TempDir root;
  const std::vector<std::string> dirs = {root.path() + "/a", root.path() + "/b",
                                         root.path() + "/c"};
  MiniServerOptions opts;
  opts.server.data_dir = dirs[0] + "," + dirs[1] + "," + dirs[2] + "/";  // (a trailing / is fine)
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(opts));
  ASSERT_OK_AND_ASSIGN(auto client, server->Client());
  for (int s = 0; s < 6; ++s) {
    const std::string id = "s" + std::to_string(s);
    ASSERT_OK(client->CreateShuffle(id, 4, 1).status());
    ASSERT_OK(Write(*client, id, 0, 1000));
  }
  // Equal partitions each: two shuffles a directory.
  for (const std::string& dir : dirs) {
    int held = 0;
    for (int s = 0; s < 6; ++s) held += Holds(dir, "s" + std::to_string(s));
    EXPECT_EQ(held, 2) << dir;
  }
  ASSERT_OK_AND_ASSIGN(NodeStatus node, client->GetNode());
  ASSERT_EQ(node.data_dirs.size(), 3u);
  for (const auto& d : node.data_dirs) {
    EXPECT_FALSE(d.failed);
    EXPECT_EQ(d.shuffles, 2u);
    EXPECT_EQ(d.partitions, 8u);
    EXPECT_GT(d.disk_total_bytes, 0u);
  }
  // Every directory is recovered at start; deletes find the right one.
  ASSERT_OK(server->Restart());
  ASSERT_OK_AND_ASSIGN(client, server->Client());
  for (int s = 0; s < 6; ++s) {
    ASSERT_OK_AND_ASSIGN(uint64_t n, Count(*client, "s" + std::to_string(s), 4));
    EXPECT_EQ(n, 1000u);
  }
  ASSERT_OK(client->DeleteShuffle("s4"));
  for (const std::string& dir : dirs) EXPECT_FALSE(Holds(dir, "s4"));
  ASSERT_OK(client->CreateShuffle("s6", 4, 1).status());  // where s4 left room
  ASSERT_OK_AND_ASSIGN(node, client->GetNode());
  for (const auto& d : node.data_dirs) EXPECT_EQ(d.shuffles, 2u);
}

TEST(DataDirsTest, BadListsAreRefusedNamingTheFlag) {
  testing::TempDir root;
  ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.data_dir = root.path() + "/a,," + root.path() + "/b";
  EXPECT_THAT(SluiceServer::Start(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "has an empty directory"));
  o.data_dir = root.path() + "/a," + root.path() + "/a/";
  EXPECT_THAT(SluiceServer::Start(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "twice"));
}

// Data directory 1 "fails": its shuffles/ bind-mounted read-only over itself (root only, as in
// CI; skipped otherwise). New files there fail with EROFS, as on a disk the kernel turned
// read-only after errors, while its contents can still be listed and read, and files the
// server holds open stay usable. Directory 2 is healthy.
class FailingDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    disk_ = root_.path() + "/disk1";
    other_ = root_.path() + "/disk2";
    ASSERT_TRUE(std::filesystem::create_directories(disk_ + "/shuffles"));
    ASSERT_TRUE(std::filesystem::create_directories(other_ + "/shuffles"));
    // Can we mount here at all?
    const std::string probe = root_.path() + "/probe";
    ::mkdir(probe.c_str(), 0755);
    if (::mount("tmpfs", probe.c_str(), "tmpfs", MS_RDONLY, "size=1m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
    }
    ::umount2(probe.c_str(), MNT_DETACH);
  }
  void TearDown() override { Fail(false); }
  // Mounts (or removes) the read-only file system over `dir`/shuffles.
  void Fail(bool failed, const std::string& dir = "") {
    const std::string target = (dir.empty() ? disk_ : dir) + "/shuffles";
    if (failed) {
      ASSERT_EQ(::mount(target.c_str(), target.c_str(), nullptr, MS_BIND, nullptr), 0)
          << std::strerror(errno);
      mounted_.push_back(target);
      ASSERT_EQ(
          ::mount(nullptr, target.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr), 0)
          << std::strerror(errno);
      return;
    }
    for (const std::string& m : mounted_) ::umount2(m.c_str(), MNT_DETACH);
    mounted_.clear();
  }
  testing::TempDir root_;
  std::string disk_, other_;
  std::vector<std::string> mounted_;
};

TEST_F(FailingDirTest, AFailedDiskIsReportedTakesNothingNewAndTheOtherServes) {
  MiniServerOptions opts;
  opts.server.data_dir = disk_ + "," + other_;
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(opts));
  ASSERT_OK_AND_ASSIGN(auto client, server->Client());
  for (const char* id : {"x1", "x2"}) {
    ASSERT_OK(client->CreateShuffle(id, 2, 2).status());
    ASSERT_OK(Write(*client, id, 0, 500));
  }
  ASSERT_TRUE(Holds(disk_, "x1") != Holds(disk_, "x2")) << "one shuffle on each disk";
  const std::string on_disk = Holds(disk_, "x1") ? "x1" : "x2";
  const std::string on_other = on_disk == "x1" ? "x2" : "x1";

  Fail(true);  // the disk fails under the running server
  // The next shuffles go to the healthy directory: the failed one is found out by the first
  // creation that fails on it, and marked.
  for (const char* id : {"x3", "x4", "x5"}) {
    ASSERT_OK(client->CreateShuffle(id, 2, 2).status()) << id;
    EXPECT_TRUE(Holds(other_, id)) << id;
    ASSERT_OK(Write(*client, id, 0, 500));
  }
  ASSERT_OK_AND_ASSIGN(NodeStatus node, client->GetNode());
  ASSERT_EQ(node.data_dirs.size(), 2u);
  EXPECT_TRUE(node.data_dirs[0].failed);
  EXPECT_NE(node.data_dirs[0].error.find("Read-only file system"), std::string::npos)
      << node.data_dirs[0].error;
  EXPECT_EQ(node.data_dirs[0].error.find(disk_), std::string::npos)
      << "a client is not told server paths: " << node.data_dirs[0].error;
  EXPECT_FALSE(node.data_dirs[1].failed);
  EXPECT_NE(server->server()->RenderMetrics().find("sluice_data_dir_failed{dir=\"1\"} 1\n"),
            std::string::npos);
  // The healthy directory's shuffle takes pushes; what the failed one holds open still reads.
  ASSERT_OK(Write(*client, on_other, 1, 500));
  ASSERT_OK_AND_ASSIGN(uint64_t n, Count(*client, on_other, 2));
  EXPECT_EQ(n, 1000u);
  ASSERT_OK_AND_ASSIGN(n, Count(*client, on_disk, 2));
  EXPECT_EQ(n, 500u);

  // A restart with the disk still failed: the server comes up on the other one, and says
  // what is missing.
  ASSERT_OK(server->Restart());
  ASSERT_OK_AND_ASSIGN(client, server->Client());
  ASSERT_OK_AND_ASSIGN(node, client->GetNode());
  EXPECT_TRUE(node.data_dirs[0].failed);
  // Its shuffles' ids stay taken: not created again elsewhere, not deleted, but named.
  ASSERT_OK_AND_ASSIGN(ShuffleStatus status, client->GetShuffle(on_disk));
  EXPECT_TRUE(status.wedged);  // listed, not open
  EXPECT_NE(status.wedge.find("data directory 1 of 2, which failed at start"), std::string::npos)
      << status.wedge;
  EXPECT_THAT(Count(*client, on_disk, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "data directory 1 of 2, which failed"));
  EXPECT_THAT(client->CreateShuffle(on_disk, 2, 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "which failed at start"));
  EXPECT_THAT(client->DeleteShuffle(on_disk),
              StatusIs(absl::StatusCode::kUnavailable, "cannot be deleted"));
  for (const std::string& id : {on_other, std::string("x3"), std::string("x5")}) {
    ASSERT_OK_AND_ASSIGN(n, Count(*client, id, 2));
    EXPECT_EQ(n, id == on_other ? 1000u : 500u) << id;
  }
  // Repaired: everything is back after a restart.
  Fail(false);
  ASSERT_OK(server->Restart());
  ASSERT_OK_AND_ASSIGN(client, server->Client());
  ASSERT_OK_AND_ASSIGN(n, Count(*client, on_disk, 2));
  EXPECT_EQ(n, 500u);
  ASSERT_OK_AND_ASSIGN(node, client->GetNode());
  EXPECT_FALSE(node.data_dirs[0].failed);
}

TEST(DataDirsTest, AShuffleFoundInTwoDirectoriesServesFromNeitherAndDeletesBoth) {
  testing::TempDir root;
  const std::string a = root.path() + "/a", b = root.path() + "/b";
  MiniServerOptions opts;
  opts.server.data_dir = a + "," + b;
  ASSERT_OK_AND_ASSIGN(auto server, MiniServer::Start(opts));
  {
    ASSERT_OK_AND_ASSIGN(auto client, server->Client());
    ASSERT_OK(client->CreateShuffle("dup", 2, 1).status());
    ASSERT_OK(Write(*client, "dup", 0, 100));
  }
  ASSERT_OK(server->Stop());
  const std::string from = (Holds(a, "dup") ? a : b) + "/shuffles/dup";
  const std::string to = (Holds(a, "dup") ? b : a) + "/shuffles/dup";
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
  ASSERT_OK(server->Restart());
  ASSERT_OK_AND_ASSIGN(auto client, server->Client());
  ASSERT_OK_AND_ASSIGN(ShuffleStatus status, client->GetShuffle("dup"));
  EXPECT_TRUE(status.wedged);
  EXPECT_NE(status.wedge.find("in data directories 1 and 2"), std::string::npos) << status.wedge;
  EXPECT_THAT(Count(*client, "dup", 2).status(),
              StatusIs(absl::StatusCode::kUnavailable, "in data directories 1 and 2"));
  ASSERT_OK(client->DeleteShuffle("dup"));
  EXPECT_FALSE(Holds(a, "dup"));
  EXPECT_FALSE(Holds(b, "dup"));
  ASSERT_OK(server->Restart());
  ASSERT_OK_AND_ASSIGN(client, server->Client());
  EXPECT_THAT(client->GetShuffle("dup").status(), StatusIs(absl::StatusCode::kNotFound, "dup"));
  EXPECT_OK(client->CreateShuffle("dup", 2, 1).status());
}

TEST_F(FailingDirTest, NoUsableDirectoryFailsTheStartNamingEach) {
  Fail(true);
  Fail(true, other_);
  ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.data_dir = disk_ + "," + other_;
  EXPECT_THAT(SluiceServer::Start(o).status(),
              StatusIs(absl::StatusCode::kUnavailable, "no data directory can be used"));
}

}  // namespace
}  // namespace sluice
