// KV provenance model: a randomized test through the public C API only.
//
// The model shares none of the library's bookkeeping. Every K/V element the
// test writes encodes what it is (the sequence's extra keys, the tokens up to
// its position, the layer, K or V), so the pool's storage itself says who
// wrote each slot and for which tokens. After every operation the test reads
// the storage back and checks, from what a user can observe:
//  - every token a sequence counts as computed (pkv_seq_info
//    .num_computed_tokens, prefix hits included) sits in its slot (through
//    the block table) with exactly the K/V computed for that token prefix
//    and those extra keys, in every layer: no unwritten slot, no other
//    tokens' K/V, no K/V of another tenant;
//  - every plan's page table (what attention reads) holds, after each layer
//    write, the K/V of the plan's tokens for every context position;
//  - accounting: used + free == usable blocks, used == the distinct blocks
//    the block tables name, pkv_pool_validate;
//  - events: a model of the prefix cache built only from drained events
//    (STORED adds, REMOVED removes exactly what was stored, ALL_CLEARED
//    empties) has as many blocks as the stats say are cached, and a block it
//    holds under hash h that a sequence names at index j carries h there.
// Operations: admit / match (token path, precomputed hashes, partial hits,
// tier hits), append, append_batch, truncate, fork, free, plans
// (pkv_batch_prepare, pkv_batch_prepare_decode and its lean path) written
// layer by layer, committed, aborted, committed twice, left to die,
// interleaved with the other operations; block copies into blocks no
// sequence holds; reset of the prefix cache; tiers with asynchronous
// offload; LoRA ids and cache salts; block sizes 1, 3, 4, 5; sliding
// windows. Copy-on-write and partial-hit copies run at the next prepare:
// their destinations (a block table entry that changed, copy_dst) are
// checked from then on. Not covered: multi-group pools (no storage),
// retention, transfers, MLA, FP8.
//
// PKV_PROVENANCE_SEEDS=n runs seeds 1..n (default 300; 60 under sanitizers),
// PKV_PROVENANCE_SEED=s seed s alone, PKV_PROVENANCE_STEPS=k k operations a
// seed (default 250); PKV_PROVENANCE_DUMP=1 adds each sequence's state to the
// trace printed on a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
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
#include "provenance_storage.h"

namespace {

using provenance::Key;
using provenance::mix;

uint64_t g_hits[6], g_commits;

using provenance::elem;
using provenance::ident;
using provenance::kHeadDim;
using provenance::kLayers;

// The pools the model drives: provenance::storage_options, events on.
pkv_pool_options model_options(uint32_t block_size, uint64_t num_blocks) {
  pkv_pool_options o = provenance::storage_options(block_size, num_blocks);
  o.enable_events = 1;
  return o;
}

struct Seq {
  pkv_seq_id id = 0;
  Key key;
  std::vector<int32_t> tokens;
};

struct Plan {
  pkv_batch* b = nullptr;
  // Per plan row: the token identity it must write.
  std::vector<uint64_t> row_ident;
  // Per sequence of the plan: its identities by position at prepare.
  std::vector<std::vector<uint64_t>> ctx_ident;
  uint32_t next_layer = 0;
};

struct Harness : provenance::Storage {
  std::mt19937_64 rng;
  pkv_pool* pool = nullptr;
  uint32_t bs = 4;
  uint64_t nblocks = 0;
  uint32_t window = 0;
  bool tiers = false, partial = false;
  std::vector<Seq> seqs;
  std::vector<Plan> plans;
  std::map<int32_t, pkv_block_hash> cache;  // from events
  // Copy-on-write and partial-hit copies run at the next prepare (or block
  // copy/swap): a block that replaced another at an index of a block table,
  // or a partial hit's copy_dst, is checked once that ran.
  std::set<int32_t> pending_dst;
  std::map<pkv_seq_id, std::vector<int32_t>> last_table;
  std::vector<std::vector<int32_t>> bases;
  std::string trace;

  explicit Harness(uint64_t seed) : rng(seed) {}
  ~Harness() {
    for (Plan& p : plans) pkv_batch_destroy(p.b);
    pkv_pool_destroy(pool);
  }
  uint64_t r(uint64_t n) { return n ? rng() % n : 0; }

  void create() {
    const uint32_t sizes[] = {1, 3, 4, 5};
    bs = sizes[r(4)];
    nblocks = 10 + r(20);
    window = r(5) == 0 ? bs * (2 + uint32_t(r(3))) + uint32_t(r(3)) : 0;
    pkv_pool_options o = model_options(bs, nblocks);
    o.sliding_window = window;
    partial = r(3) == 0;
    o.enable_partial_reuse = partial;
    o.hash_algo = r(2) ? PKV_HASH_XXH3_128 : PKV_HASH_SHA256_CBOR;
    ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK) << pkv_last_error_message();
    tiers = window == 0 && r(2) == 0;
    if (tiers) {
      uint64_t bpb = 0;
      ASSERT_EQ(pkv_pool_bytes_per_block(pool, &bpb), PKV_OK);
      pkv_tier_options t;
      pkv_tier_options_init(&t);
      t.host_bytes = bpb * (2 + r(6));
      ASSERT_EQ(pkv_pool_attach_tiers(pool, &t), PKV_OK) << pkv_last_error_message();
    }
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t w = 0; w < 2; ++w) ASSERT_EQ(pkv_pool_kv_tensor(pool, l, w, &kv[l][w]), PKV_OK);
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> b(bs * (1 + r(4)) + r(bs));
      for (auto& t : b) t = int32_t(r(3));
      bases.push_back(b);
    }
    trace = "bs=" + std::to_string(bs) + " blocks=" + std::to_string(nblocks) +
            " window=" + std::to_string(window) + " tiers=" + std::to_string(tiers) +
            " partial=" + std::to_string(partial) + "\n";
  }

  std::vector<int32_t> table(pkv_seq_id id) {
    std::vector<int32_t> t(4096);
    uint64_t n = 0;
    EXPECT_EQ(pkv_seq_get_block_table(pool, id, t.data(), t.size(), &n), PKV_OK);
    t.resize(n);
    return t;
  }
  std::vector<pkv_block_hash> hashes(pkv_seq_id id) {
    std::vector<pkv_block_hash> h(4096);
    uint64_t n = 0;
    EXPECT_EQ(pkv_seq_get_block_hashes(pool, id, h.data(), h.size(), &n), PKV_OK);
    h.resize(n);
    return h;
  }
  pkv_seq_info info(pkv_seq_id id) {
    pkv_seq_info i;
    pkv_seq_info_init(&i);
    EXPECT_EQ(pkv_seq_get_info(pool, id, &i), PKV_OK) << pkv_last_error_message();
    return i;
  }

  void drain() {
    pkv_event ev[64];
    uint64_t n = 0;
    do {
      ASSERT_EQ(pkv_pool_drain_events(pool, ev, 64, &n), PKV_OK);
      for (uint64_t i = 0; i < n; ++i) {
        const pkv_event& e = ev[i];
        if (e.type == PKV_EVENT_BLOCK_STORED) {
          ASSERT_EQ(cache.count(e.block_id), 0u)
              << trace << "STORED of block " << e.block_id << " already stored";
          ASSERT_EQ(e.num_tokens, bs);
          cache[e.block_id] = e.block_hash;
        } else if (e.type == PKV_EVENT_BLOCK_REMOVED) {
          auto it = cache.find(e.block_id);
          ASSERT_TRUE(it != cache.end())
              << trace << "REMOVED of block " << e.block_id << " never stored";
          ASSERT_EQ(std::memcmp(&it->second, &e.block_hash, sizeof e.block_hash), 0)
              << trace << "REMOVED of block " << e.block_id << " under another hash";
          cache.erase(it);
        } else if (e.type == PKV_EVENT_ALL_CLEARED) {
          cache.clear();
        }
      }
    } while (n == 64);
  }

  void check() {
    ASSERT_EQ(pkv_pool_validate(pool), PKV_OK) << trace << pkv_last_error_message();
    drain();
    if (::testing::Test::HasFatalFailure()) return;
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    ASSERT_EQ(pkv_pool_get_stats(pool, &st), PKV_OK);
    std::set<int32_t> used;
    for (Seq& s : seqs) {
      const pkv_seq_info in = info(s.id);
      ASSERT_EQ(in.num_tokens, s.tokens.size()) << trace;
      ASSERT_LE(in.num_computed_tokens, in.num_tokens) << trace;
      const auto t = table(s.id);
      const auto hs = hashes(s.id);
      {
        auto& old = last_table[s.id];
        for (size_t j = 0; j < old.size() && j < t.size(); ++j)
          if (old[j] != t[j] && old[j] != PKV_NULL_BLOCK && t[j] != PKV_NULL_BLOCK)
            pending_dst.insert(t[j]);
        old = t;
      }
      for (int32_t b : t)
        if (b != PKV_NULL_BLOCK) used.insert(b);
      for (uint64_t pos = 0; pos < in.num_computed_tokens; ++pos) {
        const int32_t b = t[pos / bs];
        if (b == PKV_NULL_BLOCK || pending_dst.count(b)) continue;
        const std::string bad = slot_holds(b, pos % bs, ident(s.key, s.tokens, pos));
        ASSERT_EQ(bad, "") << trace << "seq " << s.id << " counts token " << pos << " computed (of "
                           << in.num_computed_tokens << "), but its " << bad;
      }
      for (size_t j = 0; j < hs.size() && j < t.size(); ++j) {
        auto it = cache.find(t[j]);
        if (it == cache.end()) continue;
        ASSERT_EQ(std::memcmp(&it->second, &hs[j], sizeof hs[j]), 0)
            << trace << "events say block " << t[j] << " is cached under another hash than seq "
            << s.id << "'s block " << j;
      }
    }
    ASSERT_EQ(st.num_used_blocks, used.size()) << trace;
    ASSERT_EQ(st.num_used_blocks + st.num_free_blocks, nblocks - 1) << trace;
    if (st.num_events_dropped == 0) ASSERT_EQ(st.num_cached_blocks, cache.size()) << trace;
  }

  std::vector<int32_t> prompt() {
    return provenance::random_prompt([this](uint64_t n) { return r(n); }, bases, bs);
  }

  Key key() {
    return provenance::random_key([this](uint64_t n) { return r(n); });
  }

  void admit() {
    Seq s;
    s.key = key();
    s.tokens = prompt();
    pkv_seq_options so;
    pkv_seq_options_init(&so);
    so.lora_id = s.key.lora;
    const std::string salt = "s" + std::to_string(s.key.salt);
    so.cache_salt = s.key.salt ? salt.c_str() : nullptr;
    const int how = int(r(6));
    std::vector<pkv_block_hash> hs(s.tokens.size() / bs + 1);
    uint64_t nh = 0;
    {
      pkv_pool_options po;
      pkv_pool_options_init(&po);
      ASSERT_EQ(pkv_pool_get_options(pool, &po), PKV_OK);
      pkv_hash_options ho;
      pkv_hash_options_init(&ho);
      ho.algo = po.hash_algo;
      ho.block_size = bs;
      ho.lora_id = s.key.lora;
      ho.cache_salt = so.cache_salt;
      ASSERT_EQ(pkv_hash_prefix(&ho, s.tokens.data(), s.tokens.size(), hs.data(), hs.size(), &nh),
                PKV_OK)
          << pkv_last_error_message();
    }
    uint64_t cached = 0;
    pkv_status st;
    trace += "admit how=" + std::to_string(how) + " n=" + std::to_string(s.tokens.size());
    if (how == 0) {
      st = pkv_seq_admit(pool, &so, s.tokens.data(), s.tokens.size(), uint32_t(r(3)), &s.id,
                         &cached);
    } else if (how == 1) {
      st = pkv_seq_admit_hashes(pool, &so, s.tokens.data(), s.tokens.size(), hs.data(), nh, 0,
                                &s.id, &cached);
    } else {
      ASSERT_EQ(pkv_seq_create(pool, &so, &s.id), PKV_OK);
      if (how == 2) {
        st = pkv_seq_match_prefix(pool, s.id, s.tokens.data(), s.tokens.size(), &cached);
      } else if (how == 3) {
        pkv_prefix_match m;
        pkv_prefix_match_init(&m);
        st = pkv_seq_match_prefix_partial(pool, s.id, s.tokens.data(), s.tokens.size(), &m);
        cached = m.num_cached;
        if (m.copy_dst != PKV_NULL_BLOCK) pending_dst.insert(m.copy_dst);
      } else {
        pkv_tier_match m;
        pkv_tier_match_init(&m);
        if (how == 4)
          st = pkv_seq_match_prefix_tiered(pool, s.id, s.tokens.data(), s.tokens.size(), &m);
        else
          st = pkv_seq_match_prefix_hashes_tiered(pool, s.id, s.tokens.data(), s.tokens.size(),
                                                  hs.data(), nh, &m);
        cached = m.num_cached;
      }
      ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
      st = pkv_seq_append(pool, s.id, s.tokens.data() + cached, s.tokens.size() - cached, 0);
      if (st != PKV_OK) {
        ASSERT_EQ(st, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
        ASSERT_EQ(pkv_seq_free(pool, s.id), PKV_OK);
        trace += " oob\n";
        return;
      }
    }
    if (st == PKV_E_OUT_OF_BLOCKS) {
      trace += " oob\n";
      return;
    }
    ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
    trace += " -> seq " + std::to_string(s.id) + " cached " + std::to_string(cached) + "\n";
    if (cached) ++g_hits[how];
    seqs.push_back(s);
  }

  void append() {
    if (seqs.empty()) return;
    Seq& s = seqs[r(seqs.size())];
    std::vector<int32_t> t(1 + r(2 * bs));
    for (auto& x : t) x = int32_t(r(3));
    const pkv_status st = pkv_seq_append(pool, s.id, t.data(), t.size(), uint32_t(r(2)));
    trace += "append seq " + std::to_string(s.id) + " +" + std::to_string(t.size()) + " -> " +
             std::to_string(st) + "\n";
    if (st == PKV_OK)
      s.tokens.insert(s.tokens.end(), t.begin(), t.end());
    else
      ASSERT_EQ(st, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
  }

  void truncate() {
    if (seqs.empty()) return;
    Seq& s = seqs[r(seqs.size())];
    const uint64_t n = r(s.tokens.size() + 1);
    trace += "truncate seq " + std::to_string(s.id) + " to " + std::to_string(n) + "\n";
    const pkv_status st = pkv_seq_truncate(pool, s.id, n);
    if (st != PKV_OK) {
      trace += "  refused: " + std::string(pkv_last_error_message()) + "\n";
      return;
    }
    s.tokens.resize(n);
  }

  void fork() {
    if (seqs.empty()) return;
    Seq c = seqs[r(seqs.size())];
    const pkv_seq_id parent = c.id;
    const pkv_status st = pkv_seq_fork(pool, parent, &c.id);
    trace += "fork seq " + std::to_string(parent) + " -> " + std::to_string(st) + " " +
             std::to_string(c.id) + "\n";
    if (st == PKV_OK) seqs.push_back(c);
  }

  void free_one() {
    if (seqs.empty()) return;
    const size_t i = r(seqs.size());
    trace += "free seq " + std::to_string(seqs[i].id) + "\n";
    last_table.erase(seqs[i].id);
    ASSERT_EQ(pkv_seq_free(pool, seqs[i].id), PKV_OK) << pkv_last_error_message();
    seqs.erase(seqs.begin() + i);
  }

  void prepare() {
    if (seqs.empty() || plans.size() >= 3) return;
    std::vector<size_t> pick;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (r(4) && !seqs[i].tokens.empty()) pick.push_back(i);
    if (pick.empty()) return;
    std::vector<pkv_seq_id> ids;
    std::vector<uint32_t> q;
    for (size_t i : pick) {
      const pkv_seq_info in = info(seqs[i].id);
      const uint64_t need = in.num_tokens - in.num_computed_tokens;
      uint64_t c = std::max<uint64_t>(need, 1);
      if (r(4) == 0) c = std::min<uint64_t>(in.num_tokens, c + r(3));
      ids.push_back(seqs[i].id);
      q.push_back(uint32_t(c));
    }
    Plan p;
    const pkv_status st =
        pkv_batch_prepare(pool, ids.data(), q.data(), uint32_t(ids.size()), nullptr, &p.b);
    trace += "prepare " + std::to_string(ids.size()) + " seqs -> " + std::to_string(st) + "\n";
    if (st != PKV_OK) {
      ASSERT_TRUE(st == PKV_E_INVALID_STATE || st == PKV_E_INVALID_ARGUMENT)
          << pkv_last_error_message();
      return;
    }
    pending_dst.clear();
    for (size_t k = 0; k < pick.size(); ++k) {
      const Seq& s = seqs[pick[k]];
      std::vector<uint64_t> ids_by_pos(s.tokens.size());
      for (size_t pos = 0; pos < s.tokens.size(); ++pos)
        ids_by_pos[pos] = ident(s.key, s.tokens, pos);
      for (size_t pos = s.tokens.size() - q[k]; pos < s.tokens.size(); ++pos)
        p.row_ident.push_back(ids_by_pos[pos]);
      p.ctx_ident.push_back(std::move(ids_by_pos));
    }
    plans.push_back(std::move(p));
  }

  const int32_t* plan_i32(pkv_batch* b, uint32_t which) {
    pkv_tensor t;
    EXPECT_EQ(pkv_batch_plan_tensor(b, which, &t), PKV_OK);
    return reinterpret_cast<const int32_t*>(static_cast<const char*>(t.data) + t.byte_offset);
  }

  // What attention of layer l reads through the plan's page table.
  void check_plan_reads(Plan& p, uint32_t l) {
    const int32_t* pptr = plan_i32(p.b, PKV_PLAN_PAGE_INDPTR);
    const int32_t* pidx = plan_i32(p.b, PKV_PLAN_PAGE_INDICES);
    const int32_t* ctx = plan_i32(p.b, PKV_PLAN_CONTEXT_LENS);
    const int32_t* qptr = plan_i32(p.b, PKV_PLAN_QUERY_INDPTR);
    for (size_t s = 0; s < p.ctx_ident.size(); ++s) {
      ASSERT_EQ(size_t(ctx[s]), p.ctx_ident[s].size()) << trace;
      // The first query of the sequence sees keys after first_q - window.
      const int64_t first_q = int64_t(ctx[s]) - (qptr[s + 1] - qptr[s]);
      for (int64_t pos = 0; pos < ctx[s]; ++pos) {
        const int64_t page = pos / bs;
        ASSERT_LT(pptr[s] + page, pptr[s + 1]) << trace;
        const int32_t b = pidx[pptr[s] + page];
        if (b == PKV_NULL_BLOCK) {
          ASSERT_TRUE(window != 0 && pos <= first_q - int64_t(window))
              << trace << "plan row seq " << s << " reads position " << pos << " (a query at "
              << first_q << " sees it) from the null block";
          continue;
        }
        const float* e = slot_ptr(l, 0, b, pos % bs);
        bool ok = true;
        for (uint32_t d = 0; d < kHeadDim; ++d)
          ok = ok && e[d] == elem(p.ctx_ident[s][pos], l, 0, d);
        ASSERT_TRUE(ok) << trace << "plan row seq " << s << " reads position " << pos
                        << " of layer " << l << " from block " << b << ", which holds "
                        << (e[0] == 0 ? "nothing written" : "other K/V");
      }
    }
  }

  void plan_op() {
    if (plans.empty()) return;
    const size_t i = r(plans.size());
    Plan& p = plans[i];
    const int what = int(r(10));
    if (what <= 5) {  // write the next layer (or every layer left)
      const bool all = r(2) == 0;
      do {
        write_layer(p, i);
        if (::testing::Test::HasFatalFailure()) return;
      } while (all && p.next_layer > 0 && p.next_layer < kLayers && r(8));
      return;
    }
    plan_other(p, i, what);
  }

  void write_layer(Plan& p, size_t i) {
    {
      if (p.next_layer >= kLayers) return;
      const uint32_t l = p.next_layer;
      const int64_t n = int64_t(p.row_ident.size());
      std::vector<float> k(n * kHeadDim), v(n * kHeadDim);
      for (int64_t row = 0; row < n; ++row)
        for (uint32_t d = 0; d < kHeadDim; ++d) {
          k[row * kHeadDim + d] = elem(p.row_ident[row], l, 0, d);
          v[row * kHeadDim + d] = elem(p.row_ident[row], l, 1, d);
        }
      const int64_t shape[3] = {n, 1, kHeadDim};
      pkv_tensor kt, vt;
      ASSERT_EQ(pkv_tensor_init(k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &kt), PKV_OK);
      ASSERT_EQ(pkv_tensor_init(v.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &vt), PKV_OK);
      const pkv_status st = pkv_cache_write(p.b, l, &kt, &vt, nullptr);
      trace += "plan " + std::to_string(i) + " write layer " + std::to_string(l) + " -> " +
               std::to_string(st) + "\n";
      if (st == PKV_OK) {
        if (l + 1 == kLayers) ++g_commits;
        ++p.next_layer;
        check_plan_reads(p, l);
      } else {
        ASSERT_EQ(st, PKV_E_INVALID_STATE) << pkv_last_error_message();
      }
      return;
    }
  }

  void plan_other(Plan& p, size_t i, int what) {
    if (what == 6) {
      // An explicit commit is the caller's word that every layer was
      // written: given only when it was.
      if (p.next_layer < kLayers) return;
      const pkv_status st = pkv_batch_commit(p.b);
      trace += "plan " + std::to_string(i) + " commit -> " + std::to_string(st) + "\n";
      return;
    }
    if (what == 7) {
      const pkv_status st = pkv_batch_abort(p.b);
      trace += "plan " + std::to_string(i) + " abort -> " + std::to_string(st) + "\n";
      return;
    }
    trace += "plan " + std::to_string(i) + " destroy\n";
    pkv_batch_destroy(p.b);
    plans.erase(plans.begin() + i);
  }

  // The engine copies a block into one no sequence holds (ids are its
  // business; the pool moves bytes): any later hit on it must still hold
  // the K/V of the hit's tokens.
  void copy_into_free() {
    std::set<int32_t> held;
    for (Seq& q : seqs)
      for (int32_t b : table(q.id)) held.insert(b);
    int32_t dst = int32_t(1 + r(nblocks - 1));
    const int32_t src = int32_t(1 + r(nblocks - 1));
    if (!cache.empty() && r(4)) dst = std::next(cache.begin(), long(r(cache.size())))->first;
    if (held.count(dst) || pending_dst.count(src) || dst == src) return;
    trace += "copy block " + std::to_string(src) + " -> " + std::to_string(dst) + "\n";
    ASSERT_EQ(pkv_pool_copy_blocks(pool, &src, &dst, 1, nullptr), PKV_OK)
        << pkv_last_error_message();
    pending_dst.clear();  // pending copies ran first
  }

  // Index of the live sequence with id, or seqs.size().
  size_t find(pkv_seq_id id) const {
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs[i].id == id) return i;
    return seqs.size();
  }

  // pkv_batch_prepare_decode over the last decode batch (its lean path) or
  // a fresh pick; or pkv_seq_append_batch.
  std::vector<pkv_seq_id> decode_ids;
  void decode(bool batch_append) {
    if (plans.size() >= 3 && !batch_append) return;
    std::vector<pkv_seq_id> ids;
    if (r(3) && !decode_ids.empty()) {
      ids = decode_ids;
    } else {
      for (const Seq& q : seqs)
        if (r(3)) ids.push_back(q.id);
    }
    for (pkv_seq_id id : ids)
      if (find(id) == seqs.size()) return;  // freed: the engine would not
    if (ids.empty()) return;
    decode_ids = ids;
    std::vector<int32_t> tok(ids.size());
    for (auto& t : tok) t = int32_t(r(3));
    if (batch_append) {
      const pkv_status st = pkv_seq_append_batch(pool, ids.data(), tok.data(), ids.size());
      trace += "append_batch " + std::to_string(ids.size()) + " -> " + std::to_string(st) + "\n";
      if (st != PKV_OK) {
        ASSERT_EQ(st, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
        return;
      }
      for (size_t k = 0; k < ids.size(); ++k) seqs[find(ids[k])].tokens.push_back(tok[k]);
      return;
    }
    Plan p;
    const pkv_status st = pkv_batch_prepare_decode(pool, ids.data(), tok.data(),
                                                   uint32_t(ids.size()), 0, nullptr, &p.b);
    trace += "prepare_decode " + std::to_string(ids.size()) + " -> " + std::to_string(st) + "\n";
    if (st != PKV_OK) {
      ASSERT_TRUE(st == PKV_E_INVALID_STATE || st == PKV_E_OUT_OF_BLOCKS ||
                  st == PKV_E_INVALID_ARGUMENT)
          << pkv_last_error_message();
      return;
    }
    pending_dst.clear();
    for (size_t k = 0; k < ids.size(); ++k) {
      Seq& q = seqs[find(ids[k])];
      q.tokens.push_back(tok[k]);
      std::vector<uint64_t> by_pos(q.tokens.size());
      for (size_t pos = 0; pos < q.tokens.size(); ++pos) by_pos[pos] = ident(q.key, q.tokens, pos);
      p.row_ident.push_back(by_pos.back());
      p.ctx_ident.push_back(std::move(by_pos));
    }
    plans.push_back(std::move(p));
  }

  void step() {
    const int op = int(r(26));
    if (op == 23 || op == 24) return decode(false);
    if (op == 25) return decode(true);
    if (op < 4)
      admit();
    else if (op < 6)
      append();
    else if (op < 7)
      truncate();
    else if (op < 8)
      fork();
    else if (op < 10)
      free_one();
    else if (op < 13)
      prepare();
    else if (op < 18 || op == 20 || op == 21)
      plan_op();
    else if (op == 18 && r(3) == 0) {
      trace += "reset prefix cache\n";
      ASSERT_EQ(pkv_pool_reset_prefix_cache(pool), PKV_OK);
    } else if (op == 18 || op == 19) {
      copy_into_free();
    } else if (op == 22 && tiers) {
      trace += "flush tiers\n";
      ASSERT_EQ(pkv_pool_flush_tiers(pool), PKV_OK);
    }
  }
};

void run(uint64_t seed, int steps) {
  Harness h(seed);
  h.create();
  if (::testing::Test::HasFatalFailure()) return;
  for (int i = 0; i < steps; ++i) {
    h.step();
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "seed " << seed << " step " << i;
      return;
    }
    h.check();
    if (std::getenv("PKV_PROVENANCE_DUMP"))
      for (Seq& s : h.seqs) {
        const pkv_seq_info in = h.info(s.id);
        std::string line = "   seq " + std::to_string(s.id) +
                           " n=" + std::to_string(in.num_tokens) +
                           " c=" + std::to_string(in.num_computed_tokens) + " t=";
        for (int32_t b : h.table(s.id)) line += std::to_string(b) + ",";
        h.trace += line + "\n";
      }
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) {
      ADD_FAILURE() << "seed " << seed << " step " << i;
      return;
    }
  }
}

TEST(Provenance, RandomOperationsNeverServeKvNobodyWroteForThoseTokens) {
  const char* env = std::getenv("PKV_PROVENANCE_SEEDS");
#if defined(PKV_SANITIZED)
  constexpr int kSeeds = 60;  // ~10x slower per operation: the CI stage's share
#else
  constexpr int kSeeds = 300;
#endif
  const int seeds = env ? std::atoi(env) : kSeeds;
  const char* one = std::getenv("PKV_PROVENANCE_SEED");
  const char* steps_env = std::getenv("PKV_PROVENANCE_STEPS");
  const int steps = steps_env ? std::atoi(steps_env) : 250;
  if (one) return run(std::strtoull(one, nullptr, 10), steps);
  for (int s = 1; s <= seeds && !HasFailure(); ++s) run(uint64_t(s), steps);
  if (std::getenv("PKV_PROVENANCE_DUMP"))
    std::printf("hits %lu %lu %lu %lu %lu commits %lu\n", (unsigned long)g_hits[0],
                (unsigned long)g_hits[1], (unsigned long)g_hits[2], (unsigned long)g_hits[3],
                (unsigned long)g_hits[4], (unsigned long)g_commits);
}

}  // namespace

namespace {

// One full-block prompt prefilled and committed (both layers written with
// its provenance); returns the sequence.
pkv_seq_id prefill(Harness& h, const Key& k, const std::vector<int32_t>& tokens) {
  pkv_seq_options so;
  pkv_seq_options_init(&so);
  so.lora_id = k.lora;
  pkv_seq_id id = 0;
  uint64_t cached = 0;
  EXPECT_EQ(pkv_seq_admit(h.pool, &so, tokens.data(), tokens.size(), 0, &id, &cached), PKV_OK)
      << pkv_last_error_message();
  Seq s;
  s.id = id;
  s.key = k;
  s.tokens = tokens;
  h.seqs.push_back(s);
  const uint32_t q = uint32_t(tokens.size() - cached);
  Plan p;
  EXPECT_EQ(pkv_batch_prepare(h.pool, &id, &q, 1, nullptr, &p.b), PKV_OK)
      << pkv_last_error_message();
  for (size_t pos = cached; pos < tokens.size(); ++pos)
    p.row_ident.push_back(ident(k, tokens, pos));
  std::vector<uint64_t> all;
  for (size_t pos = 0; pos < tokens.size(); ++pos) all.push_back(ident(k, tokens, pos));
  p.ctx_ident.push_back(all);
  h.plans.push_back(std::move(p));
  h.write_layer(h.plans.back(), 0);
  h.write_layer(h.plans.back(), 1);
  pkv_batch_destroy(h.plans.back().b);
  h.plans.pop_back();
  return id;
}

Harness* directed_pool(uint32_t bs, uint64_t blocks) {
  auto* h = new Harness(0);
  h->bs = bs;
  h->nblocks = blocks;
  const pkv_pool_options o = model_options(bs, blocks);
  EXPECT_EQ(pkv_pool_create(&o, &h->pool), PKV_OK);
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t w = 0; w < 2; ++w)
      EXPECT_EQ(pkv_pool_kv_tensor(h->pool, l, w, &h->kv[l][w]), PKV_OK);
  return h;
}

// pkv_pool_copy_blocks into a cached block: the destination now holds the
// source's K/V (other tokens), so it must not stay cached under its own
// hash: a later prefix hit would serve the source's K/V for its tokens.
TEST(Provenance, CopyIntoACachedBlockDoesNotServeTheSourcesKvUnderItsHash) {
  std::unique_ptr<Harness> h(directed_pool(4, 8));
  const std::vector<int32_t> t1 = {1, 1, 1, 1, 9}, t2 = {2, 2, 2, 2, 9};
  const pkv_seq_id a = prefill(*h, Key{}, t1);
  const pkv_seq_id b = prefill(*h, Key{}, t2);
  const int32_t x = h->table(a)[0], y = h->table(b)[0];
  h->check();
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(pkv_seq_free(h->pool, a), PKV_OK);  // x: cached, written, free
  h->seqs.erase(h->seqs.begin());
  h->check();
  // The engine reuses block x's bytes for a copy of y (the block is free:
  // ids and ref counts are the caller's business, the pool moves bytes).
  ASSERT_EQ(pkv_pool_copy_blocks(h->pool, &y, &x, 1, nullptr), PKV_OK);
  h->check();
  // A new request with t1's first block: any hit must hold t1's K/V.
  pkv_seq_options so;
  pkv_seq_options_init(&so);
  Seq c;
  uint64_t cached = 0;
  ASSERT_EQ(pkv_seq_admit(h->pool, &so, t1.data(), t1.size(), 0, &c.id, &cached), PKV_OK);
  c.tokens = t1;
  h->seqs.push_back(c);
  h->check();  // counts t1's first block computed only if it holds t1's K/V
}

}  // namespace
