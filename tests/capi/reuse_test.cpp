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

}  // namespace
