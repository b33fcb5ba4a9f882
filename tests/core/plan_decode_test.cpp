// Fused decode steps (Batch::prepare_decode, pkv_batch_prepare_decode)
// against the two calls they replace. Twin pools get the same random
// workload (prompts, prefix hits, forks, truncates, frees, aborted steps);
// each decode step runs as prepare_decode on one and as append_batch then
// prepare on the other, and every plan array, block table, sequence info
// and pool counter must agree. A fused step that fails must leave its pool
// exactly as it was (the twin then skips the step).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <random>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::append;
using test::iota_tokens;

// What a user can observe of a pool: every live sequence's info and table,
// and the pool's counters.
struct Snapshot {
  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<uint64_t>> infos;
  std::vector<uint64_t> stats;
  bool operator==(const Snapshot& o) const {
    return tables == o.tables && infos == o.infos && stats == o.stats;
  }
};

Snapshot snap(const Pool& p, const std::vector<SeqId>& ids) {
  Snapshot s;
  for (SeqId id : ids) {
    s.tables.push_back(test::table(p, id));
    const SeqInfo i = p.seq_info(id);
    s.infos.push_back(
        {i.num_tokens, i.num_cached_tokens, i.num_blocks, i.num_slots, i.num_computed_tokens});
  }
  const PoolStats st = p.stats();
  s.stats = {st.num_free_blocks,   st.num_used_blocks, st.num_cached_blocks,
             st.num_seqs,          st.num_tokens,      st.prefix_query_tokens,
             st.prefix_hit_tokens, st.num_evictions,   st.num_cow_copies};
  return s;
}

// The plan's host arrays, element by element.
void expect_same_plan(const Batch& a, const Batch& b, const char* where) {
  const PlanView& x = a.host_view();
  const PlanView& y = b.host_view();
  ASSERT_EQ(x.num_seqs, y.num_seqs) << where;
  ASSERT_EQ(x.num_tokens, y.num_tokens) << where;
  ASSERT_EQ(x.max_query, y.max_query) << where;
  ASSERT_EQ(x.max_context, y.max_context) << where;
  ASSERT_EQ(a.info().num_pages, b.info().num_pages) << where;
  const int32_t s = x.num_seqs;
  for (int64_t t = 0; t < x.num_tokens; ++t)
    ASSERT_EQ(x.slot_mapping[t], y.slot_mapping[t]) << where << " token " << t;
  for (int32_t i = 0; i <= s; ++i) {
    ASSERT_EQ(x.query_indptr[i], y.query_indptr[i]) << where << " i " << i;
    ASSERT_EQ(x.page_indptr[i], y.page_indptr[i]) << where << " i " << i;
  }
  for (int32_t i = 0; i < s; ++i) {
    ASSERT_EQ(x.last_page_len[i], y.last_page_len[i]) << where << " i " << i;
    ASSERT_EQ(x.context_lens[i], y.context_lens[i]) << where << " i " << i;
  }
  for (uint64_t k = 0; k < a.info().num_pages; ++k)
    ASSERT_EQ(x.page_indices[k], y.page_indices[k]) << where << " page " << k;
}

struct Config {
  uint32_t block_size;
  uint64_t num_blocks;
  uint32_t window;
  bool storage;
};

using Ids = std::array<SeqId, 2>;  // a sequence's id on each twin (pools tag their ids)

class Twin {
 public:
  explicit Twin(const Config& c, uint32_t seed) : c_(c), rng_(seed) {
    PoolOptions o = c.storage ? test::storage_options(c.block_size, c.num_blocks, 4)
                              : test::manager_options(c.block_size, c.num_blocks);
    o.sliding_window = c.window;
    pools_[0] = Pool::create(o);
    pools_[1] = Pool::create(o);
  }

  // Both pools run f(pool, k) (k: 0 = the fused twin); they must agree on
  // whether it threw. Returns that code and what each returned.
  template <class F>
  auto both(F&& f) {
    Errc e[2] = {Errc(0), Errc(0)};
    std::array<decltype(f(pools_[0], 0)), 2> r{};
    for (int k = 0; k < 2; ++k) try {
        r[k] = f(pools_[k], k);
      } catch (const Error& err) {
        e[k] = err.code();
      }
    EXPECT_EQ(e[0], e[1]);
    return std::make_pair(e[0], r);
  }

  std::vector<int32_t> random_prompt(size_t n) {
    std::vector<int32_t> t(n);
    // A few shared prefixes so that prefix hits happen.
    const int32_t base = int32_t(rng_() % 3) * 1000;
    for (size_t i = 0; i < n; ++i)
      t[i] = i < 24 && rng_() % 4 != 0 ? base + int32_t(i) : int32_t(rng_() % 50000);
    return t;
  }

  // A step over what the sequence has not computed, committed or
  // (sometimes) aborted on both pools.
  void prefill(const Ids& id) {
    const SeqInfo i = pools_[0]->seq_info(id[0]);
    if (i.num_tokens == i.num_computed_tokens) return;
    const uint32_t q = uint32_t(i.num_tokens - i.num_computed_tokens);
    const bool abort = rng_() % 8 == 0;
    both([&](std::shared_ptr<Pool>& p, int k) {
      auto b = Batch::prepare(p, &id[k], &q, 1, nullptr);
      if (abort)
        b->abort();
      else
        b->commit();
      return 0;
    });
  }

  void op() {
    const uint32_t r = uint32_t(rng_() % 100);
    if (ids_.empty() || r < 15) {  // a new request: prefix match, prompt, maybe computed
      auto prompt = random_prompt(1 + rng_() % 40);
      auto [e, id] = both([&](std::shared_ptr<Pool>& p, int) {
        SeqId s = p->seq_create({});
        try {
          p->match_prefix(s, prompt.data(), prompt.size());
          const uint64_t have = p->seq_info(s).num_tokens;
          p->append(s, prompt.data() + have, prompt.size() - have, 0);
        } catch (...) {
          p->free(s);
          throw;
        }
        return s;
      });
      if (e != Errc(0)) return;
      ids_.push_back(id);
      if (rng_() % 12 != 0) prefill(id);  // else left uncomputed: decode must refuse it
    } else if (r < 22) {
      const Ids parent = ids_[rng_() % ids_.size()];
      auto [e, id] = both([&](std::shared_ptr<Pool>& p, int k) { return p->fork(parent[k]); });
      if (e == Errc(0)) ids_.push_back(id);
    } else if (r < 28 && c_.window == 0) {
      const Ids id = ids_[rng_() % ids_.size()];
      const uint64_t n = pools_[0]->seq_info(id[0]).num_tokens;
      const uint64_t to = n > 1 ? 1 + rng_() % (n - 1) : n;
      both([&](std::shared_ptr<Pool>& p, int k) {
        p->truncate(id[k], to);
        return 0;
      });
      if (rng_() % 2) prefill(id);
    } else if (r < 36) {
      const size_t k = rng_() % ids_.size();
      const Ids id = ids_[k];
      both([&](std::shared_ptr<Pool>& p, int j) {
        p->free(id[j]);
        return 0;
      });
      ids_.erase(ids_.begin() + long(k));
    } else if (r < 40) {
      prefill(ids_[rng_() % ids_.size()]);
    } else {
      decode_step();
    }
  }

  void decode_step() {
    // Mostly sequences whose every token is computed (an engine's running
    // batch); sometimes any, which the fused call must refuse unchanged.
    // Often the previous step's batch again, in its order (the steady
    // path), when none of it was freed.
    std::vector<Ids> picked;
    const bool again = !last_.empty() && rng_() % 3 != 0 &&
                       std::all_of(last_.begin(), last_.end(), [&](const Ids& id) {
                         return std::find(ids_.begin(), ids_.end(), id) != ids_.end();
                       });
    if (again) {
      picked = last_;
    } else {
      for (const Ids& id : ids_) {
        const SeqInfo i = pools_[0]->seq_info(id[0]);
        if (i.num_computed_tokens == i.num_tokens) picked.push_back(id);
      }
      if (picked.empty() || rng_() % 4 == 0) picked = ids_;
      std::shuffle(picked.begin(), picked.end(), rng_);
      picked.resize(1 + rng_() % picked.size());
      if (rng_() % 20 == 0) picked.push_back(picked.front());  // a repeated id
    }
    std::vector<SeqId> batch[2];
    for (const Ids& id : picked)
      for (int k = 0; k < 2; ++k) batch[k].push_back(id[k]);
    std::vector<int32_t> toks(picked.size());
    for (auto& t : toks) t = int32_t(rng_() % 50000);
    const bool persistent = rng_() % 2;
    const uint32_t m = uint32_t(picked.size());
    const Snapshot before = snap(0);
    Errc e = Errc(0);
    std::unique_ptr<Batch> f;
    try {
      f = Batch::prepare_decode(pools_[0], batch[0].data(), toks.data(), m, nullptr, persistent);
    } catch (const Error& err) {
      e = err.code();
    }
    if (e != Errc(0)) {
      ++failed_;
      // Nothing appended, nothing changed; the split twin skips the step.
      EXPECT_EQ(snap(0), before) << "a failed fused step changed the pool";
      EXPECT_EQ(pools_[0]->validate(), "");
      return;
    }
    ++fused_steps_;
    steady_steps_ += f->steady_for_testing();
    lane_steps_ += f->lane_for_testing();
    last_ = picked;
    pools_[1]->append_batch(batch[1].data(), toks.data(), m);
    std::vector<uint32_t> ones(m, 1);
    auto s = Batch::prepare(pools_[1], batch[1].data(), ones.data(), m, nullptr, persistent);
    expect_same_plan(*f, *s, "decode step");
    // Sometimes the running batch changes before the step's commit (a
    // request freed, truncated, forked or extended meanwhile): commit must
    // then skip what no longer stands, on both paths alike.
    if (rng_() % 4 == 0) between_prepare_and_commit(picked);
    if (rng_() % 10 == 0) {
      f->abort();
      s->abort();
    } else {
      f->commit();                      // a decode step: the fast path
      s->commit_general_for_testing();  // its reference
    }
  }

  void between_prepare_and_commit(const std::vector<Ids>& picked) {
    const Ids id = picked[rng_() % picked.size()];
    const uint32_t r = uint32_t(rng_() % 4);
    const int32_t tok = int32_t(rng_() % 50000);
    const uint64_t n = pools_[0]->seq_info(id[0]).num_tokens;
    const uint64_t to = n > 1 ? 1 + rng_() % (n - 1) : n;
    auto [e, forked] = both([&](std::shared_ptr<Pool>& p, int k) -> SeqId {
      if (r == 0) p->free(id[k]);
      if (r == 1 && c_.window == 0) p->truncate(id[k], to);
      if (r == 2) return p->fork(id[k]);
      if (r == 3) p->append(id[k], &tok, 1, 0);
      return SeqId(0);
    });
    if (e != Errc(0)) return;
    if (r == 0) ids_.erase(std::find(ids_.begin(), ids_.end(), id));
    if (r == 2) ids_.push_back(forked);
  }

  Snapshot snap(int k) const {
    std::vector<SeqId> ids;
    for (const Ids& id : ids_) ids.push_back(id[k]);
    return pagedkv::snap(*pools_[k], ids);
  }

  // The KV events each pool emitted since the last check (what a
  // subscriber such as a router sees): the same, in the same order.
  void check_events() {
    const auto a = test::drain(*pools_[0]);
    const auto b = test::drain(*pools_[1]);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(int(a[i].type), int(b[i].type)) << "event " << i;
      ASSERT_EQ(a[i].block_id, b[i].block_id) << "event " << i;
      ASSERT_TRUE(a[i].block_hash == b[i].block_hash) << "event " << i;
      ASSERT_TRUE(a[i].parent_hash == b[i].parent_hash) << "event " << i;
      ASSERT_EQ(a[i].num_tokens, b[i].num_tokens) << "event " << i;
    }
    events_ += a.size();
  }

  void check() {
    check_events();
    ASSERT_EQ(snap(0), snap(1));
    ASSERT_EQ(pools_[0]->validate(), "");
    ASSERT_EQ(pools_[1]->validate(), "");
  }

  size_t failed_ = 0, fused_steps_ = 0, steady_steps_ = 0, lane_steps_ = 0, events_ = 0;
  std::vector<Ids> last_;  // the last fused step's batch

 private:
  Config c_;
  std::mt19937 rng_;
  std::shared_ptr<Pool> pools_[2];
  std::vector<Ids> ids_;
};

TEST(PlanDecode, MatchesAppendBatchThenPrepare) {
  const Config configs[] = {{4, 64, 0, false}, {16, 256, 0, false}, {4, 40, 0, true},
                            {4, 64, 9, false}, {8, 24, 0, false},   {16, 96, 20, true}};
  size_t failed = 0, fused = 0, steady = 0, lane = 0, events = 0;
  for (const Config& c : configs)
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      Twin t(c, seed * 7919 + c.block_size);
      for (int i = 0; i < 400; ++i) {
        t.op();
        t.check();
        if (HasFatalFailure()) return;
      }
      failed += t.failed_;
      fused += t.fused_steps_;
      steady += t.steady_steps_;
      lane += t.lane_steps_;
      events += t.events_;
    }
  // Both outcomes were exercised, many times.
  EXPECT_GT(fused, 3000u) << failed;
  EXPECT_GT(events, 1000u);
  EXPECT_GT(steady, 1000u) << fused;
  EXPECT_GT(lane, 300u) << steady;
  std::printf("fused steps %zu (steady %zu, lane %zu), refused %zu, events compared %zu\n", fused,
              steady, lane, failed, events);
  EXPECT_GT(failed, 500u) << fused;
}

// The failures the fused call adds over append_batch: a context no
// committed step wrote, refused before anything is appended.
TEST(PlanDecode, UnwrittenContextAppendsNothing) {
  auto pool = Pool::create(test::manager_options(4, 32));
  SeqId done = pool->seq_create({}), fresh = pool->seq_create({});
  append(*pool, done, iota_tokens(6, 1));
  test::step(pool, done);
  append(*pool, fresh, iota_tokens(5, 100));  // never computed
  const SeqId ids[] = {done, fresh};
  const int32_t toks[] = {7, 8};
  try {
    Batch::prepare_decode(pool, ids, toks, 2, nullptr);
    FAIL() << "expected kInvalidState";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidState);
    EXPECT_NE(std::string(e.what()).find("seqs[1]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokens [0, 5)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool->seq_info(done).num_tokens, 6u);
  EXPECT_EQ(pool->seq_info(fresh).num_tokens, 5u);
  EXPECT_EQ(pool->validate(), "");
  // Once computed, the same step succeeds and counts after its commit.
  test::step(pool, fresh);
  auto b = Batch::prepare_decode(pool, ids, toks, 2, nullptr, true);
  EXPECT_EQ(b->host_view().num_tokens, 2);
  EXPECT_EQ(pool->seq_info(done).num_computed_tokens, 6u);
  b->commit();
  EXPECT_EQ(pool->seq_info(done).num_computed_tokens, 7u);
  EXPECT_EQ(pool->seq_info(fresh).num_computed_tokens, 6u);
}

// Out of blocks part-way: the sequences before the one that ran out keep
// nothing either.
TEST(PlanDecode, OutOfBlocksAppendsNothing) {
  auto pool = Pool::create(test::manager_options(4, 5));  // block 0 is the null block
  SeqId a = pool->seq_create({}), b = pool->seq_create({});
  append(*pool, a, iota_tokens(4, 1));  // full: the next token needs a block
  append(*pool, b, iota_tokens(8, 50));
  test::step(pool, a);
  test::step(pool, b);
  SeqId c = pool->seq_create({});
  append(*pool, c, iota_tokens(4, 90));  // the last free block
  test::step(pool, c);
  const SeqId ids[] = {a, b, c};
  const int32_t toks[] = {5, 6, 7};
  EXPECT_EQ(test::code_of([&] { Batch::prepare_decode(pool, ids, toks, 3, nullptr); }),
            Errc::kOutOfBlocks);
  for (SeqId id : ids) EXPECT_EQ(pool->seq_info(id).num_tokens % 4, 0u);
  EXPECT_EQ(pool->stats().num_tokens, 16u);
  EXPECT_EQ(pool->validate(), "");
}

// The steady path's block count: a steady step with more blocks to open
// than are free is refused by the general path, unchanged.
TEST(PlanDecode, SteadyStepOutOfBlocksAppendsNothing) {
  auto pool = Pool::create(test::manager_options(4, 6));  // 5 usable blocks
  const SeqId a = pool->seq_create({}), b = pool->seq_create({}), c = pool->seq_create({});
  append(*pool, a, iota_tokens(3, 1));
  append(*pool, b, iota_tokens(7, 20));
  append(*pool, c, iota_tokens(3, 40));
  for (SeqId id : {a, b, c}) test::step(pool, id);
  const SeqId ids[] = {a, b, c};
  const int32_t first[] = {4, 27, 43};  // each fills its tail block
  auto step = Batch::prepare_decode(pool, ids, first, 3, nullptr);
  step->commit();
  step.reset();
  const int32_t next[] = {5, 28, 44};  // each would open one: 3 of 1 free
  const Snapshot before = snap(*pool, {a, b, c});
  EXPECT_EQ(test::code_of([&] { Batch::prepare_decode(pool, ids, next, 3, nullptr); }),
            Errc::kOutOfBlocks);
  EXPECT_EQ(snap(*pool, {a, b, c}), before);
  EXPECT_EQ(pool->validate(), "");
  pool->free(c);  // two free now: a and b fit
  auto ok = Batch::prepare_decode(pool, ids, next, 2, nullptr);
  EXPECT_TRUE(ok->steady_for_testing());
  EXPECT_EQ(pool->seq_info(a).num_tokens, 5u);
  EXPECT_EQ(pool->seq_info(b).num_tokens, 9u);
}

// Row i of a decode plan over ids: its slot is the new (last) token's place
// in the sequence's block table as the pool holds it now (block size 4).
void expect_slot_in_table(const Pool& pool, const PlanView& v, const SeqId* ids, int i) {
  const std::vector<int32_t> table = test::table(pool, ids[i]);
  const uint64_t last = pool.seq_info(ids[i]).num_tokens - 1;  // the new token
  ASSERT_LT(last / 4, table.size());
  EXPECT_EQ(v.slot_mapping[i], int64_t(table[last / 4]) * 4 + int64_t(last % 4)) << i;
}

// The steady path takes each sequence's tail block from the step before
// while the sequence's block table did not change (Pool::DecodeMemo). A
// table changed between two steps of the same batch, here truncated and
// refilled into another block at the same index, must be read again.
TEST(PlanDecode, SteadyStepAfterTableChangeWritesTheNewTailBlock) {
  auto pool = Pool::create(test::manager_options(4, 64));
  const SeqId a = pool->seq_create({}), b = pool->seq_create({});
  append(*pool, a, iota_tokens(5, 1));
  append(*pool, b, iota_tokens(5, 100));
  for (SeqId id : {a, b}) test::step(pool, id);
  const SeqId ids[] = {a, b};
  size_t checked = 0;
  auto decode = [&](int32_t t) {
    const int32_t toks[] = {t, t + 1};
    auto s = Batch::prepare_decode(pool, ids, toks, 2, nullptr);
    EXPECT_TRUE(s->steady_for_testing());
    const PlanView& v = s->host_view();
    for (int i = 0; i < 2; ++i) {
      expect_slot_in_table(*pool, v, ids, i);
      const std::vector<int32_t> table = test::table(*pool, ids[i]);
      // The row's pages: the whole table (a plan without a persistent table).
      ASSERT_EQ(uint64_t(v.page_indptr[i + 1] - v.page_indptr[i]), table.size()) << i;
      for (size_t k = 0; k < table.size(); ++k)
        EXPECT_EQ(v.page_indices[v.page_indptr[i] + int64_t(k)], table[k]) << i << " page " << k;
      ++checked;
    }
    s->commit();
  };
  decode(500);  // token 6 of each: block 1, slot 1
  decode(600);  // slot 2: the memo's block
  const int32_t before = test::table(*pool, a)[1];
  // Another sequence holds a's block 1 once a lets it go, so a's refill
  // gets a different block at index 1.
  pool->truncate(a, 4);
  const SeqId c = pool->seq_create({});
  append(*pool, c, iota_tokens(4, 900));
  append(*pool, a, iota_tokens(2, 40));
  test::step(pool, a);
  test::step(pool, c);
  ASSERT_NE(test::table(*pool, a)[1], before);
  decode(700);  // a: token 7, in its new block 1
  decode(800);
  EXPECT_EQ(checked, 8u);
  EXPECT_EQ(pool->validate(), "");
}

// The memo belongs to the ids of the last steady step. A general-path step
// over other ids of the same count (here refused by the steady path for a
// shared tail) remembers those ids; the tails must not carry over to them.
TEST(PlanDecode, TailMemoDoesNotCarryOverToOtherIds) {
  auto pool = Pool::create(test::manager_options(4, 64));
  SeqId s[4];
  for (int k = 0; k < 4; ++k) {
    s[k] = pool->seq_create({});
    append(*pool, s[k], iota_tokens(5, 100 * (k + 1)));
    test::step(pool, s[k]);
  }
  auto decode = [&](SeqId x, SeqId y, int32_t t, bool want_steady) {
    const SeqId ids[] = {x, y};
    const int32_t toks[] = {t, t + 1};
    auto b = Batch::prepare_decode(pool, ids, toks, 2, nullptr);
    EXPECT_EQ(b->steady_for_testing(), want_steady);
    const PlanView& v = b->host_view();
    for (int i = 0; i < 2; ++i) expect_slot_in_table(*pool, v, ids, i);
    b->commit();
  };
  decode(s[0], s[1], 500, true);         // the memo: s0's and s1's block 1
  const SeqId child = pool->fork(s[2]);  // s2's tail shared: not steady
  decode(s[2], s[3], 600, false);
  // Steady over {s2, s3}: s3 has s1's table_version and block index.
  decode(s[2], s[3], 700, true);
  EXPECT_NE(test::table(*pool, s[3])[1], test::table(*pool, s[1])[1]);
  pool->free(child);
  EXPECT_EQ(pool->validate(), "");
}

// pkv_seq_reserve: room for the tokens to come, nothing else; decode steps
// up to that length then move none of the sequence's vectors.
TEST(PlanDecode, ReservedSequencesDecodeWithoutReallocating) {
  auto pool = Pool::create(test::manager_options(16, 512));
  std::vector<SeqId> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(pool->seq_create({}));
    append(*pool, ids.back(), iota_tokens(20 + 13 * i, 1000 * i));
    test::step(pool, ids.back());
  }
  const Snapshot before = snap(*pool, ids);
  for (size_t i = 0; i < ids.size(); ++i) pool->reserve(ids[i], 20 + 13 * i + 300);
  pool->reserve(ids[0], 3);  // below what it holds: no-op
  EXPECT_EQ(snap(*pool, ids), before);
  EXPECT_EQ(pool->validate(), "");
  struct Where {
    const int32_t* tokens;
    const int32_t* blocks;
    const BlockHash* hashes;
  };
  auto where = [&](SeqId id) {
    const Sequence& s = *pool->seq_table_for_testing().find(id);
    return Where{s.tokens.data(), s.blocks.data(), s.hashes.data()};
  };
  std::vector<Where> at;
  for (SeqId id : ids) at.push_back(where(id));
  std::vector<int32_t> toks(ids.size());
  size_t steady = 0;
  for (int step = 0; step < 300; ++step) {
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(step * 7 + i);
    auto b = Batch::prepare_decode(pool, ids.data(), toks.data(), uint32_t(ids.size()), nullptr,
                                   step % 2 == 0);
    steady += b->steady_for_testing();
    b->commit();
  }
  EXPECT_GT(steady, 250u);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Where w = where(ids[i]);
    EXPECT_EQ(w.tokens, at[i].tokens) << i;
    EXPECT_EQ(w.blocks, at[i].blocks) << i;
    EXPECT_EQ(w.hashes, at[i].hashes) << i;
    EXPECT_EQ(pool->seq_info(ids[i]).num_computed_tokens, 20 + 13 * i + 300);
  }
  EXPECT_EQ(pool->validate(), "");
  EXPECT_EQ(test::code_of([&] { pool->reserve(ids[0], uint64_t(1) << 31); }),
            Errc::kInvalidArgument);
  // The largest legal count reserves what the sequence could ever hold in
  // this pool (512 blocks of 16), not 2^31 - 1 tokens.
  pool->reserve(ids[0], (uint64_t(1) << 31) - 1);
  const Sequence& s0 = *pool->seq_table_for_testing().find(ids[0]);
  EXPECT_EQ(s0.tokens.capacity(), 512u * 16u);
  EXPECT_LE(s0.blocks.capacity(), 512u);
  EXPECT_EQ(pool->validate(), "");
  // With a sliding window nothing bounds the length but 2^31 - 1: the room
  // stops at 2^24 tokens.
  PoolOptions wo = test::manager_options(16, 64);
  wo.sliding_window = 32;
  auto windowed = Pool::create(wo);
  const SeqId w = windowed->seq_create({});
  windowed->reserve(w, (uint64_t(1) << 31) - 1);
  EXPECT_EQ(windowed->seq_table_for_testing().find(w)->tokens.capacity(), uint64_t(1) << 24);
}

}  // namespace
}  // namespace pagedkv
