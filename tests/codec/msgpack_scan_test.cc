// The scanner is checked against msgpack-cxx, the reference implementation: on valid objects,
// random garbage and every truncation, both must agree on whether one object parses and where
// it ends.
#include "codec/msgpack_scan.h"

#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <string>
#include <vector>

#include "tests/codec/test_records.h"

namespace sluice {
namespace {

// Returns the end offset of the first object per msgpack-cxx, or -1 if it does not parse.
// msgpack-cxx allocates a container before reading its elements, so a garbage header would
// make it allocate gigabytes: limit every count to the input size (each element takes at least
// one byte, so no valid input is refused by the limit).
long ReferenceEnd(const std::string& bytes) {
  try {
    std::size_t off = 0;
    const auto n = static_cast<std::size_t>(bytes.size());
    msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size(), off, nullptr, nullptr,
                                                msgpack::unpack_limit(n, n, n, n, n, n + 1));
    return static_cast<long>(off);
  } catch (const std::exception&) {
    return -1;
  }
}

long ScanEnd(const std::string& bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  mp::ScanError err;
  const uint8_t* q = mp::SkipObject(p, p + bytes.size(), &err);
  return q == nullptr ? -1 : static_cast<long>(q - p);
}

TEST(MsgpackScanTest, AgreesWithMsgpackCxxOnValidObjectsAndTruncations) {
  testing::Gen g(1);
  for (int i = 0; i < 2000; ++i) {
    std::string v;
    g.AnyValue(&v, 3);
    ASSERT_EQ(ScanEnd(v), static_cast<long>(v.size()));
    ASSERT_EQ(ReferenceEnd(v), static_cast<long>(v.size()));
    // Extra bytes after the object are not consumed.
    ASSERT_EQ(ScanEnd(v + "\x01"), static_cast<long>(v.size()));
    if (v.size() < 200) {
      for (size_t cut = 0; cut < v.size(); ++cut) {
        ASSERT_EQ(ScanEnd(v.substr(0, cut)), -1) << "cut " << cut;
      }
    }
  }
}

TEST(MsgpackScanTest, AgreesWithMsgpackCxxOnGarbage) {
  testing::Gen g(2);
  for (int i = 0; i < 20000; ++i) {
    const std::string bytes = g.Bytes(24);
    const long ref = ReferenceEnd(bytes);
    const long got = ScanEnd(bytes);
    ASSERT_EQ(got, ref) << "input of " << bytes.size() << " bytes, case " << i;
  }
}

TEST(MsgpackScanTest, HugeDeclaredCountsFailFastWithoutRecursion) {
  // array32 of 2^32-1 elements with 3 bytes present.
  const std::string a("\xdd\xff\xff\xff\xff\x01\x02\x03", 8);
  EXPECT_EQ(ScanEnd(a), -1);
  // 100,000 nested single-element arrays: no recursion, so no stack overflow.
  std::string deep(100000, static_cast<char>(0x91));
  deep.push_back(0x01);
  EXPECT_EQ(ScanEnd(deep), static_cast<long>(deep.size()));
}

TEST(MsgpackScanTest, ReservedByteIsRejected) {
  const std::string r("\xc1", 1);
  const auto* p = reinterpret_cast<const uint8_t*>(r.data());
  mp::ScanError err;
  EXPECT_EQ(mp::SkipObject(p, p + 1, &err), nullptr);
  EXPECT_EQ(err, mp::ScanError::kReservedByte);
}

TEST(MsgpackScanTest, CanonicalIntsMatchMsgpackCxxPacking) {
  testing::Gen g(3);
  for (int i = 0; i < 5000; ++i) {
    const int64_t v = g.EdgeInt();
    msgpack::sbuffer ref;
    msgpack::pack(ref, v);
    uint8_t mine[9];
    const size_t n = static_cast<size_t>(mp::WriteInt(mine, v) - mine);
    ASSERT_EQ(std::string(ref.data(), ref.size()), std::string(reinterpret_cast<char*>(mine), n))
        << v;
    ASSERT_EQ(mp::IntSize(v), n);
    int64_t back = 0;
    ASSERT_EQ(mp::ReadCanonicalInt(mine, mine + n, &back), mine + n);
    ASSERT_EQ(back, v);
  }
}

TEST(MsgpackScanTest, NonCanonicalIntsAreNotAcceptedAsCanonical) {
  int64_t v;
  const uint8_t u8_small[] = {0xcc, 0x05};  // 5 fits a positive fixint
  EXPECT_EQ(mp::ReadCanonicalInt(u8_small, u8_small + 2, &v), nullptr);
  const uint8_t i8_pos[] = {0xd0, 0x05};  // a positive value in a signed type
  EXPECT_EQ(mp::ReadCanonicalInt(i8_pos, i8_pos + 2, &v), nullptr);
  const uint8_t u64_huge[] = {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  EXPECT_EQ(mp::ReadCanonicalInt(u64_huge, u64_huge + 9, &v), nullptr);  // > INT64_MAX
}

TEST(MsgpackScanTest, FastIntReaderAgreesWithTheCanonicalReader) {
  // Every tag byte, followed by bytes that sit on and around each width's canonical bounds,
  // with and without the 9 bytes the fast path wants.
  std::vector<std::string> tails = {std::string(8, '\0'), std::string(8, '\xff')};
  for (uint64_t v : {uint64_t{31}, uint64_t{32}, uint64_t{127}, uint64_t{128}, uint64_t{255},
                     uint64_t{256}, uint64_t{65535}, uint64_t{65536}, uint64_t{0xffffffff},
                     uint64_t{0x100000000}, uint64_t{0x7fffffffffffffff}, uint64_t{1} << 63}) {
    for (int shift : {0, 8, 16, 24, 32, 40, 48, 56}) {
      std::string t(8, '\0');
      StoreBE64(reinterpret_cast<uint8_t*>(t.data()), v << shift);
      tails.push_back(t);
      StoreBE64(reinterpret_cast<uint8_t*>(t.data()), ~(v << shift));
      tails.push_back(t);
    }
  }
  testing::Gen g(3);
  for (int i = 0; i < 200; ++i) tails.push_back(g.Bytes(8) + std::string(8, '\x7f'));
  for (int tag = 0; tag < 256; ++tag) {
    for (const std::string& tail : tails) {
      const std::string bytes = std::string(1, static_cast<char>(tag)) + tail.substr(0, 8);
      for (size_t len = 0; len <= bytes.size(); ++len) {
        const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
        int64_t a = 0x1234, b = 0x1234;
        const uint8_t* ra = mp::ReadCanonicalInt(p, p + len, &a);
        const uint8_t* rb = mp::ReadCanonicalIntFast(p, p + len, &b);
        ASSERT_EQ(ra, rb) << "tag " << tag << " len " << len;
        if (ra != nullptr) {
          ASSERT_EQ(a, b) << "tag " << tag;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sluice
