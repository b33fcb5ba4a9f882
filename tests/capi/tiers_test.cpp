// Offload tiers through the C ABI (issue 20): pkv_pool_drain_events keeps
// returning device events only, numbered without gaps, while the tiers
// record their own; a tiered match and a plan bring evicted blocks back.
#include <gtest/gtest.h>

#include <vector>

#include "assert_ok.h"
#include "pagedkv/pagedkv.h"

namespace {

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

// A 6-block f32 pool (1 layer, 1 KV head, head dim 8, block 4) with a host
// tier of host_blocks blocks and, when file_blocks > 0, a file tier in /tmp.
void make_tiered_pool(pkv_pool** out, uint64_t host_blocks, uint64_t file_blocks = 0,
                      bool events = false) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 6;  // blocks 1..5
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 8;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 1;
  o.enable_events = events ? 1 : 0;
  PKV_ASSERT_OK(pkv_pool_create(&o, out));
  uint64_t bpb = 0;
  PKV_ASSERT_OK(pkv_pool_bytes_per_block(*out, &bpb));
  pkv_tier_options t;
  pkv_tier_options_init(&t);
  t.host_bytes = host_blocks * bpb;
  if (file_blocks > 0) {
    t.file_dir = "/tmp";
    t.file_bytes = file_blocks * bpb;
  }
  PKV_ASSERT_OK(pkv_pool_attach_tiers(*out, &t));
}

TEST(CapiTiers, DrainEventsStaysDeviceOnlyAndGapFree) {
  pkv_pool* p = nullptr;
  ASSERT_NO_FATAL_FAILURE(make_tiered_pool(&p, 8, 0, true));

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

// The tiered admit and hash lookup through the C ABI: hits per medium,
// the loads in the next plan bring the bytes back exactly.
TEST(CapiTiers, AdmitTieredAndHashLookupLoadFromBothTiers) {
  pkv_pool* p = nullptr;
  ASSERT_NO_FATAL_FAILURE(make_tiered_pool(&p, 3, 2));
  uint64_t bpb = 0;
  PKV_ASSERT_OK(pkv_pool_bytes_per_block(p, &bpb));

  std::vector<int32_t> ta(17), tb(20);
  for (int i = 0; i < 17; ++i) ta[i] = 7 * i + 3;
  for (int i = 0; i < 20; ++i) tb[i] = 1000 + i;
  pkv_seq_id a = 0, b = 0;
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &a));
  PKV_ASSERT_OK(pkv_seq_append(p, a, ta.data(), ta.size(), 0));
  write_all(p, a, 17, 1.25f);
  std::vector<pkv_block_hash> hs(4);
  uint64_t n = 0;
  PKV_ASSERT_OK(pkv_seq_get_block_hashes(p, a, hs.data(), hs.size(), &n));
  ASSERT_EQ(n, 4u);
  std::vector<int32_t> table(5);
  PKV_ASSERT_OK(pkv_seq_get_block_table(p, a, table.data(), table.size(), &n));
  std::vector<char> want(4 * bpb), got(4 * bpb);
  PKV_ASSERT_OK(
      pkv_pool_swap_blocks(p, table.data(), 4, want.data(), want.size(), PKV_SWAP_OUT, nullptr));
  PKV_ASSERT_OK(pkv_seq_free(p, a));
  PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &b));
  PKV_ASSERT_OK(pkv_seq_append(p, b, tb.data(), tb.size(), 0));  // evicts a's 4 blocks
  PKV_ASSERT_OK(pkv_seq_free(p, b));
  PKV_ASSERT_OK(pkv_pool_flush_tiers(p));

  for (int by_hash = 0; by_hash < 2; ++by_hash) {
    SCOPED_TRACE(by_hash ? "hash lookup" : "admit");
    pkv_tier_match m;
    pkv_tier_match_init(&m);
    pkv_seq_id c = 0;
    if (by_hash) {
      PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &c));
      PKV_ASSERT_OK(
          pkv_seq_match_prefix_hashes_tiered(p, c, ta.data(), ta.size(), hs.data(), 4, &m));
      PKV_ASSERT_OK(pkv_seq_append(p, c, ta.data() + 16, 1, 0));
    } else {
      PKV_ASSERT_OK(pkv_seq_admit_tiered(p, nullptr, ta.data(), ta.size(), nullptr, 0, 0, &c, &m));
    }
    // The first round loaded the tier hits into device blocks that stay
    // cached: the second finds them on the device.
    if (by_hash) {
      EXPECT_EQ(m.device_tokens, 16u);
    } else {
      EXPECT_EQ(m.host_tokens, 12u);
      EXPECT_EQ(m.file_tokens, 4u);
    }
    EXPECT_EQ(m.num_cached, 16u);
    PKV_ASSERT_OK(pkv_pool_flush_tiers(p));  // runs the loads
    pkv_seq_info info;
    pkv_seq_info_init(&info);
    PKV_ASSERT_OK(pkv_seq_get_info(p, c, &info));
    EXPECT_EQ(info.num_tokens, 17u);
    EXPECT_EQ(info.num_computed_tokens, 16u);
    PKV_ASSERT_OK(pkv_seq_get_block_table(p, c, table.data(), table.size(), &n));
    PKV_ASSERT_OK(
        pkv_pool_swap_blocks(p, table.data(), 4, got.data(), got.size(), PKV_SWAP_OUT, nullptr));
    EXPECT_EQ(got, want);
    PKV_ASSERT_OK(pkv_pool_validate(p));
    PKV_ASSERT_OK(pkv_seq_free(p, c));
  }
  pkv_tier_stats st;
  pkv_tier_stats_init(&st);
  PKV_ASSERT_OK(pkv_pool_get_tier_stats(p, PKV_MEDIUM_FILE, &st));
  EXPECT_EQ(st.num_loaded, 1u);
  EXPECT_EQ(st.num_checksum_failures, 0u);
  pkv_pool_destroy(p);
}

// A copy-on-write copy waits in the pool until the next plan (or copy,
// swap or flush) runs it; a tier hit's load waits there too. Its source or
// its destination may meanwhile have been freed and handed to a tier hit:
// the copy must read and write the blocks as they were when it was
// recorded, before the load writes the tier's bytes into them (and so
// before the copy could overwrite a loaded, cached block).
TEST(CapiTiers, PendingCopiesRunBeforeTierLoadsIntoTheirBlocks) {
  for (int freed_dst = 0; freed_dst < 2; ++freed_dst) {
    SCOPED_TRACE(freed_dst ? "the copy's destination went to a tier hit"
                           : "the copy's source went to a tier hit");
    pkv_pool* p = nullptr;
    ASSERT_NO_FATAL_FAILURE(make_tiered_pool(&p, 8));
    uint64_t bpb = 0;
    PKV_ASSERT_OK(pkv_pool_bytes_per_block(p, &bpb));

    // x's first block (K = 1.0 + 0.01 i) goes to the host tier.
    const int32_t tx[5] = {0, 1, 2, 3, 4};
    std::vector<int32_t> ty(20);
    for (int i = 0; i < 20; ++i) ty[i] = 1000 + i;
    pkv_seq_id x = 0, y = 0, par = 0, child = 0, e = 0;
    PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &x));
    PKV_ASSERT_OK(pkv_seq_append(p, x, tx, 5, 0));
    write_all(p, x, 5, 1.0f);
    PKV_ASSERT_OK(pkv_seq_free(p, x));
    PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &y));
    PKV_ASSERT_OK(pkv_seq_append(p, y, ty.data(), ty.size(), 0));  // evicts x's cached block
    PKV_ASSERT_OK(pkv_seq_free(p, y));
    PKV_ASSERT_OK(pkv_pool_flush_tiers(p));

    // A parent's written partial block (K = 2.0 + 0.01 i), shared with a
    // child whose append copies it (pending).
    const int32_t tp[3] = {200, 201, 202};
    PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &par));
    PKV_ASSERT_OK(pkv_seq_append(p, par, tp, 2, 0));
    write_all(p, par, 2, 2.0f);
    PKV_ASSERT_OK(pkv_seq_fork(p, par, &child));
    PKV_ASSERT_OK(pkv_seq_append(p, child, tp + 2, 1, 0));
    int32_t src = 0, dst = 0;
    uint64_t n = 0;
    PKV_ASSERT_OK(pkv_seq_get_block_table(p, par, &src, 1, &n));
    PKV_ASSERT_OK(pkv_seq_get_block_table(p, child, &dst, 1, &n));
    ASSERT_NE(src, dst);
    // The freed block (no hash) goes to the head of the free queue, where
    // the tier hit's block is taken from.
    PKV_ASSERT_OK(pkv_seq_free(p, freed_dst ? child : par));
    PKV_ASSERT_OK(pkv_seq_create(p, nullptr, &e));
    pkv_tier_match m;
    pkv_tier_match_init(&m);
    PKV_ASSERT_OK(pkv_seq_match_prefix_tiered(p, e, tx, 5, &m));
    ASSERT_EQ(m.host_tokens, 4u);
    int32_t hit = 0;
    PKV_ASSERT_OK(pkv_seq_get_block_table(p, e, &hit, 1, &n));
    ASSERT_EQ(hit, freed_dst ? dst : src);
    PKV_ASSERT_OK(pkv_pool_flush_tiers(p));  // runs the load (and the copy)

    // Block dst holds the parent's two slots (copied), or x's block (loaded).
    std::vector<char> raw(bpb);
    PKV_ASSERT_OK(pkv_pool_swap_blocks(p, &dst, 1, raw.data(), raw.size(), PKV_SWAP_OUT, nullptr));
    const float* k = reinterpret_cast<const float*>(raw.data());
    const int slots = freed_dst ? 4 : 2;
    const float base = freed_dst ? 1.0f : 2.0f;
    for (int i = 0; i < slots * 8; ++i)
      ASSERT_EQ(k[i], base + 0.01f * float(i)) << "K element " << i;
    if (!freed_dst) {  // and the tier's block is where the hit put it
      PKV_ASSERT_OK(
          pkv_pool_swap_blocks(p, &src, 1, raw.data(), raw.size(), PKV_SWAP_OUT, nullptr));
      for (int i = 0; i < 4 * 8; ++i) ASSERT_EQ(k[i], 1.0f + 0.01f * float(i)) << "K element " << i;
    }
    PKV_ASSERT_OK(pkv_pool_validate(p));
    pkv_pool_destroy(p);
  }
}

}  // namespace
