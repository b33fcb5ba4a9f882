#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "free_block_queue.h"

namespace pagedkv {
namespace {

std::vector<int32_t> items(const FreeBlockQueue& q) {
  std::vector<int32_t> v;
  q.for_each([&](int32_t id) { v.push_back(id); });
  return v;
}

TEST(FreeBlockQueue, StartsWithBlocksInIdOrderSkippingTheNullBlock) {
  FreeBlockQueue q(6);
  EXPECT_EQ(items(q), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(q.size(), 5);
  EXPECT_FALSE(q.contains(0));
  EXPECT_STREQ(q.check(), "");
}

// A run's pushes go to the head in push order, tail pushes alongside; out of
// a run push_front_run is push_front. Also with levels (retention).
TEST(FreeBlockQueue, FrontRunPushesInOrderAtTheHead) {
  for (int32_t levels : {1, 3}) {
    FreeBlockQueue q(9, 1, levels, levels);
    for (int i = 0; i < 6; ++i) q.pop_front();  // 7, 8 left
    {
      FreeBlockQueue::FrontRun run(q);
      q.push_front_run(3);
      q.push_back(5);
      q.push_front_run(2);
      q.push_front_run(6);
    }
    q.push_front_run(1);  // no run: the head
    q.push_front_run(4);
    EXPECT_EQ(items(q), (std::vector<int32_t>{4, 1, 3, 2, 6, 7, 8, 5})) << levels;
    EXPECT_EQ(q.size(), 8);
    EXPECT_STREQ(q.check(), "");
    while (!q.empty()) q.pop_front();
    {
      FreeBlockQueue::FrontRun run(q);  // a run into an empty queue
      q.push_front_run(8);
      q.push_front_run(7);
    }
    EXPECT_EQ(items(q), (std::vector<int32_t>{8, 7}));
    EXPECT_STREQ(q.check(), "");
  }
}

TEST(FreeBlockQueue, PopPushAndRemoveFromTheMiddle) {
  FreeBlockQueue q(6);
  EXPECT_EQ(q.pop_front(), 1);
  EXPECT_EQ(q.pop_front(), 2);
  q.remove(4);  // middle
  EXPECT_EQ(items(q), (std::vector<int32_t>{3, 5}));
  q.push_back(2);
  q.push_front(4);
  q.push_back(1);
  EXPECT_EQ(items(q), (std::vector<int32_t>{4, 3, 5, 2, 1}));
  q.remove(4);  // head
  q.remove(1);  // tail
  EXPECT_EQ(items(q), (std::vector<int32_t>{3, 5, 2}));
  EXPECT_EQ(q.front(), 3);
  EXPECT_EQ(q.back(), 2);
  EXPECT_FALSE(q.contains(4));
  EXPECT_TRUE(q.contains(5));
  EXPECT_STREQ(q.check(), "");
}

TEST(FreeBlockQueue, EmptiesAndRefills) {
  FreeBlockQueue q(3);
  q.pop_front();
  q.pop_front();
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.front(), q.tail());
  EXPECT_STREQ(q.check(), "");
  q.push_front(2);
  EXPECT_EQ(items(q), (std::vector<int32_t>{2}));
  EXPECT_STREQ(q.check(), "");
}

TEST(FreeBlockQueue, MatchesAReferenceListUnderRandomOperations) {
  std::mt19937 rng(7);
  const int32_t n = 50;
  FreeBlockQueue q(n);
  std::vector<int32_t> ref;
  for (int32_t i = 1; i < n; ++i) ref.push_back(i);
  std::vector<int32_t> out;  // blocks not in the queue
  for (int step = 0; step < 5000; ++step) {
    int op = rng() % 4;
    if ((op == 0 || out.empty()) && !ref.empty()) {
      int32_t id = q.pop_front();
      ASSERT_EQ(id, ref.front());
      ref.erase(ref.begin());
      out.push_back(id);
    } else if (op == 1 && !ref.empty()) {
      size_t i = rng() % ref.size();
      q.remove(ref[i]);
      out.push_back(ref[i]);
      ref.erase(ref.begin() + i);
    } else if (!out.empty()) {
      size_t i = rng() % out.size();
      int32_t id = out[i];
      out.erase(out.begin() + i);
      if (op == 2) {
        q.push_back(id);
        ref.push_back(id);
      } else {
        q.push_front(id);
        ref.insert(ref.begin(), id);
      }
    }
    ASSERT_EQ(q.size(), int32_t(ref.size()));
    if (step % 97 == 0) {
      ASSERT_EQ(items(q), ref);
      ASSERT_STREQ(q.check(), "");
    }
  }
  EXPECT_EQ(items(q), ref);
}

}  // namespace
}  // namespace pagedkv
