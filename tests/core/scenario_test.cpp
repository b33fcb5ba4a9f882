// Scenarios that pin the block manager's observable behaviour (DESIGN.md §3)
// at block-id level. Pools are manager-only (no storage), block_size 4, and
// every step is followed by a full invariant check.
#include <gtest/gtest.h>

#include "hash/block_hash.h"
#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::append;
using test::drain;
using test::free_queue;
using test::iota_tokens;
using test::table;
using V = std::vector<int32_t>;

class Scenario : public ::testing::Test {
 protected:
  void make(uint64_t num_blocks, uint32_t window = 0) {
    PoolOptions o = test::manager_options(4, num_blocks);
    o.sliding_window = window;
    pool = Pool::create(o);
  }
  SeqId seq(uint64_t lora = 0, std::string salt = {}) {
    SeqOptions so;
    so.lora_id = lora;
    so.cache_salt = std::move(salt);
    return pool->seq_create(so);
  }
  // The hashes the pool must register for tokens under a context.
  std::vector<BlockHash> expected_hashes(const std::vector<int32_t>& t, uint64_t lora = 0,
                                         std::string salt = {}) {
    HashContext ctx;
    ctx.block_size = 4;
    ctx.lora_id = lora;
    ctx.cache_salt = std::move(salt);
    return hash_prefix(ctx, hash_root(HashAlgo::kSha256Cbor, ""), t.data(), t.size());
  }
  std::shared_ptr<Pool> pool;
};

TEST_F(Scenario, PrefillRegistersFullBlocksWithChainedHashes) {
  make(10);
  SeqId a = seq();
  auto t = iota_tokens(10);
  append(*pool, a, t);
  EXPECT_VALID(*pool);
  EXPECT_EQ(table(*pool, a), (V{1, 2, 3}));
  EXPECT_EQ(free_queue(*pool), (V{4, 5, 6, 7, 8, 9}));
  auto want = expected_hashes(t);
  ASSERT_EQ(want.size(), 2u);
  std::vector<BlockHash> got(2);
  ASSERT_EQ(pool->block_hashes(a, got.data(), 2), 2u);
  EXPECT_EQ(got, want);
  auto ev = drain(*pool);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].type, EventType::kStored);
  EXPECT_EQ(ev[0].seq_no, 1u);
  EXPECT_EQ(ev[0].block_id, 1);
  EXPECT_EQ(ev[0].block_hash, want[0]);
  EXPECT_TRUE(ev[0].parent_hash.empty());
  EXPECT_EQ(ev[0].num_tokens, 4u);
  EXPECT_EQ(ev[1].block_id, 2);
  EXPECT_EQ(ev[1].seq_no, 2u);
  EXPECT_EQ(ev[1].parent_hash, want[0]);
  PoolStats s = pool->stats();
  EXPECT_EQ(s.num_used_blocks, 3u);
  EXPECT_EQ(s.num_cached_blocks, 2u);
  EXPECT_EQ(s.num_free_blocks, 6u);
  EXPECT_EQ(s.num_tokens, 10u);
}

TEST_F(Scenario, FreeReleasesTailFirstHashedToTailOthersToHead) {
  make(10);
  SeqId a = seq();
  append(*pool, a, iota_tokens(10));
  test::step(pool, a);  // computed: its full blocks stay cached
  pool->free(a);
  EXPECT_VALID(*pool);
  // 3 (partial, no hash) to the head; then 2 and 1 to the tail in that order.
  EXPECT_EQ(free_queue(*pool), (V{3, 4, 5, 6, 7, 8, 9, 2, 1}));
  EXPECT_THROW(pool->seq_info(a), Error);
  EXPECT_EQ(pool->stats().num_cached_blocks, 2u);
}

// vLLM's free_blocks prepends a free's uncached blocks as one list, in the
// order freed (tail first): the next allocation takes the freed tail first.
// What a user sees: the block ids a later sequence gets.
TEST(FreeOrder, UncachedBlocksOfOneFreeAreReusedInTheOrderFreed) {
  for (bool retention : {false, true}) {
    SCOPED_TRACE(retention ? "retention" : "plain");
    PoolOptions o = test::manager_options(4, 12);
    o.enable_prefix_caching = false;
    o.enable_retention = retention;
    auto pool = Pool::create(o);
    SeqId a = pool->seq_create({}), b = pool->seq_create({});
    append(*pool, a, iota_tokens(12));  // 1 2 3
    append(*pool, b, iota_tokens(8));   // 4 5
    pool->free(a);
    pool->free(b);  // b's run goes before a's
    EXPECT_EQ(free_queue(*pool), (V{5, 4, 3, 2, 1, 6, 7, 8, 9, 10, 11}));
    SeqId c = pool->seq_create({});
    append(*pool, c, iota_tokens(16));
    EXPECT_EQ(table(*pool, c), (V{5, 4, 3, 2}));
    pool->truncate(c, 3);  // releases 2, 3, 4 in that order (tail first)
    EXPECT_EQ(free_queue(*pool), (V{2, 3, 4, 1, 6, 7, 8, 9, 10, 11}));
    EXPECT_VALID(*pool);
  }
}

// One append's window releases (vLLM's remove_skipped_blocks: one
// free_blocks call, nearest block first) form one run too.
TEST(FreeOrder, WindowReleasesOfOneAppendAreOneRun) {
  PoolOptions o = test::manager_options(4, 12);
  o.enable_prefix_caching = false;
  o.sliding_window = 4;
  auto pool = Pool::create(o);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(16));  // 1 2 3 4
  test::step(pool, a);                // 0..15 computed
  // Query 16 sees 13..16: blocks 0..2 go (3, 2, 1 to the head, as vLLM's
  // allocate_slots before it allocates), and the new block is the first.
  append(*pool, a, {16});
  EXPECT_EQ(table(*pool, a), (V{0, 0, 0, 4, 3}));
  EXPECT_EQ(free_queue(*pool), (V{2, 1, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, PrefixHitTouchesFreeCachedBlocksAndIsCappedBeforeTheLastToken) {
  make(10);
  SeqId a = seq();
  auto t = iota_tokens(10);
  append(*pool, a, t);
  test::step(pool, a);
  pool->free(a);
  SeqId b = seq();
  EXPECT_EQ(pool->match_prefix(b, t.data(), t.size()), 8u);
  EXPECT_VALID(*pool);
  EXPECT_EQ(table(*pool, b), (V{1, 2}));
  EXPECT_EQ(free_queue(*pool), (V{3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(pool->seq_info(b).num_cached_tokens, 8u);
  append(*pool, b, V(t.begin() + 8, t.end()));
  EXPECT_EQ(table(*pool, b), (V{1, 2, 3}));
  EXPECT_VALID(*pool);

  // Exactly 8 tokens: at least one must be computed, so only 1 block hits.
  SeqId c = seq();
  EXPECT_EQ(pool->match_prefix(c, t.data(), 8), 4u);
  EXPECT_EQ(table(*pool, c), (V{1}));
  EXPECT_EQ(pool->block_pool().ref(1), 2);
  PoolStats s = pool->stats();
  EXPECT_EQ(s.prefix_query_tokens, 18u);
  EXPECT_EQ(s.prefix_hit_tokens, 12u);
  // match_prefix only works on an empty sequence.
  try {
    pool->match_prefix(b, t.data(), t.size());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidState);
  }
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, HitStopsAtTheFirstMiss) {
  make(10);
  SeqId a = seq();
  auto t = iota_tokens(12);
  append(*pool, a, t);  // blocks 1 2 3, all full
  test::step(pool, a);  // computed (written): hits need written blocks
  auto u = t;
  u[5] = 999;  // second block differs
  SeqId b = seq();
  EXPECT_EQ(pool->match_prefix(b, u.data(), u.size()), 4u);
  EXPECT_EQ(table(*pool, b), (V{1}));
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, EvictionFollowsTheFreeQueueAndEmitsRemoved) {
  make(10);
  SeqId a = seq();
  auto t = iota_tokens(10);
  append(*pool, a, t);
  test::step(pool, a);
  pool->free(a);  // queue: 3 4 5 6 7 8 9 2 1
  drain(*pool);
  SeqId c = seq();
  append(*pool, c, iota_tokens(28, 100));  // takes 3..9: nothing cached is evicted
  EXPECT_EQ(table(*pool, c), (V{3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(pool->stats().num_evictions, 0u);
  auto want = expected_hashes(t);
  drain(*pool);
  SeqId d = seq();
  append(*pool, d, iota_tokens(1, 500));  // pops 2: A's second block goes
  EXPECT_EQ(table(*pool, d), (V{2}));
  EXPECT_EQ(pool->stats().num_evictions, 1u);
  auto ev = drain(*pool);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, EventType::kRemoved);
  EXPECT_EQ(ev[0].block_id, 2);
  EXPECT_EQ(ev[0].block_hash, want[1]);
  EXPECT_VALID(*pool);
  SeqId e = seq();
  EXPECT_EQ(pool->match_prefix(e, t.data(), t.size()), 4u);  // block 1 survived
  EXPECT_EQ(table(*pool, e), (V{1}));
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, ForkSharesEveryBlockAndCopyOnWriteRecordsTheCopy) {
  make(10);
  SeqId p = seq();
  append(*pool, p, iota_tokens(6));  // 1 (full) 2 (2 tokens)
  SeqId c = pool->fork(p);
  EXPECT_VALID(*pool);
  EXPECT_EQ(table(*pool, c), (V{1, 2}));
  EXPECT_EQ(pool->block_pool().ref(1), 2);
  EXPECT_EQ(pool->block_pool().ref(2), 2);
  EXPECT_EQ(pool->blocks_needed(c, 1, 0), 1u);  // the copy
  EXPECT_EQ(pool->blocks_needed(c, 3, 0), 2u);  // the copy and one new block
  append(*pool, c, {77});
  EXPECT_VALID(*pool);
  EXPECT_EQ(table(*pool, c), (V{1, 3}));
  EXPECT_EQ(table(*pool, p), (V{1, 2}));
  auto copies = pool->pending_copies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, 2);
  EXPECT_EQ(copies[0].dst, 3);
  EXPECT_EQ(pool->stats().num_cow_copies, 1u);
  // The parent now holds block 2 alone: it writes in place.
  append(*pool, p, {88});
  EXPECT_EQ(table(*pool, p), (V{1, 2}));
  EXPECT_EQ(pool->pending_copies().size(), 1u);
  EXPECT_VALID(*pool);
  pool->free(p);
  pool->free(c);
  EXPECT_VALID(*pool);
  EXPECT_EQ(pool->stats().num_used_blocks, 0u);
}

TEST_F(Scenario, ForkAtABlockBoundaryNeedsNoCopy) {
  make(10);
  SeqId p = seq();
  append(*pool, p, iota_tokens(8));
  SeqId c = pool->fork(p);
  append(*pool, c, {1});
  append(*pool, p, {2});
  EXPECT_EQ(table(*pool, c), (V{1, 2, 3}));
  EXPECT_EQ(table(*pool, p), (V{1, 2, 4}));
  EXPECT_TRUE(pool->pending_copies().empty());
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, ForkedLookaheadBlocksAreReplacedWithoutACopy) {
  make(10);
  SeqId p = seq();
  append(*pool, p, iota_tokens(4), 4);  // block 1 full, block 2 reserved
  SeqId c = pool->fork(p);
  append(*pool, c, {9});  // writes into shared block 2, which holds no token yet
  EXPECT_EQ(table(*pool, c), (V{1, 3}));
  EXPECT_TRUE(pool->pending_copies().empty());
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, TruncateDropsTheCachedHashOfAnExclusiveBlock) {
  make(10);
  SeqId a = seq();
  append(*pool, a, iota_tokens(8));  // 1 2, both cached
  drain(*pool);
  pool->truncate(a, 6);
  EXPECT_VALID(*pool);
  EXPECT_EQ(table(*pool, a), (V{1, 2}));
  EXPECT_EQ(pool->stats().num_cached_blocks, 1u);
  auto ev = drain(*pool);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, EventType::kRemoved);
  EXPECT_EQ(ev[0].block_id, 2);
  pool->truncate(a, 4);
  EXPECT_EQ(table(*pool, a), (V{1}));
  EXPECT_EQ(free_queue(*pool), (V{2, 3, 4, 5, 6, 7, 8, 9}));  // empty block: head
  EXPECT_EQ(pool->seq_info(a).num_tokens, 4u);
  append(*pool, a, {40, 41, 42, 43});  // other content in block 2 now
  EXPECT_EQ(table(*pool, a), (V{1, 2}));
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, TruncateOfASharedFullBlockLosesNothingShared) {
  make(10);
  SeqId a = seq();
  auto t = iota_tokens(8);
  append(*pool, a, t);  // 1 2
  test::step(pool, a);
  SeqId b = seq();
  auto t9 = iota_tokens(9);
  EXPECT_EQ(pool->match_prefix(b, t9.data(), 9), 8u);  // shares 1 2
  pool->truncate(a, 6);
  EXPECT_VALID(*pool);
  EXPECT_EQ(pool->stats().num_cached_blocks, 2u);  // block 2 still cached
  append(*pool, a, {500});                         // copy-on-write: b's block 2 stays intact
  EXPECT_EQ(table(*pool, a), (V{1, 3}));
  auto copies = pool->pending_copies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, 2);
  EXPECT_EQ(copies[0].dst, 3);
  SeqId c = seq();
  EXPECT_EQ(pool->match_prefix(c, t9.data(), 9), 8u);
  EXPECT_EQ(table(*pool, c), (V{1, 2}));
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, TruncateToZeroAndPastTheEnd) {
  make(10);
  SeqId a = seq();
  append(*pool, a, iota_tokens(6), 3);
  EXPECT_EQ(table(*pool, a).size(), 3u);
  EXPECT_THROW(pool->truncate(a, 7), Error);
  pool->truncate(a, 6);  // drops the lookahead block only
  EXPECT_EQ(table(*pool, a), (V{1, 2}));
  pool->truncate(a, 0);
  EXPECT_TRUE(table(*pool, a).empty());
  EXPECT_EQ(pool->stats().num_used_blocks, 0u);
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, SlidingWindowReleasesBlocksToTheNullBlock) {
  make(10, /*window=*/8);
  SeqId a = seq();
  append(*pool, a, iota_tokens(12));  // 1 2 3
  EXPECT_EQ(table(*pool, a), (V{1, 2, 3}));
  // Nothing is computed yet: the next plan starts at 0 and needs every key.
  append(*pool, a, {12});
  EXPECT_EQ(table(*pool, a), (V{1, 2, 3, 4}));
  test::step(pool, a);  // 0..12 computed
  // The next query (13) sees keys 6..13: block 0 (tokens 0..3) is done with.
  append(*pool, a, {13});
  EXPECT_VALID(*pool);
  EXPECT_EQ(table(*pool, a), (V{0, 2, 3, 4}));
  EXPECT_EQ(free_queue(*pool), (V{5, 6, 7, 8, 9, 1}));  // cached: tail
  test::step(pool, a, 1);
  append(*pool, a, {14});
  test::step(pool, a, 1);
  EXPECT_EQ(table(*pool, a), (V{0, 2, 3, 4}));
  append(*pool, a, {15});  // query at 15 sees 8..15: block 1 (4..7) goes
  EXPECT_EQ(table(*pool, a), (V{0, 0, 3, 4}));
  test::step(pool, a, 1);
  append(*pool, a, {16});
  EXPECT_EQ(table(*pool, a), (V{0, 0, 3, 4, 5}));
  EXPECT_EQ(pool->seq_info(a).num_tokens, 17u);
  EXPECT_VALID(*pool);
  // Truncating back into released keys is refused; within the window is fine.
  // 15 tokens would leave position 14 as the last token, whose window
  // (7..14) reaches the released block 1 (4..7).
  EXPECT_THROW(pool->truncate(a, 10), Error);
  EXPECT_THROW(pool->truncate(a, 15), Error);
  pool->truncate(a, 16);
  EXPECT_EQ(table(*pool, a), (V{0, 0, 3, 4}));
  uint32_t q = 1;
  EXPECT_NO_THROW(Batch::prepare(pool, &a, &q, 1, nullptr));  // the last token is queryable
  append(*pool, a, {}, 4);                                    // a reservation releases nothing
  EXPECT_EQ(table(*pool, a), (V{0, 0, 3, 4, 5}));
  EXPECT_VALID(*pool);
  pool->free(a);
  EXPECT_VALID(*pool);
  EXPECT_EQ(pool->stats().num_used_blocks, 0u);
}

TEST_F(Scenario, SaltAndLoraIsolateTheCache) {
  make(20);
  auto t = iota_tokens(9);
  SeqId a = seq(0, "tenant-a");
  append(*pool, a, t);
  test::step(pool, a);
  SeqId plain = seq();
  EXPECT_EQ(pool->match_prefix(plain, t.data(), t.size()), 0u);
  SeqId other = seq(0, "tenant-b");
  EXPECT_EQ(pool->match_prefix(other, t.data(), t.size()), 0u);
  SeqId same = seq(0, "tenant-a");
  EXPECT_EQ(pool->match_prefix(same, t.data(), t.size()), 8u);
  SeqId lora = seq(7);
  append(*pool, lora, t);
  test::step(pool, lora);
  SeqId lora8 = seq(8);
  EXPECT_EQ(pool->match_prefix(lora8, t.data(), t.size()), 0u);
  SeqId lora7 = seq(7);
  EXPECT_EQ(pool->match_prefix(lora7, t.data(), t.size()), 8u);
  std::vector<BlockHash> got(2);
  pool->block_hashes(a, got.data(), 2);
  EXPECT_EQ(got, expected_hashes(t, 0, "tenant-a"));
  pool->block_hashes(lora, got.data(), 2);
  EXPECT_EQ(got, expected_hashes(t, 7));
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, ExhaustionChangesNothingAndRecoversAfterFree) {
  make(10);
  SeqId a = seq();
  append(*pool, a, iota_tokens(32));  // 8 of 9 blocks
  SeqId b = seq();
  PoolStats before = pool->stats();
  try {
    append(*pool, b, iota_tokens(5));  // needs 2
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kOutOfBlocks);
  }
  try {
    append(*pool, a, iota_tokens(1), 4);  // needs 2 with lookahead
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kOutOfBlocks);
  }
  PoolStats after = pool->stats();
  EXPECT_EQ(after.num_free_blocks, before.num_free_blocks);
  EXPECT_EQ(after.num_tokens, before.num_tokens);
  EXPECT_TRUE(table(*pool, b).empty());
  EXPECT_EQ(table(*pool, a).size(), 8u);
  EXPECT_VALID(*pool);
  append(*pool, b, iota_tokens(4));  // one block fits
  EXPECT_EQ(table(*pool, b), (V{9}));
  pool->free(a);
  append(*pool, b, iota_tokens(5, 4));
  EXPECT_EQ(table(*pool, b).size(), 3u);
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, StaleIdsAreNotFoundAndSlotsAreReused) {
  make(10);
  SeqId a = seq();
  EXPECT_NE(a, 0u);
  pool->free(a);
  SeqId b = seq();
  const uint64_t slot = SeqTable::kMaxSlots - 1;
  EXPECT_EQ(a & slot, b & slot);  // same slot
  EXPECT_NE(a, b);                // new generation
  try {
    pool->append(a, nullptr, 0, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kNotFound);
  }
  EXPECT_THROW(pool->free(a), Error);
  EXPECT_THROW(pool->fork(0), Error);
  EXPECT_THROW(pool->seq_info(~0ull), Error);
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, ResetPrefixCacheForgetsHashesButKeepsBlocks) {
  make(10);
  SeqId a = seq();
  auto t = iota_tokens(9);
  append(*pool, a, t);
  drain(*pool);
  pool->reset_prefix_cache();
  auto ev = drain(*pool);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, EventType::kAllCleared);
  EXPECT_EQ(pool->stats().num_cached_blocks, 0u);
  EXPECT_EQ(table(*pool, a), (V{1, 2, 3}));
  SeqId b = seq();
  EXPECT_EQ(pool->match_prefix(b, t.data(), t.size()), 0u);
  append(*pool, a, {9, 10, 11});  // block 3 fills and is cached again
  EXPECT_EQ(pool->stats().num_cached_blocks, 1u);
  EXPECT_VALID(*pool);
}

TEST_F(Scenario, StatsCountBytesOfTokensAndPartialBlocks) {
  PoolOptions o = test::manager_options(4, 10);
  o.num_layers = 2;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.dtype = DType::kF32;
  o.num_threads = 1;
  pool = Pool::create(o);
  const uint64_t per_token = 2 * 2 * 2 * 8 * 4;  // layers * (K,V) * heads * dim * f32
  EXPECT_EQ(pool->bytes_per_block(), 4 * per_token);
  SeqId a = seq();
  append(*pool, a, iota_tokens(6));
  SeqId c = pool->fork(a);  // shares both blocks: counted once
  PoolStats s = pool->stats();
  EXPECT_EQ(s.kv_bytes_per_block, 4 * per_token);
  EXPECT_EQ(s.kv_bytes_allocated, 10 * 4 * per_token);
  EXPECT_EQ(s.kv_bytes_used, 6 * per_token);
  EXPECT_EQ(s.kv_bytes_wasted, 2 * per_token);
  EXPECT_DOUBLE_EQ(s.usage, 2.0 / 9.0);
  EXPECT_EQ(s.num_tokens, 12u);
  EXPECT_EQ(s.num_seqs, 2u);
  append(*pool, c, {1});  // copy-on-write: 3 blocks hold 4 + 2 + 3 tokens
  s = pool->stats();
  EXPECT_EQ(s.kv_bytes_used, 9 * per_token);
  EXPECT_EQ(s.kv_bytes_wasted, 3 * per_token);
  EXPECT_VALID(*pool);
}

TEST(PoolCreate, RejectsBadOptionsNamingTheField) {
  auto expect_bad = [](PoolOptions o, const char* field) {
    try {
      Pool::create(o);
      ADD_FAILURE() << field;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  PoolOptions o = test::manager_options(16, 10);
  o.block_size = 0;
  expect_bad(o, "block_size");
  o = test::manager_options(16, 1);
  expect_bad(o, "num_blocks");
  o = test::manager_options(16, 0);
  expect_bad(o, "num_blocks");
  o = test::manager_options(16, 10);
  o.hash_algo = HashAlgo(9);
  expect_bad(o, "hash_algo");
  o = test::manager_options(16, 10);
  o.num_layers = 1;
  expect_bad(o, "num_kv_heads");
  o.num_kv_heads = 1;
  o.head_dim = 8;
  o.dtype = DType::kI32;
  expect_bad(o, "dtype");
  o.dtype = DType::kF32;
  o.num_blocks = 0;
  o.memory_budget_bytes = 100;
  expect_bad(o, "memory_budget_bytes");
  o = test::manager_options(16, 10);
  o.device_type = 7;
  expect_bad(o, "device_type");
}

TEST(PoolCreate, DerivesNumBlocksFromTheMemoryBudget) {
  PoolOptions o = test::manager_options(16, 0);
  o.num_layers = 2;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.dtype = DType::kF16;
  o.num_threads = 1;
  const uint64_t bpb = 2 * 2 * 2 * 16 * 8 * 2;
  o.memory_budget_bytes = bpb * 37 + bpb / 2;
  auto p = Pool::create(o);
  EXPECT_EQ(p->options().num_blocks, 37u);
  EXPECT_EQ(p->stats().num_free_blocks, 36u);
}

}  // namespace
}  // namespace pagedkv
