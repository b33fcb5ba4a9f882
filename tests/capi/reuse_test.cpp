// Partial-block hits and retention priorities through the C ABI (issue 22):
// the versioned structs, what a manager-only engine is told to copy, the
// pool's clock, priority counts and events.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "assert_ok.h"
#include "pagedkv/pagedkv.h"

namespace {

pkv_pool* manager_pool(uint32_t partial, uint32_t retention, uint64_t max_pinned = 0) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  EXPECT_EQ(o.enable_partial_reuse, 0u);  // off by default
  EXPECT_EQ(o.enable_retention, 0u);
  EXPECT_EQ(o.max_pinned_blocks, 0u);
  o.block_size = 4;
  o.num_blocks = 8;
  o.enable_events = 1;
  o.enable_partial_reuse = partial;
  o.enable_retention = retention;
  o.max_pinned_blocks = max_pinned;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

// A step over a sequence's uncomputed tokens, committed.
void compute(pkv_pool* p, pkv_seq_id s) {
  pkv_seq_info i;
  pkv_seq_info_init(&i);
  ASSERT_EQ(pkv_seq_get_info(p, s, &i), PKV_OK);
  const uint32_t q = uint32_t(i.num_tokens - i.num_computed_tokens);
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b));
  PKV_ASSERT_OK(pkv_batch_commit(b));
  pkv_batch_destroy(b);
}

TEST(CapiReuse, PartialHitTellsAManagerOnlyEngineWhatToCopy) {
  pkv_pool* p = manager_pool(1, 0);
  pkv_seq_id a = 0, b = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &a));
  const int32_t ta[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  PKV_ASSERT_OK(pkv_seq_append(p, a, ta, 10, 0));
  compute(p, a);
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &b));
  const int32_t tb[8] = {0, 1, 2, 3, 4, 5, 6, 42};
  pkv_prefix_match m;
  pkv_prefix_match_init(&m);
  PKV_ASSERT_OK(pkv_seq_match_prefix_partial(p, b, tb, 8, &m));
  EXPECT_EQ(m.num_cached, 7u);
  EXPECT_EQ(m.partial_tokens, 3u);
  EXPECT_EQ(m.copy_src, 2);
  EXPECT_EQ(m.copy_dst, 4);
  int32_t table[4];
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_seq_get_block_table(p, b, table, 4, &n));
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(table[0], 1);
  EXPECT_EQ(table[1], 4);
  pkv_seq_info i;
  pkv_seq_info_init(&i);
  PKV_ASSERT_OK(pkv_seq_get_info(p, b, &i));
  EXPECT_EQ(i.num_computed_tokens, 7u);
  pkv_pool_stats s;
  pkv_pool_stats_init(&s);
  PKV_ASSERT_OK(pkv_pool_get_stats(p, &s));
  EXPECT_EQ(s.num_partial_hits, 1u);
  EXPECT_EQ(s.partial_hit_tokens, 3u);
  EXPECT_EQ(s.prefix_hit_tokens, 7u);
  // A caller built against the first pkv_pool_stats gets its fields only.
  pkv_pool_stats old;
  pkv_pool_stats_init(&old);
  old.struct_size = uint32_t(offsetof(pkv_pool_stats, num_partial_hits));
  old.num_partial_hits = 777;
  PKV_ASSERT_OK(pkv_pool_get_stats(p, &old));
  EXPECT_EQ(old.num_partial_hits, 777u);
  EXPECT_EQ(old.prefix_hit_tokens, 7u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_options got;
  pkv_pool_options_init(&got);
  PKV_ASSERT_OK(pkv_pool_get_options(p, &got));
  EXPECT_EQ(got.enable_partial_reuse, 1u);
  pkv_pool_destroy(p);
}

TEST(CapiReuse, RetentionThroughTheAbi) {
  pkv_pool* p = manager_pool(0, 1, 1);
  PKV_ASSERT_OK(pkv_pool_set_clock(p, 1000));
  pkv_seq_id a = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &a));
  const pkv_retention_range r[2] = {{0, 4, PKV_PRIORITY_PINNED, 0, 0},
                                    {4, PKV_TOKEN_END, 70, 0, 500}};
  PKV_ASSERT_OK(pkv_seq_set_retention(p, a, r, 2));
  const int32_t t[9] = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  PKV_ASSERT_OK(pkv_seq_append(p, a, t, 9, 0));
  compute(p, a);
  std::vector<uint64_t> c(PKV_PRIORITY_MAX + 1);
  uint64_t len = 0;
  PKV_ASSERT_OK(pkv_pool_get_priority_counts(p, c.data(), c.size(), &len));
  EXPECT_EQ(len, 101u);
  EXPECT_EQ(c[PKV_PRIORITY_PINNED], 1u);
  EXPECT_EQ(c[70], 1u);
  PKV_ASSERT_OK(pkv_seq_free(p, a));  // the 70 lasts until 1500
  pkv_pool_stats s;
  pkv_pool_stats_init(&s);
  PKV_ASSERT_OK(pkv_pool_get_stats(p, &s));
  EXPECT_EQ(s.num_pinned_blocks, 1u);
  EXPECT_EQ(s.num_free_blocks, 6u);  // 7 usable, 1 pinned
  pkv_event ev[16];
  uint64_t ne = 0;
  PKV_ASSERT_OK(pkv_pool_drain_events(p, ev, 16, &ne));
  PKV_ASSERT_OK(pkv_pool_set_clock(p, 1500));
  PKV_ASSERT_OK(pkv_pool_get_priority_counts(p, c.data(), c.size(), &len));
  EXPECT_EQ(c[70], 0u);
  EXPECT_EQ(c[PKV_PRIORITY_DEFAULT], 1u);
  PKV_ASSERT_OK(pkv_pool_drain_events(p, ev, 16, &ne));
  ASSERT_EQ(ne, 1u);
  EXPECT_EQ(ev[0].type, uint32_t(PKV_EVENT_BLOCK_PRIORITY));
  EXPECT_EQ(ev[0].num_tokens, uint32_t(PKV_PRIORITY_DEFAULT));
  // A second pin is over the budget of 1: refused, nothing changed.
  pkv_seq_id b = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &b));
  const int32_t u[5] = {50, 51, 52, 53, 54};
  PKV_ASSERT_OK(pkv_seq_append(p, b, u, 5, 0));
  compute(p, b);
  const pkv_retention_range pin = {0, PKV_TOKEN_END, PKV_PRIORITY_PINNED, 0, 0};
  EXPECT_EQ(pkv_seq_set_retention(p, b, &pin, 1), PKV_E_OUT_OF_BLOCKS);
  EXPECT_NE(std::string(pkv_last_error_message()).find("max_pinned_blocks"), std::string::npos);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

// A pool whose cached blocks [0, 8) of kPinned are pinned and free: the
// pinned level of the free queue is kept, never allocated, so such blocks
// count neither as free nor as freed when a hit takes them or a sliding
// window releases them.
const int32_t kPinned[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};

pkv_pool* pinning_pool(uint64_t num_blocks, uint32_t window) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = num_blocks;
  o.sliding_window = window;
  o.enable_retention = 1;
  o.max_pinned_blocks = 2;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

pkv_seq_id pinned_seq(pkv_pool* p) {
  pkv_seq_id a = 0;
  EXPECT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
  pkv_retention_range pin = {0, PKV_TOKEN_END, PKV_PRIORITY_PINNED, 0, 0};
  EXPECT_EQ(pkv_seq_set_retention(p, a, &pin, 1), PKV_OK) << pkv_last_error_message();
  return a;
}

uint64_t free_blocks(pkv_pool* p) {
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  EXPECT_EQ(pkv_pool_get_stats(p, &st), PKV_OK);
  return st.num_free_blocks;
}

// Admission counted a pinned free hit as leaving the free blocks: 2 free
// blocks and 2 pinned hits left "0 free" and a prompt that fits (as
// match_prefix + append shows) was refused.
TEST(CapiReuse, AdmitDoesNotCountPinnedHitsAsFreeBlocks) {
  pkv_pool* p = pinning_pool(5, 0);  // blocks 1..4
  pkv_seq_id a = pinned_seq(p);
  PKV_ASSERT_OK(pkv_seq_append(p, a, kPinned, 8, 0));
  compute(p, a);
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  ASSERT_EQ(free_blocks(p), 2u);  // 2 pinned blocks are not free
  int32_t prompt[13];
  for (int i = 0; i < 13; ++i) prompt[i] = i;  // the 8 pinned tokens + 5: 4 blocks, 2 new
  pkv_seq_id b = 0;
  uint64_t cached = 0;
  PKV_ASSERT_OK(pkv_seq_admit(p, nullptr, prompt, 13, 0, &b, &cached));
  EXPECT_EQ(cached, 8u);
  EXPECT_EQ(free_blocks(p), 0u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

// With every unpinned block taken, the same count went below zero (uint64)
// and the admission allocated from an empty free queue.
TEST(CapiReuse, AdmitWithOnlyPinnedFreeBlocksIsOutOfBlocks) {
  pkv_pool* p = pinning_pool(4, 0);  // blocks 1..3
  pkv_seq_id a = pinned_seq(p);
  PKV_ASSERT_OK(pkv_seq_append(p, a, kPinned, 8, 0));
  compute(p, a);
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  pkv_seq_id other = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &other));
  const int32_t t[4] = {50, 51, 52, 53};
  PKV_ASSERT_OK(pkv_seq_append(p, other, t, 4, 0));  // the last unpinned block
  ASSERT_EQ(free_blocks(p), 0u);
  pkv_seq_id b = 0;
  uint64_t cached = 0;
  EXPECT_EQ(pkv_seq_admit(p, nullptr, kPinned, 9, 0, &b, &cached), PKV_E_OUT_OF_BLOCKS);
  EXPECT_EQ(b, 0u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  PKV_ASSERT_OK(pkv_pool_get_stats(p, &st));
  EXPECT_EQ(st.num_seqs, 1u);
  EXPECT_EQ(st.num_pinned_blocks, 2u);
  pkv_pool_destroy(p);
}

// A sliding window releasing a pinned block gives no free block back (it
// stays cached, pinned): the append needs a free block of its own.
TEST(CapiReuse, WindowReleasingAPinnedBlockFreesNothing) {
  pkv_pool* p = pinning_pool(4, 4);  // blocks 1..3, window of 4 tokens
  pkv_seq_id a = pinned_seq(p);
  PKV_ASSERT_OK(pkv_seq_append(p, a, kPinned, 4, 0));
  compute(p, a);
  PKV_ASSERT_OK(pkv_seq_append(p, a, kPinned + 4, 4, 0));
  compute(p, a);
  pkv_seq_id other = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &other));
  const int32_t t[4] = {50, 51, 52, 53};
  PKV_ASSERT_OK(pkv_seq_append(p, other, t, 4, 0));  // the last unpinned block
  ASSERT_EQ(free_blocks(p), 0u);
  uint64_t need = 0;
  PKV_ASSERT_OK(pkv_seq_blocks_needed(p, a, 1, 0, &need));
  EXPECT_EQ(need, 1u);  // the window releases block 0 of a, which stays pinned
  EXPECT_EQ(pkv_seq_append(p, a, kPinned + 8, 1, 0), PKV_E_OUT_OF_BLOCKS);
  EXPECT_EQ(pkv_seq_append_batch(p, &a, kPinned + 8, 1), PKV_E_OUT_OF_BLOCKS);
  pkv_batch* b = nullptr;
  EXPECT_EQ(pkv_batch_prepare_decode(p, &a, kPinned + 8, 1, 0, nullptr, &b), PKV_E_OUT_OF_BLOCKS);
  EXPECT_EQ(b, nullptr);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_seq_info i;
  pkv_seq_info_init(&i);
  PKV_ASSERT_OK(pkv_seq_get_info(p, a, &i));
  EXPECT_EQ(i.num_tokens, 8u);
  pkv_pool_destroy(p);
}

}  // namespace
