// Destroying a pool while another thread runs a kernel of one of its step
// plans (docs/threading.md, "Destroy while in use"): the running call either
// finishes with a correct result or fails with PKV_E_INVALID_STATE, every
// later call on the plan fails with PKV_E_INVALID_STATE, and the storage is
// freed when the last holder lets go (ASan: no use after free; LSan: no
// leak; TSan: no race).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kHeadDim = 64, kBlock = 16;

pkv_tensor rows(float* data, int64_t n, int64_t heads) {
  const int64_t shape[3] = {n, heads, kHeadDim};
  pkv_tensor t;
  EXPECT_EQ(pkv_tensor_init(data, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t), PKV_OK);
  return t;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct Fixture {
  pkv_pool* pool = nullptr;
  pkv_seq_id id = 0;
  pkv_batch* batch = nullptr;  // one decode query over the whole context
  std::vector<float> v;        // the values written, to bound the output
};

// A pool holding one sequence of `tokens` random K/V rows (written through a
// plan over all of them), and a decode plan over its last token.
Fixture make(uint32_t tokens, std::mt19937& rng) {
  Fixture s;
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBlock;
  o.num_blocks = tokens / kBlock + 2;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = kHeadDim;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 2;
  EXPECT_EQ(pkv_pool_create(&o, &s.pool), PKV_OK) << pkv_last_error_message();
  pkv_seq_id& id = s.id;
  EXPECT_EQ(pkv_seq_create(s.pool, nullptr, &id), PKV_OK);
  std::vector<int32_t> toks(tokens);
  for (uint32_t i = 0; i < tokens; ++i) toks[i] = int32_t(rng() % 50000);
  EXPECT_EQ(pkv_seq_append(s.pool, id, toks.data(), tokens, 0), PKV_OK);
  pkv_batch* all = nullptr;
  EXPECT_EQ(pkv_batch_prepare(s.pool, &id, &tokens, 1, nullptr, &all), PKV_OK);
  std::vector<float> k = random_floats(size_t(tokens) * kHeadDim, rng);
  s.v = random_floats(size_t(tokens) * kHeadDim, rng);
  pkv_tensor kt = rows(k.data(), tokens, 1), vt = rows(s.v.data(), tokens, 1);
  EXPECT_EQ(pkv_cache_write(all, 0, &kt, &vt, nullptr), PKV_OK) << pkv_last_error_message();
  pkv_batch_destroy(all);
  const uint32_t one = 1;
  EXPECT_EQ(pkv_batch_prepare(s.pool, &id, &one, 1, nullptr, &s.batch), PKV_OK);
  return s;
}

// Attention output is a convex combination of the value rows: each element
// lies within the column's min and max (a use after free or a torn arena
// would show up as garbage, NaN or out-of-range values).
void expect_convex(const std::vector<float>& out, const std::vector<float>& v, uint32_t tokens) {
  for (uint32_t d = 0; d < kHeadDim; ++d) {
    float lo = INFINITY, hi = -INFINITY;
    for (uint32_t t = 0; t < tokens; ++t) {
      lo = std::min(lo, v[size_t(t) * kHeadDim + d]);
      hi = std::max(hi, v[size_t(t) * kHeadDim + d]);
    }
    ASSERT_TRUE(out[d] >= lo - 1e-4f && out[d] <= hi + 1e-4f) << "out[" << d << "] = " << out[d];
  }
}

TEST(DestroyThreads, PoolDestroyedWhileAttentionRunsIsDefined) {
  std::mt19937 rng(7);
  const uint32_t tokens = 16384;
  for (int round = 0; round < 12; ++round) {
    Fixture s = make(tokens, rng);
    std::vector<float> q = random_floats(kHeadDim, rng);
    std::atomic<int> done{0};
    pkv_status last = PKV_OK;
    std::string bad;
    // Attention back to back until the destroy stops it: the destroy lands
    // inside a running kernel in most rounds.
    std::thread runner([&] {
      std::vector<float> out(kHeadDim);
      pkv_tensor qt = rows(q.data(), 1, 1), ot = rows(out.data(), 1, 1);
      while ((last = pkv_attention_forward(s.batch, 0, &qt, &ot, nullptr, nullptr, nullptr)) ==
             PKV_OK) {
        expect_convex(out, s.v, tokens);
        ++done;
      }
      bad = pkv_last_error_message();
    });
    while (done < 1) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    pkv_pool_destroy(s.pool);
    runner.join();
    EXPECT_EQ(last, PKV_E_INVALID_STATE) << bad;
    EXPECT_NE(bad.find("destroyed"), std::string::npos) << bad;
    // Every later call on the plan fails cleanly.
    std::vector<float> out(kHeadDim);
    pkv_tensor qt = rows(q.data(), 1, 1), ot = rows(out.data(), 1, 1);
    EXPECT_EQ(pkv_attention_forward(s.batch, 0, &qt, &ot, nullptr, nullptr, nullptr),
              PKV_E_INVALID_STATE);
    pkv_tensor kt = rows(q.data(), 1, 1), vt = rows(q.data(), 1, 1);
    EXPECT_EQ(pkv_cache_write(s.batch, 0, &kt, &vt, nullptr), PKV_E_INVALID_STATE);
    pkv_batch_info info;
    pkv_batch_info_init(&info);
    EXPECT_EQ(pkv_batch_get_info(s.batch, &info), PKV_OK);  // host data: still readable
    EXPECT_EQ(info.num_tokens, 1u);
    pkv_batch_destroy(s.batch);  // the last holder: the pool's memory goes now
  }
}

TEST(DestroyThreads, CacheWriteRacingDestroyIsDefined) {
  std::mt19937 rng(11);
  const uint32_t tokens = 4096;
  for (int round = 0; round < 8; ++round) {
    Fixture s = make(tokens, rng);
    pkv_batch_destroy(s.batch);
    // A plan writing every token's K/V, run again and again.
    pkv_batch* b = nullptr;
    const uint32_t n = tokens;
    ASSERT_EQ(pkv_batch_prepare(s.pool, &s.id, &n, 1, nullptr, &b), PKV_OK);
    std::vector<float> k = random_floats(size_t(n) * kHeadDim, rng), v = k;
    std::atomic<bool> go{false};
    pkv_status st = PKV_OK;
    std::thread writer([&] {
      pkv_tensor kt = rows(k.data(), n, 1), vt = rows(v.data(), n, 1);
      go = true;
      for (int i = 0; i < 50 && st == PKV_OK; ++i) st = pkv_cache_write(b, 0, &kt, &vt, nullptr);
    });
    while (!go) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    pkv_pool_destroy(s.pool);
    writer.join();
    EXPECT_TRUE(st == PKV_OK || st == PKV_E_INVALID_STATE) << st;
    pkv_batch_destroy(b);
  }
}

}  // namespace
