// What a persistent multi-group plan rewrites (group_plan_table.h): in a
// decode loop, only the rows of sequences whose table of that group
// changed since the last plan, checked through the C++ core.
#include <gtest/gtest.h>

#include <vector>

#include "group_plan.h"
#include "kv_groups.h"

namespace pagedkv {
namespace {

GroupSpec spec(GroupKind kind, uint32_t window = 0) {
  GroupSpec g;
  g.kind = kind;
  g.num_kv_heads = 1;
  g.head_dim = 8;
  g.sliding_window = window;
  if (kind == GroupKind::kRecurrent) g.state_bytes = 64;
  return g;
}

TEST(GroupTableRows, DecodeRewritesOnlyRowsThatChanged) {
  constexpr uint32_t kBs = 4, kSeqs = 8;
  PoolOptions o;
  o.block_size = kBs;
  o.num_blocks = 256;
  o.enable_prefix_caching = false;  // no snapshots: a recurrent slot never moves
  auto pool = GroupPool::create(
      o, {spec(GroupKind::kFull), spec(GroupKind::kSlidingWindow, 6), spec(GroupKind::kRecurrent)});
  std::vector<SeqId> seqs;
  std::vector<uint32_t> q;
  for (uint32_t i = 0; i < kSeqs; ++i) {
    seqs.push_back(pool->seq_create(SeqOptions{}));
    std::vector<int32_t> t(5 + i, int32_t(i + 1));
    pool->append(seqs.back(), t.data(), t.size(), 0);
    q.push_back(uint32_t(t.size()));
  }
  GroupBatch::prepare(pool, seqs.data(), q.data(), kSeqs)->commit();  // CSR, computes all
  std::vector<uint64_t> n(kSeqs);
  for (uint32_t i = 0; i < kSeqs; ++i) n[i] = 5 + i;
  uint64_t full_total = 0;
  for (int step = 0; step < 24; ++step) {
    std::vector<uint32_t> ones(kSeqs, 1);
    uint32_t grew = 0, released = 0;
    for (uint32_t i = 0; i < kSeqs; ++i) {
      const int32_t tok = 7;
      const uint64_t n0 = n[i];
      pool->append(seqs[i], &tok, 1, 0);
      ++n[i];
      grew += (n[i] - 1) % kBs == 0;  // a new page
      // The window (6) of the new token at n0 releases a block when its
      // first key crosses a block boundary: (n0 + 1 - 6) % 4 == 0.
      released += n0 + 1 > 6 && (n0 + 1 - 6) % kBs == 0;
    }
    auto plan = GroupBatch::prepare(pool, seqs.data(), ones.data(), kSeqs, true);
    for (uint32_t g = 0; g < 3; ++g) {
      int32_t src[64], dst[64];
      pool->take_copies(g, src, dst, 64);
    }
    if (step == 0) {
      // A new table: every row of every group.
      for (uint32_t g = 0; g < 3; ++g) EXPECT_EQ(plan->rows_rewritten(g), kSeqs) << g;
    } else {
      EXPECT_EQ(plan->rows_rewritten(0), grew) << "step " << step;
      EXPECT_LE(plan->rows_rewritten(1), grew + released) << "step " << step;
      EXPECT_GE(plan->rows_rewritten(1), grew) << "step " << step;
      EXPECT_EQ(plan->rows_rewritten(2), 0u) << "step " << step;  // the slot stays
      full_total += plan->rows_rewritten(0);
    }
    plan->commit();
  }
  // One row in four per step (a page every block_size tokens), not all.
  EXPECT_EQ(full_total, 23u * kSeqs / kBs);
  EXPECT_EQ(pool->check(), "");
}

}  // namespace
}  // namespace pagedkv
