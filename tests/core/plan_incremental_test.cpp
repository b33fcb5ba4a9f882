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

// Random engine steps over one pool: mostly decode steps, with every other
// kind of table change now and then (appends with lookahead, frees, new
// sequences with prefix hits, forks, truncates, reordered batches).
struct RandomSteps {
  explicit RandomSteps(uint32_t seed, uint32_t num_blocks)
      : rng(seed), pool(Pool::create(test::manager_options(4, num_blocks))) {
    for (int i = 0; i < 12; ++i) add();
  }
  int32_t tok() { return int32_t(rng() % 50); }  // small vocabulary: prefix hits happen
  void add() {
    SeqId id = pool->seq_create({});
    std::vector<int32_t> prompt(1 + rng() % 30);
    for (auto& x : prompt) x = tok();
    pool->match_prefix(id, prompt.data(), prompt.size());
    const uint64_t hit = pool->seq_info(id).num_tokens;
    test::append(*pool, id, std::vector<int32_t>(prompt.begin() + long(hit), prompt.end()));
    live.push_back(id);
  }
  // One change; returns the query counts of the next plan (every
  // uncomputed token is a query, at least one per sequence).
  std::vector<uint32_t> step() {
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
    std::vector<uint32_t> q(live.size());
    for (size_t i = 0; i < live.size(); ++i) {
      const SeqInfo in = pool->seq_info(live[i]);
      q[i] = uint32_t(std::max<uint64_t>(1, in.num_tokens - in.num_computed_tokens));
    }
    return q;
  }
  std::mt19937 rng;
  std::shared_ptr<Pool> pool;
  std::vector<SeqId> live;
};

TEST(PlanIncremental, EqualsFromScratchUnderRandomChanges) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    RandomSteps w(seed, 2000);
    auto& pool = w.pool;
    auto& live = w.live;
    size_t reused = 0, rows = 0;
    for (int round = 0; round < 300; ++round) {
      const std::vector<uint32_t> q = w.step();
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

// Persistent page tables (step_plan_table.h): each row equals the CSR row
// of a from-scratch plan over the same state, padded with the null block;
// every other array is equal; a plan still alive never sees its arrays
// change; most decode rows are not rewritten.
void expect_same_rows(const Batch& pers, const Batch& csr, int round) {
  const BatchInfo& a = pers.info();
  const BatchInfo& b = csr.info();
  ASSERT_EQ(a.num_seqs, b.num_seqs) << round;
  ASSERT_EQ(a.num_tokens, b.num_tokens) << round;
  const uint32_t stride = pers.page_row_stride();
  ASSERT_GT(stride, 0u);
  ASSERT_EQ(a.num_pages, uint64_t(a.num_seqs) * stride) << round;
  const size_t s = a.num_seqs, t = a.num_tokens;
  for (int copy = 0; copy < 2; ++copy) {  // the kernels' view, then the callers' tensors
    const PlanView& x = pers.host_view();
    const PlanView& y = csr.host_view();
    const int32_t* pidx =
        copy ? static_cast<const int32_t*>(pers.plan_tensor(3).data) : x.page_indices;
    const int32_t* pptr =
        copy ? static_cast<const int32_t*>(pers.plan_tensor(2).data) : x.page_indptr;
    EXPECT_EQ(arr(x.slot_mapping, t), arr(y.slot_mapping, t)) << round;
    EXPECT_EQ(arr(x.query_indptr, s + 1), arr(y.query_indptr, s + 1)) << round;
    EXPECT_EQ(arr(x.last_page_len, s), arr(y.last_page_len, s)) << round;
    EXPECT_EQ(arr(x.context_lens, s), arr(y.context_lens, s)) << round;
    for (size_t i = 0; i < s; ++i) {
      ASSERT_EQ(pptr[i], int32_t(i * stride)) << round;
      const int32_t n = y.page_indptr[i + 1] - y.page_indptr[i];
      ASSERT_LE(uint32_t(n), stride);
      for (uint32_t j = 0; j < stride; ++j)
        ASSERT_EQ(pidx[i * stride + j], int32_t(j) < n ? y.page_indices[y.page_indptr[i] + j] : 0)
            << "round " << round << " row " << i << " page " << j << " copy " << copy;
    }
  }
}

TEST(PlanPersistent, RowsEqualFromScratchUnderRandomChanges) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    RandomSteps w(seed, 3000);
    auto& pool = w.pool;
    auto& live = w.live;
    size_t reused = 0, rows = 0;
    std::unique_ptr<Batch> held;  // a plan kept alive across the next one
    std::vector<int32_t> held_rows;
    for (int round = 0; round < 300; ++round) {
      const std::vector<uint32_t> q = w.step();
      auto pers = Batch::prepare(pool, live.data(), q.data(), uint32_t(live.size()), nullptr, true);
      auto csr = Batch::prepare(pool, live.data(), q.data(), uint32_t(live.size()), nullptr);
      expect_same_rows(*pers, *csr, round);
      if (held) {  // built before this plan, alive through it: unchanged
        const PlanView& v = held->host_view();
        EXPECT_EQ(arr(v.page_indices, held->info().num_pages), held_rows) << round;
        held.reset();
      }
      reused += pers->rows_reused();
      rows += live.size();
      csr->abort();
      pers->commit();
      if (w.rng() % 5 == 0) {
        held_rows = arr(pers->host_view().page_indices, pers->info().num_pages);
        held = std::move(pers);
      }
      ASSERT_EQ(pool->validate(), "") << round;
    }
    EXPECT_GT(reused, rows / 3) << "seed " << seed;
  }
}

}  // namespace
}  // namespace pagedkv
