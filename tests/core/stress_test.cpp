// Random operation sequences against the block manager, validating every
// invariant after each step, plus a simple model of tokens and tables.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

void run(uint32_t window, bool caching, uint32_t seed) {
  std::mt19937 rng(seed);
  PoolOptions o = test::manager_options(4, 40);
  o.sliding_window = window;
  o.enable_prefix_caching = caching;
  o.max_events = 64;
  auto pool = Pool::create(o);
  std::map<SeqId, std::vector<int32_t>> model;  // tokens per live sequence
  auto pick = [&]() {
    auto it = model.begin();
    std::advance(it, rng() % model.size());
    return it;
  };
  // Few distinct token streams so that prefixes repeat and hit.
  auto stream = [&](size_t n) {
    std::vector<int32_t> t(n);
    int32_t base = int32_t(rng() % 3) * 1000;
    for (size_t i = 0; i < n; ++i) t[i] = base + int32_t(i);
    return t;
  };
  for (int step = 0; step < 3000; ++step) {
    const int op = int(rng() % 8);
    try {
      if (op == 0 || model.empty()) {
        SeqId id = pool->seq_create({});
        auto t = stream(rng() % 30);
        uint64_t hit = pool->match_prefix(id, t.data(), t.size());
        ASSERT_EQ(hit % 4, 0u);
        ASSERT_LT(hit, std::max<size_t>(t.size(), 1));
        model[id] = std::vector<int32_t>(t.begin(), t.begin() + hit);
      } else if (op <= 3) {
        auto it = pick();
        std::vector<int32_t> t(rng() % 6);
        for (auto& x : t) x = int32_t(it->second.size() + (&x - t.data()));
        PoolStats before = pool->stats();
        try {
          pool->append(it->first, t.data(), t.size(), rng() % 3);
          it->second.insert(it->second.end(), t.begin(), t.end());
        } catch (const Error& e) {
          ASSERT_EQ(e.code(), Errc::kOutOfBlocks);
          PoolStats after = pool->stats();
          ASSERT_EQ(after.num_free_blocks, before.num_free_blocks);
          ASSERT_EQ(after.num_tokens, before.num_tokens);
          auto victim = pick();  // preempt someone
          pool->free(victim->first);
          model.erase(victim);
        }
      } else if (op == 4) {
        auto it = pick();
        SeqId c = pool->fork(it->first);
        model[c] = it->second;
      } else if (op == 5) {
        auto it = pick();
        uint64_t m = it->second.empty() ? 0 : rng() % (it->second.size() + 1);
        try {
          pool->truncate(it->first, m);
          it->second.resize(m);
        } catch (const Error& e) {
          ASSERT_EQ(e.code(), Errc::kInvalidArgument);  // into the released window
          ASSERT_GT(window, 0u);
        }
      } else if (op == 6) {
        auto it = pick();
        pool->free(it->first);
        model.erase(it);
      } else {
        std::vector<SeqId> ids;
        std::vector<uint32_t> q;
        for (auto& [id, t] : model)
          if (!t.empty() && rng() % 2) {
            ids.push_back(id);
            q.push_back(rng() % 4 ? 1 : 1 + uint32_t(rng() % t.size()));
          }
        // Some steps fail before their writes (abort): nothing counts.
        auto run_step = [&](const std::vector<uint32_t>& qs) {
          auto b = Batch::prepare(pool, ids.data(), qs.data(), uint32_t(ids.size()), nullptr);
          if (rng() % 4 == 0) b->abort();
        };
        try {
          if (!ids.empty()) run_step(q);
        } catch (const Error& e) {
          // Refused: context nobody wrote (an aborted step, a fork whose
          // parent went away) or re-queried old tokens whose window keys
          // were released. Computing from the first unwritten token works.
          ASSERT_TRUE(e.code() == Errc::kInvalidState ||
                      (e.code() == Errc::kInvalidArgument && window > 0))
              << e.what();
          std::vector<uint32_t> from(ids.size());
          for (size_t i = 0; i < ids.size(); ++i) {
            const SeqInfo si = pool->seq_info(ids[i]);
            from[i] = uint32_t(std::max<uint64_t>(1, si.num_tokens - si.num_computed_tokens));
          }
          run_step(from);
        }
        if (rng() % 50 == 0) pool->reset_prefix_cache();
      }
    } catch (const Error& e) {
      FAIL() << "step " << step << " op " << op << ": " << e.what();
    }
    ASSERT_EQ(pool->validate(), "") << "step " << step << " op " << op;
    for (auto& [id, t] : model) ASSERT_EQ(pool->seq_info(id).num_tokens, t.size());
  }
  for (auto& [id, t] : model) pool->free(id);
  EXPECT_EQ(pool->validate(), "");
  EXPECT_EQ(pool->stats().num_used_blocks, 0u);
  EXPECT_EQ(pool->stats().num_free_blocks, 39u);
}

TEST(Stress, RandomOperationsKeepEveryInvariant) { run(0, true, 1); }
TEST(Stress, RandomOperationsWithSlidingWindow) { run(8, true, 2); }
TEST(Stress, RandomOperationsWithoutPrefixCaching) { run(0, false, 3); }

}  // namespace
}  // namespace pagedkv
