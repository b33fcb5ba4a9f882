// The event queue keeps a stored block's token ids beside its event (for
// pkv_pool_drain_events_v2 and the publisher) through growth, drops,
// shrinking and partial drains.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "event_queue.h"

namespace pagedkv {
namespace {

std::vector<int32_t> ids_of(uint64_t n, uint32_t bs) {
  std::vector<int32_t> t(bs);
  for (uint32_t k = 0; k < bs; ++k) t[k] = int32_t(n * 1000 + k * 7 + 3);
  return t;
}

TEST(EventTokens, SurviveGrowthDropsAndShrinking) {
  const uint32_t bs = 5;
  EventQueue q(true, 100);
  q.keep_tokens(bs);
  std::mt19937 rng(3);
  // 150 pushes into at most 100 slots, the ring growing from 64: the
  // oldest 50 dropped. Every other event has ids; media vary.
  for (uint64_t n = 1; n <= 150; ++n) {
    Event e;
    e.type = n % 2 ? EventType::kStored : EventType::kRemoved;
    e.medium = uint32_t(rng() % 3);
    e.num_tokens = uint32_t(n);  // identifies the push below
    const std::vector<int32_t> t = ids_of(n, bs);
    q.push(e, n % 2 ? t.data() : nullptr);
    if (n == 120) q.shrink_to_fit();
  }
  EXPECT_EQ(q.dropped(), 50u);
  ASSERT_EQ(q.size(), 100u);
  std::vector<Event> out(7);
  std::vector<int32_t> tokens(7 * bs, -1);
  uint64_t expect = 51;
  while (q.size() > 0) {
    const size_t got = q.drain(out.data(), out.size(), tokens.data());
    for (size_t i = 0; i < got; ++i, ++expect) {
      EXPECT_EQ(out[i].num_tokens, expect);
      EXPECT_EQ(out[i].has_tokens, expect % 2 == 1);
      if (out[i].has_tokens) {
        const std::vector<int32_t> want = ids_of(expect, bs);
        for (uint32_t k = 0; k < bs; ++k) EXPECT_EQ(tokens[i * bs + k], want[k]) << expect;
      }
    }
  }
  EXPECT_EQ(expect, 151u);
}

TEST(EventTokens, DrainOneLeavesAnEventWhoseIdsHaveNoRoom) {
  EventQueue q(true, 8);
  q.keep_tokens(2);
  const int32_t t[2] = {4, 9};
  Event removed;
  removed.type = EventType::kRemoved;
  q.push(removed);
  Event stored;
  q.push(stored, t);
  Event e;
  int32_t ids[2] = {0, 0};
  EXPECT_EQ(q.drain_one(&e, ids, false), 1);  // no ids: drained without room
  EXPECT_EQ(e.type, EventType::kRemoved);
  EXPECT_EQ(q.drain_one(&e, ids, false), -1);  // ids and no room: stays
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.drain_one(&e, ids, true), 1);
  EXPECT_TRUE(e.has_tokens);
  EXPECT_EQ(ids[0], 4);
  EXPECT_EQ(ids[1], 9);
  EXPECT_EQ(q.drain_one(&e, ids, true), 0);
}

TEST(EventTokens, WithoutKeepTokensNoIdsAreKept) {
  EventQueue q(true, 8);
  const int32_t t[2] = {1, 2};
  q.push(Event{}, t);
  Event e;
  ASSERT_EQ(q.drain(&e, 1), 1u);
  EXPECT_FALSE(e.has_tokens);
}

}  // namespace
}  // namespace pagedkv
