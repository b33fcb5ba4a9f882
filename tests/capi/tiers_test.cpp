// Offload tiers through the C ABI (issue 20): pkv_pool_drain_events keeps
// returning device events only, numbered without gaps, while the tiers
// record their own; a tiered match and a plan bring evicted blocks back.
#include <gtest/gtest.h>

#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

#define PKV_ASSERT_OK(expr)                                              \
  do {                                                                   \
    pkv_status st_ = (expr);                                             \
    ASSERT_EQ(st_, PKV_OK) << #expr << ": " << pkv_last_error_message(); \
  } while (0)

void write_all(pkv_pool* p, pkv_seq_id s, uint32_t n, float seed) {
  pkv_batch* b = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &s, &n, 1, nullptr, &b));
  std::vector<float> k(n * 8), v(n * 8);
  for (size_t i = 0; i < k.size(); ++i) k[i] = seed + 0.01f * float(i), v[i] = -k[i];
  int64_t shape[3] = {int64_t(n), 1, 8};
  pkv_tensor kt, vt;
  PKV_ASSERT_OK(pkv_tensor_init(k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &kt));
  PKV_ASSERT_OK(pkv_tensor_init(v.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &vt));
  PKV_ASSERT_OK(pkv_cache_write(b, 0, &kt, &vt, nullptr));
  pkv_batch_destroy(b);
}

TEST(CapiTiers, DrainEventsStaysDeviceOnlyAndGapFree) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 6;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 8;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 1;
  o.enable_events = 1;
  pkv_pool* p = nullptr;
  PKV_ASSERT_OK(pkv_pool_create(&o, &p));
  uint64_t bpb = 0;
  PKV_ASSERT_OK(pkv_pool_bytes_per_block(p, &bpb));
  pkv_tier_options t;
  pkv_tier_options_init(&t);
  t.host_bytes = 8 * bpb;
  PKV_ASSERT_OK(pkv_pool_attach_tiers(p, &t));

  std::vector<int32_t> ta(17), tb(20);
  for (int i = 0; i < 17; ++i) ta[i] = i;
  for (int i = 0; i < 20; ++i) tb[i] = 1000 + i;
  pkv_seq_id a = 0, b = 0, c = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &a));
  PKV_ASSERT_OK(pkv_seq_append(p, a, ta.data(), ta.size(), 0));
  write_all(p, a, 17, 1.0f);
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &b));
  PKV_ASSERT_OK(pkv_seq_append(p, b, tb.data(), tb.size(), 0));  // evicts a's 4 cached blocks
  write_all(p, b, 20, 5.0f);
  PKV_ASSERT_OK(pkv_seq_free(p, b));
  PKV_ASSERT_OK(pkv_pool_flush_tiers(p));
  pkv_tier_stats st;
  pkv_tier_stats_init(&st);
  PKV_ASSERT_OK(pkv_pool_get_tier_stats(p, PKV_MEDIUM_HOST, &st));
  EXPECT_EQ(st.num_stored, 4u);

  std::vector<pkv_event> ev(64);
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_pool_drain_events(p, ev.data(), ev.size(), &n));
  // Device events only: a's 4 blocks stored and removed, b's 5 stored.
  int stored = 0, removed = 0;
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(ev[i].seq_no, i + 1) << "device events are numbered without gaps";
    stored += ev[i].type == PKV_EVENT_BLOCK_STORED;
    removed += ev[i].type == PKV_EVENT_BLOCK_REMOVED;
  }
  EXPECT_EQ(stored, 4 + 5);
  EXPECT_EQ(removed, 4);

  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &c));
  pkv_tier_match m;
  pkv_tier_match_init(&m);
  PKV_ASSERT_OK(pkv_seq_match_prefix_tiered(p, c, ta.data(), ta.size(), &m));
  EXPECT_EQ(m.num_cached, 16u);
  EXPECT_EQ(m.host_tokens, 16u);
  PKV_ASSERT_OK(pkv_seq_append(p, c, ta.data() + 16, 1, 0));
  uint32_t one = 1;
  pkv_batch* batch = nullptr;
  PKV_ASSERT_OK(pkv_batch_prepare(p, &c, &one, 1, nullptr, &batch));  // loads the hits
  pkv_batch_destroy(batch);
  pkv_seq_info info;
  pkv_seq_info_init(&info);
  PKV_ASSERT_OK(pkv_seq_get_info(p, c, &info));
  EXPECT_EQ(info.num_computed_tokens, 16u);
  PKV_ASSERT_OK(pkv_pool_validate(p));
  pkv_pool_destroy(p);
}

}  // namespace
