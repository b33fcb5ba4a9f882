// Commits and failed prepares of step plans (issue 16 item 4): a commit
// reuses the sequences its prepare resolved while no sequence was freed, and
// looks each id up again otherwise; either way a sequence freed (its slot
// possibly reused by a new one), truncated or changed between prepare and
// commit is skipped, and the others are committed. A prepare that fails
// changes nothing a later plan could see. Block size 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::append;
using test::iota_tokens;

std::unique_ptr<Batch> plan(const std::shared_ptr<Pool>& p, std::vector<SeqId> ids,
                            std::vector<uint32_t> q, bool persistent = false) {
  return Batch::prepare(p, ids.data(), q.data(), uint32_t(ids.size()), nullptr, persistent);
}

uint64_t computed(const Pool& p, SeqId id) { return p.seq_info(id).num_computed_tokens; }

uint32_t slot_of(SeqId id) { return uint32_t(id) & (SeqTable::kMaxSlots - 1); }

// The written count of each block of id's table.
std::vector<uint32_t> written(const Pool& p, SeqId id) {
  std::vector<uint32_t> w;
  for (int32_t b : test::table(p, id)) w.push_back(p.block_pool().written(b));
  return w;
}

TEST(PlanCommit, FreedSequenceWhoseSlotIsReusedIsSkipped) {
  for (bool persistent : {false, true}) {
    auto pool = Pool::create(test::manager_options(4, 16));
    SeqId a = pool->seq_create({});
    append(*pool, a, iota_tokens(6, 100));
    SeqId keep = pool->seq_create({});
    append(*pool, keep, iota_tokens(7, 200));
    auto step = plan(pool, {a, keep}, {6, 7}, persistent);
    pool->free(a);
    // The new sequence takes a's slot (a newer generation) and, the free
    // queue being LIFO for unhashed blocks, blocks a held.
    SeqId b = pool->seq_create({});
    ASSERT_EQ(slot_of(b), slot_of(a));
    ASSERT_NE(b, a);
    append(*pool, b, iota_tokens(6, 300));
    step->commit();
    EXPECT_EQ(computed(*pool, b), 0u);
    EXPECT_EQ(written(*pool, b), (std::vector<uint32_t>{0, 0}));
    EXPECT_EQ(computed(*pool, keep), 7u);  // the plan's other sequence counts
    EXPECT_EQ(written(*pool, keep), (std::vector<uint32_t>{4, 3}));
    EXPECT_EQ(pool->validate(), "");
  }
}

// Another sequence freed between prepare and commit: the planned ones are
// looked up again, and still committed.
TEST(PlanCommit, AnotherSequenceFreedStillCommitsThePlannedOnes) {
  auto pool = Pool::create(test::manager_options(4, 16));
  SeqId a = pool->seq_create({}), b = pool->seq_create({}), other = pool->seq_create({});
  append(*pool, a, iota_tokens(5, 1));
  append(*pool, b, iota_tokens(9, 50));
  append(*pool, other, iota_tokens(3, 90));
  auto step = plan(pool, {b, a}, {9, 5});
  pool->free(other);
  SeqId again = pool->seq_create({});  // reuses other's slot
  EXPECT_EQ(slot_of(again), slot_of(other));
  step->commit();
  EXPECT_EQ(computed(*pool, a), 5u);
  EXPECT_EQ(computed(*pool, b), 9u);
  EXPECT_EQ(pool->validate(), "");
}

// Truncated (writes_epoch) or grown (its query block no longer the same
// after a copy-on-write) between prepare and commit: skipped.
TEST(PlanCommit, TruncatedOrCopiedSequencesAreSkipped) {
  auto pool = Pool::create(test::manager_options(4, 16));
  SeqId a = pool->seq_create({}), b = pool->seq_create({});
  append(*pool, a, iota_tokens(6, 1));
  append(*pool, b, iota_tokens(6, 40));
  auto step = plan(pool, {a, b}, {6, 6});
  pool->truncate(a, 5);
  SeqId child = pool->fork(b);  // b's tail is shared now: its next append copies block 1
  append(*pool, b, {77});
  step->commit();
  EXPECT_EQ(computed(*pool, a), 0u);
  EXPECT_EQ(written(*pool, a), (std::vector<uint32_t>{0, 0}));
  // b's block 0 is still its own: marked; block 1 was copied: not marked,
  // so b counts 4 tokens computed.
  EXPECT_EQ(computed(*pool, b), 4u);
  EXPECT_EQ(written(*pool, b), (std::vector<uint32_t>{4, 0}));
  // The child holds b's old blocks: block 0 counts, the old block 1 (which
  // b's table no longer names) was not marked.
  EXPECT_EQ(written(*pool, child), (std::vector<uint32_t>{4, 0}));
  EXPECT_EQ(pool->validate(), "");
}

// A prepare that fails (an id stale, given twice, an unwritten context)
// changes nothing: counts, tables and later plans are as without it.
TEST(PlanCommit, FailedPrepareChangesNothing) {
  for (bool persistent : {false, true}) {
    auto pool = Pool::create(test::manager_options(4, 64));
    std::vector<SeqId> ids;
    for (int i = 0; i < 5; ++i) {
      ids.push_back(pool->seq_create({}));
      append(*pool, ids.back(), iota_tokens(5 + i, 10 * i));
    }
    std::vector<uint32_t> all(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) all[i] = uint32_t(5 + i);
    plan(pool, ids, all, persistent)->commit();
    const std::vector<int32_t> toks(ids.size(), 7);
    pool->append_batch(ids.data(), toks.data(), ids.size());
    const std::vector<uint32_t> ones(ids.size(), 1);
    const auto before = [&] {
      std::vector<uint64_t> v;
      for (SeqId id : ids) {
        const SeqInfo in = pool->seq_info(id);
        v.insert(v.end(), {in.num_tokens, in.num_computed_tokens, in.num_blocks});
      }
      return v;
    }();
    // Stale: the last id freed.
    SeqId gone = pool->seq_create({});
    append(*pool, gone, {1, 2});
    pool->free(gone);
    std::vector<SeqId> bad = ids;
    bad.push_back(gone);
    std::vector<uint32_t> q = ones;
    q.push_back(1);
    EXPECT_THROW(plan(pool, bad, q, persistent), Error);
    // Given twice.
    bad = ids;
    bad.push_back(ids[1]);
    EXPECT_THROW(plan(pool, bad, q, persistent), Error);
    // Unwritten context: ids[3] has an uncomputed token before its query.
    append(*pool, ids[3], {8});
    try {
      plan(pool, ids, ones, persistent);
      FAIL() << "a query over an unwritten slot";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidState);
    }
    pool->truncate(ids[3], pool->seq_info(ids[3]).num_tokens - 1);
    std::vector<uint64_t> after;
    for (SeqId id : ids) {
      const SeqInfo in = pool->seq_info(id);
      after.insert(after.end(), {in.num_tokens, in.num_computed_tokens, in.num_blocks});
    }
    EXPECT_EQ(after, before);
    // The next plan equals one built from scratch and commits every query.
    auto next = plan(pool, ids, ones, persistent);
    auto memo = pool->swap_last_plan_for_testing(nullptr);
    auto scratch = plan(pool, ids, ones);
    pool->swap_last_plan_for_testing(memo);
    const PlanView& x = next->host_view();
    const PlanView& y = scratch->host_view();
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(x.slot_mapping[i], y.slot_mapping[i]);
      EXPECT_EQ(x.context_lens[i], y.context_lens[i]);
      const int32_t n = y.page_indptr[i + 1] - y.page_indptr[i];
      for (int32_t j = 0; j < n; ++j)
        EXPECT_EQ(x.page_indices[x.page_indptr[i] + j], y.page_indices[y.page_indptr[i] + j]);
    }
    scratch->abort();
    next->commit();
    for (SeqId id : ids) EXPECT_EQ(computed(*pool, id), pool->seq_info(id).num_tokens);
    EXPECT_EQ(pool->validate(), "");
  }
}

// Random steps with changes between prepare and commit: every sequence
// planned and untouched until the commit counts all its tokens; a freed,
// truncated or changed one counts no more than its written slots
// (validate); a sequence created in between counts nothing.
TEST(PlanCommit, RandomChangesBetweenPrepareAndCommit) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937 rng(seed);
    auto pool = Pool::create(test::manager_options(4, 4000));
    std::vector<SeqId> live;
    const auto add = [&] {
      SeqId id = pool->seq_create({});
      std::vector<int32_t> prompt(1 + rng() % 20);
      for (auto& x : prompt) x = int32_t(rng() % 40);
      pool->match_prefix(id, prompt.data(), prompt.size());
      const uint64_t hit = pool->seq_info(id).num_tokens;
      append(*pool, id, std::vector<int32_t>(prompt.begin() + long(hit), prompt.end()));
      live.push_back(id);
    };
    for (int i = 0; i < 16; ++i) add();
    for (int round = 0; round < 300; ++round) {
      std::vector<int32_t> toks(live.size());
      for (auto& x : toks) x = int32_t(rng() % 40);
      pool->append_batch(live.data(), toks.data(), live.size());
      std::vector<uint32_t> q(live.size());
      std::map<SeqId, uint64_t> end;
      for (size_t i = 0; i < live.size(); ++i) {
        const SeqInfo in = pool->seq_info(live[i]);
        q[i] = uint32_t(std::max<uint64_t>(1, in.num_tokens - in.num_computed_tokens));
        end[live[i]] = in.num_tokens;
      }
      auto step = plan(pool, live, q, rng() % 2);
      std::vector<SeqId> touched, born;
      const uint32_t changes = rng() % 3;
      for (uint32_t c = 0; c < changes; ++c) {
        const uint32_t r = rng() % 4;
        const size_t k = rng() % live.size();
        if (r == 0 && live.size() > 4) {
          touched.push_back(live[k]);
          pool->free(live[k]);
          live.erase(live.begin() + long(k));
          add();  // often in the freed slot
          born.push_back(live.back());
        } else if (r == 1) {
          const uint64_t n = pool->seq_info(live[k]).num_tokens;
          if (n > 1) pool->truncate(live[k], n - 1 - rng() % std::min<uint64_t>(n - 1, 5));
          touched.push_back(live[k]);
        } else if (r == 2 && live.size() < 40) {
          live.push_back(pool->fork(live[k]));
          born.push_back(live.back());
          touched.push_back(live[k]);
        } else {
          append(*pool, live[k], {int32_t(rng() % 40)});
          touched.push_back(live[k]);
        }
      }
      step->commit();
      ASSERT_EQ(pool->validate(), "") << "seed " << seed << " round " << round;
      for (SeqId id : live) {
        const bool untouched = std::find(touched.begin(), touched.end(), id) == touched.end();
        const bool new_here = std::find(born.begin(), born.end(), id) != born.end();
        if (untouched && !new_here)
          EXPECT_EQ(computed(*pool, id), end[id]) << "seed " << seed << " round " << round;
      }
      // Uncomputed tokens of changed sequences are computed by the next
      // step (every uncomputed token is a query there).
    }
  }
}

}  // namespace
}  // namespace pagedkv
