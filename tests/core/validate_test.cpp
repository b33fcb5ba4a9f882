// pkv_pool_validate must notice each kind of broken invariant and name it.
// The state is corrupted through a test-only peer, then restored.
#include <gtest/gtest.h>

#include "test_util.h"

namespace pagedkv {

struct BlockPoolTestPeer {
  static int32_t& ref(BlockPool& p, int32_t id) { return p.ref_[id]; }
  static BlockHash& hash(BlockPool& p, int32_t id) { return p.hash_[id]; }
  static FreeBlockQueue& queue(BlockPool& p) { return p.queue_; }
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

}  // namespace
}  // namespace pagedkv
