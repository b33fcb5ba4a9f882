#include "cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace pagedkv
