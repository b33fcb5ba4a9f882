// Eight threads hammer one pool through the C ABI (create, prefix hits,
// append, fork, truncate, plans, stats, events, free); afterwards every
// invariant must hold and every block must be back.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

TEST(Threads, EightThreadsOnOnePoolKeepEveryInvariant) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 257;
  o.enable_events = 1;
  o.max_events = 128;
  o.hash_algo = PKV_HASH_XXH3_128;
  pkv_pool* pool = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK);
  std::atomic<int> unexpected{0};
  std::atomic<uint64_t> hits{0};
  auto worker = [&](int t) {
    std::mt19937 rng(1000 + t);
    std::vector<pkv_seq_id> mine;
    std::vector<int32_t> prompt(40);
    for (int step = 0; step < 1500; ++step) {
      int op = int(rng() % 10);
      pkv_status st = PKV_OK;
      if (op < 2 || mine.empty()) {
        pkv_seq_id id;
        st = pkv_seq_create(pool, nullptr, &id);
        if (st != PKV_OK) break;
        int32_t base = int32_t(rng() % 4) * 100;  // shared prompts across threads
        for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = base + int32_t(i);
        uint64_t cached = 0;
        st = pkv_seq_match_prefix(pool, id, prompt.data(), prompt.size(), &cached);
        hits += cached;
        if (st == PKV_OK)
          st = pkv_seq_append(pool, id, prompt.data() + cached, prompt.size() - cached, 0);
        mine.push_back(id);
      } else if (op < 6) {
        int32_t tok = int32_t(rng() % 1000);
        st = pkv_seq_append(pool, mine[rng() % mine.size()], &tok, 1, rng() % 2);
      } else if (op == 6) {
        pkv_seq_id child;
        st = pkv_seq_fork(pool, mine[rng() % mine.size()], &child);
        if (st == PKV_OK) mine.push_back(child);
      } else if (op == 7) {
        pkv_seq_info info;
        pkv_seq_info_init(&info);
        pkv_seq_id id = mine[rng() % mine.size()];
        st = pkv_seq_get_info(pool, id, &info);
        if (st == PKV_OK && info.num_tokens > 0)
          st = pkv_seq_truncate(pool, id, info.num_tokens - 1 - rng() % info.num_tokens / 2);
      } else if (op == 8) {
        pkv_seq_id id = mine[rng() % mine.size()];
        // A step computes what is not computed yet (only this thread
        // touches its sequences); a quarter of them fail and abort.
        pkv_seq_info info;
        pkv_seq_info_init(&info);
        st = pkv_seq_get_info(pool, id, &info);
        uint32_t q = uint32_t(std::max<uint64_t>(1, info.num_tokens - info.num_computed_tokens));
        pkv_batch* b = nullptr;
        if (st == PKV_OK) st = pkv_batch_prepare(pool, &id, &q, 1, nullptr, &b);
        if (st == PKV_E_INVALID_ARGUMENT && info.num_tokens == 0) st = PKV_OK;  // empty: q > tokens
        if (st == PKV_OK && b) st = rng() % 4 ? pkv_batch_commit(b) : pkv_batch_abort(b);
        pkv_batch_destroy(b);
        pkv_pool_stats s;
        pkv_pool_stats_init(&s);
        if (st == PKV_OK) st = pkv_pool_get_stats(pool, &s);
        pkv_event ev[16];
        uint64_t n;
        if (st == PKV_OK) st = pkv_pool_drain_events(pool, ev, 16, &n);
      } else {
        size_t i = rng() % mine.size();
        st = pkv_seq_free(pool, mine[i]);
        mine.erase(mine.begin() + long(i));
      }
      if (st == PKV_E_OUT_OF_BLOCKS && !mine.empty()) {  // preempt one of ours
        size_t i = rng() % mine.size();
        st = pkv_seq_free(pool, mine[i]);
        mine.erase(mine.begin() + long(i));
      }
      if (st != PKV_OK) ++unexpected;
    }
    for (pkv_seq_id id : mine)
      if (pkv_seq_free(pool, id) != PKV_OK) ++unexpected;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_EQ(pkv_pool_validate(pool), PKV_OK) << pkv_last_error_message();
  pkv_pool_stats s;
  pkv_pool_stats_init(&s);
  ASSERT_EQ(pkv_pool_get_stats(pool, &s), PKV_OK);
  EXPECT_EQ(s.num_used_blocks, 0u);
  EXPECT_EQ(s.num_free_blocks, 256u);
  EXPECT_EQ(s.num_seqs, 0u);
  EXPECT_GT(hits.load(), 0u);
  pkv_pool_destroy(pool);
}

}  // namespace

namespace {

// A CPU f32 pool: blocks of 16 tokens, 2 KV heads of 64, 2 kernel threads.
pkv_pool* storage_pool(uint64_t num_blocks, uint32_t num_layers) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 16;
  o.num_blocks = num_blocks;
  o.num_layers = num_layers;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 2;
  pkv_pool* pool = nullptr;
  return pkv_pool_create(&o, &pool) == PKV_OK ? pool : nullptr;
}

// Kernels run outside the pool lock (docs/threading.md): four threads each
// step their own sequences (append, prepare, write, attention) on one
// storage pool while the others do the same.
TEST(Threads, ConcurrentStepsOnOneStoragePool) {
  pkv_pool* pool = storage_pool(129, 2);
  ASSERT_NE(pool, nullptr) << pkv_last_error_message();
  std::atomic<int> unexpected{0};
  auto worker = [&](int t) {
    std::mt19937 rng(t);
    std::uniform_real_distribution<float> d(-1, 1);
    pkv_seq_id s[2];
    for (auto& id : s) {
      if (pkv_seq_create(pool, nullptr, &id) != PKV_OK) ++unexpected;
      std::vector<int32_t> prompt(20 + t);
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(t * 1000 + i);
      if (pkv_seq_append(pool, id, prompt.data(), prompt.size(), 0) != PKV_OK) ++unexpected;
    }
    uint32_t q[2] = {uint32_t(20 + t), uint32_t(20 + t)};
    for (int step = 0; step < 12; ++step) {
      pkv_batch* b = nullptr;
      if (pkv_batch_prepare(pool, s, q, 2, nullptr, &b) != PKV_OK) {
        ++unexpected;
        break;
      }
      const int64_t n = q[0] + q[1];
      std::vector<float> kv(size_t(n) * 2 * 64), qs(size_t(n) * 4 * 64), out(qs.size());
      for (auto& x : kv) x = d(rng);
      for (auto& x : qs) x = d(rng);
      int64_t kshape[3] = {n, 2, 64}, qshape[3] = {n, 4, 64};
      pkv_tensor kt, qt, ot;
      pkv_tensor_init(kv.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, kshape, &kt);
      pkv_tensor_init(qs.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, qshape, &qt);
      pkv_tensor_init(out.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, qshape, &ot);
      for (uint32_t layer = 0; layer < 2; ++layer) {
        if (pkv_cache_write(b, layer, &kt, &kt, nullptr) != PKV_OK) ++unexpected;
        if (pkv_attention_forward(b, layer, &qt, &ot, nullptr, nullptr, nullptr) != PKV_OK)
          ++unexpected;
      }
      for (float x : out)
        if (!(x >= -1.001f && x <= 1.001f)) {  // a convex mix of values in [-1, 1]
          ++unexpected;
          break;
        }
      pkv_batch_destroy(b);
      int32_t next[2] = {int32_t(rng() % 100), int32_t(rng() % 100)};
      for (int i = 0; i < 2; ++i)
        if (pkv_seq_append(pool, s[i], &next[i], 1, 0) != PKV_OK) ++unexpected;
      q[0] = q[1] = 1;
    }
    for (auto id : s) pkv_seq_free(pool, id);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(unexpected.load(), 0) << pkv_last_error_message();
  EXPECT_EQ(pkv_pool_validate(pool), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(pool);
}

}  // namespace

namespace {

// Issue 14 item 7: a block read (swap-out, which the bindings' read_kv_block
// uses) racing cache writes to that block on another thread. Cache writes
// hold the pool's KV lock exclusively and reads hold it shared, so a read
// sees one write's values or the next's, never a mix (and TSan sees no race).
TEST(Threads, BlockReadsNeverSeeATornCacheWrite) {
  pkv_pool* pool = storage_pool(4, 1);
  ASSERT_NE(pool, nullptr) << pkv_last_error_message();
  pkv_seq_id s = 0;
  ASSERT_EQ(pkv_seq_create(pool, nullptr, &s), PKV_OK);
  std::vector<int32_t> tokens(16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 7 + 3);
  ASSERT_EQ(pkv_seq_append(pool, s, tokens.data(), tokens.size(), 0), PKV_OK);
  int32_t block = -1;
  uint64_t n = 0;
  ASSERT_EQ(pkv_seq_get_block_table(pool, s, &block, 1, &n), PKV_OK);
  uint32_t q = 16;
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(pool, &s, &q, 1, nullptr, &b), PKV_OK);
  uint64_t bpb = 0;
  ASSERT_EQ(pkv_pool_bytes_per_block(pool, &bpb), PKV_OK);
  const int64_t shape[3] = {16, 2, 64};
  {
    // One whole write before any read: the bytes before it are whatever the
    // arena held, not a write that could be torn.
    std::vector<float> first(16 * 2 * 64, 0.5f);
    pkv_tensor t;
    ASSERT_EQ(pkv_tensor_init(first.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t),
              PKV_OK);
    ASSERT_EQ(pkv_cache_write(b, 0, &t, &t, nullptr), PKV_OK);
  }

  std::atomic<bool> done{false};
  std::atomic<int> failures{0}, torn{0};
  std::thread writer([&] {
    std::vector<float> kv(16 * 2 * 64);
    pkv_tensor t;
    pkv_tensor_init(kv.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t);
    for (int i = 1; i <= 400; ++i) {
      std::fill(kv.begin(), kv.end(), float(i));
      if (pkv_cache_write(b, 0, &t, &t, nullptr) != PKV_OK) ++failures;
    }
    done = true;
  });
  std::vector<float> host(bpb / sizeof(float));
  int reads = 0;
  while (!done || reads < 10) {
    if (pkv_pool_swap_blocks(pool, &block, 1, host.data(), bpb, PKV_SWAP_OUT, nullptr) != PKV_OK) {
      ++failures;
      break;
    }
    ++reads;
    for (float x : host)
      if (x != host[0]) {
        ++torn;
        break;
      }
  }
  writer.join();
  EXPECT_EQ(failures.load(), 0) << pkv_last_error_message();
  EXPECT_EQ(torn.load(), 0) << "of " << reads << " reads";
  ASSERT_EQ(pkv_pool_swap_blocks(pool, &block, 1, host.data(), bpb, PKV_SWAP_OUT, nullptr), PKV_OK);
  EXPECT_EQ(host[0], 400.f);
  EXPECT_EQ(host.back(), 400.f);
  pkv_batch_destroy(b);
  pkv_pool_destroy(pool);
}

}  // namespace
