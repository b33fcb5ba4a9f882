// KV provenance model for multi-group (hybrid) pools: a randomized test
// through the public C API only (pagedkv/groups.h).
//
// provenance_test.cpp reads a single-group pool's storage back; a
// multi-group pool is manager only, so here the test keeps the storage
// itself: a shadow arena, one cell per slot of every block id (block id x
// block_size + offset), shared by all groups as their pages alias one arena.
// The "engine" writes a cell only where the user's view says a step writes:
// the slots each plan's per-group SLOT_MAPPING names for its query tokens,
// the live state slot of a recurrent group (the state after the step), the
// PKV_PLAN_SNAPSHOT_* slots (the state after the named query row), and the
// copies pkv_pool_group_take_copies hands out. Every cell records the group
// that wrote it and the identity of what it holds: a hash of the sequence's
// extra keys (LoRA id, cache salt) and every token up to the position (K/V),
// or up to the state's length (recurrent state). After every operation the
// test checks, from the user's view only:
//  1. every token a sequence counts as computed (pkv_seq_info
//     .num_computed_tokens, prefix hits included) has its own K/V, written
//     by its group, in the slot its block table of every full-attention and
//     MLA group maps it to; in sliding-window groups the same for the
//     positions the next query sees (and for every entry still held); a
//     recurrent group's live state slot holds the state after exactly the
//     computed tokens (so a hit's restored snapshot must hold the state
//     after exactly the hit's prefix);
//  2. each plan's per-group arrays: page tables (CSR or persistent rows)
//     cover the context, slot mappings agree with them, and every context
//     position a kernel reads (a window's from the first query's window on)
//     holds that position's K/V; a recurrent page is the live slot holding
//     the state after the context before the queries; snapshot rows end a
//     block and their slots are fresh blocks;
//  3. accounting: used + free = usable blocks, per-group used/cached sum to
//     the pool's, each group's used blocks are exactly the blocks its tables
//     name (plus open plans' snapshot slots) when nothing else can hold one,
//     no block id in two groups' tables, no live state slot in two tables, a
//     block in two sequences' tables only at the same index with the same
//     tokens where both have them (a shared prefix), pkv_seq_blocks_needed
//     agrees with whether the append fits, pkv_pool_validate passes.
// Steps are launched as an engine does: prepare (pkv_batch_prepare or
// pkv_batch_prepare_ex with a persistent table), take every group's copies,
// then the writes happen (or the step fails part-way: torn K/V, no state);
// the plan is committed, aborted (failed steps), or destroyed uncommitted
// (counts as committed) later, interleaved with appends, forks, truncates,
// frees, admissions and other steps. Some pools start with appends before
// any plan (computed at append: the engine writes them then).
//
// Not covered, because multi-group pools answer PKV_E_UNSUPPORTED (the test
// asserts that): events, pkv_seq_admit / _hashes, precomputed-hash matches,
// pkv_seq_append_batch, pkv_batch_prepare_decode, pkv_pool_reset_prefix_cache,
// partial reuse, retention, tiers, block copies; per-group block sizes do not
// exist (one base block_size).
//
// PKV_PROVENANCE_GROUPS_SEEDS=n runs seeds 1..n (default 400; 40 under
// sanitizers), PKV_PROVENANCE_GROUPS_SEED=s seed s alone,
// PKV_PROVENANCE_GROUPS_STEPS=k operations a seed (default 250).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../reliability/sanitizers.h"
#include "pagedkv/pagedkv.h"
#include "provenance_model.h"

namespace {

using provenance::Key;
using provenance::mix;

// Coverage counters (PKV_PROVENANCE_GROUPS_DUMP=1 prints them): prefix
// hits, hits restoring a recurrent state, steps written, steps failed,
// snapshot slots written, copies run, appends refused, plans refused.
enum { kHits, kStateHits, kSteps, kFailed, kSnaps, kCopies, kOob, kRefused, kCounters };
uint64_t g_count[kCounters];

constexpr uint64_t kTorn = 0x7045a27u;  // a step that failed part-way left it

// idents[pos]: the K/V identity of token pos (extra keys, tokens 0..pos, pos).
std::vector<uint64_t> idents(const Key& k, const std::vector<int32_t>& t) {
  std::vector<uint64_t> out(t.size());
  uint64_t h = mix(mix(1, k.lora), uint64_t(k.salt));
  for (size_t i = 0; i < t.size(); ++i) {
    h = mix(h, uint64_t(uint32_t(t[i])) + 7);
    out[i] = mix(h, i) | 1;
  }
  return out;
}

// The identity of a recurrent state after the first n tokens (n > 0).
uint64_t state_of(const std::vector<uint64_t>& id, uint64_t n) {
  return mix(id[n - 1], 0x57a7e) | 1;
}

struct Cell {
  int32_t g = -1;   // group that wrote it; -1 never written
  uint64_t id = 0;  // identity held
};

struct Grp {
  uint32_t kind = PKV_GROUP_FULL;
  uint32_t window = 0;
  bool every_block = false;
};

struct Seq {
  pkv_seq_id id = 0;
  Key key;
  std::vector<int32_t> tokens;
  int plan = -1;          // open plan over it (index into plans), -1 none
  uint64_t inflight = 0;  // its context in that plan, when the step wrote (its state is after it)
  bool may_src = false;   // may hold a state to start from (hit or fork) before its first append
};

struct Plan {
  pkv_batch* b = nullptr;
  std::vector<pkv_seq_id> ids;
  bool failed = false;
  bool committed = false;
  std::vector<uint64_t> snaps;  // per group: snapshot slots it holds until resolved
};

std::string str(uint64_t v) { return std::to_string(v); }

struct Harness {
  std::mt19937_64 rng;
  pkv_pool* pool = nullptr;
  uint32_t bs = 4;
  uint64_t nblocks = 0;
  bool caching = true, preplan = false;
  std::vector<Grp> grps;
  std::vector<Cell> arena;
  std::vector<Seq> seqs;
  std::vector<Plan> plans;
  std::vector<std::vector<int32_t>> bases;
  // Copy-on-write and state copies are taken (and run) at the next step or
  // take: until then a table entry that changed, or a new live state slot,
  // holds nothing to check.
  std::set<int32_t> pending;
  bool copies_maybe = false;  // an operation since the last take may have recorded copies
  std::map<pkv_seq_id, std::vector<std::vector<int32_t>>> last;
  std::string trace;

  explicit Harness(uint64_t seed) : rng(seed) {}
  ~Harness() {
    for (Plan& p : plans) {
      if (p.failed) pkv_batch_abort(p.b);
      pkv_batch_destroy(p.b);
    }
    pkv_pool_destroy(pool);
  }
  uint64_t r(uint64_t n) { return n ? rng() % n : 0; }
  uint32_t G() const { return uint32_t(grps.size()); }
  bool rec(uint32_t g) const { return grps[g].kind == PKV_GROUP_RECURRENT; }
  bool any_rec() const {
    for (uint32_t g = 0; g < G(); ++g)
      if (rec(g)) return true;
    return false;
  }
  Cell& cell(int64_t block, int64_t off) { return arena[size_t(block * bs + off)]; }

  void create() {
    const uint32_t sizes[] = {1, 2, 3, 4, 5};
    bs = sizes[r(5)];
    nblocks = 8 + r(48);
    const uint32_t ng = 1 + uint32_t(r(4));
    for (uint32_t g = 0; g < ng; ++g) {
      Grp x;
      x.kind = uint32_t(r(4));
      if (x.kind == PKV_GROUP_SLIDING_WINDOW) x.window = 1 + uint32_t(r(3 * bs + 3));
      if (x.kind == PKV_GROUP_RECURRENT) x.every_block = r(3) != 0;
      grps.push_back(x);
    }
    caching = r(8) != 0;
    preplan = r(3) == 0;
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = bs;
    o.num_blocks = nblocks;
    o.enable_prefix_caching = caching;
    o.hash_algo = r(2) ? PKV_HASH_XXH3_128 : PKV_HASH_SHA256_CBOR;
    std::vector<pkv_kv_group_spec> specs(ng);
    for (uint32_t g = 0; g < ng; ++g) {
      pkv_kv_group_spec& s = specs[g];
      ASSERT_EQ(pkv_kv_group_spec_init_sized(&s, sizeof s), PKV_OK);
      s.kind = grps[g].kind;
      s.num_layers = 1 + uint32_t(r(3));
      if (s.kind == PKV_GROUP_FULL || s.kind == PKV_GROUP_SLIDING_WINDOW) {
        s.num_kv_heads = 1 + uint32_t(r(2));
        s.head_dim = 8;
      } else if (s.kind == PKV_GROUP_MLA) {
        s.kv_lora_rank = 16;
        s.rope_dim = 8;
      } else {
        s.state_bytes = 64 + 64 * r(4);
        s.flags = grps[g].every_block ? PKV_GROUP_SNAPSHOT_EVERY_BLOCK : 0;
      }
      s.sliding_window = grps[g].window;
    }
    {  // events are not supported on multi-group pools
      pkv_pool_options e = o;
      e.enable_events = 1;
      pkv_pool* bad = nullptr;
      ASSERT_EQ(pkv_pool_create_groups(&e, specs.data(), ng, &bad), PKV_E_UNSUPPORTED);
    }
    ASSERT_EQ(pkv_pool_create_groups(&o, specs.data(), ng, &pool), PKV_OK)
        << pkv_last_error_message();
    arena.assign(nblocks * bs, Cell{});
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> b(bs * (1 + r(5)) + r(bs));
      for (auto& t : b) t = int32_t(r(3));
      bases.push_back(b);
    }
    trace = "bs=" + str(bs) + " blocks=" + str(nblocks) + " caching=" + str(caching) +
            " preplan=" + str(preplan) + " groups=";
    for (const Grp& x : grps)
      trace +=
          str(x.kind) + (x.window ? "/w" + str(x.window) : "") + (x.every_block ? "/e" : "") + ",";
    trace += "\n";
    unsupported_calls();
  }

  // The calls pagedkv/groups.h does not list answer PKV_E_UNSUPPORTED.
  void unsupported_calls() {
    pkv_seq_options so;
    pkv_seq_options_init(&so);
    const int32_t tok[2] = {1, 2};
    pkv_seq_id id = 0;
    uint64_t cached = 0;
    EXPECT_EQ(pkv_seq_admit(pool, &so, tok, 2, 0, &id, &cached), PKV_E_UNSUPPORTED);
    EXPECT_EQ(pkv_pool_reset_prefix_cache(pool), PKV_E_UNSUPPORTED);
    pkv_event ev[1];
    uint64_t n = 0;
    EXPECT_EQ(pkv_pool_drain_events(pool, ev, 1, &n), PKV_E_UNSUPPORTED);
    ASSERT_EQ(pkv_seq_create(pool, &so, &id), PKV_OK);
    pkv_block_hash h[1];
    EXPECT_EQ(pkv_seq_match_prefix_hashes(pool, id, tok, 2, h, 0, &cached), PKV_E_UNSUPPORTED);
    EXPECT_EQ(pkv_seq_append_batch(pool, &id, tok, 1), PKV_E_UNSUPPORTED);
    pkv_batch* b = nullptr;
    EXPECT_EQ(pkv_batch_prepare_decode(pool, &id, tok, 1, 0, nullptr, &b), PKV_E_UNSUPPORTED);
    EXPECT_EQ(b, nullptr);
    ASSERT_EQ(pkv_seq_free(pool, id), PKV_OK);
  }

  std::vector<int32_t> table(pkv_seq_id id, uint32_t g) {
    std::vector<int32_t> t(4096);
    uint64_t n = 0;
    EXPECT_EQ(pkv_seq_group_block_table(pool, id, g, t.data(), t.size(), &n), PKV_OK)
        << pkv_last_error_message();
    t.resize(n);
    return t;
  }
  pkv_seq_info info(pkv_seq_id id) {
    pkv_seq_info i;
    pkv_seq_info_init(&i);
    EXPECT_EQ(pkv_seq_get_info(pool, id, &i), PKV_OK) << pkv_last_error_message();
    return i;
  }
  size_t find(pkv_seq_id id) const {
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs[i].id == id) return i;
    return seqs.size();
  }

  // Runs every group's recorded copies on the shadow arena (groups in a
  // random order: the pins make any order safe).
  void take_copies() {
    std::vector<uint32_t> order(G());
    for (uint32_t g = 0; g < G(); ++g) order[g] = g;
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t g : order) {
      int32_t src[512], dst[512];
      uint64_t n = 0;
      ASSERT_EQ(pkv_pool_group_take_copies(pool, g, src, dst, 512, &n), PKV_OK)
          << pkv_last_error_message();
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(src[i] > 0 && dst[i] > 0 && uint64_t(src[i]) < nblocks &&
                    uint64_t(dst[i]) < nblocks && src[i] != dst[i])
            << trace << "group " << g << " copy " << src[i] << " -> " << dst[i];
        for (uint32_t o = 0; o < bs; ++o) cell(dst[i], o) = cell(src[i], o);
        ++g_count[kCopies];
        trace += "  copy g" + str(g) + " " + str(src[i]) + "->" + str(dst[i]) + "\n";
      }
    }
    pending.clear();
    copies_maybe = false;
    // What the copies changed is now in place: not pending at the next check.
    for (const Seq& s : seqs) {
      auto& old = last[s.id];
      old.resize(G());
      for (uint32_t g = 0; g < G(); ++g) old[g] = table(s.id, g);
    }
  }

  // "" when the slot holds identity id written by group g.
  std::string holds(int64_t block, int64_t off, uint32_t g, uint64_t id) {
    const Cell& c = cell(block, off);
    if (c.g == int32_t(g) && c.id == id) return "";
    std::string what = c.g < 0             ? "never written"
                       : c.g != int32_t(g) ? "written by group " + str(c.g)
                       : c.id == kTorn     ? "torn by a failed step"
                                           : "other tokens' K/V or state";
    return "block " + str(block) + " slot " + str(off) + " of group " + str(g) + ": " + what;
  }

  // ----------------------------------------------------------------- checks

  void check() {
    ASSERT_EQ(pkv_pool_validate(pool), PKV_OK) << trace << pkv_last_error_message();
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    ASSERT_EQ(pkv_pool_get_stats(pool, &st), PKV_OK);
    ASSERT_EQ(st.num_used_blocks + st.num_free_blocks, nblocks - 1) << trace;
    ASSERT_EQ(st.num_seqs, seqs.size()) << trace;
    std::vector<std::set<int32_t>> named(G());
    std::map<int32_t, std::pair<uint32_t, pkv_seq_id>>
        owner;  // block -> (group, seq) for live slots
    // block -> (group, index, seq index) of every attention table entry
    std::map<int32_t, std::vector<std::pair<uint64_t, size_t>>> shared;
    std::map<int32_t, uint32_t> group_of;
    bool src_possible = false;
    std::vector<std::vector<uint64_t>> ids_of(seqs.size());
    for (size_t si = 0; si < seqs.size(); ++si) {
      Seq& s = seqs[si];
      const pkv_seq_info in = info(s.id);
      ASSERT_EQ(in.num_tokens, s.tokens.size()) << trace << "seq " << s.id;
      const uint64_t c = in.num_computed_tokens;
      ASSERT_LE(c, in.num_tokens) << trace;
      ids_of[si] = idents(s.key, s.tokens);
      const std::vector<uint64_t>& id = ids_of[si];
      std::vector<std::vector<int32_t>> tabs(G());
      auto& old = last[s.id];
      old.resize(G());
      for (uint32_t g = 0; g < G(); ++g) {
        tabs[g] = table(s.id, g);
        const auto& t = tabs[g];
        if (rec(g)) {
          ASSERT_LE(t.size(), 1u) << trace;
          if (!t.empty() && (old[g].empty() || old[g][0] != t[0])) pending.insert(t[0]);
          if (t.empty() && s.may_src) src_possible = true;
          if (!t.empty()) s.may_src = false;
        } else {
          for (size_t j = 0; j < old[g].size() && j < t.size(); ++j)
            if (old[g][j] != t[j] && old[g][j] != PKV_NULL_BLOCK && t[j] != PKV_NULL_BLOCK)
              pending.insert(t[j]);
        }
        old[g] = t;
      }
      for (uint32_t g = 0; g < G(); ++g) {
        const auto& t = tabs[g];
        for (size_t j = 0; j < t.size(); ++j) {
          const int32_t b = t[j];
          if (b == PKV_NULL_BLOCK) continue;
          ASSERT_TRUE(b > 0 && uint64_t(b) < nblocks) << trace << "block " << b;
          auto [it, fresh] = group_of.emplace(b, g);
          ASSERT_EQ(it->second, g) << trace << "block " << b << " is in tables of groups "
                                   << it->second << " and " << g << " at once";
          named[g].insert(b);
          if (rec(g)) {
            auto [o, first] = owner.emplace(b, std::make_pair(g, s.id));
            ASSERT_TRUE(first) << trace << "state slot " << b << " of group " << g
                               << " is live in seqs " << o->second.second << " and " << s.id;
          } else {
            shared[b].push_back({j, si});
          }
        }
        if (rec(g)) {
          // A step written but not yet committed advanced the state past
          // the computed tokens: to its context.
          const uint64_t len = s.plan >= 0 && s.inflight ? s.inflight : c;
          if (len == 0 || t.empty() || pending.count(t[0])) continue;
          const std::string bad = holds(t[0], 0, g, state_of(id, len));
          ASSERT_EQ(bad, "") << trace << "seq " << s.id << " counts " << c
                             << " tokens computed (state expected after " << len
                             << "), but its live state slot " << bad;
          continue;
        }
        const uint32_t w = grps[g].window;
        ASSERT_GE(t.size() * bs, c) << trace << "seq " << s.id << " group " << g;
        for (uint64_t pos = 0; pos < c; ++pos) {
          const int32_t b = t[pos / bs];
          if (b == PKV_NULL_BLOCK) {
            // Released by the window: never a key the next query (at c) sees.
            ASSERT_TRUE(w != 0 && pos + w <= c)
                << trace << "seq " << s.id << " group " << g << " position " << pos << " of " << c
                << " computed is the null block";
            continue;
          }
          if (pending.count(b)) continue;
          const std::string bad = holds(b, pos % bs, g, id[pos]);
          ASSERT_EQ(bad, "") << trace << "seq " << s.id << " counts token " << pos
                             << " computed (of " << c << "), but its " << bad;
        }
      }
    }
    // A block in two tables: a shared prefix (same index, same tokens).
    for (const auto& [b, users] : shared) {
      for (size_t k = 1; k < users.size(); ++k) {
        const auto [j0, s0] = users[0];
        const auto [j1, s1] = users[k];
        ASSERT_EQ(j0, j1) << trace << "block " << b << " is entry " << j0 << " of seq "
                          << seqs[s0].id << " and entry " << j1 << " of seq " << seqs[s1].id;
        const auto& a = ids_of[s0];
        const auto& c = ids_of[s1];
        for (uint64_t pos = j0 * bs; pos < (j0 + 1) * bs && pos < a.size() && pos < c.size(); ++pos)
          ASSERT_EQ(a[pos], c[pos])
              << trace << "block " << b << " is shared by seqs " << seqs[s0].id << " and "
              << seqs[s1].id << " whose tokens differ at " << pos;
      }
    }
    uint64_t used = 0, cached = 0;
    for (uint32_t g = 0; g < G(); ++g) {
      pkv_group_stats gs;
      pkv_group_stats_init(&gs);
      ASSERT_EQ(pkv_pool_group_stats(pool, g, &gs), PKV_OK);
      used += gs.num_used_blocks;
      cached += gs.num_cached_blocks;
      uint64_t snaps = 0;
      for (const Plan& p : plans) snaps += p.snaps.empty() ? 0 : p.snaps[g];
      ASSERT_GE(gs.num_used_blocks, named[g].size() + snaps) << trace << "group " << g;
      if (!copies_maybe && !src_possible)
        ASSERT_EQ(gs.num_used_blocks, named[g].size() + snaps)
            << trace << "group " << g << " counts used blocks no table or plan names";
      if (!caching) ASSERT_EQ(gs.num_cached_blocks, 0u) << trace;
    }
    ASSERT_EQ(used, st.num_used_blocks) << trace;
    ASSERT_EQ(cached, st.num_cached_blocks) << trace;
  }

  // ------------------------------------------------------------ operations

  std::vector<int32_t> prompt() {
    return provenance::random_prompt([this](uint64_t n) { return r(n); }, bases, bs);
  }

  Key key() {
    return provenance::random_key([this](uint64_t n) { return r(n); });
  }

  // Before the pool's first plan, appended tokens count computed at once:
  // the engine computed them by its own means, so it writes them now.
  void preplan_write(Seq& s, uint64_t n0) {
    take_copies();
    if (::testing::Test::HasFatalFailure()) return;
    const auto id = idents(s.key, s.tokens);
    for (uint32_t g = 0; g < G(); ++g) {
      const auto t = table(s.id, g);
      if (rec(g)) {
        ASSERT_EQ(t.size(), 1u) << trace;
        if (n0 > 0) {
          const std::string bad = holds(t[0], 0, g, state_of(id, n0));
          ASSERT_EQ(bad, "") << trace << "pre-plan append to seq " << s.id << " at " << n0
                             << " starts from its state slot " << bad;
        }
        cell(t[0], 0) = Cell{int32_t(g), state_of(id, s.tokens.size())};
        continue;
      }
      for (uint64_t pos = n0; pos < s.tokens.size(); ++pos) {
        ASSERT_NE(t[pos / bs], PKV_NULL_BLOCK) << trace;
        cell(t[pos / bs], pos % bs) = Cell{int32_t(g), id[pos]};
      }
    }
  }

  bool planned_yet = false;

  // Appends tokens, checking pkv_seq_blocks_needed against the outcome.
  pkv_status do_append(Seq& s, const std::vector<int32_t>& t, uint32_t look) {
    uint64_t need = 0;
    EXPECT_EQ(pkv_seq_blocks_needed(pool, s.id, t.size(), look, &need), PKV_OK);
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    EXPECT_EQ(pkv_pool_get_stats(pool, &st), PKV_OK);
    const uint64_t n0 = s.tokens.size();
    const pkv_status rc = pkv_seq_append(pool, s.id, t.data(), t.size(), look);
    trace += "append seq " + str(s.id) + " +" + str(t.size()) + " look " + str(look) + " need " +
             str(need) + " free " + str(st.num_free_blocks) + " -> " + str(uint64_t(-rc)) + "\n";
    if (rc == PKV_OK) {
      EXPECT_LE(need, st.num_free_blocks) << trace << "the append fit where blocks_needed said not";
      s.tokens.insert(s.tokens.end(), t.begin(), t.end());
      copies_maybe = true;
      if (!planned_yet && !t.empty()) preplan_write(s, n0);
    } else {
      EXPECT_EQ(rc, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
      ++g_count[kOob];
      EXPECT_GT(need, st.num_free_blocks) << trace << "blocks_needed " << need << " fit in "
                                          << st.num_free_blocks << " free, but the append failed";
    }
    return rc;
  }

  void admit() {
    Seq s;
    s.key = key();
    s.tokens = prompt();
    pkv_seq_options so;
    pkv_seq_options_init(&so);
    so.lora_id = s.key.lora;
    const std::string salt = "s" + str(uint64_t(s.key.salt));
    so.cache_salt = s.key.salt ? salt.c_str() : nullptr;
    ASSERT_EQ(pkv_seq_create(pool, &so, &s.id), PKV_OK) << pkv_last_error_message();
    uint64_t cached = 0;
    if (r(5)) {
      ASSERT_EQ(pkv_seq_match_prefix(pool, s.id, s.tokens.data(), s.tokens.size(), &cached), PKV_OK)
          << pkv_last_error_message();
      ASSERT_LT(cached, s.tokens.size()) << trace;
      ASSERT_EQ(cached % bs, 0u) << trace;
      const pkv_seq_info in = info(s.id);
      ASSERT_EQ(in.num_tokens, cached) << trace;
      ASSERT_EQ(in.num_computed_tokens, cached) << trace;
      if (cached) ++g_count[kHits], g_count[kStateHits] += any_rec();
    }
    trace += "admit seq " + str(s.id) + " n=" + str(s.tokens.size()) + " lora " + str(s.key.lora) +
             " salt " + str(uint64_t(s.key.salt)) + " cached " + str(cached) + "\n";
    std::vector<int32_t> rest(s.tokens.begin() + long(cached), s.tokens.end());
    s.tokens.resize(cached);
    s.may_src = cached > 0;
    seqs.push_back(s);
    if (r(6) == 0) return;  // appended later (a match alone)
    do_append(seqs.back(), rest, uint32_t(r(4) == 0));
    if (::testing::Test::HasFailure()) return;
    if (seqs.back().tokens.size() == cached && r(2)) {  // refused: the engine gives up on it
      trace += "free seq " + str(seqs.back().id) + " (refused)\n";
      ASSERT_EQ(pkv_seq_free(pool, seqs.back().id), PKV_OK);
      last.erase(seqs.back().id);
      seqs.pop_back();
    }
  }

  void append() {
    if (seqs.empty()) return;
    Seq& s = seqs[r(seqs.size())];
    std::vector<int32_t> t(r(2 * bs + 1));
    for (auto& x : t) x = int32_t(r(3));
    do_append(s, t, uint32_t(r(3) == 0 ? r(bs + 1) : 0));
  }

  void truncate() {
    if (seqs.empty()) return;
    Seq& s = seqs[r(seqs.size())];
    const uint64_t n = r(3) == 0 ? s.tokens.size() : r(s.tokens.size() + 1);
    const pkv_status rc = pkv_seq_truncate(pool, s.id, n);
    trace += "truncate seq " + str(s.id) + " to " + str(n) + " -> " + str(uint64_t(-rc)) + "\n";
    if (rc == PKV_OK) {
      s.tokens.resize(n);
      return;
    }
    ASSERT_EQ(rc, PKV_E_INVALID_ARGUMENT) << pkv_last_error_message();
  }

  void fork() {
    if (seqs.empty()) return;
    const Seq& p = seqs[r(seqs.size())];
    // Not while a step over it runs: the step advances the parent's state
    // slot in place, so a child forked before its commit would start from
    // the state after the step while counting fewer tokens computed (the
    // headers do not say what a fork of a sequence with a step in flight
    // starts from; the engine forks between steps).
    if (p.plan >= 0) return;
    Seq c = p;
    c.plan = -1;
    const pkv_status rc = pkv_seq_fork(pool, p.id, &c.id);
    ASSERT_EQ(rc, PKV_OK) << pkv_last_error_message();
    trace += "fork seq " + str(p.id) + " -> " + str(c.id) + "\n";
    for (uint32_t g = 0; g < G(); ++g)
      if (rec(g) && (!table(p.id, g).empty() || p.may_src)) c.may_src = true;
    seqs.push_back(c);
  }

  void free_one() {
    if (seqs.empty()) return;
    const size_t i = r(seqs.size());
    trace += "free seq " + str(seqs[i].id) + "\n";
    ASSERT_EQ(pkv_seq_free(pool, seqs[i].id), PKV_OK) << pkv_last_error_message();
    last.erase(seqs[i].id);
    seqs.erase(seqs.begin() + long(i));
  }

  template <class T>
  const T* arr(pkv_batch* b, uint32_t g, uint32_t which, int64_t* len = nullptr) {
    pkv_tensor t;
    EXPECT_EQ(pkv_batch_plan_tensor_group(b, g, which, &t), PKV_OK) << pkv_last_error_message();
    if (len) *len = t.shape[0];
    return reinterpret_cast<const T*>(static_cast<const char*>(t.data) + t.byte_offset);
  }

  // One engine step: prepare, take the copies, check what the kernels will
  // read, write (or fail part-way), check what attention reads after.
  void launch() {
    if (seqs.empty() || plans.size() >= 3) return;
    std::vector<size_t> pick;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs[i].plan < 0 && !seqs[i].tokens.empty() && r(3)) pick.push_back(i);
    if (pick.empty()) return;
    std::shuffle(pick.begin(), pick.end(), rng);
    std::vector<pkv_seq_id> ids;
    std::vector<uint32_t> q;
    for (size_t i : pick) {
      const pkv_seq_info in = info(seqs[i].id);
      uint64_t c = std::max<uint64_t>(in.num_tokens - in.num_computed_tokens, 1);
      if (r(5) == 0) c = std::min<uint64_t>(in.num_tokens, c + r(3));  // recompute some
      if (r(8) == 0 && c > 1) c = c - 1 - r(c - 1);                    // too few
      ids.push_back(seqs[i].id);
      q.push_back(uint32_t(c));
    }
    const bool persistent = r(2);
    Plan p;
    const pkv_status rc =
        pkv_batch_prepare_ex(pool, ids.data(), q.data(), uint32_t(ids.size()),
                             persistent ? PKV_PREPARE_PERSISTENT_TABLE : 0, nullptr, &p.b);
    trace += "prepare" + std::string(persistent ? " persistent" : "") + " seqs";
    for (size_t k = 0; k < ids.size(); ++k) trace += " " + str(ids[k]) + "/q" + str(q[k]);
    trace += " -> " + str(uint64_t(-rc)) + "\n";
    if (rc != PKV_OK) {
      ASSERT_TRUE(rc == PKV_E_INVALID_STATE || rc == PKV_E_INVALID_ARGUMENT ||
                  rc == PKV_E_OUT_OF_BLOCKS)
          << trace << pkv_last_error_message();
      ASSERT_EQ(p.b, nullptr);
      ++g_count[kRefused];
      if (rc == PKV_E_INVALID_STATE) {  // a query's context is not computed, or no state slot
        bool why = false;
        for (size_t k = 0; k < ids.size(); ++k) {
          const pkv_seq_info in = info(ids[k]);
          why = why || in.num_tokens - q[k] > in.num_computed_tokens;
          for (uint32_t g = 0; g < G(); ++g) why = why || (rec(g) && table(ids[k], g).empty());
        }
        ASSERT_TRUE(why) << trace
                         << "prepare refused a computed context: " << pkv_last_error_message();
      }
      return;
    }
    planned_yet = true;
    p.ids = ids;
    take_copies();
    if (::testing::Test::HasFatalFailure()) return;
    const size_t n = ids.size();
    pkv_batch_info bi;
    pkv_batch_info_init(&bi);
    ASSERT_EQ(pkv_batch_get_info(p.b, &bi), PKV_OK);
    ASSERT_EQ(bi.num_seqs, n);
    const int32_t* qptr = arr<int32_t>(p.b, 0, PKV_PLAN_QUERY_INDPTR);
    const int32_t* ctx = arr<int32_t>(p.b, 0, PKV_PLAN_CONTEXT_LENS);
    std::vector<std::vector<uint64_t>> id(n);
    for (size_t k = 0; k < n; ++k) {
      const Seq& s = seqs[find(ids[k])];
      id[k] = idents(s.key, s.tokens);
      ASSERT_EQ(uint64_t(ctx[k]), s.tokens.size()) << trace;
      ASSERT_EQ(uint32_t(qptr[k + 1] - qptr[k]), q[k]) << trace;
    }
    ASSERT_EQ(uint64_t(qptr[n]), bi.num_tokens);
    {
      pkv_tensor pt;
      ASSERT_EQ(pkv_batch_token_positions(p.b, &pt), PKV_OK);
      const int64_t* pos = static_cast<const int64_t*>(pt.data);
      for (size_t k = 0; k < n; ++k)
        for (int32_t row = qptr[k]; row < qptr[k + 1]; ++row)
          ASSERT_EQ(pos[row], ctx[k] - (qptr[k + 1] - row)) << trace;
    }
    // Pages of group g, sequence k (padded rows or CSR).
    auto pages = [&](uint32_t g, size_t k, std::vector<int32_t>* out) {
      int64_t npidx = 0;
      const int32_t* pptr = arr<int32_t>(p.b, g, PKV_PLAN_PAGE_INDPTR);
      const int32_t* pidx = arr<int32_t>(p.b, g, PKV_PLAN_PAGE_INDICES, &npidx);
      const uint64_t want = rec(g) ? 1 : (uint64_t(ctx[k]) + bs - 1) / bs;
      if (persistent) {
        const int64_t stride = pptr[1];
        ASSERT_EQ(pptr[k], int64_t(k) * stride) << trace;
        ASSERT_GE(uint64_t(stride), want) << trace;
        ASSERT_GE(npidx, int64_t(n) * stride) << trace;
        out->assign(pidx + k * stride, pidx + k * stride + want);
        for (int64_t j = int64_t(want); j < stride; ++j)
          ASSERT_EQ(pidx[k * stride + j], 0)
              << trace << "group " << g << " row " << k << " entry " << j << " past its pages";
      } else {
        ASSERT_EQ(uint64_t(pptr[k + 1] - pptr[k]), want) << trace;
        ASSERT_LE(pptr[k + 1], npidx) << trace;
        out->assign(pidx + pptr[k], pidx + pptr[k + 1]);
      }
    };
    // What the kernels read before the writes: every context position before
    // the queries (a window's from the first query's window on), and the
    // state after the context of each recurrent group.
    p.snaps.assign(G(), 0);
    std::vector<std::vector<std::vector<int32_t>>> pg(G(), std::vector<std::vector<int32_t>>(n));
    for (uint32_t g = 0; g < G(); ++g) {
      const int64_t* slot = arr<int64_t>(p.b, g, PKV_PLAN_SLOT_MAPPING);
      const int32_t* lastlen = arr<int32_t>(p.b, g, PKV_PLAN_LAST_PAGE_LEN);
      for (size_t k = 0; k < n; ++k) {
        pages(g, k, &pg[g][k]);
        if (::testing::Test::HasFatalFailure()) return;
        const auto& pk = pg[g][k];
        const int64_t start = ctx[k] - (qptr[k + 1] - qptr[k]);
        const auto tab = table(ids[k], g);
        if (rec(g)) {
          ASSERT_EQ(lastlen[k], 1) << trace;
          ASSERT_EQ(tab.size(), 1u) << trace;
          ASSERT_EQ(pk[0], tab[0]) << trace << "group " << g << " page is not the live slot";
          ASSERT_EQ(slot[k], tab[0]) << trace;
          if (start > 0) {
            const std::string bad = holds(pk[0], 0, g, state_of(id[k], uint64_t(start)));
            ASSERT_EQ(bad, "") << trace << "plan seq " << ids[k] << " starts at " << start
                               << " from state slot " << bad;
          }
          continue;
        }
        ASSERT_EQ(lastlen[k], ctx[k] - int64_t(pk.size() - 1) * bs) << trace;
        const uint32_t w = grps[g].window;
        for (int64_t pos = 0; pos < ctx[k]; ++pos) {
          const int32_t b = pk[size_t(pos / bs)];
          ASSERT_TRUE(size_t(pos / bs) < tab.size() && b == tab[size_t(pos / bs)])
              << trace << "group " << g << " plan page " << pos / bs << " of seq " << ids[k]
              << " is not its table's";
          const bool seen = w == 0 || pos + int64_t(w) > start;
          if (b == PKV_NULL_BLOCK) {
            ASSERT_FALSE(seen) << trace << "plan seq " << ids[k] << " group " << g
                               << " reads position " << pos << " (a query at " << start
                               << " sees it) from the null block";
            continue;
          }
          if (pos >= start) {
            ASSERT_EQ(slot[qptr[k] + (pos - start)], int64_t(b) * bs + pos % bs)
                << trace << "group " << g << " slot mapping of seq " << ids[k] << " position "
                << pos << " is not its page's slot";
            continue;
          }
          if (!seen) continue;
          const std::string bad = holds(b, pos % bs, g, id[k][size_t(pos)]);
          ASSERT_EQ(bad, "") << trace << "plan seq " << ids[k] << " reads context position " << pos
                             << " from " << bad;
        }
      }
    }
    // Snapshot slots: fresh blocks no table names, each at a block's end.
    std::vector<std::vector<std::pair<int32_t, uint64_t>>> snap(G());  // (block, state length)
    for (uint32_t g = 0; g < G(); ++g) {
      if (!rec(g)) continue;
      const int32_t* sp = arr<int32_t>(p.b, g, PKV_PLAN_SNAPSHOT_INDPTR);
      const int64_t* sr = arr<int64_t>(p.b, g, PKV_PLAN_SNAPSHOT_ROWS);
      const int32_t* sb = arr<int32_t>(p.b, g, PKV_PLAN_SNAPSHOT_BLOCKS);
      ASSERT_EQ(sp[0], 0);
      if (!grps[g].every_block || !caching) ASSERT_EQ(sp[n], 0) << trace;
      for (size_t k = 0; k < n; ++k)
        for (int32_t j = sp[k]; j < sp[k + 1]; ++j) {
          ASSERT_TRUE(sr[j] >= qptr[k] && sr[j] < qptr[k + 1]) << trace;
          const uint64_t len = uint64_t(ctx[k] - (qptr[k + 1] - sr[j])) + 1;
          ASSERT_EQ(len % bs, 0u) << trace << "snapshot after " << len << " tokens";
          ASSERT_TRUE(sb[j] > 0 && uint64_t(sb[j]) < nblocks) << trace;
          for (const Seq& o : seqs)
            for (uint32_t h = 0; h < G(); ++h)
              for (int32_t b : table(o.id, h))
                ASSERT_NE(b, sb[j]) << trace << "snapshot slot " << sb[j] << " is in a table";
          for (const auto& other : snap)
            for (const auto& e : other) ASSERT_NE(e.first, sb[j]) << trace;
          snap[g].push_back({sb[j], len});
        }
      p.snaps[g] = uint64_t(sp[n]);
    }
    // The step: writes (or a failure part-way: torn K/V, no state).
    p.failed = r(6) == 0;
    trace += p.failed ? "  step fails\n" : "  step writes\n";
    ++g_count[p.failed ? kFailed : kSteps];
    for (size_t k = 0; k < n; ++k) {
      const int64_t start = ctx[k] - (qptr[k + 1] - qptr[k]);
      for (uint32_t g = 0; g < G(); ++g) {
        const auto& pk = pg[g][k];
        if (rec(g)) {
          if (!p.failed) cell(pk[0], 0) = Cell{int32_t(g), state_of(id[k], uint64_t(ctx[k]))};
          continue;
        }
        for (int64_t pos = start; pos < ctx[k]; ++pos) {
          Cell& cl = cell(pk[size_t(pos / bs)], pos % bs);
          const Cell good{int32_t(g), id[k][size_t(pos)]};
          if (!p.failed)
            cl = good;
          else if (r(2) && !(cl.g == good.g && cl.id == good.id))
            cl = Cell{int32_t(g), kTorn};
        }
      }
    }
    if (!p.failed) {
      for (uint32_t g = 0; g < G(); ++g) {
        if (!rec(g)) continue;
        const int32_t* sp = arr<int32_t>(p.b, g, PKV_PLAN_SNAPSHOT_INDPTR);
        const int32_t* sb = arr<int32_t>(p.b, g, PKV_PLAN_SNAPSHOT_BLOCKS);
        const int64_t* sr = arr<int64_t>(p.b, g, PKV_PLAN_SNAPSHOT_ROWS);
        for (size_t k = 0; k < n; ++k)
          for (int32_t j = sp[k]; j < sp[k + 1]; ++j) {
            const uint64_t len = uint64_t(ctx[k] - (qptr[k + 1] - sr[j])) + 1;
            cell(sb[j], 0) = Cell{int32_t(g), state_of(id[k], len)};
            ++g_count[kSnaps];
          }
      }
      // What attention reads after the layer's writes: every position in
      // each query's window.
      for (uint32_t g = 0; g < G(); ++g) {
        if (rec(g)) continue;
        const uint32_t w = grps[g].window;
        for (size_t k = 0; k < n; ++k) {
          const int64_t start = ctx[k] - (qptr[k + 1] - qptr[k]);
          for (int64_t pos = 0; pos < ctx[k]; ++pos) {
            if (w != 0 && pos + int64_t(w) <= start) continue;
            const int32_t b = pg[g][k][size_t(pos / bs)];
            const std::string bad = holds(b, pos % bs, g, id[k][size_t(pos)]);
            ASSERT_EQ(bad, "") << trace << "after the step's writes, seq " << ids[k]
                               << " attends over position " << pos << " in " << bad;
          }
        }
      }
    }
    const int idx = int(plans.size());
    for (size_t k = 0; k < n; ++k) {
      Seq& s = seqs[find(ids[k])];
      s.plan = idx;
      s.inflight = p.failed ? 0 : uint64_t(ctx[k]);
    }
    plans.push_back(std::move(p));
  }

  void forget_plan(size_t i) {
    plans.erase(plans.begin() + long(i));
    for (Seq& s : seqs) {
      if (s.plan == int(i))
        s.plan = -1;
      else if (s.plan > int(i))
        --s.plan;
    }
  }

  void resolve() {
    if (plans.empty()) return;
    const size_t i = r(plans.size());
    Plan& p = plans[i];
    const std::string at = "plan " + str(i) + " ";
    if (p.failed) {  // the engine aborts a step that failed
      ASSERT_EQ(pkv_batch_abort(p.b), PKV_OK) << pkv_last_error_message();
      if (r(2)) ASSERT_EQ(pkv_batch_abort(p.b), PKV_OK);
      if (r(2)) ASSERT_EQ(pkv_batch_commit(p.b), PKV_E_INVALID_STATE);
      trace += at + "abort, destroy\n";
      pkv_batch_destroy(p.b);
      forget_plan(i);
      return;
    }
    const int what = int(r(4));
    if (what == 0 && !p.committed) {  // commit, keep the plan a while
      ASSERT_EQ(pkv_batch_commit(p.b), PKV_OK) << pkv_last_error_message();
      p.committed = true;
      p.snaps.assign(G(), 0);
      trace += at + "commit\n";
      for (Seq& s : seqs)
        if (s.plan == int(i)) s.plan = -1;
      return;
    }
    if (what == 1 || p.committed) {
      ASSERT_EQ(pkv_batch_commit(p.b), PKV_OK) << pkv_last_error_message();
      if (r(2)) ASSERT_EQ(pkv_batch_commit(p.b), PKV_OK);
      if (r(2)) ASSERT_EQ(pkv_batch_abort(p.b), PKV_E_INVALID_STATE);
      trace += at + "commit, destroy\n";
    } else {
      trace += at + "destroy uncommitted\n";
    }
    pkv_batch_destroy(p.b);
    forget_plan(i);
  }

  void step() {
    const int op = int(r(20));
    if (!planned_yet && preplan && op >= 8 && op < 12 && r(4)) return append();
    if (op < 3)
      admit();
    else if (op < 6)
      append();
    else if (op < 7)
      truncate();
    else if (op < 8)
      fork();
    else if (op < 10)
      free_one();
    else if (op < 14)
      launch();
    else if (op < 18)
      resolve();
    else if (op == 18) {
      trace += "take copies\n";
      take_copies();
    }
  }
};

void run(uint64_t seed, int steps) {
  Harness h(seed);
  h.create();
  if (::testing::Test::HasFatalFailure()) return;
  for (int i = 0; i < steps; ++i) {
    h.step();
    if (!::testing::Test::HasFailure()) h.check();
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "seed " << seed << " step " << i;
      return;
    }
  }
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

TEST(ProvenanceGroups, RandomOperationsNeverServeKvNobodyWroteForThoseTokens) {
#if defined(PKV_SANITIZED)
  constexpr int kSeeds = 40;
#else
  constexpr int kSeeds = 400;
#endif
  const int steps = env_int("PKV_PROVENANCE_GROUPS_STEPS", 250);
  if (const char* one = std::getenv("PKV_PROVENANCE_GROUPS_SEED"))
    return run(std::strtoull(one, nullptr, 10), steps);
  const int seeds = env_int("PKV_PROVENANCE_GROUPS_SEEDS", kSeeds);
  for (int s = 1; s <= seeds && !HasFailure(); ++s) run(uint64_t(s), steps);
  if (std::getenv("PKV_PROVENANCE_GROUPS_DUMP"))
    std::printf(
        "hits %lu (with state %lu) steps %lu failed %lu snapshots %lu copies %lu "
        "appends refused %lu plans refused %lu\n",
        (unsigned long)g_count[kHits], (unsigned long)g_count[kStateHits],
        (unsigned long)g_count[kSteps], (unsigned long)g_count[kFailed],
        (unsigned long)g_count[kSnaps], (unsigned long)g_count[kCopies],
        (unsigned long)g_count[kOob], (unsigned long)g_count[kRefused]);
}

}  // namespace
