// Step plans over multi-group pools (pkv_batch_prepare on a pool from
// pkv_pool_create_groups), through the C ABI: random workloads whose every
// plan array is checked against the per-group block tables, and a model of
// what an engine wrote into each block (executing the pool's copies, writing
// only on commit) that every context read must match, so a prefix hit on
// something no committed step wrote fails the test.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kBs = 4;

void ok(pkv_status s, const char* what) {
  ASSERT_EQ(s, PKV_OK) << what << ": " << pkv_last_error_message();
}

pkv_kv_group_spec spec(uint32_t kind, uint32_t window = 0) {
  pkv_kv_group_spec g;
  pkv_kv_group_spec_init(&g);
  g.kind = kind;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.sliding_window = window;
  if (kind == PKV_GROUP_MLA) g.kv_lora_rank = 16, g.rope_dim = 4;
  if (kind == PKV_GROUP_RECURRENT) g.state_bytes = 64;
  return g;
}

pkv_pool* make_pool(const std::vector<pkv_kv_group_spec>& groups, uint64_t blocks) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = blocks;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create_groups(&o, groups.data(), uint32_t(groups.size()), &p), PKV_OK)
      << pkv_last_error_message();
  return p;
}

std::vector<int32_t> group_table(pkv_pool* p, pkv_seq_id s, uint32_t g) {
  uint64_t n = 0;
  pkv_seq_group_block_table(p, s, g, nullptr, 0, &n);
  std::vector<int32_t> t(n);
  EXPECT_EQ(pkv_seq_group_block_table(p, s, g, t.data(), n, &n), PKV_OK);
  return t;
}

uint64_t computed(pkv_pool* p, pkv_seq_id s) {
  pkv_seq_info i;
  pkv_seq_info_init(&i);
  EXPECT_EQ(pkv_seq_get_info(p, s, &i), PKV_OK);
  return i.num_computed_tokens;
}

template <class T>
std::vector<T> plan_array(const pkv_batch* b, uint32_t g, uint32_t which) {
  pkv_tensor t;
  EXPECT_EQ(pkv_batch_plan_tensor_group(b, g, which, &t), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(t.ndim, 1);
  EXPECT_EQ(t.dtype,
            which == PKV_PLAN_SLOT_MAPPING ? uint32_t(PKV_DTYPE_I64) : uint32_t(PKV_DTYPE_I32));
  const T* d = reinterpret_cast<const T*>(static_cast<const char*>(t.data) + t.byte_offset);
  return std::vector<T>(d, d + t.shape[0]);
}

// What the engine wrote: per block id, per slot, a value naming the token
// and its position (attention groups), or a state's token prefix digest.
struct Engine {
  std::map<int32_t, std::vector<int64_t>> kv;  // block -> slot values (-1 unwritten)
  std::map<int32_t, uint64_t> state;           // recurrent slot -> digest of its tokens
  static int64_t value(uint64_t pos, int32_t tok) { return int64_t(pos) * 1000003 + tok; }
  static uint64_t digest(const std::vector<int32_t>& t, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; ++i) h = (h ^ uint64_t(t[i])) * 1099511628211ull;
    return h ^ n;
  }
  std::vector<int64_t>& block(int32_t b) {
    auto& v = kv[b];
    if (v.empty()) v.assign(kBs, -1);
    return v;
  }
};

struct Workload {
  pkv_pool* pool;
  std::vector<pkv_kv_group_spec> groups;
  bool recurrent = false;
  std::mt19937 rng;
  std::map<pkv_seq_id, std::vector<int32_t>> seqs;  // id -> its tokens
  std::vector<std::vector<int32_t>> families;
  Engine eng;
  std::map<pkv_seq_id, std::string> log;  // what happened to each sequence, for failures
  uint64_t plans = 0, commits = 0, aborts = 0, hits = 0, checked = 0;

  uint64_t rnd(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); }

  void run_copies() {
    for (uint32_t g = 0; g < groups.size(); ++g) {
      int32_t src[512], dst[512];
      uint64_t n = 0;
      ok(pkv_pool_group_take_copies(pool, g, src, dst, 512, &n), "take_copies");
      for (uint64_t i = 0; i < n; ++i) {
        if (groups[g].kind == PKV_GROUP_RECURRENT) {
          if (eng.state.count(src[i]))
            eng.state[dst[i]] = eng.state[src[i]];
          else
            eng.state.erase(dst[i]);
        } else {
          eng.block(dst[i]) = eng.block(src[i]);
        }
      }
    }
  }

  // Appends toks to s; on PKV_E_OUT_OF_BLOCKS frees the sequence.
  void append(pkv_seq_id s, const std::vector<int32_t>& toks) {
    const pkv_status st = pkv_seq_append(pool, s, toks.data(), toks.size(), 0);
    if (st == PKV_E_OUT_OF_BLOCKS) {
      ok(pkv_seq_free(pool, s), "free on oob");
      seqs.erase(s);
      return;
    }
    ok(st, "append");
    log[s] +=
        " append" + std::to_string(toks.size()) + "(c" + std::to_string(computed(pool, s)) + ")";
    auto& t = seqs[s];
    t.insert(t.end(), toks.begin(), toks.end());
  }

  void admit() {
    const auto& fam = families[rnd(families.size())];
    std::vector<int32_t> prompt(fam.begin(), fam.begin() + 1 + rnd(fam.size() - 1));
    for (uint64_t k = rnd(5); k-- > 0;) prompt.push_back(int32_t(rnd(50000)));
    pkv_seq_id s = 0;
    ok(pkv_seq_create(pool, nullptr, &s), "create");
    uint64_t cached = 0;
    ok(pkv_seq_match_prefix(pool, s, prompt.data(), prompt.size(), &cached), "match");
    hits += cached;
    log[s] += " hit" + std::to_string(cached);
    seqs[s].assign(prompt.begin(), prompt.begin() + cached);
    EXPECT_EQ(computed(pool, s), cached);
    append(s, std::vector<int32_t>(prompt.begin() + cached, prompt.end()));
  }

  // One step over a random subset: checks the plan against the tables and
  // the engine's writes, then commits, aborts or just destroys it.
  void step() {
    std::vector<pkv_seq_id> ids;
    std::vector<uint32_t> qs;
    for (const auto& kv : seqs) {
      const uint64_t n = kv.second.size(), c = computed(pool, kv.first);
      ASSERT_LE(c, n);
      if (c == n || rnd(4) == 0) continue;
      // A fork child or a hit holds no state slot before its first append.
      bool slotless = false;
      for (uint32_t g = 0; g < groups.size(); ++g)
        slotless = slotless || (groups[g].kind == PKV_GROUP_RECURRENT &&
                                group_table(pool, kv.first, g).empty());
      if (slotless) continue;
      uint64_t q = n - c;
      // Attention-only pools may recompute a few computed tokens.
      if (!recurrent && rnd(3) == 0) q = std::min<uint64_t>(n, q + rnd(3));
      ids.push_back(kv.first);
      qs.push_back(uint32_t(q));
    }
    if (ids.empty()) return;
    run_copies();
    pkv_batch* b = nullptr;
    const pkv_status st =
        pkv_batch_prepare(pool, ids.data(), qs.data(), uint32_t(ids.size()), nullptr, &b);
    if (st == PKV_E_INVALID_ARGUMENT && !recurrent) {  // recomputing into a released window
      ASSERT_NE(std::strstr(pkv_last_error_message(), "released"), nullptr)
          << pkv_last_error_message();
      return;
    }
    if (st == PKV_E_OUT_OF_BLOCKS && recurrent) {  // moving shared state slots: preempt one
      ok(pkv_seq_free(pool, ids[0]), "preempt");
      seqs.erase(ids[0]);
      return;
    }
    ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
    ++plans;
    run_copies();  // prepare may move a shared state slot to a copy
    const uint32_t S = uint32_t(ids.size());
    const auto qptr = plan_array<int32_t>(b, 0, PKV_PLAN_QUERY_INDPTR);
    const auto ctx = plan_array<int32_t>(b, 0, PKV_PLAN_CONTEXT_LENS);
    ASSERT_EQ(qptr.size(), S + 1u);
    ASSERT_EQ(ctx.size(), S);
    pkv_tensor pt;
    ok(pkv_batch_token_positions(b, &pt), "positions");
    const int64_t* pos = static_cast<const int64_t*>(pt.data);
    ASSERT_EQ(uint64_t(pt.shape[0]), uint64_t(qptr[S]));
    for (uint32_t i = 0; i < S; ++i) {
      const auto& toks = seqs[ids[i]];
      ASSERT_EQ(qptr[i + 1] - qptr[i], int32_t(qs[i]));
      ASSERT_EQ(ctx[i], int32_t(toks.size()));
      for (int32_t r = qptr[i]; r < qptr[i + 1]; ++r)
        ASSERT_EQ(pos[r], int64_t(toks.size()) - (qptr[i + 1] - r));
    }
    for (uint32_t g = 0; g < groups.size(); ++g) {
      const bool rec = groups[g].kind == PKV_GROUP_RECURRENT;
      const auto slots = plan_array<int64_t>(b, g, PKV_PLAN_SLOT_MAPPING);
      const auto pptr = plan_array<int32_t>(b, g, PKV_PLAN_PAGE_INDPTR);
      const auto pidx = plan_array<int32_t>(b, g, PKV_PLAN_PAGE_INDICES);
      const auto last = plan_array<int32_t>(b, g, PKV_PLAN_LAST_PAGE_LEN);
      ASSERT_EQ(pptr.size(), S + 1u);
      ASSERT_EQ(last.size(), S);
      ASSERT_EQ(uint64_t(pptr[S]), pidx.size());
      ASSERT_EQ(slots.size(), rec ? S : uint64_t(qptr[S]));
      for (uint32_t i = 0; i < S; ++i) {
        const auto& toks = seqs[ids[i]];
        const uint64_t n = toks.size(), start = n - qs[i];
        const auto t = group_table(pool, ids[i], g);
        if (rec) {
          ASSERT_EQ(t.size(), 1u);
          ASSERT_EQ(pptr[i], int32_t(i));
          ASSERT_EQ(pidx[i], t[0]);
          ASSERT_EQ(slots[i], t[0]);
          ASSERT_EQ(last[i], 1);
          // The state holds exactly the context before the queries.
          if (start > 0) {
            ASSERT_TRUE(eng.state.count(t[0])) << "group " << g << " slot " << t[0];
            ASSERT_EQ(eng.state[t[0]], Engine::digest(toks, start)) << "group " << g;
          }
          ++checked;
          continue;
        }
        const uint64_t np = (n + kBs - 1) / kBs;
        ASSERT_EQ(uint64_t(pptr[i + 1] - pptr[i]), np);
        ASSERT_GE(t.size(), np);
        for (uint64_t j = 0; j < np; ++j) ASSERT_EQ(pidx[pptr[i] + j], t[j]) << "page " << j;
        ASSERT_EQ(last[i], int32_t(n - (np - 1) * kBs));
        for (uint64_t p = start; p < n; ++p)
          ASSERT_EQ(slots[qptr[i] + (p - start)], int64_t(t[p / kBs]) * kBs + int64_t(p % kBs));
        // Every context key the first query sees holds what the engine
        // wrote for that token.
        const uint64_t w = groups[g].sliding_window;
        const uint64_t first = w && start + 1 > w ? start + 1 - w : 0;
        for (uint64_t p = first; p < start; ++p) {
          const int32_t blk = t[p / kBs];
          ASSERT_NE(blk, 0) << "group " << g << " position " << p;
          ASSERT_EQ(eng.block(blk)[p % kBs], Engine::value(p, toks[p]))
              << "group " << g << " position " << p << " of " << n << " block " << blk << " start "
              << start << ":" << log[ids[i]];
          ++checked;
        }
      }
    }
    // The engine's step: write, then commit (or abort: nothing written).
    const uint64_t how = rnd(5);
    if (how == 0) {
      ok(pkv_batch_abort(b), "abort");
      ++aborts;
      for (pkv_seq_id id : ids) log[id] += " abort";
      std::vector<uint64_t> before;
      for (pkv_seq_id s : ids) before.push_back(computed(pool, s));
      pkv_batch_destroy(b);
      for (uint32_t i = 0; i < S; ++i) EXPECT_EQ(computed(pool, ids[i]), before[i]);
      return;
    }
    for (uint32_t g = 0; g < groups.size(); ++g) {
      const auto slots = plan_array<int64_t>(b, g, PKV_PLAN_SLOT_MAPPING);
      for (uint32_t i = 0; i < S; ++i) {
        const auto& toks = seqs[ids[i]];
        const uint64_t n = toks.size(), start = n - qs[i];
        if (groups[g].kind == PKV_GROUP_RECURRENT) {
          eng.state[int32_t(slots[i])] = Engine::digest(toks, n);
          continue;
        }
        for (uint64_t p = start; p < n; ++p) {
          const int64_t sl = slots[qptr[i] + (p - start)];
          eng.block(int32_t(sl / kBs))[sl % kBs] = Engine::value(p, toks[p]);
        }
      }
    }
    if (how == 1)
      pkv_batch_destroy(b);  // neither commit nor abort: committed (ABI 1)
    else {
      ok(pkv_batch_commit(b), "commit");
      ok(pkv_batch_commit(b), "commit again");
      EXPECT_EQ(pkv_batch_abort(b), PKV_E_INVALID_STATE);
      pkv_batch_destroy(b);
    }
    ++commits;
    for (uint32_t i = 0; i < S; ++i)
      log[ids[i]] += " step" + std::to_string(seqs[ids[i]].size() - qs[i]) + "-" +
                     std::to_string(seqs[ids[i]].size());
    for (uint32_t i = 0; i < S; ++i) EXPECT_EQ(computed(pool, ids[i]), seqs[ids[i]].size());
  }

  void op() {
    const uint64_t r = rnd(20);
    if (seqs.size() < 2 || r < 3) return admit();
    auto it = seqs.begin();
    std::advance(it, rnd(seqs.size()));
    const pkv_seq_id s = it->first;
    if (r < 9) {
      std::vector<int32_t> toks(1 + rnd(r < 5 ? 9 : 2));
      for (auto& x : toks) x = int32_t(rnd(50000));
      append(s, toks);
    } else if (r < 11) {
      pkv_seq_id c = 0;
      ok(pkv_seq_fork(pool, s, &c), "fork");
      seqs[c] = it->second;
      log[c] = log[s] + " |fork";
    } else if (r < 13 && !recurrent) {
      const uint64_t n = it->second.size(), m = n - rnd(std::min<uint64_t>(n, 6));
      const pkv_status st = pkv_seq_truncate(pool, s, m);
      if (st == PKV_OK) {
        it->second.resize(m);
        log[s] += " trunc" + std::to_string(m);
      } else
        ASSERT_EQ(st, PKV_E_INVALID_ARGUMENT) << pkv_last_error_message();  // released window
    } else if (r < 14) {
      ok(pkv_seq_free(pool, s), "free");
      seqs.erase(it);
    } else {
      step();
    }
  }
};

void run_workload(std::vector<pkv_kv_group_spec> groups, uint32_t seed) {
  Workload w{make_pool(groups, 160), groups};
  ASSERT_NE(w.pool, nullptr);
  for (const auto& g : groups) w.recurrent = w.recurrent || g.kind == PKV_GROUP_RECURRENT;
  w.rng.seed(seed);
  for (int f = 0; f < 3; ++f) {
    std::vector<int32_t> fam(40);
    for (auto& x : fam) x = int32_t(w.rnd(50000));
    w.families.push_back(fam);
  }
  // Before its first plan the pool counts appended tokens computed (manager
  // calls alone); the first plan takes that back from its queries on.
  pkv_seq_id first = 0;
  const int32_t toks[5] = {7, 8, 9, 10, 11};
  ok(pkv_seq_create(w.pool, nullptr, &first), "create");
  ok(pkv_seq_append(w.pool, first, toks, 5, 0), "append");
  EXPECT_EQ(computed(w.pool, first), 5u);
  pkv_batch* b = nullptr;
  const uint32_t q = 5;
  ok(pkv_batch_prepare(w.pool, &first, &q, 1, nullptr, &b), "prepare");
  EXPECT_EQ(computed(w.pool, first), 0u);
  ok(pkv_batch_abort(b), "abort");
  pkv_batch_destroy(b);
  EXPECT_EQ(computed(w.pool, first), 0u);
  ok(pkv_seq_free(w.pool, first), "free");
  w.run_copies();
  for (int i = 0; i < 3000 && !::testing::Test::HasFatalFailure(); ++i) {
    w.op();
    ASSERT_EQ(pkv_pool_validate(w.pool), PKV_OK) << "op " << i << ": " << pkv_last_error_message();
  }
  EXPECT_GT(w.plans, 100u);
  EXPECT_GT(w.aborts, 10u);
  EXPECT_GT(w.hits, 0u);
  EXPECT_GT(w.checked, 1000u);
  pkv_pool_destroy(w.pool);
}

TEST(GroupPlans, FullWindowMlaRandomWorkload) {
  for (uint32_t seed : {1u, 2u, 3u})
    run_workload({spec(PKV_GROUP_FULL), spec(PKV_GROUP_SLIDING_WINDOW, 6), spec(PKV_GROUP_MLA)},
                 seed);
}

TEST(GroupPlans, FullWindowRecurrentRandomWorkload) {
  for (uint32_t seed : {4u, 5u, 6u})
    run_workload(
        {spec(PKV_GROUP_FULL), spec(PKV_GROUP_SLIDING_WINDOW, 9), spec(PKV_GROUP_RECURRENT)}, seed);
}

}  // namespace
