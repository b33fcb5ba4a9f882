// The decode lane (Pool::DecodeMemo, step_plan_steady.cpp): a steady step
// whose every sequence is as the last steady step and its commit left it
// plans from the lane without reading the sequences. These tests pin down
// when a step may do so (only reads, event drains, the step's own layer
// writes and attention ran in between) and that any other call in between
// sends the next step back to reading every sequence. Every step is
// checked against the same appends and plan made by the general calls on a
// twin pool, and Pool::validate() checks the lane against the sequences
// whenever it stands.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kv_pool.h"
#include "step_plan.h"
#include "test_util.h"

namespace pagedkv {
namespace {

using test::append;
using test::iota_tokens;

constexpr uint32_t kDim = 8;

// Two pools fed the same calls: `fused` decodes with prepare_decode, `ref`
// with append_batch then prepare.
struct Twin {
  std::shared_ptr<Pool> fused, ref;
  std::vector<SeqId> ids[2];
  uint32_t step_no = 0;

  explicit Twin(const PoolOptions& o) : fused(Pool::create(o)), ref(Pool::create(o)) {}

  std::shared_ptr<Pool>& pool(int k) { return k == 0 ? fused : ref; }

  // lookahead: blocks appended ahead, which later steps enter without
  // opening them.
  void add(size_t n, int32_t first, uint32_t lookahead = 0) {
    for (int k = 0; k < 2; ++k) {
      const SeqId s = pool(k)->seq_create({});
      append(*pool(k), s, iota_tokens(n, first), lookahead);
      compute_rest(pool(k), s);
      ids[k].push_back(s);
    }
  }

  // Every layer's K/V, for a pool with storage (the last write commits).
  static void write_layers(Batch& b, const Pool& p, uint32_t n, uint32_t seed) {
    for (uint32_t l = 0; l < p.options().num_layers; ++l) {
      auto k = test::random_floats(size_t(n) * kDim, seed + l);
      auto v = test::random_floats(size_t(n) * kDim, seed + 100 + l);
      TensorArg kt = test::rows(k, n, 1, kDim), vt = test::rows(v, n, 1, kDim);
      b.write(l, &kt, &vt, nullptr);
      auto q = test::random_floats(size_t(n) * kDim, seed + 200 + l);
      std::vector<float> out(size_t(n) * kDim);
      TensorArg qt = test::rows(q, n, 1, kDim), ot = test::rows(out, n, 1, kDim);
      b.attend(l, &qt, &ot, nullptr, AttentionParams{}, nullptr);
    }
  }

  // A step over what s has not computed, committed (storage: by writing
  // every layer).
  static void compute_rest(const std::shared_ptr<Pool>& p, SeqId s) {
    const SeqInfo i = p->seq_info(s);
    const uint32_t q = uint32_t(i.num_tokens - i.num_computed_tokens);
    if (q == 0) return;
    auto b = Batch::prepare(p, &s, &q, 1, nullptr);
    if (p->has_storage())
      write_layers(*b, *p, q, 5);
    else
      b->commit();
  }

  // One decode step over every sequence on both pools; returns whether the
  // fused pool's step came from the lane.
  bool step() {
    ++step_no;
    const uint32_t m = uint32_t(ids[0].size());
    std::vector<int32_t> toks(m);
    for (uint32_t i = 0; i < m; ++i) toks[i] = int32_t(step_no * 31 + i * 7) % 5000;
    const bool storage = fused->has_storage();
    auto f = Batch::prepare_decode(fused, ids[0].data(), toks.data(), m, nullptr, step_no % 3 != 0);
    const bool lane = f->lane_for_testing();
    ref->append_batch(ids[1].data(), toks.data(), m);
    std::vector<uint32_t> ones(m, 1);
    auto r = Batch::prepare(ref, ids[1].data(), ones.data(), m, nullptr, step_no % 3 != 0);
    const PlanView& x = f->host_view();
    const PlanView& y = r->host_view();
    EXPECT_EQ(f->info().num_pages, r->info().num_pages);
    for (uint32_t i = 0; i < m; ++i) {
      EXPECT_EQ(x.slot_mapping[i], y.slot_mapping[i]) << "step " << step_no << " seq " << i;
      EXPECT_EQ(x.context_lens[i], y.context_lens[i]) << "step " << step_no;
      EXPECT_EQ(x.last_page_len[i], y.last_page_len[i]) << "step " << step_no;
      EXPECT_EQ(x.page_indptr[i + 1], y.page_indptr[i + 1]) << "step " << step_no;
    }
    for (uint64_t k = 0; k < f->info().num_pages; ++k)
      EXPECT_EQ(x.page_indices[k], y.page_indices[k]) << "step " << step_no << " page " << k;
    if (storage) {
      write_layers(*f, *fused, m, step_no);
      write_layers(*r, *ref, m, step_no);
      EXPECT_TRUE(f->committed());
    } else {
      f->commit();
      r->commit_general_for_testing();
    }
    f.reset();
    r.reset();
    check();
    return lane;
  }

  void check() {
    EXPECT_EQ(fused->validate(), "");
    EXPECT_EQ(ref->validate(), "");
    for (size_t i = 0; i < ids[0].size(); ++i) {
      EXPECT_EQ(test::table(*fused, ids[0][i]), test::table(*ref, ids[1][i])) << i;
      const SeqInfo a = fused->seq_info(ids[0][i]), b = ref->seq_info(ids[1][i]);
      EXPECT_EQ(a.num_tokens, b.num_tokens) << i;
      EXPECT_EQ(a.num_computed_tokens, b.num_computed_tokens) << i;
    }
    EXPECT_EQ(test::drain(*fused).size(), test::drain(*ref).size());
  }
};

void lane_survives_reads_and_ends_at_changes(const PoolOptions& o) {
  Twin t(o);
  for (int i = 0; i < 5; ++i) t.add(3 + 5 * size_t(i), 100 * i, i == 3 ? 9 : 0);
  EXPECT_FALSE(t.step());  // no lane yet: the sequences are read
  // Steps crossing several blocks (block size 4): every step after the
  // first plans from the lane, though the test reads the pools (infos,
  // tables, stats, events, validate) between steps.
  for (int s = 0; s < 12; ++s) EXPECT_TRUE(t.step()) << "step " << s;
  // Each call that changes a sequence, even one outside the batch, ends
  // the lane for one step; the step after it has one again.
  SeqId other[2];
  for (int k = 0; k < 2; ++k) other[k] = t.pool(k)->seq_create({});
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
  const int32_t tok = 9;
  for (int k = 0; k < 2; ++k) t.pool(k)->append(other[k], &tok, 1, 0);
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
  for (int k = 0; k < 2; ++k) t.pool(k)->free(other[k]);
  EXPECT_FALSE(t.step());  // a free also moves every id's memo
  EXPECT_TRUE(t.step());
  // A fork of a batch sequence shares its tail: no steady step, no lane.
  SeqId child[2];
  for (int k = 0; k < 2; ++k) child[k] = t.pool(k)->fork(t.ids[k][1]);
  EXPECT_FALSE(t.step());
  for (int k = 0; k < 2; ++k) t.pool(k)->free(child[k]);
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
  // A truncate of a batch sequence (its step recomputed on both twins).
  for (int k = 0; k < 2; ++k) {
    t.pool(k)->truncate(t.ids[k][2], t.pool(k)->seq_info(t.ids[k][2]).num_tokens - 1);
    Twin::compute_rest(t.pool(k), t.ids[k][2]);
  }
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
  // A step aborted: its tokens stay uncomputed, so no lane after it.
  {
    const uint32_t m = uint32_t(t.ids[0].size());
    std::vector<int32_t> toks(m, 1);
    auto f = Batch::prepare_decode(t.fused, t.ids[0].data(), toks.data(), m, nullptr, true);
    EXPECT_TRUE(f->lane_for_testing());
    f->abort();
    f.reset();
    t.ref->append_batch(t.ids[1].data(), toks.data(), m);
    for (int k = 0; k < 2; ++k)
      for (SeqId s : t.ids[k]) Twin::compute_rest(t.pool(k), s);
  }
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
  // A second commit, and a refused abort after the commit (what a `with`
  // block's exit does), change nothing: the lane stays.
  {
    const uint32_t m = uint32_t(t.ids[0].size());
    std::vector<int32_t> toks(m, 2);
    auto f = Batch::prepare_decode(t.fused, t.ids[0].data(), toks.data(), m, nullptr, false);
    EXPECT_TRUE(f->lane_for_testing());
    if (t.fused->has_storage())
      Twin::write_layers(*f, *t.fused, m, 77);
    else
      f->commit();
    f->commit();
    EXPECT_EQ(test::code_of([&] { f->abort(); }), Errc::kInvalidState);
    f.reset();
    t.ref->append_batch(t.ids[1].data(), toks.data(), m);
    for (SeqId s : t.ids[1]) Twin::compute_rest(t.ref, s);
  }
  t.check();
  EXPECT_TRUE(t.step());
}

TEST(PlanLane, ManagerOnlyPool) {
  lane_survives_reads_and_ends_at_changes(test::manager_options(4, 256));
}

TEST(PlanLane, StoragePoolKeepsItThroughLayerWritesAndAttention) {
  PoolOptions o = test::storage_options(4, 256, kDim);
  o.num_layers = 2;
  lane_survives_reads_and_ends_at_changes(o);
}

// Another plan's commit counts tokens of its sequences: the lane ends.
// Dropping a plan that is already committed changes nothing and keeps it;
// dropping an open one on a manager-only pool commits it (ABI 1) and ends
// it.
TEST(PlanLane, AnotherPlansCommitEndsItButDroppingACommittedPlanDoesNot) {
  Twin t(test::manager_options(4, 256));
  for (int i = 0; i < 3; ++i) t.add(6 + size_t(i), 50 * i);
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
  std::unique_ptr<Batch> old[2];
  SeqId extra[2];
  const uint32_t q = 5;
  for (int k = 0; k < 2; ++k) {
    extra[k] = t.pool(k)->seq_create({});
    append(*t.pool(k), extra[k], iota_tokens(5, 1));
    old[k] = Batch::prepare(t.pool(k), &extra[k], &q, 1, nullptr);
  }
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
  for (auto& b : old) b->commit();
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
  for (auto& b : old) b.reset();  // committed already
  EXPECT_TRUE(t.step());
  const uint32_t two = 2;
  for (int k = 0; k < 2; ++k) {
    append(*t.pool(k), extra[k], iota_tokens(2, 9));
    old[k] = Batch::prepare(t.pool(k), &extra[k], &two, 1, nullptr);
  }
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
  for (auto& b : old) b.reset();  // open: commits (ABI 1)
  EXPECT_FALSE(t.step());
  EXPECT_TRUE(t.step());
}

// An engine that drops each step's plan only after preparing the next
// (double buffering) keeps the lane from step to step.
TEST(PlanLane, DroppingThePreviousPlanAfterTheNextPrepareKeepsIt) {
  auto pool = Pool::create(test::manager_options(4, 256));
  std::vector<SeqId> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(pool->seq_create({}));
    append(*pool, ids.back(), iota_tokens(5 + size_t(i), 10 * i));
    Twin::compute_rest(pool, ids.back());
  }
  std::unique_ptr<Batch> prev;
  size_t lanes = 0;
  for (int step = 0; step < 20; ++step) {
    std::vector<int32_t> toks(ids.size(), step);
    auto b =
        Batch::prepare_decode(pool, ids.data(), toks.data(), uint32_t(ids.size()), nullptr, true);
    EXPECT_EQ(b->lane_for_testing(), step >= 1) << step;
    lanes += b->lane_for_testing();
    b->commit();
    prev = std::move(b);  // the step before's plan goes now
    EXPECT_EQ(pool->validate(), "");
  }
  EXPECT_EQ(lanes, 19u);
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(pool->seq_info(ids[i]).num_computed_tokens, 5 + i + 20);
}

}  // namespace
}  // namespace pagedkv
