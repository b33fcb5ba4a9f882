// Sequence ids (DESIGN.md §9, "Ids"): an id names its pool, slot and
// generation; an id of another pool, or one whose slot's generation could
// have wrapped, is unknown. The generation hook stands in for 2^24 - 1
// create/free cycles of one slot.
#include <gtest/gtest.h>

#include <set>

#include "kv_groups.h"
#include "test_util.h"

namespace pagedkv {
namespace {

uint32_t slot_of(SeqId id) { return uint32_t(id) & (SeqTable::kMaxSlots - 1); }

uint16_t tag_of(SeqId id) { return uint16_t(id >> SeqTable::kTagShift); }

template <class P>
void expect_unknown(P& p, SeqId id) {
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

// Tags are 16 bits, so the 65536th pool created after one was destroyed
// may get its tag back. Ids the old pool handed out (a user may still hold
// them) must not name the new pool's sequences, of either pool kind.
GroupSpec full_group() {
  GroupSpec g;
  g.kind = GroupKind::kFull;
  g.num_layers = 1;
  g.num_kv_heads = 1;
  g.head_dim = 8;
  return g;
}

// Creates and destroys pools of the kind make() gives, each with one
// sequence, until one has tag t (at most 65535 of them); returns that one.
template <class Make>
auto pool_with_tag(uint16_t t, Make make) -> decltype(make()) {
  for (int i = 0; i < 65536; ++i) {
    auto p = make();
    const SeqId s = p->seq_create({});
    if (tag_of(s) == t) {
      p->free(s);
      return p;
    }
  }
  ADD_FAILURE() << "tag " << t << " did not come back";
  return nullptr;
}

TEST(SeqIds, AReusedTagDoesNotLetOldIdsNameNewSequences) {
  auto make_pool = [] { return Pool::create(test::manager_options(4, 4)); };
  auto make_groups = [] {
    PoolOptions o;
    o.block_size = 4;
    o.num_blocks = 4;
    return GroupPool::create(o, {full_group()});
  };
  // Pool A: slot 0 used twice (generations 1 and 2), a live sequence left.
  std::vector<SeqId> old;
  uint16_t t;
  {
    auto a = make_pool();
    const SeqId a0 = a->seq_create({});
    a->free(a0);
    const SeqId a1 = a->seq_create({});
    test::append(*a, a1, test::iota_tokens(3));
    old = {a0, a1, a->seq_create({})};
    t = a->tag();
  }
  auto check = [&](auto& p, const std::vector<SeqId>& mine) {
    for (SeqId o : old) {
      expect_unknown(p, o);
      for (SeqId m : mine) EXPECT_NE(m, o) << seq_name(m) << " was handed out before";
    }
  };
  // A group pool that gets the tag back, then a plain pool after it.
  {
    auto g = pool_with_tag(t, make_groups);
    ASSERT_NE(g, nullptr);
    std::vector<SeqId> mine;
    for (int i = 0; i < 3; ++i) mine.push_back(g->seq_create({}));
    check(*g, mine);
    old.insert(old.end(), mine.begin(), mine.end());
  }
  {
    auto p = pool_with_tag(t, make_pool);
    ASSERT_NE(p, nullptr);
    std::vector<SeqId> mine;
    for (int i = 0; i < 3; ++i) mine.push_back(p->seq_create({}));
    check(*p, mine);
    try {
      p->free(old[1]);
      ADD_FAILURE() << "freed a sequence through an id of the tag's earlier pool";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kNotFound);
    }
    for (SeqId m : mine) EXPECT_EQ(p->seq_info(m).num_tokens, 0u);
    EXPECT_EQ(p->validate(), "");
  }
}

// A tag whose next holder would start with too few generations left is not
// handed out again.
TEST(SeqIds, ATagWithHalfItsGenerationsUsedIsRetired) {
  uint16_t t;
  {
    auto a = Pool::create(test::manager_options(4, 4));
    const SeqId s = a->seq_create({});
    a->free(s);
    a->seq_table_for_testing().set_generation_for_testing(slot_of(s), PoolTag::kRetireAt);
    a->seq_create({});  // generation kRetireAt
    t = a->tag();
  }
  for (int i = 0; i < 65536; ++i) {
    auto p = Pool::create(test::manager_options(4, 4));
    ASSERT_NE(p->tag(), t) << "a retired tag was handed out again";
  }
}

}  // namespace
}  // namespace pagedkv
