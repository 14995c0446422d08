// The deterministic datasets of the codec benchmark (docs/benchmarks.md defines them).
// Each record's value is a msgpack map; its key is the msgpack encoding of one field, the way
// zephyr derives shuffle keys. Generated with a seeded splitmix64 so every machine and every
// tool sees the same bytes.
#ifndef SLUICE_CODEC_BENCH_DATASETS_H_
#define SLUICE_CODEC_BENCH_DATASETS_H_

#include <string>
#include <vector>

#include "codec/frame_format.h"

namespace sluice::bench {

struct Dataset {
  std::string name;         // e.g. "ints3"
  std::string description;  // one line for tables
  std::vector<std::string> keys;
  std::vector<std::string> values;

  std::vector<Record> Records() const {
    std::vector<Record> r(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) r[i] = Record{keys[i], values[i]};
    return r;
  }
};

/// The seed's four datasets: ints3 (N=10,000), int_float_str (N=10,000), wide10 (N=5,000),
/// str3 (N=5,000); then items (N=5,000), the record `sluice bench` shuffles.
std::vector<Dataset> MakeSeedDatasets(uint64_t seed = 42);

}  // namespace sluice::bench

#endif  // SLUICE_CODEC_BENCH_DATASETS_H_
