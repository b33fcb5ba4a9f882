// Written blocks (DESIGN.md §9, issue 13): nothing may hit, attach or attend
// over slots whose K/V nobody wrote. Tokens count as computed when their step
// is committed; prefix hits attach only fully written blocks; a full block
// released unwritten leaves the cache; a sequence that counted on blocks
// whose writer went away sees it (num_computed_tokens, a refused plan).
// Block ids pinned; block_size 4 unless said otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::append;
using test::drain;
using test::free_queue;
using test::iota_tokens;
using test::table;
using V = std::vector<int32_t>;

std::shared_ptr<Pool> make(uint32_t bs, uint64_t num_blocks, uint32_t window = 0) {
  PoolOptions o = test::manager_options(bs, num_blocks);
  o.sliding_window = window;
  return Pool::create(o);
}

std::unique_ptr<Batch> plan(const std::shared_ptr<Pool>& p, std::vector<SeqId> ids,
                            std::vector<uint32_t> q) {
  return Batch::prepare(p, ids.data(), q.data(), uint32_t(ids.size()), nullptr);
}

// The message of the Error a plan fails with, or "" when it is accepted
// (the accepted plan is aborted: nothing counts).
std::string refusal(const std::shared_ptr<Pool>& p, std::vector<SeqId> ids, std::vector<uint32_t> q,
                    Errc want = Errc::kInvalidState) {
  try {
    plan(p, ids, q)->abort();
    return "";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), want) << e.what();
    return e.what();
  }
}

void commit(const std::shared_ptr<Pool>& p, SeqId id, uint32_t q = 0) {
  if (q == 0) q = uint32_t(p->seq_info(id).num_tokens);
  plan(p, {id}, {q})->commit();
}

uint64_t computed(const Pool& p, SeqId id) { return p.seq_info(id).num_computed_tokens; }

size_t count(const std::vector<Event>& ev, EventType t) {
  size_t n = 0;
  for (const Event& e : ev) n += e.type == t;
  return n;
}

std::vector<int32_t> with(std::vector<int32_t> v, int32_t last) {
  v.push_back(last);
  return v;
}

// The issue's first repro (block size 16): s2 is admitted in the same step
// as s1 and looks up s1's system prompt, which no step has computed yet.
TEST(Written, SameStepAdmissionDoesNotShareUncomputedBlocks) {
  auto pool = make(16, 16);
  const auto system = iota_tokens(48);
  SeqId s1 = pool->seq_create({});
  append(*pool, s1, with(system, 1));  // blocks 1 2 3 (full, registered) 4
  SeqId s2 = pool->seq_create({});
  auto q2 = with(system, 2);
  EXPECT_EQ(pool->match_prefix(s2, q2.data(), q2.size()), 0u);  // not written: no hit
  append(*pool, s2, q2);
  EXPECT_EQ(table(*pool, s2), (V{5, 6, 7, 8}));
  drain(*pool);
  pool->free(s1);  // preempted before the step
  // s1's full blocks were never written: they leave the cache (REMOVED) and
  // go to the head of the free queue, like its partial block, as one run in
  // the order freed: the tail block first.
  EXPECT_EQ(count(drain(*pool), EventType::kRemoved), 3u);
  EXPECT_EQ(free_queue(*pool), (V{4, 3, 2, 1, 9, 10, 11, 12, 13, 14, 15}));
  // s2 must compute everything; a plan for its last token alone is refused.
  EXPECT_EQ(computed(*pool, s2), 0u);
  EXPECT_NE(refusal(pool, {s2}, {1}).find("tokens [0, 48)"), std::string::npos);
  commit(pool, s2);
  EXPECT_EQ(computed(*pool, s2), 49u);
  pool->free(s2);
  SeqId s3 = pool->seq_create({});
  auto q3 = with(system, 3);
  EXPECT_EQ(pool->match_prefix(s3, q3.data(), q3.size()), 48u);  // s2's written blocks
  EXPECT_EQ(table(*pool, s3), (V{5, 6, 7}));
  EXPECT_EQ(computed(*pool, s3), 48u);
  EXPECT_VALID(*pool);
}

// The second door: append 33 with no plan, a lookup of the same tokens, then
// free or truncate of the appender.
TEST(Written, UncomputedBlocksAreNeverHitAndLeaveTheCacheWhenReleased) {
  for (bool use_truncate : {false, true}) {
    SCOPED_TRACE(use_truncate ? "truncate" : "free");
    auto pool = make(16, 8);
    const auto t = iota_tokens(33);
    SeqId a = pool->seq_create({});
    append(*pool, a, t);                             // 1 2 full, 3 partial
    EXPECT_EQ(pool->stats().num_cached_blocks, 2u);  // registered (vLLM's event order)
    SeqId b = pool->seq_create({});
    EXPECT_EQ(pool->match_prefix(b, t.data(), t.size()), 0u);
    drain(*pool);
    if (use_truncate)
      pool->truncate(a, 0);
    else
      pool->free(a);
    EXPECT_EQ(count(drain(*pool), EventType::kRemoved), 2u);
    EXPECT_EQ(pool->stats().num_cached_blocks, 0u);
    EXPECT_EQ(free_queue(*pool), (V{3, 2, 1, 4, 5, 6, 7}));
    SeqId c = pool->seq_create({});
    EXPECT_EQ(pool->match_prefix(c, t.data(), t.size()), 0u);
    EXPECT_VALID(*pool);
  }
}

// The third door: a step whose model raises after prepare, before its
// writes. An aborted step counts nothing; the tokens stay, uncomputed.
TEST(Written, AbortedStepCountsNothing) {
  auto pool = make(16, 8);
  const auto t = iota_tokens(33);
  SeqId a = pool->seq_create({});
  append(*pool, a, t);
  plan(pool, {a}, {33})->abort();
  EXPECT_EQ(pool->seq_info(a).num_tokens, 33u);
  EXPECT_EQ(computed(*pool, a), 0u);
  SeqId b = pool->seq_create({});
  EXPECT_EQ(pool->match_prefix(b, t.data(), t.size()), 0u);
  EXPECT_NE(refusal(pool, {a}, {1}).find("query_counts[0] >= 33"), std::string::npos);
  commit(pool, a);  // the retry computes them
  EXPECT_EQ(computed(*pool, a), 33u);
  SeqId c = pool->seq_create({});
  EXPECT_EQ(pool->match_prefix(c, t.data(), t.size()), 32u);
  EXPECT_EQ(table(*pool, c), (V{1, 2}));
  EXPECT_VALID(*pool);
}

TEST(Written, CommitAndAbortAreFinal) {
  auto pool = make(4, 8);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(5));
  auto b = plan(pool, {a}, {5});
  b->commit();
  b->commit();  // idempotent
  EXPECT_THROW(b->abort(), Error);
  EXPECT_TRUE(b->committed());
  append(*pool, a, {5});
  auto c = plan(pool, {a}, {1});
  c->abort();
  c->abort();
  try {
    c->commit();
    FAIL() << "commit after abort";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidState);
  }
  EXPECT_EQ(computed(*pool, a), 5u);
}

// ABI 1: a manager-only plan destroyed with neither commit nor abort counts
// as committed (older engines never call pkv_batch_commit).
TEST(Written, ManagerOnlyPlanDestroyedWithoutAbortCounts) {
  auto pool = make(4, 8);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(9));
  { auto b = plan(pool, {a}, {9}); }
  EXPECT_EQ(computed(*pool, a), 9u);
}

// A fork before the parent's step shares blocks nobody wrote; when the parent
// goes away unwritten, the child sees it.
TEST(Written, ForkChildSeesItsParentGoAwayBeforeWriting) {
  auto pool = make(4, 12);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(9));  // 1 2 3
  SeqId c = pool->fork(a);
  EXPECT_EQ(computed(*pool, c), 0u);
  drain(*pool);
  pool->free(a);  // the child still holds 1 2 3: nothing leaves the cache
  EXPECT_EQ(count(drain(*pool), EventType::kRemoved), 0u);
  SeqId d = pool->seq_create({});
  auto t = iota_tokens(9);
  EXPECT_EQ(pool->match_prefix(d, t.data(), t.size()), 0u);  // registered, not written
  EXPECT_NE(refusal(pool, {c}, {1}).find("would attend over tokens [0, 8)"), std::string::npos);
  commit(pool, c);  // computes all 9 into 1 2 3
  EXPECT_EQ(computed(*pool, c), 9u);
  pool->free(d);
  d = pool->seq_create({});
  EXPECT_EQ(pool->match_prefix(d, t.data(), t.size()), 8u);
  EXPECT_EQ(table(*pool, d), (V{1, 2}));
  EXPECT_VALID(*pool);
}

// Same-step sharing within one plan is fine: a layer's cache write precedes
// its attention, so a context slot written by another query of the same plan
// is in place.
TEST(Written, ContextWrittenByTheSamePlanIsAccepted) {
  auto pool = make(4, 12);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(8));  // 1 2, both full
  SeqId c = pool->fork(a);
  append(*pool, c, {100});  // 3 (fresh: the shared blocks are full)
  EXPECT_EQ(table(*pool, c), (V{1, 2, 3}));
  EXPECT_NE(refusal(pool, {c}, {1}), "");  // alone: 0..7 unwritten
  plan(pool, {a, c}, {8, 1})->commit();    // a writes 0..7, c reads them
  EXPECT_EQ(computed(*pool, a), 8u);
  EXPECT_EQ(computed(*pool, c), 9u);
  EXPECT_VALID(*pool);
}

// Copy-on-write copies carry the source's written state: a child forked
// after the parent's step reads the copy; one forked before does not.
TEST(Written, CopyOnWriteCarriesWrittenState) {
  for (bool parent_step_first : {true, false}) {
    SCOPED_TRACE(parent_step_first ? "fork after the step" : "fork before the step");
    auto pool = make(4, 12);
    SeqId a = pool->seq_create({});
    append(*pool, a, iota_tokens(6));  // 1 2 (2 partial)
    if (parent_step_first) commit(pool, a);
    SeqId c = pool->fork(a);
    append(*pool, c, {100});  // copy 2 -> 3
    EXPECT_EQ(table(*pool, c), (V{1, 3}));
    EXPECT_EQ(pool->block_pool().written(3), parent_step_first ? 2u : 0u);
    EXPECT_EQ(computed(*pool, c), parent_step_first ? 6u : 0u);
    EXPECT_EQ(refusal(pool, {c}, {1}).empty(), parent_step_first);
    EXPECT_VALID(*pool);
  }
}

// Truncating into written slots and appending other tokens there: the new
// tokens are not computed, and a step prepared before the truncate counts
// nothing for the truncated sequence when committed later.
TEST(Written, TruncateAndReappendRewritesNothingStale) {
  auto pool = make(4, 12);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(6));
  auto early = plan(pool, {a}, {6});
  pool->truncate(a, 3);
  append(*pool, a, {70, 71, 72});
  early->commit();  // a was truncated since: skipped
  EXPECT_EQ(computed(*pool, a), 0u);
  commit(pool, a);
  EXPECT_EQ(computed(*pool, a), 6u);
  pool->truncate(a, 5);  // block 2 keeps slot 0 written
  EXPECT_EQ(pool->block_pool().written(2), 1u);
  append(*pool, a, {80});
  EXPECT_EQ(computed(*pool, a), 5u);
  EXPECT_EQ(refusal(pool, {a}, {1}), "");
  EXPECT_VALID(*pool);
}

// The sliding window advances only behind committed tokens.
TEST(Written, SlidingWindowWaitsForTheCommit) {
  auto pool = make(4, 16, 4);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(12));
  plan(pool, {a}, {12})->abort();
  append(*pool, a, {12});
  EXPECT_EQ(table(*pool, a), (V{1, 2, 3, 4}));  // nothing released
  commit(pool, a, 13);
  append(*pool, a, {13});  // query 13 sees 10..13: blocks 0, 1 go
  EXPECT_EQ(table(*pool, a), (V{0, 0, 3, 4}));
  EXPECT_EQ(computed(*pool, a), 13u);
  EXPECT_VALID(*pool);
}

// A reset forgets every hash but not what was written: a later
// registration of the same content by the writer is hittable again.
TEST(Written, ResetPrefixCacheKeepsWrittenState) {
  auto pool = make(4, 12);
  SeqId a = pool->seq_create({});
  auto t = iota_tokens(9);
  append(*pool, a, t);
  commit(pool, a);
  pool->reset_prefix_cache();
  SeqId b = pool->seq_create({});
  EXPECT_EQ(pool->match_prefix(b, t.data(), t.size()), 0u);
  EXPECT_EQ(computed(*pool, a), 9u);
  EXPECT_EQ(refusal(pool, {a}, {1}), "");
  pool->free(a);  // no hash: head of the queue, the tail block first
  EXPECT_EQ(free_queue(*pool), (V{3, 2, 1, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_VALID(*pool);
}

// Validate names a cached free block whose K/V was never written.
TEST(Written, ValidateCatchesAnUnwrittenCachedBlock) {
  auto pool = make(4, 8);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(5));
  commit(pool, a);
  pool->free(a);  // block 1 cached in the free queue, written
  ASSERT_EQ(pool->validate(), "");
  pool->block_pool_for_testing().set_written(1, 2);
  EXPECT_NE(pool->validate().find("written state: block 1"), std::string::npos) << pool->validate();
  pool->block_pool_for_testing().set_written(1, 4);
  EXPECT_EQ(pool->validate(), "");
}

TEST(Written, ValidateCatchesASequenceCountingUnwrittenSlots) {
  auto pool = make(4, 8);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(5));
  commit(pool, a);
  pool->block_pool_for_testing().set_written(2, 0);
  EXPECT_NE(pool->validate().find("counts 5 tokens as computed but only its first 4"),
            std::string::npos)
      << pool->validate();
  pool->block_pool_for_testing().set_written(2, 1);
  EXPECT_EQ(pool->validate(), "");
}

// ---------------------------------------------------------------- storage

std::shared_ptr<Pool> storage_pool(uint32_t layers) {
  PoolOptions o = test::manager_options(4, 16);
  o.num_layers = layers;
  o.num_kv_heads = 1;
  o.head_dim = 8;
  o.dtype = DType::kF32;
  o.num_threads = 1;
  auto p = Pool::create(o);
  // Poison the arena with NaN: any read of a slot nobody wrote shows.
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t w = 0; w < 2; ++w) {
      TensorArg t = p->kv_tensor(l, w);
      std::fill_n(static_cast<float*>(t.data), 16 * 4 * 8, std::numeric_limits<float>::quiet_NaN());
    }
  return p;
}

TensorArg rows(std::vector<float>& v, int64_t n, int64_t h) { return test::rows(v, n, h, 8); }
using test::random_floats;

void write_layer(Batch& b, uint32_t layer, uint32_t seed) {
  const int64_t n = int64_t(b.info().num_tokens);
  auto k = random_floats(size_t(n) * 8, seed), v = random_floats(size_t(n) * 8, seed + 1);
  TensorArg kt = rows(k, n, 1), vt = rows(v, n, 1);
  b.write(layer, &kt, &vt, nullptr);
}

// Every output of a plan over s's last q tokens, layer 0.
std::vector<float> attend(const std::shared_ptr<Pool>& p, SeqId s, uint32_t q) {
  auto b = plan(p, {s}, {q});
  auto qv = random_floats(q * 8, 9);
  std::vector<float> out(q * 8, 0);
  TensorArg qt = rows(qv, q, 1), ot = rows(out, q, 1);
  b->attend(0, &qt, &ot, nullptr, AttentionParams{}, nullptr);
  b->abort();
  return out;
}

TEST(WrittenStorage, EveryLayerWrittenCommitsAndPartialWritesDoNot) {
  auto pool = storage_pool(2);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(9));
  {
    auto b = plan(pool, {a}, {9});
    write_layer(*b, 0, 1);  // the model raises before layer 1
  }
  EXPECT_EQ(computed(*pool, a), 0u);  // destroyed half-written: aborted
  {
    auto b = plan(pool, {a}, {9});
    write_layer(*b, 0, 1);
    EXPECT_FALSE(b->committed());
    write_layer(*b, 1, 3);
    EXPECT_TRUE(b->committed());
    EXPECT_THROW(b->abort(), Error);
  }
  EXPECT_EQ(computed(*pool, a), 9u);
  for (float x : attend(pool, a, 1)) EXPECT_TRUE(std::isfinite(x));
  EXPECT_VALID(*pool);
}

// The issue's repro on a NaN-poisoned arena: the sharer's plan over its
// last token is refused; computing everything gives finite attention, and
// a later request hits only written blocks.
TEST(WrittenStorage, IssueReproNeverReadsPoison) {
  auto pool = storage_pool(1);
  const auto system = iota_tokens(8);
  SeqId s1 = pool->seq_create({});
  append(*pool, s1, with(system, 1));
  SeqId s2 = pool->seq_create({});
  auto q2 = with(system, 2);
  EXPECT_EQ(pool->match_prefix(s2, q2.data(), q2.size()), 0u);
  append(*pool, s2, q2);
  pool->free(s1);
  EXPECT_NE(refusal(pool, {s2}, {1}), "");
  {
    auto b = plan(pool, {s2}, {9});
    write_layer(*b, 0, 5);
  }
  for (float x : attend(pool, s2, 1)) EXPECT_TRUE(std::isfinite(x));
  pool->free(s2);
  SeqId s3 = pool->seq_create({});
  auto q3 = with(system, 3);
  EXPECT_EQ(pool->match_prefix(s3, q3.data(), q3.size()), 8u);
  append(*pool, s3, {3});
  {
    auto b = plan(pool, {s3}, {1});
    write_layer(*b, 0, 7);
  }
  for (float x : attend(pool, s3, 1)) EXPECT_TRUE(std::isfinite(x));
  EXPECT_VALID(*pool);
}

// A swap-in restores written state; copy_blocks carries it.
TEST(WrittenStorage, SwapInAndCopyBlocksMarkWritten) {
  auto pool = storage_pool(1);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(4));  // block 1, full
  {
    auto b = plan(pool, {a}, {4});
    write_layer(*b, 0, 11);
  }
  std::vector<char> host(pool->bytes_per_block());
  int32_t one = 1, two = 2;
  pool->swap_blocks(&one, 1, host.data(), host.size(), true, nullptr);
  SeqId c = pool->seq_create({});
  append(*pool, c, iota_tokens(4, 50));  // block 2, unwritten
  EXPECT_EQ(computed(*pool, c), 0u);
  pool->swap_blocks(&two, 1, host.data(), host.size(), false, nullptr);
  EXPECT_EQ(pool->block_pool().written(2), 4u);
  EXPECT_EQ(computed(*pool, c), 4u);
  SeqId d = pool->seq_create({});
  append(*pool, d, iota_tokens(3, 90));  // block 3, unwritten
  pool->copy_blocks(&one, &two, 0, nullptr);
  int32_t three = 3;
  pool->copy_blocks(&one, &three, 1, nullptr);
  EXPECT_EQ(pool->block_pool().written(3), 4u);
  EXPECT_EQ(computed(*pool, d), 3u);
  EXPECT_VALID(*pool);
}

// A copy of less written K/V over a block a sequence counted on: the
// sequence no longer counts it (its plan over the last token is refused,
// num_computed_tokens shrinks), the pool stays valid, and recomputing the
// overwritten tokens gives finite attention on the NaN-poisoned arena.
TEST(WrittenStorage, CopyOverACountedBlockUncountsIt) {
  auto pool = storage_pool(1);
  SeqId a = pool->seq_create({});
  append(*pool, a, iota_tokens(6));  // blocks 1 (full), 2 (2 tokens)
  {
    auto b = plan(pool, {a}, {6});
    write_layer(*b, 0, 21);
  }
  ASSERT_EQ(computed(*pool, a), 6u);
  SeqId u = pool->seq_create({});
  append(*pool, u, iota_tokens(4, 70));  // block 3, never written
  ASSERT_EQ(table(*pool, a), (V{1, 2}));
  ASSERT_EQ(table(*pool, u), (V{3}));
  int32_t src = 3, dst = 1;
  pool->copy_blocks(&src, &dst, 1, nullptr);
  EXPECT_EQ(pool->block_pool().written(1), 0u);
  EXPECT_EQ(computed(*pool, a), 0u);
  EXPECT_VALID(*pool);
  append(*pool, a, {6});
  EXPECT_NE(refusal(pool, {a}, {1}), "");
  {
    auto b = plan(pool, {a}, {7});
    write_layer(*b, 0, 23);
  }
  for (float x : attend(pool, a, 1)) EXPECT_TRUE(std::isfinite(x));
  EXPECT_VALID(*pool);
}

// A prefill whose early context the sliding window made unnecessary (only
// the last 2 tokens were queries) leaves slots 0 and 1 unwritten; truncating
// to 1 token must not count token 0 as computed (found by the fuzz harness).
TEST(Written, TruncateUnderAWindowCountsOnlyWrittenSlots) {
  auto p = make(2, 3, 1);
  SeqId x = p->seq_create({});
  append(*p, x, {1, 2, 3, 4});
  test::step(p, x, 2);
  EXPECT_VALID(*p);
  SeqId c = p->fork(x);
  p->truncate(c, 1);
  EXPECT_EQ(p->seq_info(c).num_computed_tokens, 0u);
  EXPECT_VALID(*p);
  p->truncate(x, 1);
  EXPECT_EQ(p->seq_info(x).num_computed_tokens, 0u);
  EXPECT_VALID(*p);
}

}  // namespace
}  // namespace pagedkv
