// Multi-group pools (pkv_pool_create_groups, pagedkv/groups.h) under random
// operation sequences, checked against a reference model of what an engine
// observes. Built as groups_replay (CTest fuzz.replay_groups_corpus over
// corpus_groups/) and fuzz_groups (libFuzzer, scripts/test-fuzz.sh).
//
// The model never reads the library's bookkeeping. It keeps:
//  - per sequence: its tokens (so a fingerprint of every prefix, including
//    its LoRA and salt), the lookahead it reserved, the window's released
//    entries per group as the contract defines them (blocks wholly before
//    the window of the first token of each append, or of the hit point),
//    and its computed count as groups.h defines it (appends before the
//    pool's first plan; committed plans after; a hit's length);
//  - a mirror of the engine's memory: per block id and slot, the (group,
//    fingerprint) the harness as engine wrote there: the query tokens of
//    the plans it committed (at the plan's SLOT_MAPPING), the state after
//    the plan's tokens in a recurrent group's slot, the copies it took with
//    pkv_pool_group_take_copies (in the order given), and, before the
//    pool's first plan, the appended tokens at append (an ABI 1 engine).
// Checks, after every operation: pkv_pool_validate is OK; every table has
// the length the sequence's slots need (recurrent: one slot once appended);
// a window group's table is null exactly at the released entries; no block
// id is in two groups, nor twice in one table, and a block two sequences
// hold lies at the same index and holds the same tokens for both; the
// blocks in use over all groups fit the budget and the per-group stats add
// up; infos and stats equal the model. Whenever no copy is pending, every
// computed token's slot (every group, within the window) holds what the
// harness wrote for that token, and a recurrent slot the state after the
// computed tokens. Every prefix hit's blocks hold exactly the queried
// tokens (written, by a committed step, for this group). Every plan's
// arrays equal the tables, and a recurrent group's snapshot arrays
// (PKV_GROUP_SNAPSHOT_EVERY_BLOCK, on in pools whose header sets it) name
// increasing block boundaries inside each query chunk in fresh slots, which
// the harness as engine writes with the state after that boundary, so a
// hit on one is checked like any state; a plan is refused exactly when its context is
// not computed (INVALID_STATE) or it recomputes a recurrent state or needs
// released keys (INVALID_ARGUMENT). A failed call changes nothing that can
// be observed. An append fails with OUT_OF_BLOCKS exactly when
// pkv_seq_blocks_needed exceeds the free blocks, and takes that many.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ops_harness.h"
#include "pagedkv/pagedkv.h"

namespace pkv_fuzz {
namespace {

Counters g_counters;
const bool g_trace = std::getenv("PKV_FUZZ_TRACE") != nullptr;

void trace(const char* f, ...) {
  if (!g_trace) return;
  va_list ap;
  va_start(ap, f);
  std::vfprintf(stderr, f, ap);
  va_end(ap);
}

[[noreturn]] void die(int line, const char* cond, const std::string& what) {
  std::fprintf(stderr,
               "pkv_fuzz: check failed at groups_harness.cpp:%d: %s\n  %s\n  last error: %s\n",
               line, cond, what.c_str(), pkv_last_error_message());
  std::fflush(stderr);
  std::abort();
}

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) die(__LINE__, #cond, fmt(__VA_ARGS__)); \
  } while (0)

#define EXPECT_STATUS(call, want)                                                               \
  do {                                                                                          \
    pkv_status got_ = (call);                                                                   \
    pkv_status want_ = (want);                                                                  \
    CHECK(got_ == want_, "%s returned %d, the model expects %d", #call, int(got_), int(want_)); \
    if (got_ != PKV_OK) {                                                                       \
      CHECK(pkv_last_error_message()[0] != '\0', "%s failed without a message", #call);         \
      ++g_counters.failed_calls;                                                                \
    }                                                                                           \
  } while (0)

#define OK(call) EXPECT_STATUS(call, PKV_OK)

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Bytes {
 public:
  Bytes(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint32_t below(uint32_t m) { return m ? u8() % m : 0; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t i_ = 0;
};

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Prompt families: every sequence of a family draws its tokens from one
// stream, so prefixes repeat and hits happen.
constexpr uint32_t kFamilies = 3;
constexpr uint32_t kStream = 512;
int32_t family_token(uint32_t f, uint64_t pos) {
  return int32_t(mix(f * 1000003ull + pos) % 50000);
}

constexpr uint32_t kMaxSeqs = 8;
constexpr uint64_t kMaxTokens = 160;

struct Slot {
  int32_t group = -1;  // -1: nothing the harness wrote
  uint64_t fp = 0;
  bool operator==(const Slot& o) const { return group == o.group && fp == o.fp; }
};

struct MSeq {
  pkv_seq_id id = 0;
  uint32_t family = 0;
  uint64_t lora = 0;
  uint32_t salt = 0;  // 0 = none
  std::vector<int32_t> tokens;
  uint64_t reserved = 0;        // slots the table must cover (tokens + lookahead)
  uint64_t computed = 0;        // groups.h's computed count
  uint64_t cached = 0;          // num_cached_tokens
  std::vector<uint64_t> nulls;  // per group: released leading entries
  bool state_started = false;   // recurrent groups hold a slot (appended since create/fork)
  bool planned = false;         // computed count follows committed plans
  uint32_t epoch = 0;           // bumped by a truncate that drops tokens
  std::vector<std::vector<int32_t>> tables;  // per group, as last read
  uint64_t ctx_fp() const { return mix(0x1234 + lora * 31 + salt * 7); }
  // fingerprint of the K/V of token p (depends on the whole prefix)
  uint64_t fp(uint64_t p) const {
    uint64_t h = ctx_fp();
    for (uint64_t i = 0; i <= p; ++i) h = mix(h ^ (uint64_t(uint32_t(tokens[i])) + 1) * 0x9E37ull);
    return h;
  }
  std::vector<uint64_t> fps() const {
    std::vector<uint64_t> out(tokens.size());
    uint64_t h = ctx_fp();
    for (uint64_t i = 0; i < tokens.size(); ++i)
      out[i] = h = mix(h ^ (uint64_t(uint32_t(tokens[i])) + 1) * 0x9E37ull);
    return out;
  }
};

// The recurrent state after the first n tokens (fps of the prefix).
uint64_t state_fp(const std::vector<uint64_t>& fps, uint64_t n) {
  return mix(fps[n - 1] ^ 0x5157A7Eull);
}

struct Harness {
  pkv_pool* pool = nullptr;
  uint32_t G = 0, bs = 0, nb = 0;
  std::vector<uint32_t> kind, window;
  bool caching = true;
  bool snap_every = false;  // recurrent groups take PKV_GROUP_SNAPSHOT_EVERY_BLOCK
  bool planned = false;     // the pool has prepared a plan
  std::vector<MSeq> seqs;
  std::vector<std::vector<Slot>> mem;  // [block][slot]; recurrent: slot 0
  std::vector<pkv_seq_id> dead;        // freed ids (stale)
  uint64_t query_tokens = 0, hit_tokens = 0;
  bool copies_pending = false;  // an op may have recorded copies not taken yet
  bool persistent = false;      // the current plan's page table is padded rows

  bool rec(uint32_t g) const { return kind[g] == PKV_GROUP_RECURRENT; }
  bool any_rec() const {
    for (uint32_t g = 0; g < G; ++g)
      if (rec(g)) return true;
    return false;
  }
  // Blocks wholly before the window of a token at position p (no window: 0).
  uint64_t window_end(uint32_t g, uint64_t p) const {
    if (kind[g] != PKV_GROUP_SLIDING_WINDOW || p + 1 <= window[g]) return 0;
    return (p + 1 - window[g]) / bs;
  }

  // ----------------------------------------------------------- observation
  struct Obs {
    std::vector<std::vector<std::vector<int32_t>>> tables;
    std::vector<pkv_seq_info> infos;
    pkv_pool_stats stats;
    std::vector<pkv_group_stats> gstats;
  };
  std::vector<int32_t> read_table(pkv_seq_id id, uint32_t g) {
    std::vector<int32_t> t(256);
    uint64_t len = 0;
    OK(pkv_seq_group_block_table(pool, id, g, t.data(), t.size(), &len));
    CHECK(len <= t.size(), "table length %llu", (unsigned long long)len);
    t.resize(len);
    return t;
  }
  Obs observe() {
    Obs o;
    for (const MSeq& s : seqs) {
      std::vector<std::vector<int32_t>> ts;
      for (uint32_t g = 0; g < G; ++g) ts.push_back(read_table(s.id, g));
      o.tables.push_back(ts);
      pkv_seq_info info;
      pkv_seq_info_init(&info);
      OK(pkv_seq_get_info(pool, s.id, &info));
      o.infos.push_back(info);
    }
    pkv_pool_stats_init(&o.stats);
    OK(pkv_pool_get_stats(pool, &o.stats));
    for (uint32_t g = 0; g < G; ++g) {
      pkv_group_stats gs;
      pkv_group_stats_init(&gs);
      OK(pkv_pool_group_stats(pool, g, &gs));
      o.gstats.push_back(gs);
    }
    return o;
  }
  void expect_same(const Obs& a, const Obs& b, const char* what) {
    CHECK(a.tables == b.tables, "%s: a failed call changed a block table", what);
    for (size_t i = 0; i < a.infos.size(); ++i)
      CHECK(std::memcmp(&a.infos[i], &b.infos[i], sizeof a.infos[i]) == 0,
            "%s: a failed call changed seq %zu's info", what, i);
    const pkv_pool_stats &x = a.stats, &y = b.stats;
    CHECK(x.num_free_blocks == y.num_free_blocks && x.num_used_blocks == y.num_used_blocks &&
              x.num_cached_blocks == y.num_cached_blocks && x.num_seqs == y.num_seqs &&
              x.num_tokens == y.num_tokens && x.prefix_hit_tokens == y.prefix_hit_tokens &&
              x.num_evictions == y.num_evictions && x.num_cow_copies == y.num_cow_copies,
          "%s: a failed call changed the pool's stats", what);
    for (uint32_t g = 0; g < G; ++g)
      CHECK(std::memcmp(&a.gstats[g], &b.gstats[g], sizeof a.gstats[g]) == 0,
            "%s: a failed call changed group %u's stats", what, g);
  }

  // Everything checked after every operation.
  void check_all() {
    CHECK(pkv_pool_validate(pool) == PKV_OK, "pkv_pool_validate: %s", pkv_last_error_message());
    ++g_counters.validates;
    Obs o = observe();
    std::map<int32_t, std::vector<std::tuple<size_t, uint32_t, uint64_t>>> holders;
    uint64_t tokens = 0;
    std::vector<uint64_t> null_sum(G, 0);
    for (size_t i = 0; i < seqs.size(); ++i) {
      MSeq& s = seqs[i];
      s.tables = o.tables[i];
      tokens += s.tokens.size();
      uint64_t held = 0, slots = 0;
      for (uint32_t g = 0; g < G; ++g) {
        const std::vector<int32_t>& t = s.tables[g];
        if (rec(g)) {
          CHECK(t.size() == (s.state_started ? 1u : 0u),
                "seq %zu group %u (recurrent) table has %zu entries, expected %d", i, g, t.size(),
                s.state_started ? 1 : 0);
        } else {
          CHECK(t.size() == ceil_div(s.reserved, bs),
                "seq %zu group %u table has %zu entries, the model expects %llu (%llu slots)", i, g,
                t.size(), (unsigned long long)ceil_div(s.reserved, bs),
                (unsigned long long)s.reserved);
          for (uint64_t j = 0; j < t.size(); ++j)
            CHECK((t[j] == 0) == (j < s.nulls[g]),
                  "seq %zu group %u entry %llu is %d; the model says %llu leading entries are "
                  "released",
                  i, g, (unsigned long long)j, t[j], (unsigned long long)s.nulls[g]);
          slots = std::max<uint64_t>(slots, t.size() * bs);
          null_sum[g] += s.nulls[g];
        }
        std::set<int32_t> mine;
        for (uint64_t j = 0; j < t.size(); ++j) {
          if (t[j] == 0) continue;
          CHECK(t[j] > 0 && uint32_t(t[j]) < nb, "block id %d out of range", t[j]);
          CHECK(mine.insert(t[j]).second, "seq %zu group %u names block %d twice", i, g, t[j]);
          holders[t[j]].push_back({i, g, j});
          ++held;
        }
      }
      const pkv_seq_info& info = o.infos[i];
      CHECK(info.num_tokens == s.tokens.size(), "seq %zu num_tokens %llu, model %zu", i,
            (unsigned long long)info.num_tokens, s.tokens.size());
      CHECK(info.num_computed_tokens == s.computed, "seq %zu num_computed_tokens %llu, model %llu",
            i, (unsigned long long)info.num_computed_tokens, (unsigned long long)s.computed);
      CHECK(info.num_cached_tokens == s.cached, "seq %zu num_cached_tokens %llu, model %llu", i,
            (unsigned long long)info.num_cached_tokens, (unsigned long long)s.cached);
      CHECK(info.num_blocks == held, "seq %zu num_blocks %llu, its tables hold %llu", i,
            (unsigned long long)info.num_blocks, (unsigned long long)held);
      CHECK(info.num_slots == slots, "seq %zu num_slots %llu, expected %llu", i,
            (unsigned long long)info.num_slots, (unsigned long long)slots);
      CHECK(info.lora_id == s.lora, "seq %zu lora", i);
    }
    // Sharing: one group per block; holders at the same index with the
    // same tokens there.
    std::vector<std::vector<uint64_t>> fps(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) fps[i] = seqs[i].fps();
    for (const auto& kv : holders) {
      const auto& hs = kv.second;
      const auto& [i0, g0, j0] = hs[0];
      for (const auto& [i, g, j] : hs) {
        CHECK(g == g0, "block %d is in group %u (seq %zu) and group %u (seq %zu)", kv.first, g0, i0,
              g, i);
        if (rec(g)) {
          CHECK(hs.size() == 1, "state slot %d is live in %zu sequences", kv.first, hs.size());
          continue;
        }
        CHECK(j == j0, "block %d is at index %llu of seq %zu and %llu of seq %zu", kv.first,
              (unsigned long long)j0, i0, (unsigned long long)j, i);
        const uint64_t end =
            std::min<uint64_t>({(j + 1) * bs, seqs[i].tokens.size(), seqs[i0].tokens.size()});
        for (uint64_t p = j * bs; p < end; ++p)
          CHECK(fps[i][p] == fps[i0][p],
                "block %d is shared by seqs %zu and %zu, which differ at token %llu", kv.first, i0,
                i, (unsigned long long)p);
      }
    }
    // Budget and stats.
    const pkv_pool_stats& st = o.stats;
    CHECK(st.num_used_blocks + st.num_free_blocks == nb - 1, "used %llu + free %llu != %u",
          (unsigned long long)st.num_used_blocks, (unsigned long long)st.num_free_blocks, nb - 1);
    CHECK(holders.size() <= st.num_used_blocks, "tables name %zu blocks, stats say %llu used",
          holders.size(), (unsigned long long)st.num_used_blocks);
    uint64_t used = 0;
    for (uint32_t g = 0; g < G; ++g) {
      used += o.gstats[g].num_used_blocks;
      CHECK(o.gstats[g].kind == kind[g], "group %u kind", g);
      CHECK(o.gstats[g].num_null_entries == null_sum[g], "group %u null entries %llu, model %llu",
            g, (unsigned long long)o.gstats[g].num_null_entries, (unsigned long long)null_sum[g]);
      if (!caching) CHECK(o.gstats[g].num_cached_blocks == 0, "caching off but group %u caches", g);
    }
    CHECK(used == st.num_used_blocks, "groups use %llu blocks, the pool says %llu",
          (unsigned long long)used, (unsigned long long)st.num_used_blocks);
    CHECK(used <= nb - 1, "over budget");
    CHECK(st.num_seqs == seqs.size(), "num_seqs");
    CHECK(st.num_tokens == tokens, "num_tokens %llu, model %llu", (unsigned long long)st.num_tokens,
          (unsigned long long)tokens);
    CHECK(st.prefix_query_tokens == query_tokens, "prefix_query_tokens %llu, model %llu",
          (unsigned long long)st.prefix_query_tokens, (unsigned long long)query_tokens);
    CHECK(st.prefix_hit_tokens == hit_tokens, "prefix_hit_tokens %llu, model %llu",
          (unsigned long long)st.prefix_hit_tokens, (unsigned long long)hit_tokens);
    if (!copies_pending) check_written(fps);
  }

  // Every computed token's slot holds what the harness wrote for it.
  void check_written(const std::vector<std::vector<uint64_t>>& fps) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      const MSeq& s = seqs[i];
      for (uint32_t g = 0; g < G; ++g) {
        const std::vector<int32_t>& t = s.tables[g];
        if (rec(g)) {
          if (!s.state_started || s.computed == 0) continue;
          const Slot want{int32_t(g), state_fp(fps[i], s.computed)};
          CHECK(mem[t[0]][0] == want,
                "seq %zu group %u: state slot %d does not hold the state after its %llu computed "
                "tokens (holds group %d's %llx)",
                i, g, t[0], (unsigned long long)s.computed, mem[t[0]][0].group,
                (unsigned long long)mem[t[0]][0].fp);
          ++g_counters.attention_checked;
          continue;
        }
        for (uint64_t p = s.nulls[g] * bs; p < s.computed; ++p) {
          const int32_t b = t[p / bs];
          CHECK(b != 0, "seq %zu group %u: computed token %llu is in a released entry", i, g,
                (unsigned long long)p);
          CHECK(mem[b][p % bs] == (Slot{int32_t(g), fps[i][p]}),
                "seq %zu group %u: computed token %llu's slot (block %d) holds group %d's %llx, "
                "not its K/V",
                i, g, (unsigned long long)p, b, mem[b][p % bs].group,
                (unsigned long long)mem[b][p % bs].fp);
          ++g_counters.attention_checked;
        }
      }
    }
  }

  // -------------------------------------------------------------- copies
  void take_copies(Bytes& in) {
    for (uint32_t g = 0; g < G; ++g) {
      uint64_t len = 0;
      if (in.below(4) == 0) {
        pkv_status st = pkv_pool_group_take_copies(pool, g, nullptr, nullptr, 0, &len);
        CHECK(st == PKV_OK || (st == PKV_E_BUFFER_TOO_SMALL && len > 0),
              "take_copies(capacity 0) returned %d with %llu pending", int(st),
              (unsigned long long)len);
        if (st != PKV_OK) ++g_counters.failed_calls;
      }
      std::vector<int32_t> src(4 * nb + 8), dst(4 * nb + 8);
      OK(pkv_pool_group_take_copies(pool, g, src.data(), dst.data(), src.size(), &len));
      for (uint64_t k = 0; k < len; ++k) {
        CHECK(src[k] > 0 && uint32_t(src[k]) < nb && dst[k] > 0 && uint32_t(dst[k]) < nb &&
                  src[k] != dst[k],
              "group %u copy %d -> %d", g, src[k], dst[k]);
        trace("  copy g%u %d -> %d\n", g, src[k], dst[k]);
        mem[dst[k]] = mem[src[k]];
      }
    }
    copies_pending = false;
  }

  // ----------------------------------------------------------------- ops
  int pick(Bytes& in) { return seqs.empty() ? -1 : int(in.below(uint32_t(seqs.size()))); }

  void op_create(Bytes& in) {
    if (seqs.size() >= kMaxSeqs) return;
    MSeq s;
    s.family = in.below(kFamilies);
    const uint8_t c = in.u8();
    s.lora = (c & 3) == 3 ? 7 : 0;
    s.salt = (c >> 2) % 5 == 4 ? 1 : 0;
    pkv_seq_options o;
    pkv_seq_options_init(&o);
    o.lora_id = s.lora;
    o.cache_salt = s.salt ? "salt" : nullptr;
    OK(pkv_seq_create(pool, &o, &s.id));
    s.nulls.assign(G, 0);
    s.planned = planned;
    trace("create seq %llu family %u lora %llu salt %u\n", (unsigned long long)s.id, s.family,
          (unsigned long long)s.lora, s.salt);
    seqs.push_back(s);
  }

  std::vector<int32_t> prompt(const MSeq& s, uint64_t from, uint64_t n, Bytes& in) {
    std::vector<int32_t> t(n);
    const uint32_t diverge = in.below(4) == 0 ? in.below(uint32_t(n) + 1) : ~0u;
    for (uint64_t k = 0; k < n; ++k)
      t[k] = k == diverge ? int32_t(50000 + in.below(200)) : family_token(s.family, from + k);
    return t;
  }

  bool is_empty(const MSeq& s) const {
    bool attn = false;
    for (uint32_t g = 0; g < G; ++g) attn = attn || !rec(g);
    return s.tokens.empty() && !(any_rec() && s.state_started) &&
           (!attn || ceil_div(s.reserved, bs) == 0);
  }

  void op_match(Bytes& in) {
    int i = pick(in);
    if (i < 0) return;
    if (in.below(4) != 0)  // mostly on an empty sequence (admission)
      for (size_t k = 0; k < seqs.size(); ++k)
        if (is_empty(seqs[k])) i = int(k);
    MSeq& s = seqs[size_t(i)];
    const uint64_t n = 1 + in.below(uint32_t(std::min<uint64_t>(kMaxTokens, 24ull * bs)));
    std::vector<int32_t> q = prompt(s, 0, n, in);
    const bool empty = is_empty(s);
    // A fork child of an empty sequence is empty too; a child of a
    // non-empty one is not (it holds tokens).
    Obs before = observe();
    uint64_t cached = 0;
    pkv_status st = pkv_seq_match_prefix(pool, s.id, q.data(), n, &cached);
    trace("match seq %llu n %llu -> %d cached %llu\n", (unsigned long long)s.id,
          (unsigned long long)n, int(st), (unsigned long long)cached);
    if (!empty) {
      EXPECT_STATUS(st, PKV_E_INVALID_STATE);
      expect_same(before, observe(), "match_prefix");
      return;
    }
    OK(st);
    query_tokens += n;
    CHECK(cached % bs == 0 && cached < n, "hit %llu of %llu tokens, block size %u",
          (unsigned long long)cached, (unsigned long long)n, bs);
    if (!caching) CHECK(cached == 0, "caching off but hit %llu", (unsigned long long)cached);
    hit_tokens += cached;
    if (cached == 0) return;
    s.tokens.assign(q.begin(), q.begin() + int64_t(cached));
    s.reserved = s.computed = s.cached = cached;
    for (uint32_t g = 0; g < G; ++g) s.nulls[g] = window_end(g, cached);
    // Every hit block holds the queried tokens, written for its group.
    const std::vector<uint64_t> fps = s.fps();
    for (uint32_t g = 0; g < G; ++g) {
      if (rec(g)) continue;
      const std::vector<int32_t> t = read_table(s.id, g);
      CHECK(t.size() == cached / bs, "hit of %llu tokens gives group %u %zu entries",
            (unsigned long long)cached, g, t.size());
      for (uint64_t j = s.nulls[g]; j < t.size(); ++j) {
        CHECK(t[j] > 0, "hit entry %llu of group %u is null inside the window",
              (unsigned long long)j, g);
        for (uint64_t p = j * bs; p < (j + 1) * bs; ++p) {
          CHECK(mem[t[j]][p % bs] == (Slot{int32_t(g), fps[p]}),
                "hit block %d (group %u, entry %llu) slot %llu holds group %d's %llx, not the "
                "queried token's K/V",
                t[j], g, (unsigned long long)j, (unsigned long long)(p % bs),
                mem[t[j]][p % bs].group, (unsigned long long)mem[t[j]][p % bs].fp);
          ++g_counters.attention_checked;
        }
      }
    }
  }

  void op_append(Bytes& in, bool decode) {
    int i = pick(in);
    if (i < 0) return;
    MSeq& s = seqs[size_t(i)];
    const uint64_t n0 = s.tokens.size();
    uint64_t n = decode ? 1 : in.below(uint32_t(3 * bs + 1));
    if (in.below(8) == 0) n = 0;
    const uint32_t la = in.below(4) == 0 ? in.below(uint32_t(bs + 2)) : 0;
    if (n0 + n + la > kMaxTokens) return;
    std::vector<int32_t> t = prompt(s, n0, n, in);
    uint64_t needed = 0;
    OK(pkv_seq_blocks_needed(pool, s.id, n, la, &needed));
    Obs before = observe();
    pkv_status st = pkv_seq_append(pool, s.id, n ? t.data() : nullptr, n, la);
    trace("append seq %llu n %llu la %u (needed %llu, free %llu) -> %d\n", (unsigned long long)s.id,
          (unsigned long long)n, la, (unsigned long long)needed,
          (unsigned long long)before.stats.num_free_blocks, int(st));
    if (needed > before.stats.num_free_blocks) {
      EXPECT_STATUS(st, PKV_E_OUT_OF_BLOCKS);
      expect_same(before, observe(), "append");
      return;
    }
    OK(st);
    copies_pending = true;
    pkv_pool_stats after;
    pkv_pool_stats_init(&after);
    OK(pkv_pool_get_stats(pool, &after));
    if (g_trace)
      for (uint32_t g = 0; g < G; ++g) {
        std::string a, b2;
        for (int32_t x : before.tables[size_t(i)][g]) a += " " + std::to_string(x);
        for (int32_t x : read_table(s.id, g)) b2 += " " + std::to_string(x);
        trace("  group %u table [%s ] -> [%s ], used %llu -> ?\n", g, a.c_str(), b2.c_str(),
              (unsigned long long)before.gstats[g].num_used_blocks);
      }
    if (needed > 0)
      CHECK(after.num_free_blocks + needed == before.stats.num_free_blocks,
            "append took %llu blocks, blocks_needed said %llu",
            (unsigned long long)(before.stats.num_free_blocks - after.num_free_blocks),
            (unsigned long long)needed);
    else
      CHECK(after.num_free_blocks >= before.stats.num_free_blocks,
            "append with blocks_needed 0 took blocks");
    if (n > 0) {
      // The window of the first new token, over the computed tokens (all of
      // them before the pool's first plan).
      const uint64_t from = std::min(n0, planned ? s.computed : n0);
      for (uint32_t g = 0; g < G; ++g)
        if (!rec(g))
          s.nulls[g] = std::max<uint64_t>(
              s.nulls[g], std::min<uint64_t>(ceil_div(s.reserved, bs), window_end(g, from)));
      s.state_started = true;
    }
    s.tokens.insert(s.tokens.end(), t.begin(), t.end());
    s.reserved = std::max<uint64_t>(s.reserved, n0 + n + la);
    if (!planned && n > 0) {
      // An ABI 1 engine: the step before any plan wrote the new tokens
      // (after running the pending copies).
      take_copies(in);
      s.computed = s.tokens.size();
      s.tables.clear();
      for (uint32_t g = 0; g < G; ++g) s.tables.push_back(read_table(s.id, g));
      const std::vector<uint64_t> fps = s.fps();
      for (uint32_t g = 0; g < G; ++g) {
        if (rec(g)) {
          mem[s.tables[g][0]][0] = Slot{int32_t(g), state_fp(fps, s.tokens.size())};
          continue;
        }
        for (uint64_t p = n0; p < s.tokens.size(); ++p)
          if (p / bs >= s.nulls[g]) mem[s.tables[g][p / bs]][p % bs] = Slot{int32_t(g), fps[p]};
      }
    } else if (!planned) {
      s.computed = s.tokens.size();
    }
  }

  void op_fork(Bytes& in) {
    int i = pick(in);
    if (i < 0 || seqs.size() >= kMaxSeqs) return;
    MSeq c = seqs[size_t(i)];
    OK(pkv_seq_fork(pool, seqs[size_t(i)].id, &c.id));
    trace("fork seq %llu -> %llu\n", (unsigned long long)seqs[size_t(i)].id,
          (unsigned long long)c.id);
    c.state_started = false;
    c.epoch = 0;
    seqs.push_back(c);
  }

  void op_truncate(Bytes& in) {
    int i = pick(in);
    if (i < 0) return;
    MSeq& s = seqs[size_t(i)];
    const uint64_t len = s.tokens.size();
    const uint64_t back = in.below(uint32_t(std::min<uint64_t>(len, 2 * bs)) + 1);
    truncate_to(s, in.below(4) == 0 ? len + 1 + in.below(3) : len - back);
  }

  void truncate_to(MSeq& s, uint64_t n) {
    const uint64_t len = s.tokens.size(), keep = ceil_div(n, bs);
    pkv_status want = PKV_OK;
    if (n > len) want = PKV_E_INVALID_ARGUMENT;
    for (uint32_t g = 0; g < G; ++g) {
      if (rec(g) && n < len) want = PKV_E_INVALID_ARGUMENT;
      // The next token at n needs keys from blocks window_end(g, n) on.
      if (!rec(g))
        for (uint64_t j = window_end(g, n); j < keep; ++j)
          if (j < s.nulls[g]) want = PKV_E_INVALID_ARGUMENT;
    }
    Obs before = observe();
    pkv_status st = pkv_seq_truncate(pool, s.id, n);
    trace("truncate seq %llu %llu -> %llu: %d\n", (unsigned long long)s.id, (unsigned long long)len,
          (unsigned long long)n, int(st));
    EXPECT_STATUS(st, want);
    if (st != PKV_OK) {
      expect_same(before, observe(), "truncate");
      return;
    }
    s.tokens.resize(n);
    s.reserved = std::min<uint64_t>(keep * bs, std::max<uint64_t>(s.reserved, n));
    if (ceil_div(s.reserved, bs) > keep) s.reserved = keep * bs;
    s.computed = std::min(s.computed, n);
    s.cached = std::min(s.cached, n);
    for (uint32_t g = 0; g < G; ++g) s.nulls[g] = std::min(s.nulls[g], keep);
    // A running plan's commit skips the sequence only when the truncate
    // dropped tokens it may have written (to its own length: nothing).
    if (n < len) ++s.epoch;
  }

  void free_seq(size_t i) {
    trace("free seq %llu\n", (unsigned long long)seqs[i].id);
    OK(pkv_seq_free(pool, seqs[i].id));
    dead.push_back(seqs[i].id);
    seqs.erase(seqs.begin() + int64_t(i));
  }

  void op_free(Bytes& in) {
    int i = pick(in);
    if (i >= 0) free_seq(size_t(i));
  }

  void op_stale(Bytes& in) {
    pkv_seq_id id = dead.empty() || in.below(2) ? pkv_seq_id(0xDEAD0000u + in.u8())
                                                : dead[in.below(uint32_t(dead.size()))];
    for (const MSeq& s : seqs)
      if (s.id == id) return;
    Obs before = observe();
    int32_t tok = 5;
    uint64_t out = 0;
    pkv_seq_id child = 0;
    switch (in.below(5)) {
      case 0:
        EXPECT_STATUS(pkv_seq_append(pool, id, &tok, 1, 0), PKV_E_NOT_FOUND);
        break;
      case 1:
        EXPECT_STATUS(pkv_seq_fork(pool, id, &child), PKV_E_NOT_FOUND);
        break;
      case 2:
        EXPECT_STATUS(pkv_seq_truncate(pool, id, 0), PKV_E_NOT_FOUND);
        break;
      case 3:
        EXPECT_STATUS(pkv_seq_free(pool, id), PKV_E_NOT_FOUND);
        break;
      default: {
        uint32_t q = 1;
        pkv_batch* b = nullptr;
        EXPECT_STATUS(pkv_batch_prepare(pool, &id, &q, 1, nullptr, &b), PKV_E_NOT_FOUND);
        break;
      }
    }
    (void)out;
    expect_same(before, observe(), "stale id");
  }

  // A step: prepare over 1-4 sequences, run the copies, check the plan,
  // then the engine writes and commits, aborts, or drops the plan.
  void op_step(Bytes& in) {
    if (seqs.empty()) return;
    // Mostly sequences with tokens (a plan over an empty one is refused).
    std::vector<size_t> cand;
    // Mostly those with uncomputed tokens (a recurrent state cannot take
    // computed ones again).
    const uint8_t pool_of = in.below(8);
    for (size_t k = 0; k < seqs.size(); ++k)
      if (pool_of == 0 || (pool_of < 3 && !seqs[k].tokens.empty()) ||
          seqs[k].tokens.size() > seqs[k].computed)
        cand.push_back(k);
    if (cand.empty()) return;
    const uint32_t m = 1 + in.below(std::min<uint32_t>(4, uint32_t(cand.size())));
    std::vector<size_t> idx;
    for (uint32_t k = 0; k < m; ++k) {
      size_t i = cand[in.below(uint32_t(cand.size()))];
      if (in.below(16) == 0 || std::find(idx.begin(), idx.end(), i) == idx.end()) idx.push_back(i);
    }
    std::vector<pkv_seq_id> ids;
    std::vector<uint32_t> qs;
    pkv_status want = PKV_OK;
    std::set<size_t> seen;
    for (size_t i : idx) {
      const MSeq& s = seqs[i];
      ids.push_back(s.id);
      const uint64_t n = s.tokens.size();
      // The contract's computed count for this plan: a sequence's first
      // plan takes back what its appends counted, from its first query on.
      uint64_t q;
      const uint8_t mode = in.below(32);
      const uint64_t c0 = s.computed;
      if (mode < 29)
        q = n - std::min(c0, n ? n - 1 : 0);
      else if (mode == 29)
        q = n > c0 + 1 ? n - c0 - 1 : 0;  // too few: context not computed
      else if (mode == 30)
        q = n ? 1 + in.below(uint32_t(n)) : 0;
      else
        q = n + in.below(2);
      qs.push_back(uint32_t(q));
      pkv_status w = PKV_OK;
      if (!seen.insert(i).second)
        w = PKV_E_INVALID_ARGUMENT;
      else if (q == 0 || q > n)
        w = PKV_E_INVALID_ARGUMENT;
      else {
        const uint64_t start = n - q;
        const uint64_t c = s.planned ? s.computed : std::min(s.computed, start);
        if (start > c) w = PKV_E_INVALID_STATE;
        for (uint32_t g = 0; g < G && w == PKV_OK; ++g) {
          if (rec(g)) {
            if (!s.state_started) w = PKV_E_INVALID_STATE;
            // A recurrent state holds every computed token: recomputing
            // from below them is refused, except a sequence's first plan
            // from position 0 (the state restarts; the pool's first plan
            // needs it when appends counted tokens computed).
            else if (start < s.computed && (s.planned || start > 0))
              w = PKV_E_INVALID_ARGUMENT;
          } else if (kind[g] == PKV_GROUP_SLIDING_WINDOW) {
            const uint64_t first_key = start + 1 > window[g] ? start + 1 - window[g] : 0;
            if (first_key / bs < s.nulls[g]) w = PKV_E_INVALID_ARGUMENT;
          }
        }
      }
      // The first failing sequence decides (the library checks in order).
      if (want == PKV_OK) want = w;
    }
    Obs before = observe();
    pkv_batch* b = nullptr;
    persistent = in.below(2) == 0;
    pkv_status st =
        pkv_batch_prepare_ex(pool, ids.data(), qs.data(), uint32_t(ids.size()),
                             persistent ? PKV_PREPARE_PERSISTENT_TABLE : 0, nullptr, &b);
    trace("step over %zu seqs -> %d (model %d) %s\n", ids.size(), int(st), int(want),
          st ? pkv_last_error_message() : "");
    for (size_t k = 0; k < ids.size(); ++k)
      trace("  seq %llu q %u n %zu computed %llu\n", (unsigned long long)ids[k], qs[k],
            seqs[idx[k]].tokens.size(), (unsigned long long)seqs[idx[k]].computed);
    if (st == PKV_E_OUT_OF_BLOCKS && want == PKV_OK) {
      // Moving shared state slots to copies needs free blocks; only
      // recurrent pools move them.
      CHECK(any_rec(), "prepare ran out of blocks on a pool without recurrent groups");
      ++g_counters.failed_calls;
      expect_same(before, observe(), "prepare");
      return;
    }
    if (want != PKV_OK && st != PKV_OK) {
      if (want == PKV_E_INVALID_STATE) ++g_counters.unwritten_refused;
      EXPECT_STATUS(st, want);
      expect_same(before, observe(), "prepare");
      return;
    }
    EXPECT_STATUS(st, want);
    planned = true;
    for (size_t k = 0; k < idx.size(); ++k) {
      MSeq& s = seqs[idx[k]];
      if (!s.planned) {
        s.computed = std::min<uint64_t>(s.computed, s.tokens.size() - qs[k]);
        s.planned = true;
      }
    }
    std::vector<uint64_t> computed_at_prepare;
    for (size_t i : idx) computed_at_prepare.push_back(seqs[i].computed);
    take_copies(in);
    check_all();  // the context of every query is written
    check_plan(b, idx, qs);
    // End the step.
    const uint8_t end = in.below(8);
    std::vector<uint32_t> epochs;
    for (size_t i : idx) epochs.push_back(seqs[i].epoch);
    if (end < 6) {
      write_plan(b, idx, qs);
      std::vector<pkv_seq_id> gone;
      if (end == 5) {  // one sequence preempted or rolled back after the writes
        const size_t k = in.below(uint32_t(idx.size()));
        if (in.below(2)) {
          gone.push_back(seqs[idx[k]].id);
          free_seq(idx[k]);
        } else if (!any_rec()) {  // a recurrent state cannot be rolled back
          MSeq& s = seqs[idx[k]];
          truncate_to(s, s.tokens.size() - std::min<uint64_t>(s.tokens.size(), in.below(3)));
        }
      }
      if (in.below(3) == 0) {
        trace("  destroy (commits)\n");
        pkv_batch_destroy(b);
      } else {
        trace("  commit\n");
        OK(pkv_batch_commit(b));
        OK(pkv_batch_commit(b));  // idempotent
        EXPECT_STATUS(pkv_batch_abort(b), PKV_E_INVALID_STATE);
        pkv_batch_destroy(b);
      }
      for (size_t k = 0; k < ids.size(); ++k) {
        for (MSeq& s : seqs)
          if (s.id == ids[k] && s.epoch == epochs[k])
            s.computed = std::max<uint64_t>(s.computed, s.tokens.size());
      }
    } else {
      // The model raised before the writes (some slots of the queries may
      // be garbage: they are not computed).
      if (end == 7) garble_plan(b, idx, qs, computed_at_prepare);
      trace("  abort\n");
      OK(pkv_batch_abort(b));
      EXPECT_STATUS(pkv_batch_commit(b), PKV_E_INVALID_STATE);
      pkv_batch_destroy(b);
    }
  }

  const void* plan_array(pkv_batch* b, uint32_t g, uint32_t which, uint32_t dtype, int64_t len) {
    pkv_tensor t;
    OK(pkv_batch_plan_tensor_group(b, g, which, &t));
    CHECK(t.ndim == 1 && t.shape[0] == len && t.dtype == dtype,
          "plan array %u of group %u: ndim %u len %lld dtype %u, expected len %lld", which, g,
          t.ndim, (long long)t.shape[0], t.dtype, (long long)len);
    return static_cast<const char*>(t.data) + t.byte_offset;
  }

  void check_plan(pkv_batch* b, const std::vector<size_t>& idx, const std::vector<uint32_t>& qs) {
    const size_t m = idx.size();
    uint64_t tokens = 0;
    for (uint32_t q : qs) tokens += q;
    for (uint32_t g = 0; g < G; ++g) {
      auto qptr = static_cast<const int32_t*>(
          plan_array(b, g, PKV_PLAN_QUERY_INDPTR, PKV_DTYPE_I32, int64_t(m + 1)));
      auto ctx = static_cast<const int32_t*>(
          plan_array(b, g, PKV_PLAN_CONTEXT_LENS, PKV_DTYPE_I32, int64_t(m)));
      auto pptr = static_cast<const int32_t*>(
          plan_array(b, g, PKV_PLAN_PAGE_INDPTR, PKV_DTYPE_I32, int64_t(m + 1)));
      auto last = static_cast<const int32_t*>(
          plan_array(b, g, PKV_PLAN_LAST_PAGE_LEN, PKV_DTYPE_I32, int64_t(m)));
      uint64_t pages = 0;
      for (size_t k = 0; k < m; ++k) pages += rec(g) ? 1 : ceil_div(seqs[idx[k]].tokens.size(), bs);
      // Padded rows (PKV_PREPARE_PERSISTENT_TABLE): row k at k * stride, 0
      // past its pages; a recurrent group's rows are one page.
      const int64_t stride = persistent ? pptr[1] : 0;
      if (persistent) {
        CHECK(stride >= 1 && (!rec(g) || stride == 1), "group %u stride %lld", g,
              (long long)stride);
        pages = m * uint64_t(stride);
      }
      auto pidx = static_cast<const int32_t*>(
          plan_array(b, g, PKV_PLAN_PAGE_INDICES, PKV_DTYPE_I32, int64_t(pages)));
      auto slots = static_cast<const int64_t*>(
          plan_array(b, g, PKV_PLAN_SLOT_MAPPING, PKV_DTYPE_I64, int64_t(rec(g) ? m : tokens)));
      CHECK(qptr[0] == 0 && pptr[0] == 0, "indptr starts");
      if (rec(g)) (void)snapshots(b, g, idx, qs);  // checks the snapshot arrays
      uint64_t row = 0;
      for (size_t k = 0; k < m; ++k) {
        const MSeq& s = seqs[idx[k]];
        const uint64_t n = s.tokens.size();
        const std::vector<int32_t>& t = s.tables[g];
        CHECK(ctx[k] == int32_t(n), "context_lens[%zu] %d, tokens %llu", k, ctx[k],
              (unsigned long long)n);
        CHECK(qptr[k + 1] - qptr[k] == int32_t(qs[k]), "query_indptr");
        const uint64_t np = rec(g) ? 1 : ceil_div(n, bs);
        const std::vector<int32_t> want(t.begin(), t.begin() + int64_t(np));
        if (persistent) {
          CHECK(pptr[k] == int64_t(k) * stride && int64_t(np) <= stride,
                "group %u persistent row %zu: indptr %d, %llu pages, stride %lld", g, k, pptr[k],
                (unsigned long long)np, (long long)stride);
          for (int64_t j = 0; j < stride; ++j)
            CHECK(pidx[int64_t(k) * stride + j] == (uint64_t(j) < np ? want[size_t(j)] : 0),
                  "group %u persistent row %zu page %lld is %d", g, k, (long long)j,
                  pidx[int64_t(k) * stride + j]);
        } else {
          CHECK(uint64_t(pptr[k + 1] - pptr[k]) == np,
                "group %u row %zu has %d pages, expected %llu", g, k, pptr[k + 1] - pptr[k],
                (unsigned long long)np);
          for (uint64_t j = 0; j < np; ++j)
            CHECK(pidx[pptr[k] + int64_t(j)] == want[j],
                  "group %u row %zu page %llu is %d, table %d", g, k, (unsigned long long)j,
                  pidx[pptr[k] + int64_t(j)], want[j]);
        }
        if (rec(g)) {
          CHECK(slots[k] == t[0] && last[k] == 1,
                "recurrent group %u row %zu: slot %lld, the table says %d", g, k,
                (long long)slots[k], t[0]);
          continue;
        }
        CHECK(uint64_t(last[k]) == n - (np - 1) * bs, "last_page_len");
        for (uint64_t p = n - qs[k]; p < n; ++p, ++row) {
          CHECK(t[p / bs] != 0, "group %u: query token %llu lands in a released entry", g,
                (unsigned long long)p);
          CHECK(slots[row] == int64_t(t[p / bs]) * bs + int64_t(p % bs),
                "group %u slot_mapping[%llu] = %lld", g, (unsigned long long)row,
                (long long)slots[row]);
        }
      }
    }
  }

  // A recurrent group's snapshots of a plan (PKV_PLAN_SNAPSHOT_*) as
  // (plan row k, slot, tokens the state holds), checked against what the
  // contract allows: none without the flag or caching; else, per sequence,
  // increasing block boundaries in (start, n], each in a fresh slot that no
  // table holds and no other snapshot of the plan takes.
  struct Snap {
    size_t k;
    int32_t block;
    uint64_t pos;
  };
  std::vector<Snap> snapshots(pkv_batch* b, uint32_t g, const std::vector<size_t>& idx,
                              const std::vector<uint32_t>& qs) {
    const size_t m = idx.size();
    auto ptr = static_cast<const int32_t*>(
        plan_array(b, g, PKV_PLAN_SNAPSHOT_INDPTR, PKV_DTYPE_I32, int64_t(m + 1)));
    const int64_t count = ptr[m];
    CHECK(ptr[0] == 0 && count >= 0, "group %u snapshot indptr", g);
    auto rows =
        static_cast<const int64_t*>(plan_array(b, g, PKV_PLAN_SNAPSHOT_ROWS, PKV_DTYPE_I64, count));
    auto blocks = static_cast<const int32_t*>(
        plan_array(b, g, PKV_PLAN_SNAPSHOT_BLOCKS, PKV_DTYPE_I32, count));
    if (count) trace("  group %u: %lld snapshots\n", g, (long long)count);
    CHECK(count == 0 || (snap_every && caching),
          "group %u names %lld snapshots without PKV_GROUP_SNAPSHOT_EVERY_BLOCK and caching", g,
          (long long)count);
    std::set<int32_t> taken;
    for (const MSeq& s : seqs)
      for (uint32_t h = 0; h < G; ++h) taken.insert(s.tables[h].begin(), s.tables[h].end());
    std::vector<Snap> out;
    uint64_t row0 = 0;
    for (size_t k = 0; k < m; ++k) {
      const uint64_t n = seqs[idx[k]].tokens.size(), start = n - qs[k];
      CHECK(ptr[k + 1] >= ptr[k], "group %u snapshot indptr decreases", g);
      uint64_t prev = start;
      for (int32_t j = ptr[k]; j < ptr[k + 1]; ++j) {
        CHECK(rows[j] >= int64_t(row0) && rows[j] < int64_t(row0 + qs[k]),
              "group %u snapshot %d row %lld is not a query of plan row %zu", g, j,
              (long long)rows[j], k);
        const uint64_t pos = start + uint64_t(rows[j]) - row0 + 1;  // tokens the state holds
        CHECK(pos % bs == 0 && pos > prev, "group %u snapshot %d after %llu tokens", g, j,
              (unsigned long long)pos);
        prev = pos;
        CHECK(blocks[j] > 0 && uint32_t(blocks[j]) < nb && taken.insert(blocks[j]).second,
              "group %u snapshot slot %d is not a fresh block", g, blocks[j]);
        out.push_back({k, blocks[j], pos});
      }
      row0 += qs[k];
    }
    return out;
  }

  // The engine's writes of a step: every query token's K/V at its slot, and
  // the state after the last token in the recurrent slot (and after each
  // snapshot's row in its slot). Reads first: the recurrent state the step
  // starts from must be the one after its context.
  void write_plan(pkv_batch* b, const std::vector<size_t>& idx, const std::vector<uint32_t>& qs) {
    for (uint32_t g = 0; g < G; ++g) {
      const size_t m = idx.size();
      uint64_t tokens = 0;
      for (uint32_t q : qs) tokens += q;
      auto slots = static_cast<const int64_t*>(
          plan_array(b, g, PKV_PLAN_SLOT_MAPPING, PKV_DTYPE_I64, int64_t(rec(g) ? m : tokens)));
      uint64_t row = 0;
      for (size_t k = 0; k < m; ++k) {
        const MSeq& s = seqs[idx[k]];
        const std::vector<uint64_t> fps = s.fps();
        const uint64_t n = s.tokens.size();
        if (rec(g)) {
          mem[size_t(slots[k])][0] = Slot{int32_t(g), state_fp(fps, n)};
          continue;
        }
        for (uint64_t p = n - qs[k]; p < n; ++p, ++row)
          mem[size_t(slots[row] / bs)][size_t(slots[row] % bs)] = Slot{int32_t(g), fps[p]};
      }
      if (rec(g))
        for (const Snap& sn : snapshots(b, g, idx, qs))
          mem[size_t(sn.block)][0] = Slot{int32_t(g), state_fp(seqs[idx[sn.k]].fps(), sn.pos)};
    }
  }

  bool held_by_other(size_t i, int64_t block) const {
    for (size_t k = 0; k < seqs.size(); ++k)
      for (uint32_t g = 0; g < G && k != i; ++g)
        for (int32_t b : seqs[k].tables[g])
          if (b == block) return true;
    return false;
  }

  // A step that failed part way: some query slots hold garbage. A slot that
  // already holds the token's K/V keeps it, since recomputing a token writes
  // the same K/V: the sequence's computed tokens, and also slots another
  // sequence's committed step wrote into a block this one shares (a fork
  // child computed the parent's blocks), which may be cached by now.
  void garble_plan(pkv_batch* b, const std::vector<size_t>& idx, const std::vector<uint32_t>& qs,
                   const std::vector<uint64_t>& computed) {
    uint64_t tokens = 0;
    for (uint32_t q : qs) tokens += q;
    for (uint32_t g = 0; g < G; ++g) {
      if (rec(g)) continue;
      auto slots = static_cast<const int64_t*>(
          plan_array(b, g, PKV_PLAN_SLOT_MAPPING, PKV_DTYPE_I64, int64_t(tokens)));
      uint64_t row = 0;
      for (size_t k = 0; k < idx.size(); ++k) {
        const uint64_t n = seqs[idx[k]].tokens.size();
        const std::vector<uint64_t> fps = seqs[idx[k]].fps();
        for (uint64_t p = n - qs[k]; p < n; ++p, ++row) {
          Slot& slot = mem[size_t(slots[row] / bs)][size_t(slots[row] % bs)];
          if (p >= computed[k] && p % 2 == 0 && !(slot == Slot{int32_t(g), fps[p]}) &&
              !held_by_other(idx[k], slots[row] / bs))
            slot = Slot{-2, row};
        }
      }
    }
  }

  void run(Bytes& in) {
    // Header: groups, kinds, block size, windows, budget, mode.
    const uint8_t h0 = in.u8(), h1 = in.u8(), h2 = in.u8(), h3 = in.u8();
    G = 1 + (h0 & 3);
    bs = 1u << (h2 & 3);  // 1, 2, 4, 8
    if (h2 & 4) bs = 3;
    nb = G + 2 + h3 % 40;                      // room for the warm-up step in every group
    caching = (h0 & 4) == 0 || (h0 & 8) != 0;  // on in 3/4
    const bool warm = (h0 & 16) != 0;          // a first plan before anything else
    snap_every = (h0 & 64) != 0;
    pkv_pool_options base;
    pkv_pool_options_init(&base);
    base.block_size = bs;
    base.num_blocks = nb;
    base.enable_prefix_caching = caching ? 1 : 0;
    base.hash_algo = (h0 & 32) ? PKV_HASH_XXH3_128 : PKV_HASH_SHA256_CBOR;
    std::vector<pkv_kv_group_spec> specs(G);
    kind.assign(G, 0);
    window.assign(G, 0);
    for (uint32_t g = 0; g < G; ++g) {
      pkv_kv_group_spec& sp = specs[g];
      pkv_kv_group_spec_init(&sp);
      sp.kind = (h1 >> (2 * g)) & 3;
      kind[g] = sp.kind;
      sp.num_layers = 1 + g % 2;
      if (sp.kind == PKV_GROUP_RECURRENT && snap_every) sp.flags = PKV_GROUP_SNAPSHOT_EVERY_BLOCK;
      switch (sp.kind) {
        case PKV_GROUP_FULL:
          sp.num_kv_heads = 2;
          sp.head_dim = 8;
          break;
        case PKV_GROUP_SLIDING_WINDOW:
          sp.num_kv_heads = 1;
          sp.head_dim = 8;
          sp.sliding_window = 1 + ((h2 >> (3 + g)) & 1) * 3 + (h3 / 40 + g) % (2 * bs + 1);
          window[g] = sp.sliding_window;
          break;
        case PKV_GROUP_MLA:
          sp.kv_lora_rank = 16;
          sp.rope_dim = 4;
          break;
        default:
          sp.state_bytes = 96;
      }
    }
    trace("pool: %u groups, bs %u, %u blocks, caching %d, warm %d, snapshots %d\n", G, bs, nb,
          int(caching), int(warm), int(snap_every));
    for (uint32_t g = 0; g < G; ++g) trace("  group %u kind %u window %u\n", g, kind[g], window[g]);
    OK(pkv_pool_create_groups(&base, specs.data(), G, &pool));
    mem.assign(nb, std::vector<Slot>(bs));
    if (warm) {
      // Put the pool in planned mode: a one-token step over a throwaway
      // sequence.
      Bytes none(nullptr, 0);
      op_create(none);
      int32_t tok = 1;
      OK(pkv_seq_append(pool, seqs[0].id, &tok, 1, 0));
      seqs[0].tokens.push_back(tok);
      seqs[0].reserved = 1;
      seqs[0].state_started = true;
      uint32_t q = 1;
      pkv_batch* b = nullptr;
      OK(pkv_batch_prepare(pool, &seqs[0].id, &q, 1, nullptr, &b));
      planned = true;
      take_copies(none);
      pkv_batch_abort(b);
      pkv_batch_destroy(b);
      free_seq(0);
      for (MSeq& s : seqs) s.planned = true;
    }
    check_all();
    for (int ops = 0; ops < 300 && !in.empty(); ++ops) {
      ++g_counters.ops;
      const uint8_t op = in.u8();
      switch (op % 16) {
        case 0:
        case 1:
          op_create(in);
          break;
        case 2:
        case 3:
          op_match(in);
          break;
        case 4:
        case 5:
          op_append(in, false);
          break;
        case 6:
          op_append(in, true);
          break;
        case 7:
          op_fork(in);
          break;
        case 8:
          op_truncate(in);
          break;
        case 9:
          op_free(in);
          break;
        case 10:
        case 11:
        case 12:
          op_step(in);
          break;
        case 13:
          take_copies(in);
          break;
        case 14:
          op_stale(in);
          break;
        default: {  // a decode run: step, append one token, step...
          for (uint32_t k = 0, r = 1 + in.below(2 * bs); k < r && !in.empty(); ++k) {
            op_step(in);
            op_append(in, true);
          }
        }
      }
      check_all();
    }
    while (!seqs.empty()) free_seq(seqs.size() - 1);
    take_copies(in);
    check_all();
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    OK(pkv_pool_get_stats(pool, &st));
    CHECK(st.num_used_blocks == 0, "%llu blocks used after every sequence was freed",
          (unsigned long long)st.num_used_blocks);
    pkv_pool_destroy(pool);
  }
};

}  // namespace

void run_one(const uint8_t* data, size_t size) {
  ++g_counters.inputs;
  Bytes in(data, size);
  Harness h;
  h.run(in);
}

const Counters& counters() { return g_counters; }

}  // namespace pkv_fuzz
