// DictHashTable (codec/dict_hash_table.h) on its own: codes in order of insertion, lookups
// after the table grows, a new epoch per Clear (also across the epoch's wrap), the caller's
// confirmation of long values, and giving up after kMaxProbes colliding slots.
#include "codec/dict_hash_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace sluice::columnar_internal {
namespace {

struct Key {
  uint64_t a, b;
  uint32_t len;
};

// Looks k up; adds it when absent. Returns its code, or -1 when the table gave up.
int64_t FindOrInsert(DictHashTable& t, const Key& k, bool same = true) {
  size_t idx = t.SlotOf(k.a, k.b, k.len);
  uint32_t code = 0;
  switch (t.Find(
      &idx, k.a, k.b, k.len, [same](uint32_t) { return same; }, &code)) {
    case DictHashTable::Found::kYes:
      return code;
    case DictHashTable::Found::kNo:
      code = t.Insert(idx, k.a, k.b, k.len);
      t.GrowIfLoaded();
      return code;
    case DictHashTable::Found::kGaveUp:
      return -1;
  }
  return -2;
}

Key NthKey(uint64_t i) { return Key{i * 0x9e3779b97f4a7c15ULL + 1, i ^ 0xabcdef, 8}; }

TEST(DictHashTableTest, CodesInOrderOfInsertionAcrossGrowth) {
  DictHashTable t;
  t.Clear();
  constexpr uint64_t kCount = 5000;  // grows from 1,024 slots several times
  for (uint64_t i = 0; i < kCount; ++i) ASSERT_EQ(FindOrInsert(t, NthKey(i)), int64_t(i));
  EXPECT_EQ(t.size(), kCount);
  for (uint64_t i = 0; i < kCount; ++i) EXPECT_EQ(FindOrInsert(t, NthKey(i)), int64_t(i));
  EXPECT_EQ(t.size(), kCount);
  EXPECT_EQ(t.entry(7).a, NthKey(7).a);
}

TEST(DictHashTableTest, FirstSlotHoldsWhatTheHotPathLooksFor) {
  DictHashTable t;
  t.Clear();
  const uint8_t bytes[] = "hello, world";
  const ShortKey k = KeyShort(bytes, 12);
  ASSERT_EQ(FindOrInsert(t, Key{k.a, k.b, 12}), 0);
  const DictHashTable::Hot h = t.LoadHot();
  uint32_t code = 99;
  EXPECT_TRUE(DictHashTable::SlotHolds(h, DictHashTable::SlotOf(h, k.a, k.b, 12), k, 12, &code));
  EXPECT_EQ(code, 0u);
  EXPECT_FALSE(DictHashTable::SlotHolds(h, DictHashTable::SlotOf(h, k.a, k.b, 11), k, 11, &code));
}

TEST(DictHashTableTest, ClearForgetsEveryEntryAlsoWhenTheEpochWraps) {
  DictHashTable t;
  t.Clear();
  for (int round = 0; round < 70000; ++round) {  // the epoch is 16 bits: it wraps once
    const Key k = NthKey(static_cast<uint64_t>(round % 3));
    ASSERT_EQ(FindOrInsert(t, k), 0) << round;
    ASSERT_EQ(FindOrInsert(t, NthKey(1000)), 1) << round;
    ASSERT_EQ(t.size(), 2u);
    t.Clear();
    ASSERT_EQ(t.size(), 0u);
  }
}

TEST(DictHashTableTest, CallerConfirmsMatches) {
  DictHashTable t;
  t.Clear();
  const Key k = NthKey(3);
  ASSERT_EQ(FindOrInsert(t, k), 0);
  // Same key words, but the caller's bytes differ (a hash collision of long values): a new
  // entry in the next free slot.
  EXPECT_EQ(FindOrInsert(t, k, /*same=*/false), 1);
  EXPECT_EQ(FindOrInsert(t, k), 0);
}

TEST(DictHashTableTest, GivesUpAfterMaxProbesCollidingSlots) {
  DictHashTable t;
  t.Clear();  // 1,024 slots: a key's slot is the top 10 bits of its hash
  std::vector<Key> colliding;
  for (uint64_t i = 0; colliding.size() <= DictHashTable::kMaxProbes; ++i) {
    const Key k = NthKey(i);
    if (DictHash(k.a, k.b, k.len) >> 54 == 0) colliding.push_back(k);
  }
  for (uint32_t j = 0; j < DictHashTable::kMaxProbes; ++j) {
    ASSERT_EQ(FindOrInsert(t, colliding[j]), int64_t(j));
  }
  EXPECT_EQ(FindOrInsert(t, colliding[DictHashTable::kMaxProbes]), -1);
  EXPECT_EQ(FindOrInsert(t, colliding[0]), 0);  // the first ones are still found
}

}  // namespace
}  // namespace sluice::columnar_internal
