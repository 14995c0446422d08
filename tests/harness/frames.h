// Frames for tests: records in, frame bytes out, and back.
#ifndef SLUICE_TESTS_HARNESS_FRAMES_H_
#define SLUICE_TESTS_HARNESS_FRAMES_H_

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"

namespace sluice::testing {

using Rows = std::vector<std::pair<std::string, std::string>>;

/// One frame of `rows` (the test fails if they cannot be encoded).
inline std::string EncodeRows(const Rows& rows, const EncodeOptions& options = {}) {
  std::vector<Record> records;
  records.reserve(rows.size());
  for (const auto& [k, v] : rows) records.push_back(Record{k, v});
  FrameEncoder encoder(options);
  std::string frame;
  const absl::Status st = encoder.Encode(records, &frame);
  EXPECT_TRUE(st.ok()) << st;
  return frame;
}

/// The records of one frame (the test fails if it does not decode).
inline Rows DecodeRows(std::string_view frame) {
  FrameDecoder decoder;
  DecodedFrame decoded;
  Rows rows;
  const absl::Status st = decoder.Decode(frame, &decoded);
  EXPECT_TRUE(st.ok()) << st;
  for (const Record& r : decoded) rows.emplace_back(std::string(r.key), std::string(r.value));
  return rows;
}

/// A frame of one record "k" whose value is `value_bytes` random bytes (zstd cannot shrink it:
/// it takes about that much on the wire and on disk).
inline std::string RandomValueFrame(size_t value_bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string value(value_bytes, '\0');
  for (char& c : value) c = static_cast<char>(rng());
  return EncodeRows({{"k", value}});
}

inline absl::Span<const uint8_t> Bytes(std::string_view s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_FRAMES_H_
