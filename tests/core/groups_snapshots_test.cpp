// Recurrent state snapshots at every block boundary inside a query chunk
// (PKV_GROUP_SNAPSHOT_EVERY_BLOCK, PKV_PLAN_SNAPSHOT_*), through the C ABI.
// The engine owns the recurrent storage: modelled here as bytes per block id
// per group, written only where the plan says (the live slot gets the state
// after the chunk, each snapshot slot the state after its query row) and
// copied where pkv_pool_group_take_copies says. A state is random bytes per
// (group, prompt position), so a hit serving a state from the wrong position
// or an unwritten slot fails the byte comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kBs = 8;
using Bytes = std::vector<uint8_t>;

void ok(pkv_status s, const char* what) {
  ASSERT_EQ(s, PKV_OK) << what << ": " << pkv_last_error_message();
}

pkv_kv_group_spec spec(uint32_t kind, uint32_t flags = 0) {
  pkv_kv_group_spec g;
  pkv_kv_group_spec_init(&g);
  g.kind = kind;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  if (kind == PKV_GROUP_SLIDING_WINDOW) g.sliding_window = 3 * kBs;
  if (kind == PKV_GROUP_RECURRENT) g.state_bytes = 32;
  g.flags = flags;
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

template <class T>
std::vector<T> plan_array(const pkv_batch* b, uint32_t g, uint32_t which) {
  pkv_tensor t;
  EXPECT_EQ(pkv_batch_plan_tensor_group(b, g, which, &t), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(t.ndim, 1);
  EXPECT_EQ(t.dtype,
            which == PKV_PLAN_SNAPSHOT_ROWS ? uint32_t(PKV_DTYPE_I64) : uint32_t(PKV_DTYPE_I32));
  const T* d = reinterpret_cast<const T*>(static_cast<const char*>(t.data) + t.byte_offset);
  return std::vector<T>(d, d + t.shape[0]);
}

std::vector<int32_t> group_table(pkv_pool* p, pkv_seq_id s, uint32_t g) {
  uint64_t n = 0;
  pkv_seq_group_block_table(p, s, g, nullptr, 0, &n);
  std::vector<int32_t> t(n);
  EXPECT_EQ(pkv_seq_group_block_table(p, s, g, t.data(), n, &n), PKV_OK);
  return t;
}

pkv_pool_stats stats(pkv_pool* p) {
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  EXPECT_EQ(pkv_pool_get_stats(p, &st), PKV_OK);
  return st;
}

uint64_t cached_in(pkv_pool* p, uint32_t g) {
  pkv_group_stats st;
  pkv_group_stats_init(&st);
  EXPECT_EQ(pkv_pool_group_stats(p, g, &st), PKV_OK);
  return st.num_cached_blocks;
}

struct Engine {
  std::vector<pkv_kv_group_spec> groups;
  std::mt19937 rng;
  std::map<std::pair<uint32_t, uint64_t>, Bytes> truth;   // (group, position) -> state after it
  std::map<std::pair<uint32_t, int32_t>, Bytes> storage;  // (group, block) -> bytes held

  // The state of group g after the prompt's first pos tokens (prompts here
  // share one token stream, so equal positions are equal prefixes).
  const Bytes& state_at(uint32_t g, uint64_t pos) {
    Bytes& b = truth[{g, pos}];
    if (b.empty()) {
      b.resize(groups[g].state_bytes);
      for (auto& x : b) x = uint8_t(rng());
    }
    return b;
  }
  void run_copies(pkv_pool* p) {
    for (uint32_t g = 0; g < groups.size(); ++g) {
      std::vector<int32_t> src(256), dst(256);
      uint64_t n = 0;
      ok(pkv_pool_group_take_copies(p, g, src.data(), dst.data(), 256, &n), "take_copies");
      for (uint64_t i = 0; i < n; ++i) {
        auto it = storage.find({g, src[i]});
        if (it == storage.end())
          storage.erase({g, dst[i]});
        else
          storage[{g, dst[i]}] = it->second;
      }
    }
  }
  // Runs one step of `seqs` (ids, their lengths, query counts) and commits
  // it (or not): writes each live state slot and every snapshot slot the
  // plan names. Returns the snapshots' (group, block, position).
  struct Snap {
    uint32_t g;
    int32_t block;
    uint64_t pos;
  };
  std::vector<Snap> step(pkv_pool* p, const std::vector<pkv_seq_id>& ids,
                         const std::vector<uint64_t>& lens, const std::vector<uint32_t>& qs,
                         bool commit) {
    std::vector<Snap> out;
    pkv_batch* b = nullptr;
    EXPECT_EQ(pkv_batch_prepare(p, ids.data(), qs.data(), uint32_t(ids.size()), nullptr, &b),
              PKV_OK)
        << pkv_last_error_message();
    if (!b) return out;
    run_copies(p);
    pkv_tensor pt;
    EXPECT_EQ(pkv_batch_token_positions(b, &pt), PKV_OK);
    const int64_t* pos = static_cast<const int64_t*>(pt.data);
    for (uint32_t g = 0; g < groups.size(); ++g) {
      if (groups[g].kind != PKV_GROUP_RECURRENT) continue;
      const auto slots = plan_array<int32_t>(b, g, PKV_PLAN_PAGE_INDICES);
      const auto ptr = plan_array<int32_t>(b, g, PKV_PLAN_SNAPSHOT_INDPTR);
      const auto rows = plan_array<int64_t>(b, g, PKV_PLAN_SNAPSHOT_ROWS);
      const auto blocks = plan_array<int32_t>(b, g, PKV_PLAN_SNAPSHOT_BLOCKS);
      EXPECT_EQ(ptr.size(), ids.size() + 1);
      EXPECT_EQ(rows.size(), size_t(ptr.back()));
      EXPECT_EQ(blocks.size(), rows.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        storage[{g, slots[i]}] = state_at(g, lens[i]);
        for (int32_t j = ptr[i]; j < ptr[i + 1]; ++j) {
          const uint64_t after = uint64_t(pos[rows[j]]) + 1;  // tokens the state holds
          EXPECT_EQ(after % kBs, 0u) << "a snapshot row must end a block";
          EXPECT_NE(blocks[j], slots[i]);
          storage[{g, blocks[j]}] = state_at(g, after);
          out.push_back({g, blocks[j], after});
        }
      }
    }
    if (commit) ok(pkv_batch_commit(b), "commit");
    pkv_batch_destroy(b);
    return out;
  }
};

std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % 50000);
  return t;
}

// A long prompt prefilled in a few chunks, the first recurrent group taking
// snapshots at every block boundary and the second (when present) only where
// appends start; a second request sharing a random prefix hits exactly the
// last boundary every group can serve, and its state copy holds the bytes the
// engine wrote for that position.
TEST(GroupSnapshots, HitAtEveryBoundaryInsideAChunk) {
  std::mt19937 rng(20261124);
  int hits = 0, inside = 0;  // trials hitting, and hitting inside a chunk
  for (int trial = 0; trial < 40; ++trial) {
    const bool two_states = trial % 2 == 1, window = trial % 4 >= 2;
    Engine eng;
    eng.rng.seed(rng());
    eng.groups = {spec(PKV_GROUP_FULL), spec(PKV_GROUP_RECURRENT, PKV_GROUP_SNAPSHOT_EVERY_BLOCK)};
    if (two_states) eng.groups.push_back(spec(PKV_GROUP_RECURRENT));
    if (window) eng.groups.push_back(spec(PKV_GROUP_SLIDING_WINDOW));
    pkv_pool* p = make_pool(eng.groups, 1024);
    const uint64_t n = 40 + rng() % 300;
    const std::vector<int32_t> prompt = random_tokens(rng, n);
    // Chunk ends: one chunk on even trials, up to three otherwise.
    std::vector<uint64_t> ends;
    if (trial % 3 != 0)
      for (int k = 0; k < 2; ++k) ends.push_back(1 + rng() % (n - 1));
    ends.push_back(n);
    std::sort(ends.begin(), ends.end());
    ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
    pkv_seq_id a = 0;
    ok(pkv_seq_create(p, nullptr, &a), "create a");
    // What a user expects: per recurrent group, the positions with a state
    // kept. The flagged group: every boundary in (start, end] of a chunk;
    // both: a boundary where an append starts after a committed step.
    std::vector<std::vector<bool>> kept(eng.groups.size(), std::vector<bool>(n / kBs + 1, false));
    uint64_t start = 0;
    for (uint64_t end : ends) {
      ok(pkv_seq_append(p, a, prompt.data() + start, end - start, 0), "append a");
      if (start > 0 && start % kBs == 0)
        for (uint32_t g = 1; g < eng.groups.size(); ++g) kept[g][start / kBs] = true;
      for (uint64_t k = start / kBs + 1; k * kBs <= end; ++k) kept[1][k] = true;
      const auto snaps = eng.step(p, {a}, {end}, {uint32_t(end - start)}, true);
      uint64_t want = 0;
      for (uint64_t k = start / kBs + 1; k * kBs <= end; ++k) ++want;
      EXPECT_EQ(snaps.size(), want) << "chunk [" << start << ", " << end << ")";
      start = end;
    }
    ok(pkv_pool_validate(p), "validate");
    EXPECT_EQ(cached_in(p, 1), n / kBs);  // one snapshot per boundary, none twice
    // The second request: a random shared prefix, then other tokens.
    const uint64_t shared = 1 + rng() % n;
    std::vector<int32_t> b_prompt(prompt.begin(), prompt.begin() + shared);
    const uint64_t extra = 1 + rng() % 40;
    for (uint64_t i = 0; i < extra; ++i) b_prompt.push_back(int32_t(50000 + rng() % 1000));
    uint64_t expect = 0;  // blocks
    const uint64_t cap = std::min<uint64_t>(shared / kBs, (b_prompt.size() - 1) / kBs);
    for (uint64_t k = cap; k > 0 && expect == 0; --k) {
      bool all = true;
      for (uint32_t g = 1; g < eng.groups.size(); ++g)
        if (eng.groups[g].kind == PKV_GROUP_RECURRENT) all = all && kept[g][k];
      if (all) expect = k;
    }
    pkv_seq_id b = 0;
    uint64_t hit = 0;
    ok(pkv_seq_create(p, nullptr, &b), "create b");
    ok(pkv_seq_match_prefix(p, b, b_prompt.data(), b_prompt.size(), &hit), "match b");
    ASSERT_EQ(hit, expect * kBs) << "trial " << trial << " n " << n << " shared " << shared;
    hits += hit > 0;
    inside += hit > 0 && std::find(ends.begin(), ends.end(), hit) == ends.end();
    ok(pkv_seq_append(p, b, b_prompt.data() + hit, b_prompt.size() - hit, 0), "append b");
    // Its first append copies the hit's snapshot into its new live slot.
    for (uint32_t g = 0; g < eng.groups.size(); ++g) {
      if (eng.groups[g].kind != PKV_GROUP_RECURRENT) continue;
      std::vector<int32_t> src(8), dst(8);
      uint64_t c = 0;
      ok(pkv_pool_group_take_copies(p, g, src.data(), dst.data(), 8, &c), "take b");
      ASSERT_EQ(c, hit > 0 ? 1u : 0u);
      if (c == 0) continue;
      EXPECT_EQ(dst[0], group_table(p, b, g).at(0));
      const auto it = eng.storage.find({g, src[0]});
      ASSERT_NE(it, eng.storage.end()) << "hit on a snapshot slot nothing wrote";
      EXPECT_EQ(it->second, eng.truth.at({g, hit})) << "group " << g << " at " << hit;
    }
    ok(pkv_pool_validate(p), "validate b");
    pkv_pool_destroy(p);
  }
  EXPECT_GE(hits, 20);  // the trials exercise hits, most inside a chunk
  EXPECT_GE(inside, 10);
}

// A plan's snapshot slots: taken at prepare from the free blocks, returned by
// abort (never hittable), cached when the plan is destroyed uncommitted
// (which counts as committed, as ABI 1).
TEST(GroupSnapshots, AbortFreesAndDestroyKeeps) {
  std::mt19937 rng(7);
  Engine eng;
  eng.rng.seed(rng());
  eng.groups = {spec(PKV_GROUP_FULL), spec(PKV_GROUP_RECURRENT, PKV_GROUP_SNAPSHOT_EVERY_BLOCK)};
  pkv_pool* p = make_pool(eng.groups, 256);
  const uint64_t n = 20 * kBs + 5;
  const auto prompt = random_tokens(rng, n);
  pkv_seq_id a = 0;
  ok(pkv_seq_create(p, nullptr, &a), "create");
  ok(pkv_seq_append(p, a, prompt.data(), n, 0), "append");
  const uint64_t free0 = stats(p).num_free_blocks;
  const pkv_seq_id ids[1] = {a};
  const uint32_t qs[1] = {uint32_t(n)};
  pkv_batch* b = nullptr;
  ok(pkv_batch_prepare(p, ids, qs, 1, nullptr, &b), "prepare");
  const auto blocks = plan_array<int32_t>(b, 1, PKV_PLAN_SNAPSHOT_BLOCKS);
  ASSERT_EQ(blocks.size(), 20u);
  EXPECT_EQ(stats(p).num_free_blocks, free0 - 20);
  ok(pkv_pool_validate(p), "validate open");
  ok(pkv_batch_abort(b), "abort");
  EXPECT_EQ(stats(p).num_free_blocks, free0);
  EXPECT_EQ(cached_in(p, 1), 0u);
  // Arrays stay readable until destroy.
  EXPECT_EQ(plan_array<int32_t>(b, 1, PKV_PLAN_SNAPSHOT_BLOCKS), blocks);
  pkv_batch_destroy(b);
  ok(pkv_pool_validate(p), "validate aborted");
  // Nothing to hit: the full group holds the blocks, no state was kept.
  pkv_seq_id c = 0;
  uint64_t hit = 0;
  ok(pkv_seq_create(p, nullptr, &c), "create c");
  ok(pkv_seq_match_prefix(p, c, prompt.data(), n, &hit), "match c");
  EXPECT_EQ(hit, 0u);
  ok(pkv_seq_free(p, c), "free c");
  // The same step again, destroyed without commit or abort: kept.
  b = nullptr;
  ok(pkv_batch_prepare(p, ids, qs, 1, nullptr, &b), "prepare 2");
  eng.run_copies(p);
  pkv_batch_destroy(b);
  EXPECT_EQ(cached_in(p, 1), 20u);
  EXPECT_EQ(stats(p).num_free_blocks, free0);  // cached snapshots are free (evictable)
  ok(pkv_seq_create(p, nullptr, &c), "create c2");
  ok(pkv_seq_match_prefix(p, c, prompt.data(), n, &hit), "match c2");
  EXPECT_EQ(hit, 20u * kBs);
  ok(pkv_pool_validate(p), "validate kept");
  pkv_pool_destroy(p);
}

// Prepare takes the snapshot slots all or nothing: too few free blocks is
// PKV_E_OUT_OF_BLOCKS and the pool is as before.
TEST(GroupSnapshots, OutOfBlocksChangesNothing) {
  std::mt19937 rng(11);
  const std::vector<pkv_kv_group_spec> groups = {
      spec(PKV_GROUP_FULL), spec(PKV_GROUP_RECURRENT, PKV_GROUP_SNAPSHOT_EVERY_BLOCK)};
  const uint64_t n = 12 * kBs;  // 12 pages + 1 live slot + 12 snapshots
  pkv_pool* p = make_pool(groups, 1 + 12 + 1 + 11);
  const auto prompt = random_tokens(rng, n);
  pkv_seq_id a = 0;
  ok(pkv_seq_create(p, nullptr, &a), "create");
  ok(pkv_seq_append(p, a, prompt.data(), n, 0), "append");
  const pkv_pool_stats before = stats(p);
  const auto t0 = group_table(p, a, 0), t1 = group_table(p, a, 1);
  const pkv_seq_id ids[1] = {a};
  const uint32_t qs[1] = {uint32_t(n)};
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(p, ids, qs, 1, nullptr, &b), PKV_E_OUT_OF_BLOCKS);
  EXPECT_EQ(b, nullptr);
  EXPECT_NE(std::string(pkv_last_error_message()).find("snapshot"), std::string::npos)
      << pkv_last_error_message();
  const pkv_pool_stats after = stats(p);
  EXPECT_EQ(after.num_free_blocks, before.num_free_blocks);
  EXPECT_EQ(after.num_cached_blocks, before.num_cached_blocks);
  EXPECT_EQ(group_table(p, a, 0), t0);
  EXPECT_EQ(group_table(p, a, 1), t1);
  ok(pkv_pool_validate(p), "validate");
  // A chunk of 11 blocks fits: 11 snapshots.
  ok(pkv_seq_free(p, a), "free");
  ok(pkv_seq_create(p, nullptr, &a), "create 2");
  ok(pkv_seq_append(p, a, prompt.data(), 11 * kBs, 0), "append 11");
  const pkv_seq_id ids2[1] = {a};
  const uint32_t q2[1] = {11 * kBs};
  ok(pkv_batch_prepare(p, ids2, q2, 1, nullptr, &b), "prepare 11");
  EXPECT_EQ(plan_array<int32_t>(b, 1, PKV_PLAN_SNAPSHOT_BLOCKS).size(), 11u);
  ok(pkv_batch_commit(b), "commit");
  pkv_batch_destroy(b);
  ok(pkv_pool_validate(p), "validate 11");
  pkv_pool_destroy(p);
}

// One snapshot per hash: two sequences computing the same prompt in one plan
// share the first's, and a prompt whose boundaries are cached gets none.
// Without the flag, or in another kind of group, nothing changes.
TEST(GroupSnapshots, NoDuplicatesAndOptIn) {
  std::mt19937 rng(5);
  Engine eng;
  eng.rng.seed(rng());
  eng.groups = {spec(PKV_GROUP_FULL), spec(PKV_GROUP_RECURRENT, PKV_GROUP_SNAPSHOT_EVERY_BLOCK),
                spec(PKV_GROUP_RECURRENT)};
  pkv_pool* p = make_pool(eng.groups, 512);
  const uint64_t n = 9 * kBs + 3;
  const auto prompt = random_tokens(rng, n);
  pkv_seq_id a = 0, b = 0;
  ok(pkv_seq_create(p, nullptr, &a), "a");
  ok(pkv_seq_create(p, nullptr, &b), "b");
  ok(pkv_seq_append(p, a, prompt.data(), n, 0), "append a");
  ok(pkv_seq_append(p, b, prompt.data(), n, 0), "append b");
  const pkv_seq_id ids[2] = {a, b};
  const uint32_t qs[2] = {uint32_t(n), uint32_t(n)};
  pkv_batch* pl = nullptr;
  ok(pkv_batch_prepare(p, ids, qs, 2, nullptr, &pl), "prepare");
  EXPECT_EQ(plan_array<int32_t>(pl, 1, PKV_PLAN_SNAPSHOT_INDPTR), (std::vector<int32_t>{0, 9, 9}));
  EXPECT_EQ(plan_array<int32_t>(pl, 2, PKV_PLAN_SNAPSHOT_INDPTR), (std::vector<int32_t>{0, 0, 0}));
  EXPECT_TRUE(plan_array<int64_t>(pl, 2, PKV_PLAN_SNAPSHOT_ROWS).empty());
  pkv_tensor t;
  EXPECT_EQ(pkv_batch_plan_tensor_group(pl, 0, PKV_PLAN_SNAPSHOT_INDPTR, &t),
            PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("not PKV_GROUP_RECURRENT"),
            std::string::npos);
  EXPECT_EQ(pkv_batch_plan_tensor_group(pl, 1, 19, &t), PKV_E_INVALID_ARGUMENT);
  const auto rows = plan_array<int64_t>(pl, 1, PKV_PLAN_SNAPSHOT_ROWS);
  for (int64_t k = 0; k < 9; ++k) EXPECT_EQ(rows[size_t(k)], (k + 1) * kBs - 1);
  ok(pkv_batch_commit(pl), "commit");
  pkv_batch_destroy(pl);
  EXPECT_EQ(cached_in(p, 1), 9u);
  EXPECT_EQ(cached_in(p, 2), 0u);
  // A third sequence with the same prompt plus more: only the new boundaries.
  pkv_seq_id c = 0;
  ok(pkv_seq_create(p, nullptr, &c), "c");
  auto longer = prompt;
  const auto more = random_tokens(rng, 2 * kBs);
  longer.insert(longer.end(), more.begin(), more.end());
  ok(pkv_seq_append(p, c, longer.data(), longer.size(), 0), "append c");
  const pkv_seq_id ids3[1] = {c};
  const uint32_t q3[1] = {uint32_t(longer.size())};
  ok(pkv_batch_prepare(p, ids3, q3, 1, nullptr, &pl), "prepare c");
  const auto rows3 = plan_array<int64_t>(pl, 1, PKV_PLAN_SNAPSHOT_ROWS);
  EXPECT_EQ(rows3, (std::vector<int64_t>{10 * kBs - 1, 11 * kBs - 1}));
  ok(pkv_batch_commit(pl), "commit c");
  pkv_batch_destroy(pl);
  ok(pkv_pool_validate(p), "validate");
  // A flag on a group that is not recurrent, or an unknown bit, is refused.
  for (const pkv_kv_group_spec& bad :
       {spec(PKV_GROUP_FULL, PKV_GROUP_SNAPSHOT_EVERY_BLOCK), spec(PKV_GROUP_RECURRENT, 0x2u)}) {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = kBs;
    o.num_blocks = 16;
    const pkv_kv_group_spec g[2] = {spec(PKV_GROUP_FULL), bad};
    pkv_pool* q = nullptr;
    EXPECT_EQ(pkv_pool_create_groups(&o, g, 2, &q), PKV_E_INVALID_ARGUMENT);
    EXPECT_NE(std::string(pkv_last_error_message()).find("groups[1].flags"), std::string::npos)
        << pkv_last_error_message();
    EXPECT_EQ(q, nullptr);
  }
  pkv_pool_destroy(p);
}

// Cached snapshot slots are evictable like any cached block, a sequence's
// deepest first: taking one block more than the uncached free ones evicts
// the last boundary's snapshot, and the next hit stops one block earlier.
TEST(GroupSnapshots, EvictedDeepestFirst) {
  std::mt19937 rng(3);
  Engine eng;
  eng.rng.seed(rng());
  eng.groups = {spec(PKV_GROUP_FULL), spec(PKV_GROUP_RECURRENT, PKV_GROUP_SNAPSHOT_EVERY_BLOCK)};
  pkv_pool* p = make_pool(eng.groups, 128);
  const uint64_t n = 10 * kBs + 1;
  const auto prompt = random_tokens(rng, n);
  pkv_seq_id a = 0;
  ok(pkv_seq_create(p, nullptr, &a), "a");
  ok(pkv_seq_append(p, a, prompt.data(), n, 0), "append a");
  eng.step(p, {a}, {n}, {uint32_t(n)}, true);
  const pkv_pool_stats st = stats(p);
  ASSERT_EQ(cached_in(p, 1), 10u);
  // Another request takes every uncached free block and one more.
  const uint64_t uncached = st.num_free_blocks - 10;
  pkv_seq_id c = 0;
  ok(pkv_seq_create(p, nullptr, &c), "c");
  const auto other = random_tokens(rng, uncached * kBs);  // + its live slot = uncached + 1
  ok(pkv_seq_append(p, c, other.data(), other.size(), 0), "append c");
  EXPECT_EQ(stats(p).num_evictions, 1u);
  EXPECT_EQ(cached_in(p, 1), 9u);
  auto longer = prompt;
  longer.push_back(7);
  pkv_seq_id d = 0;
  uint64_t hit = 0;
  ok(pkv_seq_create(p, nullptr, &d), "d");
  ok(pkv_seq_match_prefix(p, d, longer.data(), longer.size(), &hit), "match d");
  EXPECT_EQ(hit, 9u * kBs);
  ok(pkv_pool_validate(p), "validate");
  pkv_pool_destroy(p);
}

// ABI 1 binaries pass specs without flags: an array of them, stepped by
// their struct_size, still creates the pool (no snapshots at every block).
TEST(GroupSnapshots, AbiOneSpecArrayStillWorks) {
  const size_t v1 = offsetof(pkv_kv_group_spec, flags);
  const pkv_kv_group_spec g[2] = {spec(PKV_GROUP_FULL), spec(PKV_GROUP_RECURRENT)};
  std::vector<unsigned char> old(2 * v1, 0xAB);  // garbage past each old spec
  for (int i = 0; i < 2; ++i) {
    pkv_kv_group_spec c = g[i];
    c.struct_size = uint32_t(v1);
    std::memcpy(old.data() + i * v1, &c, v1);
  }
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 64;
  pkv_pool* p = nullptr;
  ASSERT_EQ(
      pkv_pool_create_groups(&o, reinterpret_cast<const pkv_kv_group_spec*>(old.data()), 2, &p),
      PKV_OK)
      << pkv_last_error_message();
  pkv_group_stats st;
  pkv_group_stats_init(&st);
  ok(pkv_pool_group_stats(p, 1, &st), "group 1");
  EXPECT_EQ(st.kind, uint32_t(PKV_GROUP_RECURRENT));
  std::mt19937 rng(1);
  const auto prompt = random_tokens(rng, 5 * kBs);
  pkv_seq_id a = 0;
  ok(pkv_seq_create(p, nullptr, &a), "create");
  ok(pkv_seq_append(p, a, prompt.data(), prompt.size(), 0), "append");
  const uint32_t q = uint32_t(prompt.size());
  pkv_batch* b = nullptr;
  ok(pkv_batch_prepare(p, &a, &q, 1, nullptr, &b), "prepare");
  EXPECT_EQ(plan_array<int32_t>(b, 1, PKV_PLAN_SNAPSHOT_INDPTR), (std::vector<int32_t>{0, 0}));
  pkv_batch_destroy(b);
  pkv_pool_destroy(p);
}

}  // namespace
