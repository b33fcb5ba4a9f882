#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "prefix_cache.h"

namespace pagedkv {
namespace {

BlockHash make_hash(uint64_t v, uint64_t low = ~0ull) {
  BlockHash h;
  h.size = 32;
  // The table probes on the first 8 bytes; `low` lets tests force collisions.
  uint64_t first = low == ~0ull ? v * 0x9e3779b97f4a7c15ull : low;
  std::memcpy(h.bytes.data(), &first, 8);
  std::memcpy(h.bytes.data() + 8, &v, 8);
  return h;
}

TEST(PrefixCache, FindsInsertedBlocksAndForgetsErasedOnes) {
  const int32_t n = 16;
  std::vector<BlockHash> hashes(n);
  PrefixCache c(&hashes, n);
  hashes[3] = make_hash(1);
  c.insert(3);
  hashes[5] = make_hash(2);
  c.insert(5);
  EXPECT_EQ(c.find(make_hash(1)), 3);
  EXPECT_EQ(c.find(make_hash(2)), 5);
  EXPECT_EQ(c.find(make_hash(3)), -1);
  c.erase(3);
  EXPECT_EQ(c.find(make_hash(1)), -1);
  EXPECT_EQ(c.num_blocks(), 1);
  EXPECT_STREQ(c.check(), "");
}

TEST(PrefixCache, EqualHashesMapToSeveralBlocks) {
  const int32_t n = 16;
  std::vector<BlockHash> hashes(n);
  PrefixCache c(&hashes, n);
  for (int32_t b : {2, 7, 9}) {
    hashes[b] = make_hash(42);
    c.insert(b);
  }
  EXPECT_EQ(c.num_blocks(), 3);
  EXPECT_STREQ(c.check(), "");
  std::set<int32_t> left = {2, 7, 9};
  for (int32_t erase_first : {2, 9}) {  // head, then tail of the chain
    c.erase(erase_first);
    left.erase(erase_first);
    EXPECT_TRUE(left.count(c.find(make_hash(42))));
    EXPECT_STREQ(c.check(), "");
  }
  c.erase(7);
  EXPECT_EQ(c.find(make_hash(42)), -1);
  EXPECT_STREQ(c.check(), "");
}

TEST(PrefixCache, ProbeCollisionsSurviveBackwardShiftDeletion) {
  const int32_t n = 8;  // 16 slots
  std::vector<BlockHash> hashes(n);
  PrefixCache c(&hashes, n);
  // Blocks 1..6 all probe from slot 0 or 1.
  for (int32_t b = 1; b <= 6; ++b) {
    hashes[b] = make_hash(b, b % 2 ? 0 : 1);
    c.insert(b);
  }
  c.erase(1);
  c.erase(4);
  EXPECT_STREQ(c.check(), "");
  for (int32_t b : {2, 3, 5, 6}) EXPECT_EQ(c.find(hashes[b]), b);
  EXPECT_EQ(c.find(make_hash(1, 0)), -1);
}

TEST(PrefixCache, MatchesAReferenceMultimapUnderRandomOperations) {
  std::mt19937_64 rng(11);
  const int32_t n = 64;
  std::vector<BlockHash> hashes(n);
  PrefixCache c(&hashes, n);
  std::map<uint64_t, std::set<int32_t>> ref;  // hash value -> blocks
  std::vector<uint64_t> value(n, 0);          // 0 = not cached
  for (int step = 0; step < 20000; ++step) {
    int32_t b = int32_t(rng() % n);
    if (value[b] == 0) {
      uint64_t v = 1 + rng() % 40;  // few values: many duplicates
      // Values divisible by 5 collide on the probe key (first 8 bytes).
      hashes[b] = make_hash(v, v % 5 == 0 ? v % 3 : ~0ull);
      c.insert(b);
      value[b] = v;
      ref[v].insert(b);
    } else {
      c.erase(b);
      ref[value[b]].erase(b);
      value[b] = 0;
      hashes[b] = BlockHash{};
    }
    uint64_t probe = 1 + rng() % 40;
    int32_t got = c.find(make_hash(probe, probe % 5 == 0 ? probe % 3 : ~0ull));
    if (ref[probe].empty())
      ASSERT_EQ(got, -1);
    else
      ASSERT_TRUE(ref[probe].count(got)) << "step " << step;
    if (step % 101 == 0) ASSERT_STREQ(c.check(), "");
  }
}

}  // namespace
}  // namespace pagedkv
