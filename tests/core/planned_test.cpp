// Tokens count as computed once a step covering them is committed (here:
// manager-only plans destroyed without abort, the ABI-1 default). The
// sliding window releases relative to that mark (Sequence::num_committed),
// and full blocks nobody wrote leave the prefix cache when their sequence
// lets them go. Block ids pinned; pools are manager-only,
// block_size 4 unless said otherwise.
#include <gtest/gtest.h>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::append;
using test::drain;
using test::free_queue;
using test::iota_tokens;
using test::step;
using test::table;
using V = std::vector<int32_t>;

std::shared_ptr<Pool> make(uint64_t num_blocks, uint32_t window = 0) {
  PoolOptions o = test::manager_options(4, num_blocks);
  o.sliding_window = window;
  return Pool::create(o);
}

bool prepares(const std::shared_ptr<Pool>& pool, SeqId id, uint32_t q) {
  try {
    Batch::prepare(pool, &id, &q, 1, nullptr);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Two 1-token appends between steps (a verified draft token and the bonus
// token), then one plan over both: the first of them needs keys the window
// must not have released at the second append (reviewer's win.c).
TEST(Planned, WindowKeepsKeysOfTokensNotYetPlanned) {
  PoolOptions o = test::manager_options(8, 16);
  o.sliding_window = 8;
  auto pool = Pool::create(o);
  SeqId s = pool->seq_create({});
  append(*pool, s, iota_tokens(22));
  EXPECT_EQ(table(*pool, s), (V{1, 2, 3}));
  step(pool, s, 22);
  append(*pool, s, {22});  // next query 22 sees 15..22: block 0 (0..7) goes
  EXPECT_EQ(table(*pool, s), (V{0, 2, 3}));
  append(*pool, s, {23});  // 22 is not planned yet: block 1 (8..15) stays
  EXPECT_EQ(table(*pool, s), (V{0, 2, 3}));
  EXPECT_VALID(*pool);
  EXPECT_TRUE(prepares(pool, s, 2));  // queries 22, 23 (failed before the fix)
  append(*pool, s, {24});             // now 24 is next: it sees 17..24, block 1 goes
  EXPECT_EQ(table(*pool, s), (V{0, 0, 3, 4}));
  EXPECT_FALSE(prepares(pool, s, 3));  // 22 would read key 15
  EXPECT_TRUE(prepares(pool, s, 2));
  EXPECT_VALID(*pool);
  // One append of two tokens behaves the same.
  SeqId t = pool->seq_create({});
  append(*pool, t, iota_tokens(22));
  step(pool, t, 22);
  append(*pool, t, {22, 23});
  EXPECT_EQ(table(*pool, t), (V{0, 6, 7}));
  EXPECT_TRUE(prepares(pool, t, 2));
}

TEST(Planned, WindowReleasesNothingBeforeTheFirstPlan) {
  auto pool = make(12, 4);
  SeqId s = pool->seq_create({});
  append(*pool, s, iota_tokens(10));
  append(*pool, s, iota_tokens(10, 10));  // nothing computed: every key still needed
  EXPECT_EQ(table(*pool, s), (V{1, 2, 3, 4, 5}));
  EXPECT_EQ(pool->blocks_needed(s, 1, 0), 1u);
  step(pool, s, 20);
  // Query 20 sees 17..20: blocks 0..3 (0..15) go; the append's new block
  // comes from them, so it needs none net.
  EXPECT_EQ(pool->blocks_needed(s, 1, 0), 0u);
  const uint64_t free_before = pool->stats().num_free_blocks;
  append(*pool, s, {20});
  EXPECT_EQ(table(*pool, s), (V{0, 0, 0, 0, 5, 6}));  // released cached blocks queue at the tail
  EXPECT_EQ(pool->stats().num_free_blocks, free_before + 4 - 1);
  EXPECT_VALID(*pool);
}

// blocks_needed is what append compares with the free blocks: net of the
// blocks the window gives back first.
TEST(Planned, BlocksNeededCountsWindowReleasesAsAppendDoes) {
  auto pool = make(7, 4);  // 6 usable
  SeqId s = pool->seq_create({});
  append(*pool, s, iota_tokens(16));  // blocks 1..4
  step(pool, s, 16);
  SeqId filler = pool->seq_create({});
  append(*pool, filler, iota_tokens(8, 100));  // blocks 5, 6: none free
  ASSERT_EQ(pool->stats().num_free_blocks, 0u);
  // 12 tokens at 16: 3 new blocks; the window (first query 16 sees 13..16)
  // releases blocks 0..2 first.
  EXPECT_EQ(pool->blocks_needed(s, 12, 0), 0u);
  EXPECT_NO_THROW(append(*pool, s, iota_tokens(12, 16)));
  EXPECT_EQ(table(*pool, s), (V{0, 0, 0, 4, 3, 2, 1}));
  step(pool, s, 12);
  // 8 more at 28: 2 new blocks; the window (first query 28 sees 25..28)
  // releases the 3 blocks of 12..23: fits with nothing free.
  EXPECT_EQ(pool->blocks_needed(s, 8, 0), 0u);
  // 16 more: 4 new blocks, 3 released: one short, and append agrees.
  EXPECT_EQ(pool->blocks_needed(s, 16, 0), 1u);
  try {
    append(*pool, s, iota_tokens(16, 28));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kOutOfBlocks);
  }
  EXPECT_VALID(*pool);
}

// A sequence freed (preempted) before a plan covered its tokens: its full
// blocks hold no K/V, so they leave the cache (REMOVED events) and go to
// the head of the queue; blocks a plan covered stay cached at the tail.
TEST(Planned, FreeUncachesBlocksNoPlanCovered) {
  auto pool = make(10);
  SeqId a = pool->seq_create({});
  auto t = iota_tokens(14);
  append(*pool, a, V(t.begin(), t.begin() + 5));  // blocks 1, 2
  step(pool, a, 5);                               // 0..4 computed
  append(*pool, a, V(t.begin() + 5, t.end()));    // blocks 3, 4; 2 and 3 fill
  EXPECT_EQ(table(*pool, a), (V{1, 2, 3, 4}));
  EXPECT_EQ(pool->stats().num_cached_blocks, 3u);
  drain(*pool);
  pool->free(a);
  EXPECT_VALID(*pool);
  // 4 (partial) and 3, 2 (full, filled after the plan) to the head as one
  // run in the order freed (vLLM's prepend_n); 1 (full, planned) to the tail.
  EXPECT_EQ(free_queue(*pool), (V{4, 3, 2, 5, 6, 7, 8, 9, 1}));
  EXPECT_EQ(pool->stats().num_cached_blocks, 1u);
  auto ev = drain(*pool);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].type, EventType::kRemoved);
  EXPECT_EQ(ev[0].block_id, 2);
  EXPECT_EQ(ev[1].block_id, 3);
  SeqId b = pool->seq_create({});
  EXPECT_EQ(pool->match_prefix(b, t.data(), t.size()), 4u);  // only the planned block
  EXPECT_EQ(table(*pool, b), (V{1}));
  EXPECT_VALID(*pool);
}

TEST(Planned, PrefixHitsCountAsComputed) {
  auto pool = make(10);
  auto t = iota_tokens(9);
  SeqId a = pool->seq_create({});
  append(*pool, a, t);
  step(pool, a);
  pool->free(a);
  SeqId b = pool->seq_create({});
  EXPECT_EQ(pool->match_prefix(b, t.data(), t.size()), 8u);
  pool->free(b);  // never planned, but its blocks were hits: they stay cached
  EXPECT_EQ(pool->stats().num_cached_blocks, 2u);
  EXPECT_VALID(*pool);
}

// A block another sequence still holds keeps its hash when one holder goes.
TEST(Planned, FreeKeepsSharedBlocksCached) {
  auto pool = make(10);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(10));
  SeqId c = pool->fork(a);
  pool->free(a);  // not planned, but c holds 1 and 2
  EXPECT_EQ(pool->stats().num_cached_blocks, 2u);
  step(pool, c);
  pool->free(c);
  EXPECT_EQ(pool->stats().num_cached_blocks, 2u);
  EXPECT_VALID(*pool);
}

// Speculative rollback: drafted tokens a plan computed keep their cached
// blocks past a truncate; ones appended after the last plan do not.
TEST(Planned, TruncateUncachesReleasedBlocksNoPlanCovered) {
  auto pool = make(12);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(9));  // 1 2 3
  step(pool, a);
  append(*pool, a, iota_tokens(8, 9));  // 3 fills, 4 full, 5 partial
  EXPECT_EQ(table(*pool, a), (V{1, 2, 3, 4, 5}));
  EXPECT_EQ(pool->stats().num_cached_blocks, 4u);
  drain(*pool);
  pool->truncate(a, 9);  // releases 5, 4 (unplanned: uncached), keeps 3 partial (ours: uncached)
  EXPECT_EQ(table(*pool, a), (V{1, 2, 3}));
  EXPECT_EQ(pool->stats().num_cached_blocks, 2u);
  EXPECT_EQ(free_queue(*pool), (V{5, 4, 6, 7, 8, 9, 10, 11}));  // in the order released
  auto ev = drain(*pool);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].block_id, 3);
  EXPECT_EQ(ev[1].block_id, 4);
  EXPECT_VALID(*pool);
  // Planned, then rolled back: the released full block stays cached.
  append(*pool, a, iota_tokens(8, 9));  // 3 fills, 4 full, 5 partial
  step(pool, a, 8);
  pool->truncate(a, 9);
  EXPECT_EQ(pool->stats().num_cached_blocks, 3u);  // 1, 2 and the released 4
  EXPECT_VALID(*pool);
  SeqId b = pool->seq_create({});
  auto t = iota_tokens(17);
  EXPECT_EQ(pool->match_prefix(b, t.data(), t.size()), 8u);  // 3 lost its hash to the truncate
  EXPECT_VALID(*pool);
}

// A cached block is always full: one that a truncate left partial and ours
// alone loses its hash even when our own hashes stopped covering it at an
// earlier truncate, made while it was shared (found by the 8-thread stress).
TEST(Planned, TruncateNeverLeavesAPartialBlockCached) {
  auto pool = make(10);
  auto t = iota_tokens(9);
  SeqId a = pool->seq_create({});
  append(*pool, a, V(t.begin(), t.begin() + 8));  // 1 2, both cached
  step(pool, a);
  SeqId b = pool->seq_create({});
  EXPECT_EQ(pool->match_prefix(b, t.data(), 9), 8u);  // shares 1 2
  pool->truncate(a, 6);                               // 2 is shared: it stays cached
  EXPECT_EQ(pool->stats().num_cached_blocks, 2u);
  pool->free(b);
  pool->truncate(a, 6);  // 2 is ours alone now, 2 tokens of it ours: not cached
  EXPECT_EQ(pool->stats().num_cached_blocks, 1u);
  SeqId c = pool->seq_create({});
  EXPECT_EQ(pool->match_prefix(c, t.data(), 9), 4u);
  EXPECT_VALID(*pool);
}

// kv_bytes_used counts the slots holding tokens once per block, with the
// fill of its fullest holder; wasted is the rest of the used blocks.
TEST(Planned, StatsBytesFollowSharedAndTruncatedBlocks) {
  auto pool = Pool::create(test::storage_options(4, 16, 8));
  const uint64_t per_token = pool->bytes_per_block() / 4;
  auto expect_bytes = [&](uint64_t used, uint64_t wasted) {
    PoolStats s = pool->stats();
    EXPECT_EQ(s.kv_bytes_used, used * per_token);
    EXPECT_EQ(s.kv_bytes_wasted, wasted * per_token);
  };
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(10), 3);  // 1 2 3 4: 10 tokens in 16 slots
  expect_bytes(10, 6);
  SeqId c = pool->fork(a);  // shares everything: counted once
  expect_bytes(10, 6);
  EXPECT_EQ(pool->stats().num_tokens, 20u);
  pool->truncate(c, 5);  // c keeps 1, 2 (shared): 3 still holds a's tokens
  expect_bytes(10, 6);
  append(*pool, c, {7});  // c copies shared 2 into 5, which holds 2 tokens
  expect_bytes(12, 8);
  pool->truncate(a, 9);  // a holds 3 alone: its fill drops to 1; 4 goes
  expect_bytes(11, 5);
  pool->free(a);  // c: 1 (4 tokens), 5 (2 tokens)
  expect_bytes(6, 2);
  EXPECT_VALID(*pool);
}

}  // namespace
}  // namespace pagedkv
