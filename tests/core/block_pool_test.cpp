#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "block_pool.h"

namespace pagedkv {
namespace {

BlockHash make_hash(uint64_t v) {
  BlockHash h;
  h.size = 32;
  uint64_t k = v * 0x9e3779b97f4a7c15ull;
  std::memcpy(h.bytes.data(), &k, 8);
  return h;
}

std::vector<int32_t> queue_of(const BlockPool& p) {
  std::vector<int32_t> v;
  p.queue().for_each([&](int32_t id) { v.push_back(id); });
  return v;
}

TEST(BlockPool, AllocatesFromTheHeadAndNeverTheNullBlock) {
  EventQueue ev(true, 100);
  BlockPool p(5, true, &ev);
  EXPECT_EQ(p.num_free(), 4);
  EXPECT_EQ(p.allocate(), 1);
  EXPECT_EQ(p.allocate(), 2);
  EXPECT_EQ(p.ref(1), 1);
  EXPECT_EQ(p.num_used(), 2);
  EXPECT_EQ(p.ref(BlockPool::kNullBlock), 0);
  EXPECT_FALSE(p.in_free_queue(BlockPool::kNullBlock));
  EXPECT_EQ(p.check(), "");
}

TEST(BlockPool, FreedHashedBlocksGoToTheTailOthersToTheHead) {
  EventQueue ev(true, 100);
  BlockPool p(6, true, &ev);
  int32_t a = p.allocate(), b = p.allocate(), c = p.allocate();  // 1 2 3
  p.cache_block(b, make_hash(7), nullptr, 16, 0);
  p.release(a);  // no hash: head
  p.release(b);  // hash: tail
  EXPECT_EQ(queue_of(p), (std::vector<int32_t>{1, 4, 5, 2}));
  p.share(c);
  p.release(c);
  EXPECT_EQ(p.ref(c), 1);  // still held once
  EXPECT_FALSE(p.in_free_queue(c));
  EXPECT_EQ(p.check(), "");
}

TEST(BlockPool, TouchTakesAFreeCachedBlockOutOfTheQueue) {
  EventQueue ev(true, 100);
  BlockPool p(5, true, &ev);
  int32_t a = p.allocate();
  p.cache_block(a, make_hash(1), nullptr, 16, 0);
  p.release(a);
  EXPECT_EQ(queue_of(p), (std::vector<int32_t>{2, 3, 4, 1}));
  EXPECT_EQ(p.lookup(make_hash(1)), a);
  p.touch(a);
  EXPECT_EQ(p.ref(a), 1);
  EXPECT_EQ(queue_of(p), (std::vector<int32_t>{2, 3, 4}));
  p.touch(a);  // already in use: only the count moves
  EXPECT_EQ(p.ref(a), 2);
  EXPECT_EQ(p.check(), "");
}

TEST(BlockPool, LazyEvictionWhenACachedBlockIsReused) {
  EventQueue ev(true, 100);
  BlockPool p(3, true, &ev);
  int32_t a = p.allocate(), b = p.allocate();
  p.cache_block(a, make_hash(1), nullptr, 16, 5);
  p.release(a);
  p.release(b);  // queue: b, a
  EXPECT_EQ(p.num_cached(), 1);
  EXPECT_EQ(p.allocate(), b);
  EXPECT_EQ(p.num_cached(), 1);  // not evicted yet
  EXPECT_EQ(p.allocate(), a);    // now it is
  EXPECT_EQ(p.num_cached(), 0);
  EXPECT_EQ(p.lookup(make_hash(1)), -1);
  EXPECT_EQ(p.num_evictions(), 1u);
  std::vector<Event> e(10);
  e.resize(ev.drain(e.data(), e.size()));
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].type, EventType::kStored);
  EXPECT_EQ(e[1].type, EventType::kRemoved);
  EXPECT_EQ(e[1].block_id, a);
  EXPECT_EQ(e[1].block_hash, make_hash(1));
  EXPECT_EQ(e[1].lora_id, 5u);
  EXPECT_EQ(e[1].seq_no, 2u);
  EXPECT_EQ(p.check(), "");
}

TEST(BlockPool, CachingDisabledNeverCaches) {
  BlockPool p(3, false, nullptr);
  int32_t a = p.allocate();
  p.cache_block(a, make_hash(1), nullptr, 16, 0);
  EXPECT_TRUE(p.hash(a).empty());
  EXPECT_EQ(p.lookup(make_hash(1)), -1);
}

TEST(EventQueue, DropsTheOldestWhenFullAndKeepsNumbering) {
  EventQueue q(true, 3);
  for (int i = 0; i < 5; ++i) {
    Event e;
    e.block_id = i;
    q.push(e);
  }
  EXPECT_EQ(q.dropped(), 2u);
  std::vector<Event> out(10);
  out.resize(q.drain(out.data(), 2));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].seq_no, 3u);
  EXPECT_EQ(out[0].block_id, 2);
  EXPECT_EQ(out[1].seq_no, 4u);
  out.resize(10);
  out.resize(q.drain(out.data(), 10));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].seq_no, 5u);
  EXPECT_EQ(q.size(), 0u);
}

TEST(EventQueue, DisabledRecordsNothing) {
  EventQueue q(false, 3);
  q.push(Event{});
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(q.dropped(), 0u);
}

}  // namespace
}  // namespace pagedkv
