// What the ShuffleStore tests share (tests/server/shuffle_store*_test.cc): frames that name their
// mapper, partition and record, and ShuffleStoreTest, one store ("s1") on a real temporary
// directory with its attempts written, reopened and read back.
#ifndef SLUICE_TESTS_SERVER_SHUFFLE_STORE_FIXTURE_H_
#define SLUICE_TESTS_SERVER_SHUFFLE_STORE_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/frame_format.h"
#include "server/storage/shuffle_store.h"
#include "tests/harness/frames.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/temp_dir.h"

namespace sluice::store_test {

using testing::Bytes;
using testing::TempDir;

// A frame of `n` records whose keys and values name the mapper, partition and index; with
// `padding`, each value also carries that many pseudo-random (incompressible) bytes.
inline std::string MakeFrame(uint32_t mapper, uint32_t partition, int n, int salt = 0,
                             size_t padding = 0) {
  std::vector<std::string> keys, values;
  uint64_t x = 0x9e3779b97f4a7c15ULL * (mapper + 1) + partition;
  for (int i = 0; i < n; ++i) {
    keys.push_back("k" + std::to_string(mapper) + "-" + std::to_string(partition) + "-" +
                   std::to_string(i));
    values.push_back("v" + std::to_string(salt) + "-" + std::to_string(i));
    for (size_t k = 0; k < padding; ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      values.back().push_back(static_cast<char>('a' + x % 26));
    }
  }
  std::vector<Record> records;
  for (int i = 0; i < n; ++i) records.push_back(Record{keys[i], values[i]});
  EncodeOptions opts;
  opts.layout = LayoutChoice::kOpaque;
  FrameEncoder enc(opts);
  std::string frame;
  EXPECT_OK(enc.Encode(records, &frame));
  return frame;
}

// The shuffle's directory as messages name it (relative to the data directory).
inline constexpr char kShown[] = "shuffles/s1";

class ShuffleStoreTest : public ::testing::Test {
 protected:
  std::string ShuffleDir() const { return dir_.path() + "/shuffles/s1"; }

  std::unique_ptr<ShuffleStore> CreateStore(uint32_t partitions = 4, uint32_t mappers = 8) {
    ShuffleParams params{"s1", partitions, mappers};
    auto store = ShuffleStore::Create(ShuffleDir(), kShown, params, StoreOptions{});
    EXPECT_OK(store);
    return std::move(store).value();
  }
  std::unique_ptr<ShuffleStore> Reopen() {
    auto store = ShuffleStore::Open(ShuffleDir(), kShown, StoreOptions{});
    EXPECT_OK(store);
    return store.ok() ? std::move(store).value() : nullptr;
  }

  // Writes one frame per partition for (mapper, attempt) and returns the blocks.
  std::vector<BlockRef> WriteAttempt(ShuffleStore& store, uint32_t mapper, uint64_t attempt,
                                     int records = 5, size_t padding = 0) {
    std::vector<BlockRef> blocks;
    for (uint32_t p = 0; p < store.params().num_partitions; ++p) {
      const std::string frame = MakeFrame(mapper, p, records, static_cast<int>(attempt), padding);
      auto b = store.Append(mapper, attempt, p, Bytes(frame), records);
      EXPECT_OK(b);
      if (b.ok()) blocks.push_back(*b);
    }
    return blocks;
  }

  // All records of a partition as "key=value" strings, in stored order.
  std::vector<std::string> ReadPartition(const ShuffleStore& store, uint32_t p) {
    std::vector<std::string> out;
    FrameDecoder dec;
    DecodedFrame decoded;
    std::string frame;
    for (const BlockRef& b : store.CommittedBlocks(p)) {
      EXPECT_OK(store.ReadFrame(b, &frame));
      EXPECT_OK(dec.Decode(frame, &decoded));
      for (const Record& r : decoded)
        out.push_back(std::string(r.key) + "=" + std::string(r.value));
    }
    return out;
  }

  TempDir dir_;
};

}  // namespace sluice::store_test

#endif  // SLUICE_TESTS_SERVER_SHUFFLE_STORE_FIXTURE_H_
