// Sequence ids (DESIGN.md §9, "Ids"): an id names its pool, slot and
// generation; an id of another pool, or one whose slot's generation could
// have wrapped, is unknown. The generation hook stands in for 2^24 - 1
// create/free cycles of one slot.
#include <gtest/gtest.h>

#include <set>

#include "test_util.h"

namespace pagedkv {
namespace {

uint32_t slot_of(SeqId id) { return uint32_t(id) & (SeqTable::kMaxSlots - 1); }

void expect_unknown(Pool& p, SeqId id) {
  try {
    p.seq_info(id);
    ADD_FAILURE() << seq_name(id) << " was found";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kNotFound) << e.what();
  }
}

TEST(SeqIds, ASlotWhoseGenerationIsUsedUpIsRetired) {
  auto pool = Pool::create(test::manager_options(4, 16));
  SeqId a = pool->seq_create({});
  pool->free(a);
  SeqTable& t = pool->seq_table_for_testing();
  t.set_generation_for_testing(slot_of(a), SeqTable::kMaxGen - 1);

  SeqId b = pool->seq_create({});  // the last free slot: a's
  ASSERT_EQ(slot_of(b), slot_of(a));
  test::append(*pool, b, test::iota_tokens(5));
  pool->free(b);
  SeqId c = pool->seq_create({});  // same slot, the last generation
  ASSERT_EQ(slot_of(c), slot_of(a));
  EXPECT_NE(c, b);
  pool->free(c);
  EXPECT_EQ(t.num_retired(), 1u);

  // The slot is never reused: every later id is new, and the stale ids of
  // every generation stay unknown.
  std::set<SeqId> seen{a, b, c};
  for (int i = 0; i < 5; ++i) {
    SeqId d = pool->seq_create({});
    EXPECT_NE(slot_of(d), slot_of(a));
    EXPECT_TRUE(seen.insert(d).second) << seq_name(d) << " was handed out before";
    for (SeqId old : {a, b, c}) expect_unknown(*pool, old);
    pool->free(d);
  }
  EXPECT_EQ(pool->validate(), "");
}

TEST(SeqIds, AnIdOfAnotherPoolIsUnknownThere) {
  auto p1 = Pool::create(test::manager_options(4, 16));
  auto p2 = Pool::create(test::manager_options(4, 16));
  EXPECT_NE(p1->tag(), p2->tag());
  SeqId a = p1->seq_create({});
  SeqId b = p2->seq_create({});
  // Same slot and generation in both pools; the tag tells them apart.
  EXPECT_EQ(slot_of(a), slot_of(b));
  EXPECT_NE(a, b);
  expect_unknown(*p2, a);
  expect_unknown(*p1, b);
  try {
    p2->free(a);
    ADD_FAILURE() << "freed another pool's sequence";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kNotFound);
  }
  EXPECT_EQ(p2->seq_info(b).num_tokens, 0u);  // b untouched
}

TEST(SeqIds, TagsOfLivePoolsAreDistinctAndComeBackLate) {
  std::set<uint16_t> live;
  std::vector<std::shared_ptr<Pool>> pools;
  for (int i = 0; i < 300; ++i) {
    pools.push_back(Pool::create(test::manager_options(4, 4)));
    EXPECT_TRUE(live.insert(pools.back()->tag()).second);
  }
  const uint16_t first = pools.front()->tag();
  pools.erase(pools.begin());
  // The freed tag is not the next one handed out.
  auto next = Pool::create(test::manager_options(4, 4));
  EXPECT_NE(next->tag(), first);
  EXPECT_EQ(live.count(next->tag()), 0u);
}

}  // namespace
}  // namespace pagedkv
