// The background pre-merge reserves the disk space it will write before it starts (issue 50,
// item 3: a 32 MiB data directory holding 64 mappers' data at 56% had the whole-partition merge
// take it to 100%, refusing another shuffle's pushes past the 95% high-water mark, until the
// merge failed). On a real tmpfs of 32 MiB (root only, as the disk-full tests): a merge whose
// output would take the directory past --premerge's disk mark is not started; one that fits is.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "server/rules/premerge.h"
#include "server/rules/push_attempt.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::testing {
namespace {

class PremergeSpaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, "size=32m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
    }
    mounted_ = true;
    ASSERT_OK_AND_ASSIGN(registry_, ShuffleRegistry::Open(dir_.path(), StoreOptions{}));
    registry_->set_high_water_pct(95);
  }
  void TearDown() override {
    registry_.reset();
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  double UsedPct() {
    struct statvfs v {};
    ::statvfs(dir_.path().c_str(), &v);
    return 100.0 * (1.0 - static_cast<double>(v.f_bavail) / static_cast<double>(v.f_blocks));
  }
  // The size of shuffle `id`'s data file: a merge appends to it (and, failing, punches what it
  // wrote out, which leaves the size).
  uint64_t DataFileBytes(const std::string& id) {
    struct stat st {};
    ::stat((dir_.path() + "/shuffles/" + id + "/data").c_str(), &st);
    return static_cast<uint64_t>(st.st_size);
  }
  // Shuffle `id`, one partition, `mappers` mappers of one sorted frame each of `value_bytes`
  // incompressible bytes, every one committed (the partition is complete: a whole merge).
  void Fill(const std::string& id, uint32_t mappers, size_t value_bytes) {
    ASSERT_OK(registry_->Create({id, 1, mappers}).status());
    for (uint32_t m = 0; m < mappers; ++m) {
      PushAttempt a(registry_.get(), PushLimits{});
      ASSERT_OK(a.Open(id, m, 1));
      ASSERT_OK(a.AddFrame(0, Bytes(RandomValueFrame(value_bytes, m))));
      ASSERT_OK(a.Commit(1, 1).status());
    }
  }
  Premerger Make() {
    PremergeOptions o;
    o.bytes_per_s = uint64_t{1} << 40;
    o.min_runs = 4;
    o.merge.tmp_dir = dir_.path();
    o.disk_mark_pct = 85;
    return Premerger(registry_.get(), o, &metrics_);
  }

  TempDir dir_;
  bool mounted_ = false;
  std::unique_ptr<ShuffleRegistry> registry_;
  ServerMetrics metrics_;
};

TEST_F(PremergeSpaceTest, AMergeThatWouldPassTheDiskMarkIsNotStarted) {
  Fill("big", 64, 280 << 10);  // ~18 MiB: 56% of the directory
  const double before = UsedPct();
  ASSERT_GT(before, 50.0);
  ASSERT_LT(before, 85.0);
  const uint64_t data_bytes = DataFileBytes("big");
  Premerger premerge = Make();
  ASSERT_OK_AND_ASSIGN(auto big, registry_->Get("big"));
  EXPECT_THAT(premerge.MergeOne(big, 0, 0, 63).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "no room on the disk"));
  EXPECT_EQ(premerge.Run(), 0u);
  EXPECT_EQ(DataFileBytes("big"), data_bytes)
      << "the merge wrote (its blocks punched out when the disk filled) though it could not fit";
  EXPECT_LT(UsedPct(), before + 1.0);
  // Another shuffle's pushes go on as before.
  Fill("other", 2, 100 << 10);
}

TEST_F(PremergeSpaceTest, AMergeThatFitsUnderTheMarkIsMade) {
  Fill("small", 16, 200 << 10);  // ~3 MiB: its merge takes the directory to ~20%
  Premerger premerge = Make();
  EXPECT_EQ(premerge.Run(), 1u);
  EXPECT_GT(metrics_.premerge_bytes.load(), uint64_t{3} << 20);
}

}  // namespace
}  // namespace sluice::testing
