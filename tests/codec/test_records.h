// Random record generators shared by the codec tests: raw bytes, arbitrary msgpack values, and
// batches shaped for the COLUMNAR layout, with the edge values of every msgpack encoding.
#ifndef SLUICE_TESTS_CODEC_TEST_RECORDS_H_
#define SLUICE_TESTS_CODEC_TEST_RECORDS_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/endian.h"
#include "codec/frame_format.h"
#include "codec/msgpack_scan.h"

namespace sluice::testing {

/// Owns the bytes of a batch; Records() gives views.
struct Batch {
  std::vector<std::string> keys;
  std::vector<std::string> values;
  void Add(std::string k, std::string v) {
    keys.push_back(std::move(k));
    values.push_back(std::move(v));
  }
  size_t size() const { return keys.size(); }
  std::vector<Record> Records() const {
    std::vector<Record> r(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) r[i] = Record{keys[i], values[i]};
    return r;
  }
};

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  std::mt19937_64& rng() { return rng_; }
  uint64_t Below(uint64_t n) { return rng_() % n; }
  bool Coin() { return (rng_() & 1) != 0; }

  std::string Bytes(size_t max_len) {
    std::string s(Below(max_len + 1), '\0');
    for (char& c : s) c = static_cast<char>(rng_());
    return s;
  }

  // Canonical msgpack writers.
  static void Int(std::string* o, int64_t v) {
    uint8_t b[9];
    o->append(reinterpret_cast<char*>(b), mp::WriteInt(b, v) - b);
  }
  static void Str(std::string* o, const std::string& s) {
    uint8_t b[5];
    o->append(reinterpret_cast<char*>(b),
              mp::WriteStrHeader(b, static_cast<uint32_t>(s.size())) - b);
    o->append(s);
  }
  static void Bin(std::string* o, const std::string& s) {
    uint8_t b[5];
    o->append(reinterpret_cast<char*>(b),
              mp::WriteBinHeader(b, static_cast<uint32_t>(s.size())) - b);
    o->append(s);
  }
  static void MapHeader(std::string* o, uint32_t n) {
    uint8_t b[5];
    o->append(reinterpret_cast<char*>(b), mp::WriteMapHeader(b, n) - b);
  }
  static void F64(std::string* o, uint64_t bits) {
    uint8_t b[9];
    b[0] = 0xcb;
    StoreBE64(b + 1, bits);
    o->append(reinterpret_cast<char*>(b), 9);
  }
  static void F32(std::string* o, uint32_t bits) {
    uint8_t b[5];
    b[0] = 0xca;
    StoreBE32(b + 1, bits);
    o->append(reinterpret_cast<char*>(b), 5);
  }

  /// An int that hits every canonical width boundary often.
  int64_t EdgeInt() {
    static const int64_t kEdges[] = {
        0,        1,   127, 128,  255,  256,    65535,  65536,         4294967295,    4294967296,
        -1,       -32, -33, -128, -129, -32768, -32769, -2147483648LL, -2147483649LL, INT64_MAX,
        INT64_MIN};
    switch (Below(4)) {
      case 0:
        return kEdges[Below(std::size(kEdges))];
      case 1:
        return static_cast<int64_t>(rng_());
      case 2:
        return static_cast<int64_t>(Below(300)) - 150;
      default:
        return static_cast<int64_t>(rng_() >> Below(64));
    }
  }
  /// A string length that hits the str/bin header boundaries.
  size_t EdgeLen() {
    static const size_t kEdges[] = {0, 1, 31, 32, 255, 256, 65535, 65536};
    if (Below(8) == 0) return kEdges[Below(std::size(kEdges))];
    return Below(40);
  }

  /// One arbitrary msgpack object (nested up to `depth`), canonical or not.
  void AnyValue(std::string* o, int depth);

  /// A scalar of column type t (see ColumnType numbering), canonical.
  void Scalar(std::string* o, int t);

 private:
  std::mt19937_64 rng_;
};

inline void Gen::Scalar(std::string* o, int t) {
  switch (t) {
    case 0:
      o->push_back(static_cast<char>(0xc0));
      break;
    case 1:
      o->push_back(static_cast<char>(Coin() ? 0xc3 : 0xc2));
      break;
    case 2:
      Int(o, EdgeInt());
      break;
    case 3:
      F32(o, static_cast<uint32_t>(rng_()));
      break;
    case 4:
      F64(o, rng_());
      break;
    case 5: {
      std::string s(EdgeLen(), 'x');
      for (char& c : s) c = static_cast<char>('a' + Below(26));
      Str(o, s);
      break;
    }
    default: {
      std::string s(EdgeLen(), '\0');
      for (char& c : s) c = static_cast<char>(rng_());
      Bin(o, s);
      break;
    }
  }
}

inline void Gen::AnyValue(std::string* o, int depth) {
  const uint64_t kind = depth > 0 ? Below(12) : Below(9);
  switch (kind) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4:
    case 5:
    case 6:
      Scalar(o, static_cast<int>(kind));
      break;
    case 7: {  // ext (fixext 4)
      o->push_back(static_cast<char>(0xd6));
      o->push_back(static_cast<char>(Below(128)));
      o->append(std::string(4, 'e'));
      break;
    }
    case 8: {  // non-canonical int: uint8 holding a small value
      o->push_back(static_cast<char>(0xcc));
      o->push_back(static_cast<char>(Below(128)));
      break;
    }
    case 9:
    case 10: {  // array
      const uint32_t n = static_cast<uint32_t>(Below(5));
      o->push_back(static_cast<char>(0x90 | n));
      for (uint32_t i = 0; i < n; ++i) AnyValue(o, depth - 1);
      break;
    }
    default: {  // map
      const uint32_t n = static_cast<uint32_t>(Below(4));
      MapHeader(o, n);
      for (uint32_t i = 0; i < n; ++i) {
        Str(o, "k" + std::to_string(i));
        AnyValue(o, depth - 1);
      }
      break;
    }
  }
}

/// A batch every record of which fits the COLUMNAR layout: maps with `fields` fields of
/// random but fixed kinds (every scalar type, plus strings from a small vocabulary, lowercase
/// hex strings and decimal floats, which take the dictionary, hex and decimal encodings); keys
/// are typed msgpack scalars, raw bytes, or a copy of one field's value.
inline Batch ColumnarBatch(Gen& g, size_t n, size_t fields) {
  // kinds 0-6: Gen::Scalar types; 7: vocabulary str; 8: hex str; 9: decimal float64;
  // 10: an int that rises or falls by steps in a narrow range (timestamps; delta-packed).
  std::vector<int> kinds(fields);
  for (int& k : kinds) k = static_cast<int>(g.Below(11));
  std::vector<int64_t> running(fields);
  std::vector<int64_t> step_base(fields);
  std::vector<uint64_t> step_range(fields);
  for (size_t j = 0; j < fields; ++j) {
    running[j] = g.EdgeInt();
    step_base[j] = static_cast<int64_t>(g.Below(2000)) - 1000;
    step_range[j] = 1 + g.Below(g.Coin() ? 32 : 4000);
  }
  const int key_kind = static_cast<int>(g.Below(10));  // 7 = raw bytes, 8/9 = copy of a field
  const size_t key_field = fields == 0 ? 0 : g.Below(fields);
  std::vector<std::string> vocab;
  const size_t vocab_size = 1 + g.Below(g.Coin() ? 8 : 400);
  for (size_t i = 0; i < vocab_size; ++i) vocab.push_back("w" + std::to_string(g.rng()() % 100000));
  const int exponent = static_cast<int>(g.Below(5));
  Batch b;
  for (size_t i = 0; i < n; ++i) {
    std::string v;
    std::string field_bytes;
    Gen::MapHeader(&v, static_cast<uint32_t>(fields));
    for (size_t j = 0; j < fields; ++j) {
      Gen::Str(&v, "field_" + std::to_string(j));
      std::string x;
      switch (kinds[j]) {
        case 7:
          Gen::Str(&x, vocab[g.Below(vocab.size())]);
          break;
        case 8: {
          static const char kDigits[] = "0123456789abcdef";
          std::string h(2 * g.Below(20), '0');
          for (char& c : h) c = kDigits[g.Below(16)];
          Gen::Str(&x, h);
          break;
        }
        case 10:
          running[j] =
              static_cast<int64_t>(static_cast<uint64_t>(running[j]) +
                                   static_cast<uint64_t>(step_base[j]) + g.Below(step_range[j]));
          Gen::Int(&x, running[j]);
          break;
        case 9: {
          static const double kPow[] = {1, 10, 100, 1000, 10000};
          const double d = static_cast<double>(static_cast<int64_t>(g.Below(2000000)) - 1000000) /
                           kPow[exponent];
          uint64_t bits;
          std::memcpy(&bits, &d, 8);
          Gen::F64(&x, bits);
          break;
        }
        default:
          g.Scalar(&x, kinds[j]);
      }
      if (j == key_field) field_bytes = x;
      v += x;
    }
    std::string k;
    if (key_kind == 7) {
      k = g.Bytes(12);
    } else if (key_kind >= 8 && fields > 0) {
      k = field_bytes;
    } else {
      g.Scalar(&k, key_kind % 7);
    }
    b.Add(std::move(k), std::move(v));
  }
  return b;
}

/// Maps that COLUMNAR stores partly as plain sections: a random float64, a random 40-bit int,
/// a 300-name string column (bit-packed dictionary codes) and a small skewed int.
inline Batch SectionedBatch(Gen& g, size_t n) {
  Batch b;
  for (size_t i = 0; i < n; ++i) {
    std::string v;
    Gen::MapHeader(&v, 4);
    Gen::Str(&v, "x");
    Gen::F64(&v, (uint64_t{0x3ff} << 52) | (g.rng()() >> 12));  // in [1, 2)
    Gen::Str(&v, "id");
    Gen::Int(&v, static_cast<int64_t>(g.rng()() >> 24));
    Gen::Str(&v, "name");
    Gen::Str(&v, "name-" + std::to_string(g.Below(300)));
    Gen::Str(&v, "n");
    Gen::Int(&v, static_cast<int64_t>(g.Below(4)));
    b.Add(g.Bytes(3), v);
  }
  return b;
}

/// Builds a frame around `payload` with valid checksums, as an attacker could.
inline std::string Forge(Layout layout, Compression c, uint8_t flags, uint32_t count,
                         uint32_t uncompressed, const std::string& payload) {
  FrameHeader h;
  h.layout = layout;
  h.compression = c;
  h.flags = flags;
  h.record_count = count;
  h.uncompressed_size = uncompressed;
  h.stored_size = static_cast<uint32_t>(payload.size());
  h.payload_checksum =
      PayloadChecksum(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  std::string frame(kFrameHeaderSize, '\0');
  WriteFrameHeader(h, reinterpret_cast<uint8_t*>(frame.data()));
  return frame + payload;
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_CODEC_TEST_RECORDS_H_
