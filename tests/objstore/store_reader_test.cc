// Reading a shuffle from the object store with no server (client/store_reader.h): objects and a
// manifest put in a real S3 server (s3rver; moto_server where present) as the servers write
// them, read back by StoreShuffle in both orders. COLUMNAR frames (which rebuild their records
// larger than their payload) included.
#include "client/store_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/key_bounds.h"
#include "objstore/partition_object.h"
#include "tests/harness/frames.h"
#include "tests/harness/s3_server.h"
#include "tests/harness/status_matchers.h"

namespace sluice::testing {
namespace {

class StoreReaderTest : public S3ServerTest {};

// A msgpack map {"n": i, "s": "<i>..."}: what a dict writer sends, and COLUMNAR takes.
std::string Row(uint32_t i) {
  const std::string s = "value-" + std::to_string(i) + "-" + std::string(i % 50, 'x');
  std::string v = "\x82\xa1n";
  v += '\xce';  // uint32
  for (int b = 3; b >= 0; --b) v += static_cast<char>((i >> (8 * b)) & 0xff);
  v += "\xa1s";
  v += '\xd9';  // str8
  v += static_cast<char>(s.size());
  return v + s;
}

TEST_P(StoreReaderTest, AShufflesObjectsReadBackInBothOrdersColumnarFramesIncluded) {
  ASSERT_OK_AND_ASSIGN(auto store, objstore::S3Store::Make(s3_->Options("r")));
  ShuffleManifest m;
  m.shuffle_id = "job";
  m.partitions = 2;
  m.mappers = 3;
  std::vector<Rows> want(2);
  for (uint32_t p = 0; p < 2; ++p) {
    objstore::PartitionObjectFooter footer;
    footer.shuffle_id = "job";
    footer.partition = p;
    std::string object;
    for (uint32_t mapper = 0; mapper < 3; ++mapper) {
      footer.winners.emplace_back(mapper, 10 + mapper);
      if (mapper == 1 && p == 1) continue;  // (a mapper with nothing here)
      for (int f = 0; f < 2; ++f) {
        Rows rows;
        for (uint32_t i = 0; i < 500; ++i) {
          rows.emplace_back("k" + std::to_string((i * 7919 + mapper * 31 + f) % 1000),
                            Row(i + 1000 * mapper));
        }
        std::sort(rows.begin(), rows.end());
        EncodeOptions eo;
        eo.layout = mapper == 2 ? LayoutChoice::kMsgpack : LayoutChoice::kColumnar;
        eo.sort_by_key = true;
        const std::string frame = EncodeRows(rows, eo);
        ASSERT_EQ(DecodeRows(frame), rows);
        footer.frames.push_back(objstore::ObjectFrame{mapper,
                                                      10 + mapper,
                                                      object.size(),
                                                      static_cast<uint32_t>(frame.size()),
                                                      500,
                                                      static_cast<uint32_t>(frame.size()),
                                                      {}});
        object += frame;
        want[p].insert(want[p].end(), rows.begin(), rows.end());
      }
    }
    object += objstore::EncodeFooter(footer);
    const std::string key = PartitionObjectKey("job", p, "n0", p);
    ASSERT_OK(store->Put(key, object));
    ObjectRecord r;
    r.key = key;
    r.size = object.size();
    r.by = "n0";
    r.frames = static_cast<uint32_t>(footer.frames.size());
    r.winners = footer.winners;
    m.objects[p] = r;
  }
  ASSERT_OK(store->Put(ManifestKey("job"), EncodeShuffleManifest(m)));

  StoreReadOptions o;
  o.batch_bytes = 1;  // a frame a batch
  o.ranges.range_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(auto shuffle, StoreShuffle::Open(store.get(), "job", o));
  EXPECT_EQ(shuffle->manifest(), m);
  for (uint32_t p = 0; p < 2; ++p) {
    for (FetchOrder order : {FetchOrder::kUnordered, FetchOrder::kKey}) {
      ReaderOptions ro;
      ro.order = order;
      ASSERT_OK_AND_ASSIGN(auto reader, shuffle->OpenReader(p, ro));
      Rows got;
      Record r;
      for (;;) {
        ASSERT_OK_AND_ASSIGN(bool more, reader->Next(&r));
        if (!more) break;
        got.emplace_back(std::string(r.key), std::string(r.value));
      }
      Rows expected = want[p];
      if (order == FetchOrder::kKey) {
        // Equal keys in mapper order, then the frames' order (a stable sort of the object's).
        std::stable_sort(expected.begin(), expected.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      EXPECT_EQ(got, expected) << "partition " << p << (order == FetchOrder::kKey ? " KEY" : "");
    }
  }
  // A KEY read past the reader's memory limit is refused, naming it.
  StoreReadOptions small = o;
  small.max_merge_bytes = 1000;
  ASSERT_OK_AND_ASSIGN(auto limited, StoreShuffle::Open(store.get(), "job", small));
  ReaderOptions key;
  key.order = FetchOrder::kKey;
  EXPECT_THAT(limited->OpenReader(0, key).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_merge_bytes"));
  EXPECT_THAT(StoreShuffle::Open(store.get(), "other").status(),
              StatusIs(absl::StatusCode::kNotFound, "no manifest of shuffle 'other'"));
}

// The footer's key bounds are its index: a KEY read of a key range reads only the frames whose
// bounds meet it (here one of four, in bytes from the store), and returns exactly the records in
// the range; a frame without bounds may hold any key and is read.
TEST_P(StoreReaderTest, AKeyRangeReadsOnlyTheFramesWhoseBoundsMeetIt) {
  ASSERT_OK_AND_ASSIGN(auto store, objstore::S3Store::Make(s3_->Options("b")));
  objstore::PartitionObjectFooter footer;
  footer.shuffle_id = "ranged";
  footer.partition = 0;
  footer.winners = {{0, 1}, {1, 1}};
  std::string object;
  Rows all;
  uint64_t frame_bytes = 0;
  for (uint32_t f = 0; f < 5; ++f) {
    const uint32_t mapper = f < 4 ? 0 : 1;
    Rows rows;
    for (uint32_t i = 0; i < 400; ++i) {
      char key[16];
      // Mapper 0: frame f holds keys k<f>000..k<f>399; mapper 1 (no bounds): a few everywhere.
      std::snprintf(key, sizeof(key), "k%u%03u", mapper == 0 ? f : i % 4, i);
      std::string value(1000, 'a');
      uint64_t x = 0x9e3779b97f4a7c15ULL * (f + 1) + i;
      for (char& c : value) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c = static_cast<char>('a' + x % 26);  // (zstd cannot shrink it much)
      }
      rows.emplace_back(key, value);
    }
    std::sort(rows.begin(), rows.end());
    EncodeOptions eo;
    eo.sort_by_key = true;
    const std::string frame = EncodeRows(rows, eo);
    std::string bounds;
    if (mapper == 0) {
      FrameDecoder decoder;
      DecodedFrame decoded;
      ASSERT_OK(decoder.Decode(frame, &decoded));
      std::vector<std::string_view> scratch;
      AppendFrameBounds(decoded, &bounds, &scratch);
    }
    footer.frames.push_back(objstore::ObjectFrame{mapper, 1, object.size(),
                                                  static_cast<uint32_t>(frame.size()), 400,
                                                  static_cast<uint32_t>(frame.size()), bounds});
    object += frame;
    frame_bytes = std::max<uint64_t>(frame_bytes, frame.size());
    all.insert(all.end(), rows.begin(), rows.end());
  }
  object += objstore::EncodeFooter(footer);
  ShuffleManifest m;
  m.shuffle_id = "ranged";
  m.partitions = 1;
  m.mappers = 2;
  ObjectRecord r;
  r.key = PartitionObjectKey("ranged", 0, "n0", 1);
  r.size = object.size();
  r.by = "n0";
  r.frames = 5;
  r.winners = footer.winners;
  m.objects[0] = r;
  ASSERT_OK(store->Put(r.key, object));
  ASSERT_OK(store->Put(ManifestKey("ranged"), EncodeShuffleManifest(m)));

  StoreReadOptions o;
  o.ranges.range_bytes = 1;  // (a GET a frame: what is read is what is asked for)
  o.ranges.tail_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(auto shuffle, StoreShuffle::Open(store.get(), "ranged", o));
  ReaderOptions range;
  range.order = FetchOrder::kKey;
  range.from_key = "k2";
  range.to_key = "k3";
  const uint64_t before = store->counters().bytes_received;
  ASSERT_OK_AND_ASSIGN(auto reader, shuffle->OpenReader(0, range));
  Rows got;
  Record rec;
  for (;;) {
    ASSERT_OK_AND_ASSIGN(bool more, reader->Next(&rec));
    if (!more) break;
    got.emplace_back(std::string(rec.key), std::string(rec.value));
  }
  const uint64_t read = store->counters().bytes_received - before;
  Rows want;
  for (const auto& kv : all) {
    if (kv.first >= "k2" && kv.first < "k3") want.push_back(kv);
  }
  std::stable_sort(want.begin(), want.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  EXPECT_EQ(got.size(), 500u) << "400 of mapper 0's frame 2, 100 of mapper 1's";
  EXPECT_EQ(got, want);
  // Mapper 0's frame 2 and mapper 1's frame (and the footer): not mapper 0's other three.
  EXPECT_LT(read, 3 * frame_bytes) << read;
  EXPECT_GT(read, frame_bytes) << read;
}

INSTANTIATE_TEST_SUITE_P(Servers, StoreReaderTest, S3ServerKinds(), S3ServerName);

}  // namespace
}  // namespace sluice::testing
