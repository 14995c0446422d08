// What the COLUMNAR tests share (tests/codec/columnar*_test.cc): msgpack values written by
// hand (Map, I, S, F), AUTO's layout choice for a batch with its round trip checked, a COLUMNAR
// encoder and decoder kept across batches, a batch's payload under a ColumnarDecoder, and
// random text from an alphabet.
#ifndef SLUICE_TESTS_CODEC_COLUMNAR_FIXTURE_H_
#define SLUICE_TESTS_CODEC_COLUMNAR_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "codec/columnar.h"
#include "codec/columnar_internal.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/frame_format.h"
#include "tests/codec/test_records.h"

namespace sluice::columnar_test {

// AUTO as these tests mean it: COLUMNAR whenever the batch fits it, however few its records.
inline EncodeOptions Auto() {
  EncodeOptions o;
  o.min_columnar_records = 0;
  return o;
}

using testing::Batch;
using testing::Gen;

inline std::string Map(std::initializer_list<std::pair<std::string, std::string>> fields) {
  std::string v;
  Gen::MapHeader(&v, static_cast<uint32_t>(fields.size()));
  for (const auto& [k, val] : fields) {
    Gen::Str(&v, k);
    v += val;
  }
  return v;
}
inline std::string I(int64_t x) {
  std::string o;
  Gen::Int(&o, x);
  return o;
}
inline std::string S(const std::string& s) {
  std::string o;
  Gen::Str(&o, s);
  return o;
}

// Encodes with AUTO, checks the round trip, returns (layout, fallback reason).
inline std::pair<Layout, std::string> Auto(const Batch& b) {
  FrameEncoder enc(Auto());
  std::string frame;
  EXPECT_TRUE(enc.Encode(b.Records(), &frame).ok());
  FrameDecoder dec;
  DecodedFrame out;
  EXPECT_TRUE(dec.Decode(frame, &out).ok());
  EXPECT_EQ(out.size(), b.size());
  for (size_t i = 0; i < b.size() && i < out.size(); ++i) {
    EXPECT_EQ(out[i].key, b.keys[i]);
    EXPECT_EQ(out[i].value, b.values[i]);
  }
  return {enc.last_layout(), enc.last_fallback_reason()};
}

inline std::string F(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  std::string o;
  Gen::F64(&o, bits);
  return o;
}

// A COLUMNAR encoder without compression, and a decoder, kept across batches (the encoder's
// dictionary tables are reused from one batch to the next).
struct ColumnarRoundTrip {
  FrameEncoder enc{[] {
    EncodeOptions opts;
    opts.layout = LayoutChoice::kColumnar;
    opts.compression = Compression::kNone;
    return opts;
  }()};
  FrameDecoder dec;
  DecodedFrame out;
  std::string frame;

  // Encodes b, which must fit COLUMNAR; with `check`, decodes it and compares every record.
  // Returns the frame size.
  size_t Run(const Batch& b, bool check = true) {
    frame.clear();
    EXPECT_TRUE(enc.Encode(b.Records(), &frame).ok());
    EXPECT_EQ(enc.last_layout(), Layout::kColumnar) << enc.last_fallback_reason();
    if (!check) return frame.size();
    EXPECT_TRUE(dec.Decode(frame, &out).ok());
    EXPECT_EQ(out.size(), b.size());
    size_t wrong = 0;  // report the first few differences only
    for (size_t i = 0; i < b.size() && i < out.size() && wrong < 5; ++i) {
      if (out[i].key == b.keys[i] && out[i].value == b.values[i]) continue;
      ++wrong;
      ADD_FAILURE() << "record " << i << " differs (value " << out[i].value.size() << " bytes, "
                    << b.values[i].size() << " expected)";
    }
    return frame.size();
  }
};

// Encodes with COLUMNAR, checks the round trip and returns the frame size.
inline size_t ColumnarSize(const Batch& b) { return ColumnarRoundTrip().Run(b); }

// A batch's COLUMNAR payload, and a decoder for it (and for damaged copies of it).
struct PayloadUnderTest {
  ByteBuffer payload;
  ColumnarDecoder dec;
  ByteBuffer rows;
  PodBuffer<RecordRef> index;
  explicit PayloadUnderTest(const Batch& b) {
    ColumnarEncoder enc;
    std::string why;
    EXPECT_TRUE(enc.Encode(b.Records(), &payload, &why)) << why;
  }
  absl::Status Decode(const uint8_t* p, size_t size, uint32_t n) {
    return dec.Decode(p, size, n, 1u << 20, &rows, &index);
  }
};

inline std::string RandomText(uint64_t* state, const std::string& alphabet, size_t len) {
  std::string s(len, ' ');
  for (char& c : s) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    c = alphabet[(*state >> 33) % alphabet.size()];
  }
  return s;
}

}  // namespace sluice::columnar_test

#endif  // SLUICE_TESTS_CODEC_COLUMNAR_FIXTURE_H_
