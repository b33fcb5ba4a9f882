// Retention priorities (issue 22): eviction takes the lowest priority first
// and the least recently used within one; durations run out on the pool's
// clock (set by the test: no sleeps); pinned blocks are never evicted and
// capped by max_pinned_blocks. Block ids pinned; block_size 4.
#include <gtest/gtest.h>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::append;
using test::code_of;
using test::drain;
using test::free_queue;
using test::iota_tokens;
using test::step;
using test::step_rest;
using test::table;
using V = std::vector<int32_t>;
using Ranges = std::vector<RetentionRange>;

constexpr uint64_t kEnd = ~uint64_t(0);

std::shared_ptr<Pool> make(uint64_t num_blocks, uint64_t max_pinned = 0, bool retention = true) {
  PoolOptions o = test::manager_options(4, num_blocks);
  o.enable_retention = retention;
  o.max_pinned_blocks = max_pinned;
  return Pool::create(o);
}

// A sequence with these ranges that computed tokens.
SeqId cached(const std::shared_ptr<Pool>& p, const V& tokens, const Ranges& r = {}) {
  SeqId s = p->seq_create({});
  if (!r.empty()) p->set_retention(s, r.data(), r.size());
  append(*p, s, tokens);
  step(p, s);
  return s;
}

uint64_t hit(Pool& p, const V& tokens) {  // tokens cached, probed by a throwaway sequence
  SeqId s = p.seq_create({});
  V probe = tokens;
  probe.push_back(-1);  // so every full block of tokens may hit
  uint64_t n = p.match_prefix(s, probe.data(), probe.size());
  p.free(s);
  return n;
}

std::vector<uint64_t> counts(const Pool& p) {
  std::vector<uint64_t> c(kPriorityPinned + 1);
  p.priority_counts(c.data());
  return c;
}

const V kSys = iota_tokens(8, 100), kDoc = iota_tokens(8, 200);

// The system prompt was freed first: LRU alone evicts it; at priority 90 it
// outlives the one-off document at the default.
TEST(Retention, LowerPriorityIsEvictedFirst) {
  for (bool retention : {false, true}) {
    auto p = make(7, 0, retention);  // blocks 1..6
    Ranges r;
    if (retention) r = {{0, kEnd, 90, 0}};
    SeqId sys = cached(p, kSys, r), doc = cached(p, kDoc);
    p->free(sys);
    p->free(doc);
    SeqId x = p->seq_create({});
    append(*p, x, iota_tokens(16, 300));  // 4 blocks: 2 never used, then 2 evicted
    EXPECT_EQ(hit(*p, kSys), retention ? 8u : 0u);
    EXPECT_EQ(hit(*p, kDoc), retention ? 0u : 8u);
    EXPECT_VALID(*p);
  }
}

TEST(Retention, LeastRecentlyUsedWithinAPriority) {
  auto p = make(7);
  SeqId a = cached(p, kSys, {{0, kEnd, 90, 0}}), b = cached(p, kDoc, {{0, kEnd, 90, 0}});
  p->free(a);
  p->free(b);
  EXPECT_EQ(free_queue(*p), (V{5, 6, 2, 1, 4, 3}));  // level 0, then level 90 in release order
  SeqId x = p->seq_create({});
  append(*p, x, iota_tokens(16, 300));
  EXPECT_EQ(table(*p, x), (V{5, 6, 2, 1}));
  EXPECT_EQ(hit(*p, kDoc), 8u);
  EXPECT_VALID(*p);
}

// A duration starts when the block is free; when it runs out the block is
// back at the default, placed by when it was freed (LRU within the level).
TEST(Retention, ExpiredPrioritiesFallBackToTheDefault) {
  for (bool sys_first : {true, false}) {
    auto p = make(7);
    p->set_clock(1000);
    SeqId sys = cached(p, kSys, {{0, kEnd, 90, 500}}), doc = cached(p, kDoc);
    drain(*p);
    p->free(sys_first ? sys : doc);
    p->free(sys_first ? doc : sys);  // at 1000: the 90 lasts until 1500
    EXPECT_EQ(counts(*p)[90], 2u);
    EXPECT_EQ(counts(*p)[kPriorityDefault], 2u);
    p->set_clock(1499);
    EXPECT_EQ(counts(*p)[90], 2u);
    p->set_clock(1500);
    EXPECT_EQ(counts(*p)[90], 0u);
    EXPECT_EQ(counts(*p)[kPriorityDefault], 4u);
    auto ev = drain(*p);
    ASSERT_EQ(ev.size(), 2u);
    for (const Event& e : ev) {
      EXPECT_EQ(e.type, EventType::kPriority);
      EXPECT_EQ(e.num_tokens, kPriorityDefault);
    }
    // Whichever was freed first is now evicted first.
    SeqId x = p->seq_create({});
    append(*p, x, iota_tokens(16, 300));
    EXPECT_EQ(hit(*p, kSys), sys_first ? 0u : 8u);
    EXPECT_EQ(hit(*p, kDoc), sys_first ? 8u : 0u);
    EXPECT_VALID(*p);
  }
}

// While a sequence holds the block, its duration does not run.
TEST(Retention, DurationRestartsAtEachRelease) {
  auto p = make(7);
  p->set_clock(0);
  SeqId sys = cached(p, kSys, {{0, kEnd, 90, 100}});
  p->free(sys);  // expiry at 100
  p->set_clock(50);
  SeqId user = p->seq_create({});
  V probe = kSys;
  probe.push_back(1);
  EXPECT_EQ(p->match_prefix(user, probe.data(), probe.size()), 8u);
  p->set_clock(500);  // held: no expiry
  EXPECT_EQ(counts(*p)[90], 2u);
  p->free(user);  // expiry at 600
  p->set_clock(599);
  EXPECT_EQ(counts(*p)[90], 2u);
  p->set_clock(600);
  EXPECT_EQ(counts(*p)[90], 0u);
  EXPECT_VALID(*p);
}

// A duration that runs past the clock's end never ends, also when the
// clock is at its last value (the saturated expiry is not "now").
TEST(Retention, DurationPastTheClocksEndNeverExpires) {
  for (uint64_t start : {~uint64_t(0), ~uint64_t(0) - 10}) {
    auto p = make(7);
    p->set_clock(start);
    SeqId sys = cached(p, kSys, {{0, kEnd, 90, 100}});
    p->free(sys);
    p->set_clock(~uint64_t(0));
    EXPECT_EQ(counts(*p)[90], 2u) << start;
    EXPECT_VALID(*p);
  }
}

// Pinned blocks are never evicted, even when an append needs them: they do
// not count as free.
TEST(Retention, PinnedBlocksAreNeverEvicted) {
  auto p = make(7, 2);
  SeqId sys = cached(p, kSys, {{0, kEnd, kPriorityPinned, 0}});
  p->free(sys);
  PoolStats s = p->stats();
  EXPECT_EQ(s.num_pinned_blocks, 2u);
  EXPECT_EQ(s.num_free_blocks, 4u);
  SeqId x = p->seq_create({});
  V big = iota_tokens(20, 300);  // 5 blocks
  EXPECT_EQ(code_of([&] { append(*p, x, big); }), Errc::kOutOfBlocks);
  EXPECT_EQ(p->blocks_needed(x, 16, 0), 4u);
  append(*p, x, iota_tokens(16, 300));
  EXPECT_EQ(p->stats().num_free_blocks, 0u);
  EXPECT_EQ(hit(*p, kSys), 8u);
  EXPECT_EQ(counts(*p)[kPriorityPinned], 2u);
  EXPECT_VALID(*p);
}

// Pins beyond the budget: refused when asked for blocks already cached,
// degraded (priority 99) for blocks cached later.
TEST(Retention, PinBudgetRefusesOrDegrades) {
  auto p = make(16, 2);
  SeqId a = cached(p, iota_tokens(13));  // 3 full blocks cached
  const Ranges pin = {{0, kEnd, kPriorityPinned, 0}};
  EXPECT_EQ(code_of([&] { p->set_retention(a, pin.data(), 1); }), Errc::kOutOfBlocks);
  EXPECT_EQ(counts(*p)[kPriorityPinned], 0u);
  EXPECT_EQ(counts(*p)[kPriorityDefault], 3u);
  const Ranges two = {{0, 8, kPriorityPinned, 0}};
  p->set_retention(a, two.data(), 1);  // fits
  EXPECT_EQ(counts(*p)[kPriorityPinned], 2u);

  SeqId b = cached(p, iota_tokens(12, 50), pin);  // the budget is spent: all degrade
  (void)b;
  EXPECT_EQ(counts(*p)[kPriorityPinned - 1], 3u);
  PoolStats s = p->stats();
  EXPECT_EQ(s.num_pinned_blocks, 2u);
  EXPECT_EQ(s.num_pins_degraded, 3u);

  auto q = make(16, 0);
  SeqId c = q->seq_create({});
  EXPECT_EQ(code_of([&] { q->set_retention(c, pin.data(), 1); }), Errc::kOutOfBlocks);
  EXPECT_VALID(*p);
  EXPECT_VALID(*q);
}

// Replacing the ranges can move a pin between the sequence's own blocks:
// the pin the new ranges drop comes back to the budget in the same call, so
// a full budget neither refuses the move nor degrades the new pin, in
// either order of the blocks.
TEST(Retention, MovingAPinWithinTheSequenceFitsTheBudget) {
  for (bool forward : {true, false}) {
    auto p = make(16, 1);
    const Ranges first = {{0, 4, kPriorityPinned, 0}}, second = {{4, 8, kPriorityPinned, 0}};
    SeqId a = cached(p, iota_tokens(9), forward ? first : second);
    const V t = table(*p, a);
    EXPECT_EQ(p->stats().num_pinned_blocks, 1u);
    drain(*p);
    const Ranges& next = forward ? second : first;
    ASSERT_EQ(code_of([&] { p->set_retention(a, next.data(), 1); }), Errc(0)) << forward;
    const int32_t pinned = forward ? t[1] : t[0], unpinned = forward ? t[0] : t[1];
    EXPECT_EQ(p->block_pool().priority(pinned), kPriorityPinned) << forward;
    EXPECT_EQ(p->block_pool().priority(unpinned), kPriorityDefault) << forward;
    const PoolStats s = p->stats();
    EXPECT_EQ(s.num_pinned_blocks, 1u) << forward;
    EXPECT_EQ(s.num_pins_degraded, 0u) << forward;
    EXPECT_EQ(counts(*p)[kPriorityPinned - 1], 0u) << forward;
    const auto ev = drain(*p);
    ASSERT_EQ(ev.size(), 2u) << forward;
    for (const Event& e : ev) EXPECT_EQ(e.type, EventType::kPriority);
    // A move that still needs one pin more than the budget is refused and
    // changes nothing.
    const Ranges both = {{0, 8, kPriorityPinned, 0}};
    EXPECT_EQ(code_of([&] { p->set_retention(a, both.data(), 1); }), Errc::kOutOfBlocks);
    EXPECT_EQ(p->block_pool().priority(pinned), kPriorityPinned);
    EXPECT_EQ(p->block_pool().priority(unpinned), kPriorityDefault);
    EXPECT_TRUE(drain(*p).empty());
    EXPECT_VALID(*p);
  }
}

// A hit raises a block's priority, never lowers it: another request may
// count on it. A block a sequence fills itself takes its priority exactly.
TEST(Retention, HitsRaiseButNeverLower) {
  auto p = make(16);
  SeqId a = cached(p, kSys);
  drain(*p);
  V probe = kSys;
  probe.push_back(1);
  SeqId low = p->seq_create({});
  const Ranges zero = {{0, kEnd, 0, 0}}, high = {{0, kEnd, 80, 0}};
  p->set_retention(low, zero.data(), 1);
  p->match_prefix(low, probe.data(), probe.size());
  EXPECT_EQ(counts(*p)[kPriorityDefault], 2u);
  EXPECT_TRUE(drain(*p).empty());
  SeqId hi = p->seq_create({});
  p->set_retention(hi, high.data(), 1);
  p->match_prefix(hi, probe.data(), probe.size());
  EXPECT_EQ(counts(*p)[80], 2u);
  auto ev = drain(*p);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].type, EventType::kPriority);
  EXPECT_EQ(ev[0].num_tokens, 80u);
  // Its own new blocks: exactly its priority, low as it is.
  SeqId d = cached(p, kDoc, zero);
  for (int32_t b : table(*p, d)) EXPECT_EQ(p->block_pool().priority(b), 0u);
  (void)a;
  EXPECT_VALID(*p);
}

// "The first 5 tokens at 90": every block touching them.
TEST(Retention, TokenRangesCoverTheBlocksTheyTouch) {
  auto p = make(16);
  SeqId s = cached(p, iota_tokens(13), {{0, 5, 90, 0}});
  const V t = table(*p, s);
  EXPECT_EQ(p->block_pool().priority(t[0]), 90u);
  EXPECT_EQ(p->block_pool().priority(t[1]), 90u);
  EXPECT_EQ(p->block_pool().priority(t[2]), kPriorityDefault);
  EXPECT_EQ(p->block_pool().priority(t[3]), kPriorityDefault);  // partial: no priority
  // A fork keeps the ranges.
  SeqId f = p->fork(s);
  append(*p, f, {1, 2, 3});
  step(p, f);
  EXPECT_EQ(p->block_pool().priority(table(*p, f)[3]), kPriorityDefault);
  EXPECT_VALID(*p);
}

TEST(Retention, BadInput) {
  auto off = make(16, 0, false);
  SeqId s = off->seq_create({});
  const Ranges ok = {{0, 4, 50, 0}};
  EXPECT_EQ(code_of([&] { off->set_retention(s, ok.data(), 1); }), Errc::kInvalidState);
  auto p = make(16);
  SeqId t = p->seq_create({});
  const Ranges empty = {{4, 4, 50, 0}}, big = {{0, 4, 101, 0}};
  EXPECT_EQ(code_of([&] { p->set_retention(t, empty.data(), 1); }), Errc::kInvalidArgument);
  EXPECT_EQ(code_of([&] { p->set_retention(t, big.data(), 1); }), Errc::kInvalidArgument);
  Ranges many(Pool::kMaxRetentionRanges + 1, ok[0]);
  EXPECT_EQ(code_of([&] { p->set_retention(t, many.data(), many.size()); }),
            Errc::kInvalidArgument);
  EXPECT_EQ(code_of([&] { p->set_retention(SeqId(12345), ok.data(), 1); }), Errc::kNotFound);
  PoolOptions o = test::manager_options(4, 16);
  o.max_pinned_blocks = 1;
  EXPECT_EQ(code_of([&] { Pool::create(o); }), Errc::kInvalidArgument);
  o.enable_retention = true;
  o.max_pinned_blocks = 15;
  EXPECT_EQ(code_of([&] { Pool::create(o); }), Errc::kInvalidArgument);
  EXPECT_VALID(*p);
}

// With both options on but no ranges and no partial matches asked for, a
// pool behaves exactly as one without them: same block ids, free queue,
// events and stats, op for op (resets and block copies, which empty free
// blocks in place, are left out: those blocks move to the queue's head).
TEST(Retention, OptionsWithoutUseChangeNothing) {
  PoolOptions o = test::manager_options(4, 24);
  auto plain = Pool::create(o);
  o.enable_retention = true;
  o.enable_partial_reuse = true;
  auto opted = Pool::create(o);
  std::mt19937 rng(11);
  std::vector<std::pair<SeqId, SeqId>> live;
  for (int it = 0; it < 600; ++it) {
    const unsigned op = rng() % 6;
    if (op == 0 && !live.empty()) {
      size_t i = rng() % live.size();
      plain->free(live[i].first);
      opted->free(live[i].second);
      live.erase(live.begin() + long(i));
    } else if (op == 1 && !live.empty()) {
      size_t i = rng() % live.size();
      const uint64_t n = plain->seq_info(live[i].first).num_tokens;
      const uint64_t m = n ? rng() % n : 0;
      plain->truncate(live[i].first, m);
      opted->truncate(live[i].second, m);
    } else if (op == 2 && !live.empty()) {
      size_t i = rng() % live.size();
      step_rest(plain, live[i].first);
      step_rest(opted, live[i].second);
    } else {
      V prompt(1 + rng() % 12);
      for (auto& t : prompt) t = int32_t(rng() % 4);
      SeqId a = plain->seq_create({}), b = opted->seq_create({});
      const uint64_t ha = plain->match_prefix(a, prompt.data(), prompt.size());
      ASSERT_EQ(opted->match_prefix(b, prompt.data(), prompt.size()), ha);
      const Errc ea = code_of([&] { plain->append(a, prompt.data() + ha, prompt.size() - ha, 0); });
      ASSERT_EQ(code_of([&] { opted->append(b, prompt.data() + ha, prompt.size() - ha, 0); }), ea);
      live.emplace_back(a, b);
    }
    ASSERT_EQ(free_queue(*plain), free_queue(*opted)) << "op " << it;
    for (auto [a, b] : live) ASSERT_EQ(table(*plain, a), table(*opted, b)) << "op " << it;
    auto ea = drain(*plain), eb = drain(*opted);
    ASSERT_EQ(ea.size(), eb.size());
    for (size_t i = 0; i < ea.size(); ++i) {
      ASSERT_EQ(ea[i].type, eb[i].type);
      ASSERT_EQ(ea[i].block_id, eb[i].block_id);
    }
    const PoolStats sa = plain->stats(), sb = opted->stats();
    ASSERT_EQ(sa.num_free_blocks, sb.num_free_blocks);
    ASSERT_EQ(sa.num_cached_blocks, sb.num_cached_blocks);
    ASSERT_EQ(sa.num_evictions, sb.num_evictions);
    ASSERT_EQ(sa.prefix_hit_tokens, sb.prefix_hit_tokens);
    ASSERT_EQ(opted->validate(), "");
  }
}

}  // namespace
}  // namespace pagedkv
