// libFuzzer target for FrameEncoder: batches built from the fuzzer's bytes must round-trip
// byte for byte through every layout choice.
//
// The batches are mostly COLUMNAR-shaped (maps of one shape whose keys copy a field), because
// that is where the encoder has to prove equality cheaply (dictionaries, key references, hex,
// decimals, canonical integers); the fuzzer then bends them: a key that differs from its field in
// one byte, a value of another type, a non-canonical integer, a repeated or hex-looking string,
// trailing bytes.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "codec/endian.h"
#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/msgpack_scan.h"

namespace {

void PutInt(std::string* o, int64_t v) {
  uint8_t b[9];
  o->append(reinterpret_cast<char*>(b), sluice::mp::WriteInt(b, v) - b);
}
void PutStr(std::string* o, const std::string& s) {
  uint8_t b[5];
  o->append(reinterpret_cast<char*>(b),
            sluice::mp::WriteStrHeader(b, static_cast<uint32_t>(s.size())) - b);
  o->append(s);
}

// One scalar of kind k, from the fuzzer's bytes.
void PutScalar(FuzzedDataProvider& in, int kind, const std::vector<std::string>& vocab,
               std::string* o) {
  switch (kind) {
    case 0:
      o->push_back(static_cast<char>(0xc0));
      break;
    case 1:
      o->push_back(static_cast<char>(in.ConsumeBool() ? 0xc3 : 0xc2));
      break;
    case 2:
      PutInt(o, in.ConsumeIntegral<int64_t>());
      break;
    case 3: {  // float64: often a decimal, sometimes anything
      double d;
      if (in.ConsumeBool()) {
        static const double kPow[] = {1, 10, 100, 1000, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9};
        d = static_cast<double>(in.ConsumeIntegralInRange<int64_t>(-(1ll << 40), 1ll << 40)) /
            kPow[in.ConsumeIntegralInRange<int>(0, 9)];
      } else {
        const uint64_t bits = in.ConsumeIntegral<uint64_t>();
        std::memcpy(&d, &bits, 8);
      }
      uint8_t b[9];
      b[0] = 0xcb;
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      sluice::StoreBE64(b + 1, bits);
      o->append(reinterpret_cast<char*>(b), 9);
      break;
    }
    case 4: {  // str: from the vocabulary (dictionary), hex-looking, or arbitrary
      const int how = in.ConsumeIntegralInRange<int>(0, 2);
      if (how == 0 && !vocab.empty()) {
        PutStr(o, vocab[in.ConsumeIntegralInRange<size_t>(0, vocab.size() - 1)]);
      } else if (how == 1) {
        std::string h = in.ConsumeRandomLengthString(40);
        for (char& c : h) c = "0123456789abcdef"[static_cast<uint8_t>(c) % 16];
        PutStr(o, h);
      } else {
        PutStr(o, in.ConsumeRandomLengthString(40));
      }
      break;
    }
    default: {  // raw msgpack bytes: whatever the fuzzer says (non-canonical ints, ext...)
      const std::string raw = in.ConsumeRandomLengthString(12);
      o->append(raw.empty() ? std::string("\xcc\x05", 2) : raw);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static auto* decoder = new sluice::FrameDecoder;
  static auto* decoded = new sluice::DecodedFrame;

  const size_t fields = in.ConsumeIntegralInRange<size_t>(0, 6);
  const size_t n = in.ConsumeIntegralInRange<size_t>(1, 300);
  std::vector<int> kinds(fields);
  for (int& k : kinds) k = in.ConsumeIntegralInRange<int>(0, 4);
  std::vector<std::string> vocab(in.ConsumeIntegralInRange<size_t>(0, 20));
  for (std::string& w : vocab) w = in.ConsumeRandomLengthString(20);
  const size_t key_field = fields == 0 ? 0 : in.ConsumeIntegralInRange<size_t>(0, fields - 1);

  std::vector<std::string> keys(n), values(n);
  for (size_t i = 0; i < n && in.remaining_bytes() > 0; ++i) {
    std::string& v = values[i];
    uint8_t header[5];
    v.append(reinterpret_cast<char*>(header),
             sluice::mp::WriteMapHeader(header, static_cast<uint32_t>(fields)) - header);
    std::string key_bytes;
    for (size_t j = 0; j < fields; ++j) {
      PutStr(&v, "f" + std::to_string(j));
      // Usually the column's kind; sometimes another (mixed types must fall back).
      const int kind = in.ConsumeIntegralInRange<int>(0, 15) == 0
                           ? in.ConsumeIntegralInRange<int>(0, 5)
                           : kinds[j];
      const size_t start = v.size();
      PutScalar(in, kind, vocab, &v);
      if (j == key_field) key_bytes = v.substr(start);
    }
    if (in.ConsumeIntegralInRange<int>(0, 31) == 0) v.push_back('\x01');  // trailing byte
    // The key: usually a copy of the key field's encoding, sometimes with one byte changed.
    keys[i] = key_bytes;
    if (!keys[i].empty() && in.ConsumeIntegralInRange<int>(0, 7) == 0) {
      keys[i][in.ConsumeIntegralInRange<size_t>(0, keys[i].size() - 1)] ^=
          static_cast<char>(1 + in.ConsumeIntegralInRange<int>(0, 254));
    }
  }
  std::vector<sluice::Record> records(n);
  for (size_t i = 0; i < n; ++i) records[i] = sluice::Record{keys[i], values[i]};

  for (auto layout : {sluice::LayoutChoice::kAuto, sluice::LayoutChoice::kColumnar,
                      sluice::LayoutChoice::kOpaque}) {
    sluice::EncodeOptions opts;
    opts.layout = layout;
    opts.sort_by_key = in.ConsumeBool();
    opts.compression = in.ConsumeBool() ? sluice::Compression::kZstd : sluice::Compression::kNone;
    sluice::FrameEncoder encoder(opts);
    std::string frame;
    if (!encoder.Encode(records, &frame).ok()) continue;  // COLUMNAR on non-msgpack values
    if (!decoder->Decode(frame, decoded).ok()) std::abort();
    if (decoded->size() != n) std::abort();
    // Sorting is stable, so compare against the same stable order.
    std::vector<sluice::Record> want = records;
    if (opts.sort_by_key) {
      std::stable_sort(want.begin(), want.end(),
                       [](const sluice::Record& a, const sluice::Record& b) {
                         return sluice::KeyLess(a.key, b.key);
                       });
    }
    for (size_t i = 0; i < n; ++i) {
      if ((*decoded)[i].key != want[i].key || (*decoded)[i].value != want[i].value) std::abort();
    }
  }
  return 0;
}
