#include "cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "backend.h"
#include "cpu/cpu_backend.h"

namespace pagedkv {
namespace {

TEST(ThreadPool, RunsEveryItemOnceOnValidWorkers) {
  for (int32_t threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 3, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<bool> bad_worker{false};
      pool.parallel_for(n, [&](int64_t i, int32_t w) {
        hits[size_t(i)].fetch_add(1);
        if (w < 0 || w >= threads) bad_worker = true;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
      ASSERT_FALSE(bad_worker.load());
    }
  }
}

TEST(ThreadPool, DefaultsToHardwareConcurrency) {
  ThreadPool pool(0);
  EXPECT_GE(pool.size(), 1);
}

TEST(ThreadPool, ConcurrentCallersAreServed) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        pool.parallel_for(64, [&](int64_t i, int32_t) { total.fetch_add(i); });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), int64_t(4) * 50 * (63 * 64 / 2));
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> count{0};
  pool.parallel_for(4, [&](int64_t, int32_t) {
    pool.parallel_for(3, [&](int64_t, int32_t) { count.fetch_add(1); });
  });
  EXPECT_EQ(count.load(), 12);
}

// Threaded attention with split-KV, called from two threads at once on one
// backend (for TSan): every call agrees with a single-threaded backend.
TEST(ThreadedKernels, ConcurrentSplitAttentionMatchesSingleThread) {
  const int32_t hkv = 2, group = 4, d = 64, bs = 16, ctx = 200, nseq = 2;
  const int32_t pages_per = (ctx + bs - 1) / bs, blocks = nseq * pages_per + 1;
  KvArena arena;
  arena.num_layers = 1;
  arena.layout = {blocks, hkv, bs, d, DType::kF32};
  std::vector<float> storage(arena.layout.layer_bytes() * 2 / sizeof(float));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : storage) x = u(rng);
  arena.base = storage.data();
  std::vector<int32_t> pages(size_t(nseq) * pages_per);
  std::iota(pages.begin(), pages.end(), 1);
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<int32_t> qptr{0, 1, 2}, pptr{0, pages_per, 2 * pages_per}, ctxs{ctx, ctx - 7};
  std::vector<int32_t> last{ctx - (pages_per - 1) * bs, ctx - 7 - (pages_per - 1) * bs};
  std::vector<int64_t> slots{-1, -1};
  PlanView plan{nseq,        nseq,         1,           ctx,        slots.data(), qptr.data(),
                pptr.data(), pages.data(), last.data(), ctxs.data()};
  const int32_t hq = hkv * group;
  std::vector<float> q(size_t(nseq) * hq * d);
  for (float& x : q) x = u(rng);
  Tensor3 qt{q.data(), DType::kF32, nseq, hq, d, int64_t(hq) * d, d};
  AttentionArgs args{0.125f, 0, 0.0f, nullptr, 0};

  std::vector<float> want(q.size());
  Tensor3 wt{want.data(), DType::kF32, nseq, hq, d, int64_t(hq) * d, d};
  make_cpu_backend(1)->attend(arena, 0, plan, qt, wt, args, nullptr);

  CpuBackendOptions opts;
  opts.num_threads = 4;
  opts.min_split_keys = 16;
  auto backend = make_cpu_backend(opts);
  std::vector<std::vector<float>> got(2, std::vector<float>(q.size()));
  std::vector<std::thread> callers;
  for (int c = 0; c < 2; ++c) {
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 5; ++rep) {
        Tensor3 ot{got[c].data(), DType::kF32, nseq, hq, d, int64_t(hq) * d, d};
        backend->attend(arena, 0, plan, qt, ot, args, nullptr);
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < 2; ++c) {
    for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(got[c][i], want[i], 1e-5) << i;
  }
}

}  // namespace
}  // namespace pagedkv
