// pkv_pool_validate must notice each kind of broken invariant and name it.
// The state is corrupted through a test-only peer, then restored.
#include <gtest/gtest.h>

#include "test_util.h"

namespace pagedkv {

struct BlockPoolTestPeer {
  static int32_t& ref(BlockPool& p, int32_t id) { return p.ref_[id]; }
  static BlockHash& hash(BlockPool& p, int32_t id) { return p.hash_[id]; }
  static FreeBlockQueue& queue(BlockPool& p) { return p.queue_; }
  static uint8_t& priority(BlockPool& p, int32_t id) { return p.ret_->prio[id]; }
  static BlockHash& indexed_parent(BlockPool& p, int32_t id) { return p.partial_->parent[id]; }
};

namespace {

using Peer = BlockPoolTestPeer;

class Validate : public ::testing::Test {
 protected:
  void SetUp() override {
    pool = Pool::create(test::manager_options(4, 10));
    a = pool->seq_create({});
    test::append(*pool, a, test::iota_tokens(6));  // blocks 1 (full, cached) and 2
    ASSERT_EQ(pool->validate(), "");
  }
  BlockPool& bp() { return pool->block_pool_for_testing(); }
  std::shared_ptr<Pool> pool;
  SeqId a = 0;
};

TEST_F(Validate, RefCountThatDisagreesWithTheTables) {
  ++Peer::ref(bp(), 2);
  EXPECT_NE(pool->validate().find("ref counts: block 2 has ref 2 but 1 table references"),
            std::string::npos)
      << pool->validate();
  --Peer::ref(bp(), 2);
  EXPECT_EQ(pool->validate(), "");
}

TEST_F(Validate, BlockBothReferencedAndFree) {
  Peer::queue(bp()).push_back(2);
  EXPECT_NE(pool->validate().find("free queue: block 2 is referenced and free"), std::string::npos)
      << pool->validate();
  Peer::queue(bp()).remove(2);
  EXPECT_EQ(pool->validate(), "");
}

TEST_F(Validate, FreeBlockMissingFromTheQueue) {
  Peer::queue(bp()).remove(5);
  EXPECT_NE(pool->validate().find("free queue: block 5 is unreferenced but not free"),
            std::string::npos)
      << pool->validate();
  Peer::queue(bp()).push_back(5);
  EXPECT_EQ(pool->validate(), "");
}

TEST_F(Validate, HashTheMapDoesNotKnow) {
  BlockHash h;
  h.size = 32;
  h.bytes[0] = 7;
  Peer::hash(bp(), 2) = h;
  EXPECT_NE(pool->validate().find("prefix cache: block 2 holds a hash the map lacks"),
            std::string::npos)
      << pool->validate();
  Peer::hash(bp(), 2) = BlockHash{};
  EXPECT_EQ(pool->validate(), "");
}

TEST_F(Validate, CachedHashThatIsNotTheSequences) {
  BlockHash saved = Peer::hash(bp(), 1);
  bp().uncache_block(1);
  BlockHash other = saved;
  other.bytes[31] ^= 1;
  bp().cache_block(1, other, nullptr, 4, 0);
  EXPECT_NE(pool->validate().find("block hashes: block 1"), std::string::npos) << pool->validate();
  bp().uncache_block(1);
  bp().cache_block(1, saved, nullptr, 4, 0);
  EXPECT_EQ(pool->validate(), "");
}

TEST_F(Validate, NullBlockTouched) {
  Peer::ref(bp(), 0) = 1;
  EXPECT_NE(pool->validate().find("null block"), std::string::npos) << pool->validate();
  Peer::ref(bp(), 0) = 0;
  EXPECT_EQ(pool->validate(), "");
}

// Issue 14 item 3 (found by a long fuzz run): a shared block truncated into
// kept its other holder's fill; when that holder went away, the append that
// found the tail exclusive again let decode appends count slots on top of the
// stale fill (fill 9 in an 8-token block, kv_bytes_wasted wrapping).
TEST(ValidateStats, TruncatedSharedTailGetsItsOwnFillBack) {
  PoolOptions o = test::storage_options(8, 16, 64);
  o.enable_prefix_caching = false;
  auto pool = Pool::create(o);
  SeqId a = pool->seq_create({});
  test::append(*pool, a, test::iota_tokens(13));
  SeqId b = pool->fork(a);
  pool->truncate(b, 1);
  pool->free(a);
  ASSERT_EQ(pool->validate(), "");
  pool->append(b, nullptr, 0, 8);
  ASSERT_EQ(pool->validate(), "");
  const uint64_t per_token = pool->bytes_per_block() / 8;
  for (int i = 0; i < 15; ++i) {
    test::append(*pool, b, {100 + i});
    ASSERT_EQ(pool->validate(), "") << "after decode append " << i;
    const PoolStats st = pool->stats();
    const uint64_t tokens = 2 + uint64_t(i);
    EXPECT_EQ(st.kv_bytes_used, tokens * per_token);
    EXPECT_EQ(st.kv_bytes_wasted, (st.num_used_blocks * 8 - tokens) * per_token);
  }
}

// The decode fast path counts on the fill of a tail held alone being exactly
// the tokens it holds: validate says so when it is not.
TEST_F(Validate, ExclusiveTailWithAStaleFill) {
  BlockPool& p = bp();
  p.set_fill(2, 3);  // a holds 2 tokens of block 2
  EXPECT_NE(pool->validate().find("stats: block 2"), std::string::npos) << pool->validate();
  p.set_fill(2, 2);
  EXPECT_EQ(pool->validate(), "");
}

// Retention priorities: the pinned count and the free queue's levels agree
// with the blocks' priorities; the partial-hit index with the cache.
TEST(ValidateReuse, RetentionAndPartialIndexCorruption) {
  PoolOptions o = test::manager_options(4, 10);
  o.enable_retention = true;
  o.max_pinned_blocks = 2;
  o.enable_partial_reuse = true;
  auto pool = Pool::create(o);
  SeqId a = pool->seq_create({});
  test::append(*pool, a, test::iota_tokens(9));  // blocks 1, 2 full and cached
  test::step(pool, a);
  pool->free(a);
  ASSERT_EQ(pool->validate(), "");
  BlockPool& p = pool->block_pool_for_testing();
  Peer::priority(p, 1) = 50;  // queued at the default level
  EXPECT_NE(pool->validate().find("level other than its priority"), std::string::npos)
      << pool->validate();
  Peer::priority(p, 1) = kPriorityDefault;
  Peer::priority(p, 3) = kPriorityPinned;  // block 3 holds nothing cached
  EXPECT_NE(pool->validate().find("no cached content"), std::string::npos) << pool->validate();
  Peer::priority(p, 3) = kPriorityDefault;
  ASSERT_EQ(pool->validate(), "");
  const BlockHash saved = Peer::indexed_parent(p, 2);
  Peer::indexed_parent(p, 2) = BlockHash{};
  EXPECT_NE(pool->validate().find("partial index"), std::string::npos) << pool->validate();
  Peer::indexed_parent(p, 2) = saved;
  EXPECT_EQ(pool->validate(), "");
}

}  // namespace
}  // namespace pagedkv
