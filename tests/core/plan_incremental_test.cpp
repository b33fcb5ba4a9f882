// Incremental step plans (step_plan_rows.h): a plan that copies page rows
// from the previous plan must equal, element by element, the plan built
// from scratch over the same state, whatever happened in between (appends,
// batched appends, lookahead, frees, forks, truncates, prefix hits,
// reordered and resized batches).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

template <class T>
std::vector<T> arr(const T* p, size_t n) {
  return std::vector<T>(p, p + n);
}

void expect_same_plan(const Batch& inc, const Batch& scratch, int round) {
  const BatchInfo& a = inc.info();
  const BatchInfo& b = scratch.info();
  ASSERT_EQ(a.num_seqs, b.num_seqs) << round;
  ASSERT_EQ(a.num_tokens, b.num_tokens) << round;
  ASSERT_EQ(a.num_pages, b.num_pages) << round;
  ASSERT_EQ(a.max_context, b.max_context) << round;
  ASSERT_EQ(a.max_query, b.max_query) << round;
  const PlanView& x = inc.host_view();
  const PlanView& y = scratch.host_view();
  const size_t s = a.num_seqs, t = a.num_tokens, p = a.num_pages;
  EXPECT_EQ(arr(x.slot_mapping, t), arr(y.slot_mapping, t)) << round;
  EXPECT_EQ(arr(x.query_indptr, s + 1), arr(y.query_indptr, s + 1)) << round;
  EXPECT_EQ(arr(x.page_indptr, s + 1), arr(y.page_indptr, s + 1)) << round;
  EXPECT_EQ(arr(x.page_indices, p), arr(y.page_indices, p)) << round;
  EXPECT_EQ(arr(x.last_page_len, s), arr(y.last_page_len, s)) << round;
  EXPECT_EQ(arr(x.context_lens, s), arr(y.context_lens, s)) << round;
  // The callers' copy (plan_tensor) equals the kernels' copy.
  for (uint32_t w = 0; w < 6; ++w) {
    const TensorArg ta = inc.plan_tensor(w);
    const TensorArg tb = scratch.plan_tensor(w);
    const size_t bytes = size_t(ta.shape[0]) * (w == 0 ? 8 : 4);
    ASSERT_EQ(ta.shape[0], tb.shape[0]);
    EXPECT_EQ(0, std::memcmp(ta.data, tb.data, bytes)) << "array " << w << " round " << round;
  }
}

TEST(PlanIncremental, EqualsFromScratchUnderRandomChanges) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    auto pool = Pool::create(test::manager_options(4, 2000));
    std::vector<SeqId> live;
    auto tok = [&] { return int32_t(rng() % 50); };  // small vocabulary: prefix hits happen
    auto add = [&] {
      SeqId id = pool->seq_create({});
      std::vector<int32_t> prompt(1 + rng() % 30);
      for (auto& x : prompt) x = tok();
      pool->match_prefix(id, prompt.data(), prompt.size());
      const uint64_t hit = pool->seq_info(id).num_tokens;
      test::append(*pool, id, std::vector<int32_t>(prompt.begin() + long(hit), prompt.end()));
      live.push_back(id);
    };
    for (int i = 0; i < 12; ++i) add();
    size_t reused = 0, rows = 0;
    for (int round = 0; round < 300; ++round) {
      // Mostly decode steps, with every other kind of change now and then.
      const uint32_t r = rng() % 100;
      if (r < 60) {
        std::vector<int32_t> toks(live.size());
        for (auto& x : toks) x = tok();
        pool->append_batch(live.data(), toks.data(), live.size());
      } else if (r < 68) {
        test::append(*pool, live[rng() % live.size()], {tok(), tok(), tok()}, rng() % 6);
      } else if (r < 74 && live.size() > 2) {
        const size_t k = rng() % live.size();
        pool->free(live[k]);
        live.erase(live.begin() + long(k));
      } else if (r < 80) {
        add();
      } else if (r < 85 && live.size() < 30) {
        live.push_back(pool->fork(live[rng() % live.size()]));
      } else if (r < 90) {
        const SeqId id = live[rng() % live.size()];
        const uint64_t n = pool->seq_info(id).num_tokens;
        pool->truncate(id, n - std::min<uint64_t>(n - 1, rng() % 9));
      } else if (r < 95) {
        std::shuffle(live.begin(), live.end(), rng);
      }
      // Every uncomputed token is a query (at least one per sequence).
      std::vector<uint32_t> q(live.size());
      for (size_t i = 0; i < live.size(); ++i) {
        const SeqInfo in = pool->seq_info(live[i]);
        q[i] = uint32_t(std::max<uint64_t>(1, in.num_tokens - in.num_computed_tokens));
      }
      auto inc = Batch::prepare(pool, live.data(), q.data(), uint32_t(live.size()), nullptr);
      auto memo = pool->swap_last_plan_for_testing(nullptr);
      auto scratch = Batch::prepare(pool, live.data(), q.data(), uint32_t(live.size()), nullptr);
      EXPECT_EQ(scratch->rows_reused(), 0u);
      pool->swap_last_plan_for_testing(memo);  // the next plan follows inc, as an engine's would
      expect_same_plan(*inc, *scratch, round);
      reused += inc->rows_reused();
      rows += live.size();
      scratch->abort();
      inc->commit();
      ASSERT_EQ(pool->validate(), "") << round;
    }
    // The incremental path ran: most decode rows came from the previous plan.
    EXPECT_GT(reused, rows / 3) << "seed " << seed;
  }
}

}  // namespace
}  // namespace pagedkv
