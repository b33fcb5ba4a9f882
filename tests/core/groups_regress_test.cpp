// Regressions found by the multi-group fuzz harness (tests/fuzz/
// groups_harness.cpp), each reduced to the calls that show it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kBs = 4;

pkv_kv_group_spec spec(uint32_t kind) {
  pkv_kv_group_spec g;
  pkv_kv_group_spec_init(&g);
  g.kind = kind;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  if (kind == PKV_GROUP_RECURRENT) g.state_bytes = 64;
  return g;
}

pkv_pool* full_and_recurrent(uint64_t blocks) {
  const std::vector<pkv_kv_group_spec> groups = {spec(PKV_GROUP_FULL), spec(PKV_GROUP_RECURRENT)};
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = blocks;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create_groups(&o, groups.data(), 2, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

uint64_t free_blocks(pkv_pool* p) {
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  EXPECT_EQ(pkv_pool_get_stats(p, &st), PKV_OK);
  return st.num_free_blocks;
}

void take_all_copies(pkv_pool* p) {
  for (uint32_t g = 0; g < 2; ++g) {
    int32_t src[16], dst[16];
    uint64_t n = 0;
    ASSERT_EQ(pkv_pool_group_take_copies(p, g, src, dst, 16, &n), PKV_OK);
  }
}

// A step over the sequence's last q tokens, committed.
void step(pkv_pool* p, pkv_seq_id s, uint32_t q) {
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b), PKV_OK) << pkv_last_error_message();
  take_all_copies(p);
  ASSERT_EQ(pkv_batch_commit(b), PKV_OK);
  pkv_batch_destroy(b);
}

// An append at a block boundary of a recurrent group keeps no snapshot when
// one of that hash is cached, and pkv_seq_blocks_needed counts no block for
// it. The append's own allocation in the full group could evict that very
// snapshot (it is the oldest free block); the append then decided to keep a
// snapshot after all and took one block more than counted, from a free
// queue that may have been empty.
TEST(GroupRegress, AppendTakesWhatBlocksNeededCountedWhenItEvictsTheSnapshot) {
  pkv_pool* p = full_and_recurrent(5);  // 4 usable blocks
  const int32_t t[5] = {11, 12, 13, 14, 15};
  pkv_seq_id a = 0, b = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, a, t, 4, 0), PKV_OK);
  step(p, a, 4);
  ASSERT_EQ(pkv_seq_append(p, a, t + 4, 1, 0), PKV_OK);  // keeps the state at 4 as a snapshot
  step(p, a, 1);
  ASSERT_EQ(pkv_seq_free(p, a), PKV_OK);  // its block 0 and the snapshot stay cached, free

  ASSERT_EQ(pkv_seq_create(p, nullptr, &b), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, b, t, 4, 0), PKV_OK);  // takes the two uncached free blocks
  step(p, b, 4);
  uint64_t needed = 0;
  ASSERT_EQ(pkv_seq_blocks_needed(p, b, 1, 0, &needed), PKV_OK);
  EXPECT_EQ(needed, 1u);  // a new block in the full group; the snapshot exists
  const uint64_t before = free_blocks(p);
  ASSERT_EQ(before, 2u);  // a's snapshot (oldest) and a's block 0
  ASSERT_EQ(pkv_seq_append(p, b, t + 4, 1, 0), PKV_OK);
  EXPECT_EQ(before - free_blocks(p), needed);
  take_all_copies(p);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  ASSERT_EQ(pkv_seq_free(p, b), PKV_OK);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(p);
}

// Before a pool's first plan, appends count their tokens computed: a
// recurrent state then holds them. A sequence's first plan takes that count
// back from its first query on, which is right for attention pages (they
// are rewritten with the same K/V) but would apply tokens a second time to
// the state: it is refused, unless the plan starts at position 0 (the
// state restarts from scratch).
TEST(GroupRegress, FirstPlanDoesNotRecomputeARecurrentStateFromTheMiddle) {
  pkv_pool* p = full_and_recurrent(16);
  const int32_t t[6] = {1, 2, 3, 4, 5, 6};
  pkv_seq_id a = 0, c = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
  ASSERT_EQ(pkv_seq_create(p, nullptr, &c), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, a, t, 5, 0), PKV_OK);  // counted computed: 5
  ASSERT_EQ(pkv_seq_append(p, c, t, 3, 0), PKV_OK);  // counted computed: 3
  uint32_t q = 2;  // would recompute tokens 3 and 4 on top of the state after 5
  pkv_batch* b = nullptr;
  EXPECT_EQ(pkv_batch_prepare(p, &a, &q, 1, nullptr, &b), PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("recurrent"), std::string::npos)
      << pkv_last_error_message();
  q = 5;  // from position 0: the state restarts
  step(p, a, q);
  // c's appends before the first plan still count: its first plan may
  // start where they end, not before.
  ASSERT_EQ(pkv_seq_append(p, c, t + 3, 1, 0), PKV_OK);
  q = 2;
  EXPECT_EQ(pkv_batch_prepare(p, &c, &q, 1, nullptr, &b), PKV_E_INVALID_ARGUMENT);
  step(p, c, 1);
  pkv_seq_info info;
  pkv_seq_info_init(&info);
  ASSERT_EQ(pkv_seq_get_info(p, c, &info), PKV_OK);
  EXPECT_EQ(info.num_computed_tokens, 4u);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(p);
}

// Found by the provenance model (tests/capi/provenance_groups_test.cpp): a
// truncate to the sequence's own length (a speculative rollback that
// rejects nothing) while its step runs made that step's commit skip the
// sequence, as if tokens the step wrote were gone. The step had advanced
// the recurrent state in place, so the state held 9 tokens while 8 counted
// computed, and the next plan (queries from 8) applied token 8 twice. A
// truncate that drops no token must not make the commit skip, as
// Pool::truncate's writes_epoch.
TEST(GroupRegress, TruncateToTheSameLengthDoesNotUncountARunningStep) {
  pkv_pool* p = full_and_recurrent(16);
  const int32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  pkv_seq_id a = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, a, t, 8, 0), PKV_OK);
  step(p, a, 8);
  ASSERT_EQ(pkv_seq_append(p, a, t + 8, 1, 0), PKV_OK);
  uint32_t q = 1;
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(p, &a, &q, 1, nullptr, &b), PKV_OK) << pkv_last_error_message();
  take_all_copies(p);
  // The step runs (the state now holds 9 tokens); the engine rolls back
  // nothing.
  ASSERT_EQ(pkv_seq_truncate(p, a, 9), PKV_OK) << pkv_last_error_message();
  ASSERT_EQ(pkv_batch_commit(b), PKV_OK);
  pkv_batch_destroy(b);
  pkv_seq_info info;
  pkv_seq_info_init(&info);
  ASSERT_EQ(pkv_seq_get_info(p, a, &info), PKV_OK);
  EXPECT_EQ(info.num_computed_tokens, 9u) << "the state holds 9 tokens";
  // So the next step starts after token 8, not on it again.
  q = 1;
  pkv_batch* again = nullptr;
  EXPECT_EQ(pkv_batch_prepare(p, &a, &q, 1, nullptr, &again), PKV_E_INVALID_ARGUMENT);
  pkv_batch_destroy(again);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(p);
}

}  // namespace

// Found by review (wave 9): a multi-group pool's ids were 1, 2, 3...
// without the pool's tag, so an id of one multi-group pool named the
// sequence of the same number in another (DESIGN.md section 9, Ids: an id
// used on another pool is PKV_E_NOT_FOUND). Ids now carry the pool tag as
// single-group ids do.
TEST(GroupRegress, AnIdOfAnotherPoolIsNotFound) {
  pkv_pool* a = full_and_recurrent(16);
  pkv_pool* b = full_and_recurrent(16);
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 16;
  pkv_pool* single = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &single), PKV_OK);
  pkv_seq_id sa = 0, sb = 0, ss = 0;
  ASSERT_EQ(pkv_seq_create(a, nullptr, &sa), PKV_OK);
  ASSERT_EQ(pkv_seq_create(b, nullptr, &sb), PKV_OK);
  ASSERT_EQ(pkv_seq_create(single, nullptr, &ss), PKV_OK);
  EXPECT_NE(sa, sb);
  const int32_t toks[3] = {1, 2, 3};
  ASSERT_EQ(pkv_seq_append(b, sb, toks, 3, 0), PKV_OK);
  pkv_seq_info info;
  pkv_seq_info_init(&info);
  const uint64_t before = free_blocks(b);
  // a's id on b (and on a single-group pool), b's and the single pool's on a.
  EXPECT_EQ(pkv_seq_get_info(b, sa, &info), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_append(b, sa, toks, 3, 0), PKV_E_NOT_FOUND);
  pkv_seq_id child = 0;
  EXPECT_EQ(pkv_seq_fork(b, sa, &child), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_truncate(b, sa, 0), PKV_E_NOT_FOUND);
  const uint32_t q = 1;
  pkv_batch* batch = nullptr;
  EXPECT_EQ(pkv_batch_prepare(b, &sa, &q, 1, nullptr, &batch), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_free(b, sa), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_get_info(single, sa, &info), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_get_info(a, sb, &info), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_seq_get_info(a, ss, &info), PKV_E_NOT_FOUND);
  // b's own sequence is untouched.
  ASSERT_EQ(pkv_seq_get_info(b, sb, &info), PKV_OK);
  EXPECT_EQ(info.num_tokens, 3u);
  EXPECT_EQ(free_blocks(b), before);
  // Forks get tagged ids too, and a freed id stays unknown.
  ASSERT_EQ(pkv_seq_fork(b, sb, &child), PKV_OK);
  EXPECT_EQ(pkv_seq_get_info(a, child, &info), PKV_E_NOT_FOUND);
  ASSERT_EQ(pkv_seq_free(b, child), PKV_OK);
  EXPECT_EQ(pkv_seq_get_info(b, child, &info), PKV_E_NOT_FOUND);
  EXPECT_EQ(pkv_pool_validate(b), PKV_OK);
  pkv_pool_destroy(single);
  pkv_pool_destroy(b);
  pkv_pool_destroy(a);
}

// Found by the vLLM differential test (bindings/python/tests/
// test_vllm_differential.py): equal blocks of a group (a full hit recomputes
// the prompt's last block, which is then cached twice) were looked up newest
// first, vLLM's coordinator takes the oldest. The hit then took other block
// ids, and other blocks left the free queue, than vLLM's.
TEST(GroupRegress, AHitTakesTheOldestOfEqualBlocks) {
  pkv_kv_group_spec window = spec(PKV_GROUP_SLIDING_WINDOW);
  window.sliding_window = 2 * kBs;
  const std::vector<pkv_kv_group_spec> groups = {spec(PKV_GROUP_FULL), window};
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 40;
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create_groups(&o, groups.data(), 2, &p), PKV_OK) << pkv_last_error_message();
  const std::vector<int32_t> toks = {100, 101, 102, 103, 104, 105, 106, 107, 1, 2, 3, 4};
  const auto table = [&](pkv_seq_id s, uint32_t g) {
    std::vector<int32_t> t(8);
    uint64_t len = 0;
    EXPECT_EQ(pkv_seq_group_block_table(p, s, g, t.data(), t.size(), &len), PKV_OK);
    t.resize(len);
    return t;
  };
  // Admits toks[0, n): the hit, then the rest, computed in one step.
  const auto admit = [&](uint64_t n) {
    pkv_seq_id s = 0;
    uint64_t hit = 0;
    EXPECT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
    EXPECT_EQ(pkv_seq_match_prefix(p, s, toks.data(), n, &hit), PKV_OK);
    EXPECT_EQ(pkv_seq_append(p, s, toks.data() + hit, n - hit, 0), PKV_OK);
    step(p, s, uint32_t(n - hit));
    return s;
  };
  // The same two blocks, computed by a, then again by b (its hit stops one
  // block short: the last token is always computed).
  const pkv_seq_id a = admit(8);
  const std::vector<int32_t> a0 = table(a, 0), a1 = table(a, 1);
  ASSERT_EQ(pkv_seq_free(p, a), PKV_OK);
  const pkv_seq_id b = admit(8);
  EXPECT_NE(table(b, 0)[1], a0[1]);
  ASSERT_EQ(pkv_seq_free(p, b), PKV_OK);
  const pkv_seq_id c = admit(12);
  const std::vector<int32_t> c0 = table(c, 0), c1 = table(c, 1);
  ASSERT_EQ(c0.size(), 3u);
  ASSERT_EQ(c1.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(c0.begin(), c0.begin() + 2), a0);
  EXPECT_EQ(std::vector<int32_t>(c1.begin(), c1.begin() + 2), a1);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  ASSERT_EQ(pkv_seq_free(p, c), PKV_OK);
  pkv_pool_destroy(p);
}

// A sliding window of one token (found by test_vllm_differential_third.py):
// the hit search needs ceil((w - 1) / bs) = 0 blocks, and the pool answered
// every lookup with the whole prompt in null blocks, a hit on an empty
// cache (prefix_hit_tokens counted tokens nothing had computed). vLLM's
// SlidingWindowManager caches no block of such a group and never hits on
// it, so a pool of [full, window 1] never hits either, and the group's
// blocks go back to the free queue uncached.
TEST(GroupRegress, AOneTokenWindowCachesNothingAndNeverHits) {
  pkv_kv_group_spec window = spec(PKV_GROUP_SLIDING_WINDOW);
  window.sliding_window = 1;
  for (const bool with_full : {false, true}) {
    // Two groups (step() takes the copies of two): two such windows, or
    // full attention and one.
    const std::vector<pkv_kv_group_spec> groups = {with_full ? spec(PKV_GROUP_FULL) : window,
                                                   window};
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = kBs;
    o.num_blocks = 40;
    pkv_pool* p = nullptr;
    ASSERT_EQ(pkv_pool_create_groups(&o, groups.data(), 2, &p), PKV_OK) << pkv_last_error_message();
    const std::vector<int32_t> toks = {100, 101, 102, 103, 104, 105, 106, 107, 108};
    for (int round = 0; round < 2; ++round) {
      pkv_seq_id s = 0;
      uint64_t hit = 99;
      ASSERT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
      ASSERT_EQ(pkv_seq_match_prefix(p, s, toks.data(), toks.size(), &hit), PKV_OK);
      EXPECT_EQ(hit, 0u) << "with_full " << with_full << " round " << round;
      ASSERT_EQ(pkv_seq_append(p, s, toks.data() + hit, toks.size() - hit, 0), PKV_OK);
      step(p, s, uint32_t(toks.size() - hit));
      EXPECT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
      ASSERT_EQ(pkv_seq_free(p, s), PKV_OK);
    }
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    ASSERT_EQ(pkv_pool_get_stats(p, &st), PKV_OK);
    EXPECT_EQ(st.prefix_hit_tokens, 0u);
    pkv_pool_destroy(p);
  }
}

// A committed step that ends on a block boundary (found by
// test_vllm_differential_mamba.py): vLLM 0.33.0's MambaManager
// (mamba_cache_mode "align") caches the running state block at the end of
// that step, so a request admitted before the owner's next step hits it.
// The pool kept the state only when the owner's next append started there
// (or it was freed there): the same prompt hit a block less in between.
// The live slot is cached at commit now; the owner's next append moves to a
// copy, as it did to keep the snapshot, so no block is taken more or sooner.
TEST(GroupRegress, AStepEndingOnABoundaryCachesTheStateAtCommit) {
  pkv_pool* p = full_and_recurrent(32);
  const std::vector<int32_t> toks = {100, 101, 102, 103, 104, 105, 106, 107, 108};
  pkv_seq_id a = 0, b = 0;
  uint64_t hit = 99;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, a, toks.data(), 8, 0), PKV_OK);  // two blocks
  step(p, a, 8);
  const uint64_t free_before = free_blocks(p);
  ASSERT_EQ(pkv_seq_create(p, nullptr, &b), PKV_OK);
  ASSERT_EQ(pkv_seq_match_prefix(p, b, toks.data(), toks.size(), &hit), PKV_OK);
  EXPECT_EQ(hit, 8u) << "the state after 8 tokens was computed by a committed step";
  ASSERT_EQ(pkv_seq_free(p, b), PKV_OK);
  EXPECT_EQ(free_blocks(p), free_before);
  // The owner goes on in a copy; the cached state stays hittable.
  ASSERT_EQ(pkv_seq_append(p, a, toks.data() + 8, 1, 0), PKV_OK);
  step(p, a, 1);
  EXPECT_EQ(free_blocks(p), free_before - 1);  // the full group's third block
  ASSERT_EQ(pkv_seq_create(p, nullptr, &b), PKV_OK);
  ASSERT_EQ(pkv_seq_match_prefix(p, b, toks.data(), toks.size(), &hit), PKV_OK);
  EXPECT_EQ(hit, 8u);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  ASSERT_EQ(pkv_seq_free(p, b), PKV_OK);
  ASSERT_EQ(pkv_seq_free(p, a), PKV_OK);
  pkv_pool_destroy(p);
}
