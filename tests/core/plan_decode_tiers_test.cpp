// Fused decode steps (Batch::prepare_decode) on pools with offload tiers:
// a block the step's own allocation evicts is offloaded intact before the
// step's copies and writes reach it (the tier hit it later serves is
// byte-exact), and a refused call loads no pending tier hit (it changes
// nothing). Each is checked against append_batch then prepare too.
#include <gtest/gtest.h>

#include <cstring>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::iota_tokens;
using test::random_floats;

constexpr uint32_t kBs = 4, kLayers = 2, kHeads = 4, kDim = 4096;
constexpr size_t kPlane = size_t(kBs) * kHeads * kDim * sizeof(float);  // 256 KiB

// A storage pool of 5 usable blocks (f32, 2 layers, 256 KiB planes) with a
// host tier of 4 blocks.
std::shared_ptr<Pool> tiered_pool() {
  PoolOptions o = test::manager_options(kBs, 6);
  o.num_layers = kLayers;
  o.num_kv_heads = kHeads;
  o.head_dim = kDim;
  o.dtype = DType::kF32;
  o.num_threads = 1;
  auto pool = Pool::create(o);
  TierOptions t;
  t.host_bytes = 4 * kPlane * 2 * kLayers;
  pool->attach_tiers(t);
  return pool;
}

std::vector<char> bytes_of(Pool& p, int32_t block) {
  std::vector<char> out;
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t w = 0; w < 2; ++w) {
      const char* base = static_cast<const char*>(p.kv_tensor(l, w).data) + size_t(block) * kPlane;
      out.insert(out.end(), base, base + kPlane);
    }
  return out;
}

void write_all(const std::shared_ptr<Pool>& pool, SeqId s, uint32_t n, uint32_t seed) {
  auto b = Batch::prepare(pool, &s, &n, 1, nullptr);
  for (uint32_t l = 0; l < kLayers; ++l) {
    auto k = random_floats(size_t(n) * kHeads * kDim, seed + l);
    auto v = random_floats(size_t(n) * kHeads * kDim, seed + 10 + l);
    TensorArg kt = test::rows(k, n, kHeads, kDim), vt = test::rows(v, n, kHeads, kDim);
    b->write(l, &kt, &vt, nullptr);
  }
  ASSERT_TRUE(b->committed());
}

// Returns whether the host tier's copy of A's evicted block 1 is byte-exact.
bool run(bool fused) {
  auto pool = tiered_pool();
  Pool& p = *pool;
  // A: two full blocks, written, freed: cached in the free queue.
  auto ta = iota_tokens(12, 1);
  SeqId a = p.seq_create({});
  p.append(a, ta.data(), ta.size(), 0);
  write_all(pool, a, 12, 100);
  const auto tab_a = test::table(p, a);
  const std::vector<char> want = bytes_of(p, tab_a[2]);
  p.free(a);
  // P: 2 tokens written; C forks it (shared tail); Z holds the uncached free blocks.
  SeqId par = p.seq_create({});
  const auto tp = iota_tokens(2, 500);
  p.append(par, tp.data(), tp.size(), 0);
  write_all(pool, par, 2, 200);
  SeqId c = p.fork(par);
  SeqId z = p.seq_create({});
  const auto tz = iota_tokens(4, 900);
  p.append(z, tz.data(), tz.size(), 0);  // the 2 uncached free blocks
  EXPECT_EQ(p.stats().num_free_blocks, 3u);
  // Decode C: its shared tail is copied into a fresh block, which evicts a
  // cached block of A (queued for the host tier).
  const int32_t tok = 7;
  std::unique_ptr<Batch> b;
  if (fused) {
    b = Batch::prepare_decode(pool, &c, &tok, 1, nullptr);
  } else {
    p.append_batch(&c, &tok, 1);
    const uint32_t one = 1;
    b = Batch::prepare(pool, &c, &one, 1, nullptr);
  }
  b->abort();
  b.reset();
  p.flush_tiers();
  EXPECT_EQ(p.tier_stats(1).num_stored, 1u);
  // A new request with A's tokens: device hit on block 0, host-tier hit on block 1.
  p.free(c);
  p.free(z);
  ta.push_back(4242);
  SeqId d = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(d, ta.data(), ta.size());
  EXPECT_EQ(m.device, 8u);
  EXPECT_EQ(m.host, 4u);
  p.flush_tiers();  // loads it
  EXPECT_EQ(p.tier_stats(1).num_checksum_failures, 0u);
  const auto tab_d = test::table(p, d);
  EXPECT_EQ(p.seq_info(d).num_computed_tokens, 12u) << "the tier hit counts as computed";
  EXPECT_EQ(p.validate(), "");
  return bytes_of(p, tab_d[2]) == want;
}

TEST(PlanDecodeTiers, TwoCallsOffloadTheEvictedBlockIntact) {
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(run(false)) << "round " << i;
}

TEST(PlanDecodeTiers, FusedOffloadsTheEvictedBlockIntact) {
  int bad = 0;
  for (int i = 0; i < 20; ++i) bad += !run(true);
  EXPECT_EQ(bad, 0) << bad << " of 20 rounds served a corrupted tier hit";
}

// A call refused for a stale id must not load a pending tier hit (its
// num_computed_tokens would move although nothing changed), as
// pkv_batch_prepare_ex refuses the same batch before settling the tiers.
void stale_id_case(bool fused, uint64_t* before, uint64_t* after) {
  auto pool = tiered_pool();
  Pool& p = *pool;
  auto ta = iota_tokens(8, 1);
  SeqId a = p.seq_create({});
  p.append(a, ta.data(), ta.size(), 0);
  write_all(pool, a, 8, 100);
  p.free(a);
  ta.push_back(4242);
  SeqId z = p.seq_create({});
  const auto tz = iota_tokens(20, 900);
  p.append(z, tz.data(), tz.size(), 0);  // evicts both blocks of a
  p.free(z);
  p.flush_tiers();
  SeqId d = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(d, ta.data(), ta.size());
  EXPECT_EQ(m.host, 8u);
  SeqId dead = p.seq_create({});
  p.free(dead);
  *before = p.seq_info(d).num_computed_tokens;
  const SeqId ids[] = {d, dead};
  const int32_t toks[] = {1, 2};
  const uint32_t q[] = {1, 1};
  const Errc e = test::code_of([&] {
    if (fused)
      Batch::prepare_decode(pool, ids, toks, 2, nullptr);
    else
      Batch::prepare(pool, ids, q, 2, nullptr);
  });
  EXPECT_EQ(e, Errc::kNotFound);
  *after = p.seq_info(d).num_computed_tokens;
}

TEST(PlanDecodeTiers, RefusedCallLoadsNoTierHit) {
  uint64_t b0, a0, b1, a1;
  stale_id_case(false, &b0, &a0);
  stale_id_case(true, &b1, &a1);
  EXPECT_EQ(b0, a0);
  EXPECT_EQ(b1, a1) << "a refused prepare_decode loaded a tier hit";
}

}  // namespace
}  // namespace pagedkv
