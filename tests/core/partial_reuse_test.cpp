// Partial-block prefix hits (issue 22): a prompt that matches a cached block
// only in its first k tokens gets a fresh block holding a copy of those k
// slots, and k more tokens count as computed. Block ids pinned; block_size 4.
#include <gtest/gtest.h>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::append;
using test::code_of;
using test::drain;
using test::iota_tokens;
using test::step;
using test::step_rest;
using test::table;
using V = std::vector<int32_t>;

std::shared_ptr<Pool> make(uint64_t num_blocks, bool partial = true) {
  PoolOptions o = test::manager_options(4, num_blocks);
  o.enable_partial_reuse = partial;
  return Pool::create(o);
}

PrefixMatch match(Pool& p, SeqId id, const V& t) {
  return p.match_prefix_partial(id, t.data(), t.size());
}

// a computed 10 tokens (blocks 1, 2 full; 3 partial). b's prompt agrees with
// block 2 in its first 2 tokens: b gets block 1 (full hit) and a fresh block
// 4 into which block 2's first 2 slots are copied; 6 tokens are computed.
TEST(PartialReuse, CopiesTheFirstKSlotsIntoAFreshBlock) {
  auto p = make(16);
  SeqId a = p->seq_create({});
  append(*p, a, iota_tokens(10));
  step(p, a);
  SeqId b = p->seq_create({});
  const V prompt = {0, 1, 2, 3, 4, 5, 99, 98, 97};
  PrefixMatch m = match(*p, b, prompt);
  EXPECT_EQ(m.full_tokens, 4u);
  EXPECT_EQ(m.partial_tokens, 2u);
  EXPECT_EQ(m.copy_src, 2);
  EXPECT_EQ(m.copy_dst, 4);
  EXPECT_EQ(table(*p, b), (V{1, 4}));
  const SeqInfo i = p->seq_info(b);
  EXPECT_EQ(i.num_tokens, 6u);
  EXPECT_EQ(i.num_cached_tokens, 6u);
  EXPECT_EQ(i.num_computed_tokens, 6u);
  ASSERT_EQ(p->pending_copies().size(), 1u);
  EXPECT_EQ(p->pending_copies()[0].src, 2);
  EXPECT_EQ(p->pending_copies()[0].dst, 4);
  EXPECT_EQ(p->block_pool().written(4), 2u);  // the copied slots; the rest unwritten
  EXPECT_EQ(p->block_pool().hash(4).empty(), true);
  const PoolStats s = p->stats();
  EXPECT_EQ(s.num_partial_hits, 1u);
  EXPECT_EQ(s.partial_hit_tokens, 2u);
  EXPECT_EQ(s.prefix_hit_tokens, 6u);
  EXPECT_EQ(s.prefix_query_tokens, 9u);
  EXPECT_VALID(*p);

  // The rest is computed as usual: only the 3 new tokens are queries, and
  // block 4 fills and enters the cache under b's own content.
  append(*p, b, {99, 98, 97});
  const uint32_t q = 3;
  Batch::prepare(p, &b, &q, 1, nullptr);
  EXPECT_TRUE(p->pending_copies().empty());  // ran with the plan
  EXPECT_TRUE(p->block_pool().fully_written(4));
  EXPECT_FALSE(p->block_pool().hash(4).empty());
  EXPECT_EQ(p->seq_info(b).num_computed_tokens, 9u);
  EXPECT_VALID(*p);
  // A plan that queried fewer tokens than are uncomputed would be refused:
  // the partial tokens really are the only ones it may skip.
  SeqId c = p->seq_create({});
  match(*p, c, prompt);
  append(*p, c, {99, 98, 97});
  const uint32_t q2 = 2;
  EXPECT_EQ(code_of([&] { Batch::prepare(p, &c, &q2, 1, nullptr); }), Errc::kInvalidState);
}

// Off by default, and pkv_seq_match_prefix never makes partial hits.
TEST(PartialReuse, OffByDefaultAndNeverFromPlainMatchPrefix) {
  for (bool partial : {false, true}) {
    auto p = make(16, partial);
    SeqId a = p->seq_create({});
    append(*p, a, iota_tokens(10));
    step(p, a);
    SeqId b = p->seq_create({}), c = p->seq_create({});
    const V prompt = {0, 1, 2, 3, 4, 5, 99, 98, 97};
    EXPECT_EQ(p->match_prefix(b, prompt.data(), prompt.size()), 4u);
    EXPECT_EQ(table(*p, b), (V{1}));
    PrefixMatch m = match(*p, c, prompt);
    EXPECT_EQ(m.partial_tokens, partial ? 2u : 0u);
    EXPECT_EQ(table(*p, c), partial ? (V{1, 4}) : (V{1}));
    EXPECT_EQ(p->stats().num_partial_hits, partial ? 1u : 0u);
    EXPECT_VALID(*p);
  }
}

// At least one token is left to compute: a prompt that is a cached block's
// first 3 tokens reuses 2 of them.
TEST(PartialReuse, LeavesOneTokenToCompute) {
  auto p = make(16);
  SeqId a = p->seq_create({});
  append(*p, a, iota_tokens(8));
  step(p, a);
  SeqId b = p->seq_create({});
  PrefixMatch m = match(*p, b, {0, 1, 2});
  EXPECT_EQ(m.full_tokens, 0u);
  EXPECT_EQ(m.partial_tokens, 2u);
  EXPECT_EQ(m.copy_src, 1);
  SeqId c = p->seq_create({});
  m = match(*p, c, {0});  // nothing may be reused
  EXPECT_EQ(m.partial_tokens, 0u);
  EXPECT_TRUE(table(*p, c).empty());
  // The whole 8 tokens again: one full block hit, then 3 of block 2 (the
  // last token is left to compute).
  SeqId d = p->seq_create({});
  m = match(*p, d, iota_tokens(8));
  EXPECT_EQ(m.full_tokens, 4u);
  EXPECT_EQ(m.partial_tokens, 3u);
  EXPECT_EQ(m.copy_src, 2);
  EXPECT_VALID(*p);
}

// The longest match among the cached children of the prefix wins.
TEST(PartialReuse, LongestCandidateWins) {
  auto p = make(16);
  SeqId a = p->seq_create({}), b = p->seq_create({});
  append(*p, a, {0, 1, 2, 3, 10, 11, 12, 13});
  append(*p, b, {0, 1, 2, 3, 10, 11, 50, 51});
  step(p, a);
  step(p, b);
  // b appended before a's step: it filled its own blocks 3 and 4.
  SeqId c = p->seq_create({});
  PrefixMatch m = match(*p, c, {0, 1, 2, 3, 10, 11, 50, 9, 9});
  EXPECT_EQ(m.partial_tokens, 3u);
  EXPECT_EQ(m.copy_src, 4);
  SeqId d = p->seq_create({});
  m = match(*p, d, {0, 1, 2, 3, 10, 11, 12, 9, 9});
  EXPECT_EQ(m.partial_tokens, 3u);
  EXPECT_EQ(m.copy_src, 2);
  EXPECT_VALID(*p);
}

// A block whose K/V nobody wrote is never a candidate, and neither is one
// hashed under other extra keys (a first block of another cache salt).
TEST(PartialReuse, OnlyWrittenBlocksOfTheSameKeys) {
  auto p = make(16);
  SeqId a = p->seq_create({});
  append(*p, a, iota_tokens(8));  // not computed
  SeqId b = p->seq_create({});
  EXPECT_EQ(match(*p, b, {0, 1, 2, 7, 7}).partial_tokens, 0u);
  step(p, a);
  SeqOptions salted;
  salted.cache_salt = "tenant-x";
  SeqId c = p->seq_create(salted);
  EXPECT_EQ(match(*p, c, {0, 1, 2, 7, 7}).partial_tokens, 0u);
  SeqId d = p->seq_create(salted);
  append(*p, d, iota_tokens(8));
  step(p, d);
  SeqId e = p->seq_create(salted);
  PrefixMatch m = match(*p, e, {0, 1, 2, 7, 7});
  EXPECT_EQ(m.partial_tokens, 3u);
  EXPECT_EQ(m.copy_src, table(*p, d)[0]);
  SeqId f = p->seq_create({});
  m = match(*p, f, {0, 1, 2, 7, 7});
  EXPECT_EQ(m.copy_src, table(*p, a)[0]);
  EXPECT_VALID(*p);
}

// No free block: no partial hit (and no error); the full hits stand.
TEST(PartialReuse, NeedsAFreeBlock) {
  auto p = make(4);  // blocks 1..3
  SeqId a = p->seq_create({});
  append(*p, a, iota_tokens(12));
  step(p, a);
  SeqId b = p->seq_create({});
  PrefixMatch m = match(*p, b, {0, 1, 2, 3, 4, 5, 9, 9});
  EXPECT_EQ(m.full_tokens, 4u);
  EXPECT_EQ(m.partial_tokens, 0u);
  EXPECT_EQ(table(*p, b), (V{1}));
  EXPECT_VALID(*p);
}

// The cached block next in the free queue is the fresh block itself: its
// slots already hold the tokens, so no copy is recorded; it leaves the
// cache (its full content is gone once b writes into it).
TEST(PartialReuse, ReusesTheCachedBlockInPlaceWhenItIsNextFree) {
  auto p = make(3);  // blocks 1, 2
  SeqId a = p->seq_create({});
  append(*p, a, iota_tokens(8));
  step(p, a);
  p->free(a);  // queue: 2, 1 (tail first)
  drain(*p);
  SeqId b = p->seq_create({});
  PrefixMatch m = match(*p, b, {0, 1, 2, 3, 4, 5, 77, 78});
  EXPECT_EQ(m.full_tokens, 4u);
  EXPECT_EQ(m.partial_tokens, 2u);
  EXPECT_EQ(m.copy_src, 2);
  EXPECT_EQ(m.copy_dst, 2);
  EXPECT_TRUE(p->pending_copies().empty());
  EXPECT_TRUE(p->block_pool().hash(2).empty());
  EXPECT_EQ(p->block_pool().written(2), 2u);
  auto ev = drain(*p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, EventType::kRemoved);
  EXPECT_EQ(ev[0].block_id, 2);
  EXPECT_EQ(p->seq_info(b).num_computed_tokens, 6u);
  EXPECT_VALID(*p);
}

// A random workload of prompts over a tiny alphabet (many partial matches):
// every hit leaves the pool valid and at least one token to compute.
TEST(PartialReuse, RandomPromptsStayValid) {
  auto p = make(64);
  std::mt19937 rng(7);
  std::vector<SeqId> live;
  uint64_t partial = 0;
  for (int it = 0; it < 400; ++it) {
    if (live.size() > 6 || (rng() % 3 == 0 && !live.empty())) {
      size_t i = rng() % live.size();
      p->free(live[i]);
      live.erase(live.begin() + long(i));
      continue;
    }
    V prompt(2 + rng() % 14);
    for (auto& t : prompt) t = int32_t(rng() % 3);  // small alphabet: many partial matches
    SeqId s = p->seq_create({});
    PrefixMatch m = match(*p, s, prompt);
    partial += m.partial_tokens > 0;
    const uint64_t got = m.full_tokens + m.partial_tokens;
    ASSERT_LT(got, prompt.size());
    V rest(prompt.begin() + long(got), prompt.end());
    try {
      append(*p, s, rest);
      step_rest(p, s);
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), Errc::kOutOfBlocks);
    }
    live.push_back(s);
    ASSERT_EQ(p->validate(), "") << "iteration " << it;
  }
  EXPECT_GT(partial, 10u);
}

}  // namespace
}  // namespace pagedkv
