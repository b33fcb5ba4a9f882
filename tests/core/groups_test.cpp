// Multi-group pools (impl/kv_groups.h): one block budget, per-group tables,
// sliding-window release, copy-on-write, and prefix hits checked against an
// independent model of what each block holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "error.h"
#include "kv_groups.h"

namespace pagedkv {
namespace {

GroupSpec full(uint32_t layers = 2) {
  GroupSpec g;
  g.kind = GroupKind::kFull;
  g.num_layers = layers;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  return g;
}

GroupSpec window(uint32_t w, uint32_t layers = 2) {
  GroupSpec g = full(layers);
  g.kind = GroupKind::kSlidingWindow;
  g.sliding_window = w;
  return g;
}

GroupSpec mla(uint32_t layers, uint32_t rank, uint32_t rope) {
  GroupSpec g;
  g.kind = GroupKind::kMla;
  g.num_layers = layers;
  g.kv_lora_rank = rank;
  g.rope_dim = rope;
  return g;
}

PoolOptions base(uint32_t bs, uint64_t blocks) {
  PoolOptions o;
  o.block_size = bs;
  o.num_blocks = blocks;
  return o;
}

std::vector<int32_t> table(const GroupPool& p, SeqId s, uint32_t g) {
  std::vector<int32_t> t(p.block_table(s, g, nullptr, 0));
  p.block_table(s, g, t.data(), t.size());
  return t;
}

// The engine runs the pending copies: their blocks stay held until then.
void take_all_copies(GroupPool& p) {
  std::vector<int32_t> src(p.options().num_blocks), dst(src.size());
  for (uint32_t g = 0; g < p.num_groups(); ++g)
    p.take_copies(g, src.data(), dst.data(), src.size());
}

std::vector<int32_t> seq_tokens(uint64_t n, int32_t first) {
  std::vector<int32_t> t(n);
  for (uint64_t i = 0; i < n; ++i) t[i] = first + int32_t(i);
  return t;
}

TEST(Groups, WindowGroupReleasesWhileFullKeeps) {
  auto p = GroupPool::create(base(4, 64), {full(), window(8)});
  const SeqId s = p->seq_create({});
  const auto t = seq_tokens(21, 100);
  p->append(s, t.data(), 20, 0);
  EXPECT_EQ(table(*p, s, 0).size(), 5u);
  EXPECT_EQ(table(*p, s, 1).size(), 5u);
  const uint64_t free_before = p->stats().num_free_blocks;
  // The token at 20 sees keys 13..20: blocks 0..2 (tokens 0..11) are never
  // read again by the window group; the full group keeps them.
  p->append(s, t.data() + 20, 1, 0);
  const auto full_t = table(*p, s, 0), win_t = table(*p, s, 1);
  ASSERT_EQ(full_t.size(), 6u);
  ASSERT_EQ(win_t.size(), 6u);
  for (int j = 0; j < 6; ++j) EXPECT_NE(full_t[j], 0) << j;
  for (int j = 0; j < 3; ++j) EXPECT_EQ(win_t[j], 0) << j;
  for (int j = 3; j < 6; ++j) EXPECT_NE(win_t[j], 0) << j;
  // Two new blocks (one per group), three given back by the window.
  EXPECT_EQ(p->stats().num_free_blocks, free_before - 2 + 3);
  EXPECT_EQ(p->group_stats(1).num_null_entries, 3u);
  EXPECT_EQ(p->group_stats(0).num_used_blocks, 6u);
  EXPECT_EQ(p->group_stats(1).num_used_blocks, 3u);
  EXPECT_EQ(p->seq_info(s).num_blocks, 9u);
  EXPECT_EQ(p->check(), "");
  // Every block id serves one group: no id in both tables.
  for (int32_t b : win_t)
    if (b) EXPECT_EQ(std::count(full_t.begin(), full_t.end(), b), 0);
  p->free(s);
  EXPECT_EQ(p->stats().num_used_blocks, 0u);
  EXPECT_EQ(p->check(), "");
}

// A free gives each group's uncached blocks back as one run at the head of
// the queue, tail first, group after group (vLLM's coordinator frees manager
// after manager, each with one free_blocks call): a later sequence's tables
// show the order.
TEST(Groups, FreeGivesEachGroupsUncachedBlocksBackAsOneRun) {
  PoolOptions o = base(4, 32);
  o.enable_prefix_caching = false;
  auto p = GroupPool::create(o, {full(), window(8)});
  const auto t = seq_tokens(12, 100);
  const SeqId a = p->seq_create({});
  p->append(a, t.data(), t.size(), 0);
  const auto a0 = table(*p, a, 0), a1 = table(*p, a, 1);
  ASSERT_EQ(a0.size(), 3u);
  ASSERT_EQ(a1.size(), 3u);
  p->free(a);
  // Queue head: group 1's run (a1 tail first), then group 0's.
  const std::vector<int32_t> head = {a1[2], a1[1], a1[0], a0[2], a0[1], a0[0]};
  const SeqId c = p->seq_create({});
  p->append(c, t.data(), t.size(), 0);
  EXPECT_EQ(table(*p, c, 0), (std::vector<int32_t>(head.begin(), head.begin() + 3)));
  EXPECT_EQ(table(*p, c, 1), (std::vector<int32_t>(head.begin() + 3, head.end())));
  p->truncate(c, 1);  // group 0 releases head[2], head[1]; group 1 head[5], head[4]
  const SeqId d = p->seq_create({});
  p->append(d, t.data(), 8, 0);
  EXPECT_EQ(table(*p, d, 0), (std::vector<int32_t>{head[5], head[4]}));
  EXPECT_EQ(table(*p, d, 1), (std::vector<int32_t>{head[2], head[1]}));
  EXPECT_EQ(p->check(), "");
}

// Another pool's id is named as such, not only "stale or unknown".
TEST(Groups, AnotherPoolsIdIsNamed) {
  auto a = GroupPool::create(base(4, 16), {full()});
  auto b = GroupPool::create(base(4, 16), {full()});
  const SeqId sa = a->seq_create({});
  const auto t = seq_tokens(4, 1);
  try {
    b->append(sa, t.data(), t.size(), 0);
    ADD_FAILURE() << "another pool's id was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kNotFound);
    EXPECT_NE(std::string(e.what()).find("not an id of this pool"), std::string::npos) << e.what();
  }
  a->free(sa);
  try {
    a->free(sa);
    ADD_FAILURE() << "a freed id was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("not an id of this pool"), std::string::npos) << e.what();
  }
}

TEST(Groups, AppendIsAllOrNothingAcrossGroups) {
  // 9 usable blocks; two groups of 4-token blocks.
  auto p = GroupPool::create(base(4, 10), {full(), full(1)});
  const SeqId s = p->seq_create({});
  const auto t = seq_tokens(40, 1);
  p->append(s, t.data(), 16, 0);  // 4 + 4 blocks
  EXPECT_EQ(p->blocks_needed(s, 4, 0), 2u);
  const auto t0 = table(*p, s, 0), t1 = table(*p, s, 1);
  const PoolStats before = p->stats();
  try {
    p->append(s, t.data() + 16, 4, 0);  // needs 2, one is free
    FAIL() << "append fit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kOutOfBlocks);
  }
  EXPECT_EQ(table(*p, s, 0), t0);
  EXPECT_EQ(table(*p, s, 1), t1);
  EXPECT_EQ(p->stats().num_free_blocks, before.num_free_blocks);
  EXPECT_EQ(p->seq_info(s).num_tokens, 16u);
  EXPECT_EQ(p->check(), "");
}

TEST(Groups, WindowGainCountsTowardsTheBudget) {
  // Window 4, block 4: an append at 16 releases blocks 0..2 first, so a
  // nearly full pool still takes it.
  auto p = GroupPool::create(base(4, 7), {window(4)});
  const SeqId s = p->seq_create({});
  const auto t = seq_tokens(20, 1);
  p->append(s, t.data(), 16, 0);  // 4 blocks, 2 free
  EXPECT_EQ(p->blocks_needed(s, 12, 0), 0u);
  p->append(s, t.data() + 16, 4, 0);
  EXPECT_EQ(table(*p, s, 0),
            (std::vector<int32_t>{0, 0, 0, table(*p, s, 0)[3], table(*p, s, 0)[4]}));
  EXPECT_EQ(p->check(), "");
}

TEST(Groups, ForkCopiesOnWriteInEveryGroup) {
  auto p = GroupPool::create(base(4, 32), {full(), window(6), mla(1, 16, 4)});
  const SeqId a = p->seq_create({});
  const auto t = seq_tokens(8, 7);
  p->append(a, t.data(), 6, 0);
  const SeqId b = p->fork(a);
  for (uint32_t g = 0; g < 3; ++g) EXPECT_EQ(table(*p, a, g), table(*p, b, g));
  p->append(b, t.data() + 6, 1, 0);
  for (uint32_t g = 0; g < 3; ++g) {
    const auto ta = table(*p, a, g), tb = table(*p, b, g);
    ASSERT_EQ(tb.size(), 2u);
    EXPECT_EQ(ta[0], tb[0]);  // the full block stays shared
    EXPECT_NE(ta[1], tb[1]);  // the partial one was copied
    int32_t src[4], dst[4];
    ASSERT_EQ(p->take_copies(g, src, dst, 4), 1u);
    EXPECT_EQ(src[0], ta[1]);
    EXPECT_EQ(dst[0], tb[1]);
    EXPECT_EQ(p->take_copies(g, src, dst, 4), 0u);  // taken
  }
  EXPECT_EQ(p->stats().num_cow_copies, 3u);
  EXPECT_EQ(p->check(), "");
  p->free(a);
  p->free(b);
  EXPECT_EQ(p->stats().num_used_blocks, 0u);
}

TEST(Groups, TruncateRefusesToReachReleasedWindowBlocks) {
  auto p = GroupPool::create(base(4, 32), {full(), window(4)});
  const SeqId s = p->seq_create({});
  const auto t = seq_tokens(24, 3);
  p->append(s, t.data(), 20, 0);
  p->append(s, t.data() + 20, 4, 0);  // window releases blocks 0..3
  const auto w = table(*p, s, 1);
  try {
    p->truncate(s, 8);
    FAIL() << "truncate into the released run";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
  }
  EXPECT_EQ(table(*p, s, 1), w);
  p->truncate(s, 22);  // its window still lies in held blocks
  EXPECT_EQ(p->seq_info(s).num_tokens, 22u);
  EXPECT_EQ(p->check(), "");
  // Writing into the truncated (cached) block copies it first.
  const int32_t x = 999;
  p->append(s, &x, 1, 0);
  int32_t src[2], dst[2];
  EXPECT_EQ(p->take_copies(0, src, dst, 2), 1u);
  EXPECT_EQ(p->check(), "");
}

TEST(Groups, BytesPerBlockIsTheLargestGroupPage) {
  // gpt-oss-20b: 12 window (128) + 12 full layers, 8 KV heads x 64, bf16.
  GroupSpec f = full(12), w = window(128, 12);
  f.num_kv_heads = w.num_kv_heads = 8;
  f.head_dim = w.head_dim = 64;
  auto p = GroupPool::create(base(16, 100), {w, f});
  EXPECT_EQ(p->bytes_per_block(), 12u * 2 * 8 * 64 * 2 * 16);
  // DeepSeek V3: 61 MLA layers, 512 + 64 latent, bf16, no V.
  auto d = GroupPool::create(base(64, 10), {mla(61, 512, 64)});
  EXPECT_EQ(d->bytes_per_block(), 61u * 576 * 2 * 64);
  PoolOptions o = base(16, 0);
  o.memory_budget_bytes = p->bytes_per_block() * 50 + 7;
  EXPECT_EQ(GroupPool::create(o, {w, f})->options().num_blocks, 50u);
  // A budget of more blocks than a pool may have names the budget, not a
  // num_blocks the caller never set.
  o.memory_budget_bytes = p->bytes_per_block() * ((uint64_t(1) << 30) + 1);
  try {
    GroupPool::create(o, {w, f});
    ADD_FAILURE() << "a budget of 2^30 + 1 blocks was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("base->memory_budget_bytes"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("at most 2^30"), std::string::npos) << e.what();
  }
}

TEST(Groups, BadSpecsNameTheField) {
  auto expect_fail = [](std::vector<GroupSpec> g, const char* what, PoolOptions o = base(4, 8)) {
    try {
      GroupPool::create(o, std::move(g));
      ADD_FAILURE() << "created: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_fail({}, "num_groups");
  GroupSpec g = full();
  g.num_layers = 0;
  expect_fail({full(), g}, "groups[1].num_layers");
  expect_fail({window(0)}, "groups[0].sliding_window");
  GroupSpec f = full();
  f.sliding_window = 4;
  expect_fail({f}, "groups[0].sliding_window");
  expect_fail({mla(1, 0, 64)}, "groups[0].kv_lora_rank");
  PoolOptions o = base(4, 8);
  o.num_layers = 2;
  expect_fail({full()}, "base->num_layers", o);
  o = base(0, 8);
  expect_fail({full()}, "base->block_size", o);
}

// ---- Prefix hits against a model of block contents.
//
// The model learns what each block holds only from the block tables a user
// can read: a block at a full position of a table holds (group, the token
// prefix up to its end); a block seen at a partial position was reused for
// new content. A prefix of L tokens is servable by a group when, for each
// block the group needs (full: all L / bs; window w: those holding the
// w - 1 keys before L), some block holds that content. The pool must
// return the longest L that every group serves, capped at one token to
// compute, and blocks holding exactly the right content.
struct Model {
  uint32_t bs;
  std::vector<GroupSpec> groups;
  std::map<int32_t, std::pair<uint32_t, std::vector<int32_t>>> content;

  void learn(const GroupPool& p, SeqId s, const std::vector<int32_t>& toks) {
    for (uint32_t g = 0; g < groups.size(); ++g) {
      const auto t = table(p, s, g);
      for (size_t k = 0; k < t.size(); ++k) {
        if (t[k] == 0) continue;
        if ((k + 1) * bs <= toks.size())
          content[t[k]] = {g, std::vector<int32_t>(toks.begin(), toks.begin() + (k + 1) * bs)};
        else
          content.erase(t[k]);
      }
    }
  }
  uint64_t first_needed(uint32_t g, uint64_t L) const {
    const GroupSpec& s = groups[g];
    if (s.kind != GroupKind::kSlidingWindow) return 0;
    return L + 1 > s.sliding_window ? (L + 1 - s.sliding_window) / bs : 0;
  }
  bool holds(int32_t b, uint32_t g, const std::vector<int32_t>& prompt, uint64_t k) const {
    auto it = content.find(b);
    if (it == content.end() || it->second.first != g) return false;
    const auto& c = it->second.second;
    return c.size() == (k + 1) * bs && std::equal(c.begin(), c.end(), prompt.begin());
  }
  bool servable(uint32_t g, const std::vector<int32_t>& prompt, uint64_t L) const {
    for (uint64_t k = first_needed(g, L); k < L / bs; ++k) {
      bool found = false;
      for (const auto& kv : content)
        if (holds(kv.first, g, prompt, k)) {
          found = true;
          break;
        }
      if (!found) return false;
    }
    return true;
  }
  uint64_t longest(const std::vector<int32_t>& prompt) const {
    const uint64_t cap = prompt.empty() ? 0 : (prompt.size() - 1) / bs * bs;
    for (uint64_t L = cap; L > 0; L -= bs) {
      bool all = true;
      for (uint32_t g = 0; g < groups.size() && all; ++g) all = servable(g, prompt, L);
      if (all) return L;
    }
    return 0;
  }
};

void random_workload(std::vector<GroupSpec> groups, uint32_t bs, uint64_t blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  auto p = GroupPool::create(base(bs, blocks), groups);
  Model m{bs, groups, {}};
  // Prompts share prefixes: a few stems, branched at random points.
  std::vector<std::vector<int32_t>> stems(3);
  for (auto& s : stems)
    for (int i = 0; i < 80; ++i) s.push_back(int32_t(rng() % 50));
  std::map<SeqId, std::vector<int32_t>> live;
  uint64_t hits = 0, partial_window_hits = 0;
  for (int op = 0; op < 400; ++op) {
    const uint32_t r = rng() % 10;
    if (r < 4 || live.empty()) {
      std::vector<int32_t> prompt = stems[rng() % stems.size()];
      prompt.resize(1 + rng() % prompt.size());
      if (rng() % 2) prompt.push_back(int32_t(100 + rng() % 5));  // a branch
      const uint64_t want = m.longest(prompt);
      const SeqId s = p->seq_create({});
      const uint64_t got = p->match_prefix(s, prompt.data(), prompt.size());
      ASSERT_EQ(got, want) << "op " << op << " prompt of " << prompt.size();
      for (uint32_t g = 0; g < groups.size(); ++g) {
        const auto t = table(*p, s, g);
        ASSERT_EQ(t.size(), got / bs);
        for (uint64_t k = 0; k < t.size(); ++k) {
          if (k < m.first_needed(g, got) && t[k] == 0) continue;
          ASSERT_TRUE(m.holds(t[k], g, prompt, k)) << "op " << op << " group " << g << " k " << k;
        }
        if (got && t[0] == 0) ++partial_window_hits;
      }
      hits += got > 0;
      try {
        p->append(s, prompt.data() + got, prompt.size() - got, 0);
        live[s] = prompt;
        m.learn(*p, s, prompt);
      } catch (const Error& e) {
        ASSERT_EQ(e.code(), Errc::kOutOfBlocks);
        p->free(s);
      }
    } else if (r < 7) {
      auto it = std::next(live.begin(), rng() % live.size());
      const int32_t tok = int32_t(rng() % 50);
      try {
        p->append(it->first, &tok, 1, 0);
        it->second.push_back(tok);
        m.learn(*p, it->first, it->second);
      } catch (const Error& e) {
        ASSERT_EQ(e.code(), Errc::kOutOfBlocks);
      }
    } else if (r < 8) {
      auto it = std::next(live.begin(), rng() % live.size());
      const SeqId c = p->fork(it->first);
      live[c] = live[it->first];
    } else {
      auto it = std::next(live.begin(), rng() % live.size());
      p->free(it->first);
      live.erase(it);
    }
    ASSERT_EQ(p->check(), "") << "op " << op;
    // The engine runs the step's copies (their sources stay held until then).
    std::vector<int32_t> src(blocks), dst(blocks);
    for (uint32_t g = 0; g < groups.size(); ++g)
      ASSERT_LE(p->take_copies(g, src.data(), dst.data(), blocks), blocks);
    ASSERT_EQ(p->check(), "") << "op " << op;
    const PoolStats st = p->stats();
    ASSERT_EQ(st.num_free_blocks + st.num_used_blocks, blocks - 1);
  }
  for (auto& kv : live) p->free(kv.first);
  EXPECT_EQ(p->stats().num_used_blocks, 0u);
  EXPECT_GT(hits, 20u) << "the workload should hit";
  EXPECT_GT(p->stats().num_evictions, 0u) << "the pool should be small enough to evict";
  (void)partial_window_hits;
}

TEST(GroupsHits, FullAndWindowMatchTheModel) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    random_workload({full(), window(8)}, 4, 60, seed);
  }
}

TEST(GroupsHits, TwoWindowsAndMlaMatchTheModel) {
  for (uint32_t seed = 11; seed <= 16; ++seed) {
    SCOPED_TRACE(seed);
    random_workload({window(5), full(), window(13), mla(1, 8, 4)}, 4, 90, seed);
  }
}

TEST(GroupsHits, WindowOnlyHitsNeedOnlyTheWindow) {
  for (uint32_t seed = 21; seed <= 26; ++seed) {
    SCOPED_TRACE(seed);
    random_workload({window(6), window(9)}, 3, 40, seed);
  }
}

TEST(GroupsHits, WindowGroupHitsPastEvictedEarlyBlocks) {
  // A window group attaches only the blocks its window needs at the hit
  // point; the ones before stay null (and free for others).
  auto p = GroupPool::create(base(4, 64), {window(5)});
  const auto t = seq_tokens(41, 0);
  const SeqId a = p->seq_create({});
  p->append(a, t.data(), 40, 0);
  const SeqId b = p->seq_create({});
  EXPECT_EQ(p->match_prefix(b, t.data(), 41), 40u);
  const auto tb = table(*p, b, 0);
  EXPECT_EQ(tb[0], 0);  // before the window: not attached
  EXPECT_NE(tb[9], 0);
  EXPECT_EQ(p->check(), "");
}

// ---- Recurrent state groups.

GroupSpec state(uint64_t bytes, uint32_t layers = 2) {
  GroupSpec g;
  g.kind = GroupKind::kRecurrent;
  g.num_layers = layers;
  g.state_bytes = bytes;
  return g;
}

std::vector<std::pair<int32_t, int32_t>> copies(GroupPool& p, uint32_t g) {
  int32_t src[16], dst[16];
  const uint64_t n = p.take_copies(g, src, dst, 16);
  std::vector<std::pair<int32_t, int32_t>> out;
  for (uint64_t i = 0; i < n; ++i) out.push_back({src[i], dst[i]});
  return out;
}

TEST(GroupsRecurrent, OneSlotPerSequenceAndSnapshotsAtBoundaries) {
  auto p = GroupPool::create(base(4, 64), {full(), state(1000)});
  EXPECT_EQ(p->bytes_per_block(), 2000u);  // the state outweighs a 4-token page (512)
  const auto t = seq_tokens(40, 5);
  const SeqId a = p->seq_create({});
  EXPECT_EQ(p->blocks_needed(a, 8, 0), 3u);  // 2 pages + 1 state slot
  p->append(a, t.data(), 8, 0);
  auto ra = table(*p, a, 1);
  ASSERT_EQ(ra.size(), 1u);
  const int32_t slot1 = ra[0];
  EXPECT_TRUE(copies(*p, 1).empty());  // a fresh slot starts from the initial state
  // The next append starts at a boundary: slot1 (the state at 8) is kept as
  // the snapshot of block 1; the sequence goes on in a copy.
  p->append(a, t.data() + 8, 1, 0);
  ra = table(*p, a, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_NE(ra[0], slot1);
  EXPECT_EQ(copies(*p, 1), (std::vector<std::pair<int32_t, int32_t>>{{slot1, ra[0]}}));
  EXPECT_EQ(p->group_stats(1).num_cached_blocks, 1u);
  EXPECT_EQ(p->check(), "");

  // A prompt sharing 9 tokens hits 8: the snapshot sits at block 1.
  const SeqId b = p->seq_create({});
  EXPECT_EQ(p->match_prefix(b, t.data(), 10), 8u);
  EXPECT_TRUE(table(*p, b, 1).empty());
  const auto fa = table(*p, a, 0);
  EXPECT_EQ(table(*p, b, 0), std::vector<int32_t>(fa.begin(), fa.begin() + 2));
  p->append(b, t.data() + 8, 2, 0);
  const auto rb = table(*p, b, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(copies(*p, 1), (std::vector<std::pair<int32_t, int32_t>>{{slot1, rb[0]}}));
  EXPECT_EQ(p->check(), "");

  // a grows to 12: the full group can serve 12, the state only 8 (no
  // snapshot at 12 yet), so the hit is 8; once a appends at 12, it is 12.
  p->append(a, t.data() + 9, 3, 0);
  const SeqId c = p->seq_create({});
  EXPECT_EQ(p->match_prefix(c, t.data(), 13), 8u);
  p->append(a, t.data() + 12, 1, 0);
  const SeqId d = p->seq_create({});
  EXPECT_EQ(p->match_prefix(d, t.data(), 13), 12u);
  for (SeqId s : {a, b, c, d}) p->free(s);
  take_all_copies(*p);
  EXPECT_EQ(p->check(), "");
  EXPECT_EQ(p->stats().num_used_blocks, 0u);
}

TEST(GroupsRecurrent, ForkCopiesTheStateAndTruncateIsRefused) {
  auto p = GroupPool::create(base(4, 64), {state(64, 1), window(4)});
  const auto t = seq_tokens(16, 9);
  const SeqId a = p->seq_create({});
  p->append(a, t.data(), 6, 0);
  const int32_t slot = table(*p, a, 0)[0];
  (void)copies(*p, 0);
  const SeqId c = p->fork(a);
  EXPECT_TRUE(table(*p, c, 0).empty());
  EXPECT_EQ(p->check(), "");
  // The parent writes first: it moves to a copy, the child keeps the state.
  p->append(a, t.data() + 6, 1, 0);
  const int32_t moved = table(*p, a, 0)[0];
  EXPECT_NE(moved, slot);
  EXPECT_EQ(copies(*p, 0), (std::vector<std::pair<int32_t, int32_t>>{{slot, moved}}));
  p->append(c, t.data() + 6, 1, 0);
  const int32_t mine = table(*p, c, 0)[0];
  EXPECT_EQ(copies(*p, 0), (std::vector<std::pair<int32_t, int32_t>>{{slot, mine}}));
  EXPECT_EQ(p->check(), "");
  try {
    p->truncate(a, 6);
    FAIL() << "truncated a recurrent state";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("recurrent"), std::string::npos);
  }
  EXPECT_EQ(p->seq_info(a).num_tokens, 7u);
  p->free(a);
  p->free(c);
  take_all_copies(*p);
  EXPECT_EQ(p->stats().num_used_blocks, 0u);
}

TEST(GroupsRecurrent, FreeAtABoundaryKeepsTheSnapshot) {
  auto p = GroupPool::create(base(4, 32), {full(), state(64)});
  const auto t = seq_tokens(17, 1);
  const SeqId a = p->seq_create({});
  p->append(a, t.data(), 16, 0);
  p->free(a);
  const SeqId b = p->seq_create({});
  EXPECT_EQ(p->match_prefix(b, t.data(), 17), 16u);
  EXPECT_EQ(p->check(), "");
  // Without prefix caching nothing is kept.
  PoolOptions o = base(4, 32);
  o.enable_prefix_caching = false;
  auto q = GroupPool::create(o, {full(), state(64)});
  const SeqId x = q->seq_create({});
  q->append(x, t.data(), 16, 0);
  q->append(x, t.data() + 16, 1, 0);
  EXPECT_TRUE(copies(*q, 1).empty());
  q->free(x);
  EXPECT_EQ(q->stats().num_cached_blocks, 0u);
}

TEST(GroupsRecurrent, AppendIsAllOrNothingWithTheStateSlot) {
  // 5 usable blocks: 4 pages + 1 slot fit, a fifth page does not.
  auto p = GroupPool::create(base(4, 6), {full(), state(64)});
  const auto t = seq_tokens(20, 1);
  const SeqId a = p->seq_create({});
  p->append(a, t.data(), 16, 0);
  EXPECT_EQ(p->stats().num_free_blocks, 0u);
  EXPECT_EQ(p->blocks_needed(a, 1, 0), 2u);  // a page + the snapshot's copy
  try {
    p->append(a, t.data() + 16, 1, 0);
    FAIL() << "append fit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kOutOfBlocks);
  }
  EXPECT_EQ(p->seq_info(a).num_tokens, 16u);
  EXPECT_TRUE(copies(*p, 1).empty());
  EXPECT_EQ(p->check(), "");
}

}  // namespace
}  // namespace pagedkv

namespace pagedkv {
namespace {

// Model layers to (group, index): given ids in a random interleave, and
// numbered through the groups in order when none are given.
TEST(GroupLayers, GivenIdsInARandomInterleaveAndNumberingInOrder) {
  std::mt19937 rng(23);
  for (int round = 0; round < 20; ++round) {
    const uint32_t sizes[3] = {uint32_t(1 + rng() % 6), uint32_t(1 + rng() % 6),
                               uint32_t(1 + rng() % 6)};
    const uint32_t total = sizes[0] + sizes[1] + sizes[2];
    std::vector<uint32_t> ids(total);
    for (uint32_t i = 0; i < total; ++i) ids[i] = 3 * i + 1;  // sparse, not from 0
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<GroupSpec> given = {full(sizes[0]), window(8, sizes[1]), full(sizes[2])};
    std::vector<GroupSpec> plain = given;
    std::map<uint32_t, std::pair<uint32_t, uint32_t>> want_given, want_plain;
    uint32_t at = 0;
    for (uint32_t g = 0; g < 3; ++g)
      for (uint32_t k = 0; k < sizes[g]; ++k, ++at) {
        given[g].layer_ids.push_back(ids[at]);
        want_given[ids[at]] = {g, k};
        want_plain[at] = {g, k};
      }
    for (auto [groups, want] :
         {std::make_pair(given, want_given), std::make_pair(plain, want_plain)}) {
      auto p = GroupPool::create(base(4, 64), groups);
      for (uint32_t layer = 0; layer < 3 * total + 3; ++layer) {
        uint32_t g = 99, k = 99;
        const bool found = p->layer(layer, &g, &k);
        ASSERT_EQ(found, want.count(layer) == 1) << layer;
        if (found) {
          EXPECT_EQ(g, want[layer].first) << layer;
          EXPECT_EQ(k, want[layer].second) << layer;
        } else {
          EXPECT_EQ(g, 99u);
          EXPECT_EQ(k, 99u);
        }
      }
    }
  }
}

TEST(GroupLayers, IdsForSomeGroupsOrTwiceAreRefused) {
  std::vector<GroupSpec> g = {full(2), full(2)};
  g[0].layer_ids = {0, 1};
  try {
    GroupPool::create(base(4, 64), g);
    FAIL() << "layer ids for one group only were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("groups[1].layer_ids is NULL"), std::string::npos)
        << e.what();
  }
  g[1].layer_ids = {2, 1};
  try {
    GroupPool::create(base(4, 64), g);
    FAIL() << "a layer in two groups was accepted";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("groups[1].layer_ids[1] = 1 is also groups[0].layer_ids[1]"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pagedkv
