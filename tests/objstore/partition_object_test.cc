// partition_object.h: a partition's object's footer and trailer, round trip and every damage
// found (no store: the bytes alone).
#include "objstore/partition_object.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>

#include "codec/endian.h"
#include "objstore/object_record.h"
#include "objstore/s3_options.h"
#include "tests/harness/status_matchers.h"

namespace sluice::objstore {
namespace {

using ::sluice::testing::StatusIs;

// Frames of random sizes from the given winners (mapper 2 has none here), and their footer.
PartitionObjectFooter Sample(std::string* frames) {
  PartitionObjectFooter f;
  f.shuffle_id = "job-7";
  f.partition = 12;
  f.winners = {{0, 100}, {1, 101}, {2, 5}, {3, 77}};
  std::mt19937 rng(3);
  for (uint32_t m : {0u, 1u, 3u, 0u, 3u}) {
    ObjectFrame fr;
    fr.mapper = m;
    fr.attempt = m == 0 ? 100 : m == 1 ? 101 : 77;
    fr.offset = frames->size();
    fr.size = 10 + rng() % 500;
    fr.records = rng() % 40;
    fr.uncompressed = fr.size * 3;
    for (uint32_t i = 0; i < fr.size; ++i) frames->push_back(static_cast<char>(rng()));
    f.frames.push_back(fr);
  }
  return f;
}

absl::StatusOr<PartitionObjectFooter> Read(const std::string& object,
                                           absl::string_view id = "job-7",
                                           uint32_t partition = 12) {
  SLUICE_ASSIGN_OR_RETURN(
      uint64_t footer,
      FooterSize(absl::string_view(object).substr(object.size() - kTrailerBytes), object.size()));
  return DecodeFooter(
      absl::string_view(object).substr(object.size() - kTrailerBytes - footer, footer),
      object.size(), id, partition);
}

TEST(PartitionObjectTest, AFooterRoundTrips) {
  std::string frames;
  const PartitionObjectFooter f = Sample(&frames);
  const std::string object = frames + EncodeFooter(f);
  ASSERT_OK_AND_ASSIGN(PartitionObjectFooter back, Read(object));
  EXPECT_EQ(back.shuffle_id, f.shuffle_id);
  EXPECT_EQ(back.partition, f.partition);
  EXPECT_EQ(back.winners, f.winners);
  EXPECT_EQ(back.frames, f.frames);
  EXPECT_EQ(back.frames_bytes(), frames.size());
}

// Version 2 carries each frame's key bounds; a version 1 footer (an object uploaded by an
// earlier server) still reads, with none, and re-encodes to its very bytes (the fuzzer's one
// encoding: a version 1 footer once re-encoded as version 2).
TEST(PartitionObjectTest, KeyBoundsRoundTripAndVersionOneFootersStillRead) {
  std::string frames;
  PartitionObjectFooter f = Sample(&frames);
  f.frames[1].bounds = std::string("\x02\x01a\x01z\x01m\0\0\0\0\0\0\0\0", 15);
  const std::string v2 = EncodeFooter(f);
  ASSERT_OK_AND_ASSIGN(PartitionObjectFooter back, Read(frames + v2));
  EXPECT_EQ(back.version, 2);
  EXPECT_EQ(back.frames, f.frames);
  EXPECT_EQ(EncodeFooter(back), v2);
  f.version = 1;
  const std::string v1 = EncodeFooter(f);
  EXPECT_LT(v1.size(), v2.size());
  ASSERT_OK_AND_ASSIGN(back, Read(frames + v1));
  EXPECT_EQ(back.version, 1);
  EXPECT_TRUE(back.frames[1].bounds.empty()) << "version 1 has no bounds";
  EXPECT_EQ(EncodeFooter(back), v1);
}

TEST(PartitionObjectTest, AnEmptyPartitionStillNamesItsWinners) {
  PartitionObjectFooter f;
  f.shuffle_id = "s";
  f.partition = 0;
  f.winners = {{0, 1}, {1, 1}};
  ASSERT_OK_AND_ASSIGN(PartitionObjectFooter back, Read(EncodeFooter(f), "s", 0));
  EXPECT_EQ(back.winners, f.winners);
  EXPECT_TRUE(back.frames.empty());
}

// (The frames' own bytes are checked by their checksums when read: docs/frame-format.md.)
TEST(PartitionObjectTest, EveryByteOfTheFooterAndTrailerIsChecked) {
  std::string frames;
  const PartitionObjectFooter f = Sample(&frames);
  const std::string full = frames + EncodeFooter(f);
  for (size_t i = frames.size(); i < full.size(); ++i) {
    std::string bad = full;
    bad[i] ^= 0x20;
    EXPECT_FALSE(Read(bad).ok()) << "byte " << i - frames.size() << " of the footer";
  }
}

// One encoding: a footer whose checksums hold but whose reserved bytes are not zero is not one
// (found by tests/fuzz/object_footer_fuzzer.cc: it decoded, and encoded back otherwise).
TEST(PartitionObjectTest, ReservedBytesMustBeZero) {
  std::string frames;
  const PartitionObjectFooter f = Sample(&frames);
  std::string tail = EncodeFooter(f);
  const size_t footer = tail.size() - kTrailerBytes;
  tail[5] = 1;
  const uint64_t sum = XXH3_64bits(tail.data(), footer - 8);
  StoreLE64(reinterpret_cast<uint8_t*>(&tail[footer - 8]), sum);
  EXPECT_THAT(Read(frames + tail), StatusIs(absl::StatusCode::kDataLoss, "reserved bytes"));
}

TEST(PartitionObjectTest, DamageIsNamed) {
  std::string frames;
  PartitionObjectFooter f = Sample(&frames);
  const std::string object = frames + EncodeFooter(f);
  EXPECT_THAT(Read(object, "job-8"), StatusIs(absl::StatusCode::kDataLoss, "not partition 12"));
  EXPECT_THAT(Read(object, "job-7", 13), StatusIs(absl::StatusCode::kDataLoss, "of 'job-7'"));
  EXPECT_THAT(FooterSize("short", 5), StatusIs(absl::StatusCode::kDataLoss, "no trailer"));
  // Cut short: the footer no longer ends where the trailer says.
  const std::string cut = object.substr(0, 100) + object.substr(object.size() - 40);
  EXPECT_FALSE(Read(cut).ok());
  // The encoder trusts its caller; the decoder does not.
  PartitionObjectFooter gap = f;
  gap.frames[1].offset += 1;
  EXPECT_THAT(Read(frames + "x" + EncodeFooter(gap)),
              StatusIs(absl::StatusCode::kDataLoss, "frame 1 is not where"));
  PartitionObjectFooter loser = f;
  loser.frames[2].attempt = 99;
  EXPECT_THAT(Read(frames + EncodeFooter(loser)),
              StatusIs(absl::StatusCode::kDataLoss, "not a winner it lists"));
  PartitionObjectFooter unordered = f;
  std::swap(unordered.winners[0], unordered.winners[1]);
  EXPECT_THAT(Read(frames + EncodeFooter(unordered)),
              StatusIs(absl::StatusCode::kDataLoss, "mapper order"));
  EXPECT_THAT(Read(frames + "tail" + EncodeFooter(f)),
              StatusIs(absl::StatusCode::kDataLoss, "its frames end at"));
}

// Where a shuffle's objects lie: each partition object's key names its uploader (node ids may
// hold '-'), the manifest none.
TEST(PartitionObjectTest, AnObjectsKeyNamesItsUploader) {
  const std::string key = PartitionObjectKey("team~job", 3, "node-1.a_b", 0xab);
  EXPECT_EQ(key, "team~job/p3-node-1.a_b-00000000000000ab");
  EXPECT_TRUE(ValidObjectKey(key));
  EXPECT_EQ(PartitionObjectUploader(key), "node-1.a_b");
  EXPECT_EQ(PartitionObjectUploader(ManifestKey("team~job")), "");
  EXPECT_EQ(PartitionObjectUploader("team~job/p3"), "");
  EXPECT_EQ(ShuffleObjectsPrefix("team~job"), "team~job/");
}

}  // namespace
}  // namespace sluice::objstore
