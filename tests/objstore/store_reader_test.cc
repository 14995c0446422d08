// Reading a shuffle from the object store with no server (client/store_reader.h): objects and a
// manifest put in a real S3 server (s3rver; moto_server where present) as the servers write
// them, read back by StoreShuffle in both orders. COLUMNAR frames (which rebuild their records
// larger than their payload) included.
#include "client/store_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "codec/frame_encoder.h"
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
        footer.frames.push_back(objstore::ObjectFrame{mapper, 10 + mapper, object.size(),
                                                      static_cast<uint32_t>(frame.size()), 500,
                                                      static_cast<uint32_t>(frame.size())});
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

INSTANTIATE_TEST_SUITE_P(Servers, StoreReaderTest, S3ServerKinds(), S3ServerName);

}  // namespace
}  // namespace sluice::testing
