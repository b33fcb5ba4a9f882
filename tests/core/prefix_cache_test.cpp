#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "prefix_cache.h"

namespace pagedkv {
namespace {

BlockHash make_hash(uint64_t v) {
  BlockHash h;
  h.size = 32;
  uint64_t first = v * 0x9e3779b97f4a7c15ull;
  std::memcpy(h.bytes.data(), &first, 8);
  std::memcpy(h.bytes.data() + 8, &v, 8);
  return h;
}

// A hash for value v whose probe starts at slot `home` of c: the table's
// hash is keyed by a random secret, so colliding keys are found by search
// (bytes 16..23 vary; every v gets the same hash within one table).
BlockHash make_hash_at(const PrefixCache& c, uint64_t v, size_t home) {
  BlockHash h = make_hash(v);
  for (uint64_t salt = 1;; ++salt) {
    std::memcpy(h.bytes.data() + 16, &salt, 8);
    if (c.home_slot(h) == home) return h;
  }
}

TEST(PrefixCache, FindsInsertedBlocksAndForgetsErasedOnes) {
  const int32_t n = 16;
  std::vector<BlockHash> hashes(n);
  PrefixCache c(hashes.data(), n);
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
  PrefixCache c(hashes.data(), n);
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

// vLLM's BlockHashToBlockMap keeps equal blocks in an insertion-ordered dict
// and a hit takes the first: the oldest. The chain keeps caching order, so
// find() gives the oldest too, also after its head or tail left (a chain of
// three used to put the newest second, promoted when the head was erased).
TEST(PrefixCache, EqualHashesAreFoundOldestFirst) {
  const int32_t n = 16;
  std::vector<BlockHash> hashes(n);
  PrefixCache c(hashes.data(), n);
  const auto add = [&](int32_t b) {
    hashes[b] = make_hash(42);
    c.insert(b);
  };
  for (int32_t b : {2, 7, 9}) add(b);
  EXPECT_EQ(c.find(make_hash(42)), 2);
  c.erase(2);  // the head: the next oldest follows
  EXPECT_EQ(c.find(make_hash(42)), 7);
  EXPECT_STREQ(c.check(), "");
  add(4);      // 7, 9, 4
  c.erase(4);  // the tail: a later insert joins behind 9
  EXPECT_STREQ(c.check(), "");
  add(5);      // 7, 9, 5
  c.erase(9);  // the middle
  EXPECT_STREQ(c.check(), "");
  EXPECT_EQ(c.find(make_hash(42)), 7);
  c.erase(7);
  EXPECT_EQ(c.find(make_hash(42)), 5);
  EXPECT_STREQ(c.check(), "");
  add(3);  // 5, 3
  c.erase(5);
  EXPECT_EQ(c.find(make_hash(42)), 3);
  EXPECT_STREQ(c.check(), "");
}

TEST(PrefixCache, ProbeCollisionsSurviveBackwardShiftDeletion) {
  const int32_t n = 8;  // 16 slots
  std::vector<BlockHash> hashes(n);
  PrefixCache c(hashes.data(), n);
  // Blocks 1..6 all probe from slot 0 or 1.
  for (int32_t b = 1; b <= 6; ++b) {
    hashes[b] = make_hash_at(c, uint64_t(b), b % 2 ? 0 : 1);
    c.insert(b);
  }
  c.erase(1);
  c.erase(4);
  EXPECT_STREQ(c.check(), "");
  for (int32_t b : {2, 3, 5, 6}) EXPECT_EQ(c.find(hashes[b]), b);
  EXPECT_EQ(c.find(make_hash_at(c, 1, 0)), -1);
}

TEST(PrefixCache, MatchesAReferenceMultimapUnderRandomOperations) {
  std::mt19937_64 rng(11);
  const int32_t n = 64;
  std::vector<BlockHash> hashes(n);
  PrefixCache c(hashes.data(), n);
  std::map<uint64_t, std::vector<int32_t>> ref;  // hash value -> blocks, oldest first
  std::vector<uint64_t> value(n, 0);             // 0 = not cached
  // Values divisible by 5 collide on the probe's first slot.
  std::map<uint64_t, BlockHash> of_value;
  auto hash_of = [&](uint64_t v) {
    auto it = of_value.find(v);
    if (it == of_value.end())
      it = of_value.emplace(v, v % 5 == 0 ? make_hash_at(c, v, v % 3) : make_hash(v)).first;
    return it->second;
  };
  for (int step = 0; step < 20000; ++step) {
    int32_t b = int32_t(rng() % n);
    if (value[b] == 0) {
      uint64_t v = 1 + rng() % 40;  // few values: many duplicates
      hashes[b] = hash_of(v);
      c.insert(b);
      value[b] = v;
      ref[v].push_back(b);
    } else {
      c.erase(b);
      std::vector<int32_t>& r = ref[value[b]];
      r.erase(std::find(r.begin(), r.end(), b));
      value[b] = 0;
      hashes[b] = BlockHash{};
    }
    uint64_t probe = 1 + rng() % 40;
    int32_t got = c.find(hash_of(probe));
    if (ref[probe].empty())
      ASSERT_EQ(got, -1);
    else
      ASSERT_EQ(got, ref[probe].front()) << "step " << step;  // the oldest, as vLLM
    if (step % 101 == 0) ASSERT_STREQ(c.check(), "");
  }
}

// Hash flooding (issue 14): digests an outsider aimed so that the bits an
// unkeyed table would probe on are equal. Keyed by a per-table secret, the
// table spreads them like random keys: every key stays a few probes from its
// home slot (an unkeyed table put all 20,000 in one run: displacement 19,999).
TEST(PrefixCache, AimedDigestsDoNotShareAProbeRun) {
  const int32_t n = 20000;
  std::vector<BlockHash> hashes(n);
  PrefixCache c(hashes.data(), n);
  std::mt19937_64 rng(5);
  for (int32_t b = 0; b < n; ++b) {
    BlockHash& h = hashes[b];
    h.size = 32;
    for (size_t i = 0; i < 32; i += 8) {
      uint64_t r = rng();
      std::memcpy(h.bytes.data() + i, &r, 8);
    }
    // The low 20 bits of the first 8 bytes (the old table's key) are fixed,
    // and so are the last 8 bytes.
    h.bytes[0] = 0xab;
    h.bytes[1] = 0xcd;
    h.bytes[2] = uint8_t((h.bytes[2] & 0xf0) | 0x7);
    std::memset(h.bytes.data() + 24, 0x5a, 8);
    c.insert(b);
  }
  EXPECT_STREQ(c.check(), "");
  // 20,000 keys in 65,536 slots: random keys' longest run is a few dozen at
  // most; an aimed run would be thousands.
  EXPECT_LT(c.max_displacement(), 64u);
  for (int32_t b = 0; b < n; b += 97) EXPECT_EQ(c.find(hashes[b]), b);
}

// Two tables (two pools) get different secrets: what collides in one does
// not in the other.
TEST(PrefixCache, EachTableHasItsOwnSecret) {
  std::vector<BlockHash> hashes(1024);
  PrefixCache a(hashes.data(), 1024), b(hashes.data(), 1024);
  int same = 0;
  for (uint64_t v = 1; v <= 64; ++v) same += a.home_slot(make_hash(v)) == b.home_slot(make_hash(v));
  EXPECT_LT(same, 8);  // 2048 slots: equal homes by chance are rare
}

}  // namespace
}  // namespace pagedkv
