// "Failures change nothing" (pagedkv/pool.h), checked by a shadow pool: two
// pools created alike take the same random serving workload in lockstep,
// and one of them also takes calls that fail (bad ids, too few blocks,
// uncomputed contexts, refused pins, bad hashes...). After every step the
// two must look the same through every read the C API has: stats, each
// sequence's info, block table and hashes, priority counts, the events
// drained, and validate. A failing call that moved a block in the free
// queue, emitted an event, counted a statistic or touched a hash shows up
// there, at once or steps later (as another eviction order).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "assert_ok.h"
#include "pagedkv/pagedkv.h"

namespace {

struct Config {
  const char* name;
  uint32_t block_size, num_blocks, sliding_window;
  bool events, retention, partial, storage;
};

pkv_pool* make_pool(const Config& c) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = c.block_size;
  o.num_blocks = c.num_blocks;
  o.sliding_window = c.sliding_window;
  o.enable_events = c.events;
  o.enable_retention = c.retention;
  o.max_pinned_blocks = c.retention ? 3 : 0;
  o.enable_partial_reuse = c.partial;
  o.hash_algo = PKV_HASH_XXH3_128;
  if (c.storage) {
    o.num_layers = 1;
    o.num_kv_heads = 1;
    o.head_dim = 4;
    o.dtype = PKV_DTYPE_F32;
    o.num_threads = 1;
  }
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  if (p) EXPECT_EQ(pkv_pool_set_clock(p, 1000), PKV_OK);
  return p;
}

// Everything the C API tells about a pool and the sequences of `ids`.
std::string observe(pkv_pool* p, const std::vector<pkv_seq_id>& ids, bool retention) {
  std::string s;
  auto put = [&](const void* d, size_t n) { s.append(static_cast<const char*>(d), n); };
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  EXPECT_EQ(pkv_pool_get_stats(p, &st), PKV_OK);
  put(&st, sizeof st);
  for (pkv_seq_id id : ids) {
    pkv_seq_info info;
    pkv_seq_info_init(&info);
    const pkv_status rc = pkv_seq_get_info(p, id, &info);
    put(&rc, sizeof rc);
    if (rc != PKV_OK) continue;
    put(&info, sizeof info);
    std::vector<int32_t> t(info.num_blocks + 1);
    uint64_t n = 0;
    EXPECT_EQ(pkv_seq_get_block_table(p, id, t.data(), t.size(), &n), PKV_OK);
    put(t.data(), n * sizeof(int32_t));
    std::vector<pkv_block_hash> h(info.num_blocks + 1);
    EXPECT_EQ(pkv_seq_get_block_hashes(p, id, h.data(), h.size(), &n), PKV_OK);
    put(h.data(), n * sizeof(pkv_block_hash));
  }
  if (retention) {
    uint64_t counts[PKV_PRIORITY_MAX + 1], n = 0;
    EXPECT_EQ(pkv_pool_get_priority_counts(p, counts, PKV_PRIORITY_MAX + 1, &n), PKV_OK);
    put(counts, sizeof counts);
  }
  std::vector<pkv_event> ev(256);
  uint64_t n = 0;
  EXPECT_EQ(pkv_pool_drain_events(p, ev.data(), ev.size(), &n), PKV_OK);
  for (uint64_t i = 0; i < n; ++i) {
    put(&ev[i].seq_no, sizeof ev[i].seq_no);
    put(&ev[i].type, sizeof ev[i].type);
    put(&ev[i].block_id, sizeof ev[i].block_id);
    put(ev[i].block_hash.bytes, sizeof ev[i].block_hash.bytes);
    put(&ev[i].num_tokens, sizeof ev[i].num_tokens);
  }
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  return s;
}

struct Shadow {
  Config cfg;
  pkv_pool* a = nullptr;           // the reference
  pkv_pool* b = nullptr;           // also takes the failing calls
  std::vector<pkv_seq_id> ia, ib;  // the same sequences, by index
  std::mt19937 rng;
  std::vector<std::vector<int32_t>> prompts;
  pkv_seq_id stale_b = 0;

  explicit Shadow(const Config& c, uint32_t seed) : cfg(c), rng(seed) {
    a = make_pool(c);
    b = make_pool(c);
    pkv_seq_id gone = 0;  // a stale id: created and freed in both pools
    pkv_seq_create(a, nullptr, &gone);
    pkv_seq_free(a, gone);
    pkv_seq_create(b, nullptr, &stale_b);
    pkv_seq_free(b, stale_b);
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> t(c.block_size * 3 + 1);
      for (auto& x : t) x = int32_t(rng() % 7);
      prompts.push_back(t);
    }
  }
  ~Shadow() {
    pkv_pool_destroy(a);
    pkv_pool_destroy(b);
  }

  std::vector<int32_t> prompt() {
    std::vector<int32_t> t = prompts[rng() % prompts.size()];
    t.resize(1 + rng() % t.size());
    if (rng() % 3 == 0) t.push_back(int32_t(rng() % 1000));
    return t;
  }

  // Runs f on both pools; both must agree on the status.
  template <class F>
  pkv_status both(F&& f) {
    const pkv_status ra = f(a, ia), rb = f(b, ib);
    EXPECT_EQ(ra, rb) << pkv_last_error_message();
    return ra;
  }

  // A committed (or aborted) step over some sequences.
  void step() {
    std::vector<size_t> pick;
    for (size_t i = 0; i < ia.size(); ++i)
      if (ia[i] && rng() % 2) pick.push_back(i);
    if (pick.empty()) return;
    const bool abort = rng() % 5 == 0;
    both([&](pkv_pool* p, std::vector<pkv_seq_id>& ids) {
      std::vector<pkv_seq_id> seqs;
      std::vector<uint32_t> q;
      for (size_t i : pick) {
        pkv_seq_info info;
        pkv_seq_info_init(&info);
        if (pkv_seq_get_info(p, ids[i], &info) != PKV_OK) continue;
        const uint64_t todo = info.num_tokens - info.num_computed_tokens;
        if (todo == 0) continue;
        seqs.push_back(ids[i]);
        q.push_back(uint32_t(todo));
      }
      pkv_batch* batch = nullptr;
      pkv_status rc =
          pkv_batch_prepare(p, seqs.data(), q.data(), uint32_t(seqs.size()), nullptr, &batch);
      if (rc != PKV_OK) return rc;
      rc = abort ? pkv_batch_abort(batch) : pkv_batch_commit(batch);
      pkv_batch_destroy(batch);
      return rc;
    });
  }

  void op() {
    const uint32_t r = rng() % 100;
    const size_t i = ia.empty() ? 0 : rng() % ia.size();
    const bool have = !ia.empty() && ia[i] != 0;
    if (r < 20 || ia.empty()) {
      const std::vector<int32_t> t = prompt();
      const uint32_t la = rng() % 2;
      pkv_seq_id sa = 0, sb = 0;
      uint64_t ca = 0, cb = 0;
      const pkv_status ra = pkv_seq_admit(a, nullptr, t.data(), t.size(), la, &sa, &ca);
      const pkv_status rb = pkv_seq_admit(b, nullptr, t.data(), t.size(), la, &sb, &cb);
      ASSERT_EQ(ra, rb);
      if (ra == PKV_OK) {
        ASSERT_EQ(ca, cb);
        ia.push_back(sa);
        ib.push_back(sb);
      }
    } else if (r < 40 && have) {
      std::vector<int32_t> t(1 + rng() % cfg.block_size);
      for (auto& x : t) x = int32_t(rng() % 7);
      const uint32_t la = rng() % 3;
      both([&](pkv_pool* p, std::vector<pkv_seq_id>& ids) {
        return pkv_seq_append(p, ids[i], t.data(), t.size(), la);
      });
    } else if (r < 65) {
      step();
    } else if (r < 75 && have) {
      both([&](pkv_pool* p, std::vector<pkv_seq_id>& ids) {
        const pkv_status rc = pkv_seq_free(p, ids[i]);
        return rc;
      });
      ia[i] = ib[i] = 0;
    } else if (r < 82 && have) {
      const uint64_t keep = rng() % (cfg.block_size * 2);
      both([&](pkv_pool* p, std::vector<pkv_seq_id>& ids) {
        pkv_seq_info info;
        pkv_seq_info_init(&info);
        pkv_seq_get_info(p, ids[i], &info);
        return pkv_seq_truncate(p, ids[i], std::min<uint64_t>(keep, info.num_tokens));
      });
    } else if (r < 88 && have) {
      pkv_seq_id ca = 0, cb = 0;
      const pkv_status ra = pkv_seq_fork(a, ia[i], &ca), rb = pkv_seq_fork(b, ib[i], &cb);
      ASSERT_EQ(ra, rb);
      if (ra == PKV_OK) {
        ia.push_back(ca);
        ib.push_back(cb);
      }
    } else if (r < 94 && have && cfg.retention) {
      pkv_retention_range rr[2] = {
          {0, cfg.block_size * 2, uint32_t(rng() % 101), 0, 0},
          {cfg.block_size, PKV_TOKEN_END, uint32_t(rng() % 101), 0, rng() % 2 ? 0u : 500u}};
      const uint64_t nr = 1 + rng() % 2;
      both([&](pkv_pool* p, std::vector<pkv_seq_id>& ids) {
        return pkv_seq_set_retention(p, ids[i], rr, nr);
      });
    } else if (r < 96) {
      const uint64_t t = 1000 + rng() % 2000;
      both([&](pkv_pool* p, std::vector<pkv_seq_id>&) { return pkv_pool_set_clock(p, t); });
    } else if (r < 97) {
      both([&](pkv_pool* p, std::vector<pkv_seq_id>&) { return pkv_pool_reset_prefix_cache(p); });
    }
  }

  // A call on b alone that must fail; returns its name when it succeeded
  // (then it is replayed on a, so the pools stay alike).
  void fail_op(std::string* what) {
    const uint32_t r = rng() % 16;
    const size_t i = ia.empty() ? 0 : rng() % ia.size();
    const bool have = !ia.empty() && ia[i] != 0;
    const pkv_seq_id stale = stale_b;
    std::vector<int32_t> big(cfg.block_size * cfg.num_blocks + 1, 3);
    pkv_status rc = PKV_OK;
    switch (r) {
      case 0:  // too many tokens
        if (have) rc = pkv_seq_append(b, ib[i], big.data(), big.size(), 0), *what = "append";
        break;
      case 1:  // lookahead beyond the pool
        if (have) {
          const int32_t t = 1;
          rc = pkv_seq_append(b, ib[i], &t, 1, cfg.block_size * cfg.num_blocks),
          *what = "append la";
        }
        break;
      case 2: {  // a batch whose last id repeats the first
        std::vector<pkv_seq_id> s;
        for (pkv_seq_id id : ib)
          if (id) s.push_back(id);
        if (s.empty()) break;
        s.push_back(s[0]);
        std::vector<int32_t> t(s.size(), 5);
        rc = pkv_seq_append_batch(b, s.data(), t.data(), s.size()), *what = "append_batch dup";
        break;
      }
      case 3: {  // a batch whose last id is stale
        std::vector<pkv_seq_id> s;
        for (pkv_seq_id id : ib)
          if (id) s.push_back(id);
        s.push_back(stale);
        std::vector<int32_t> t(s.size(), 5);
        rc = pkv_seq_append_batch(b, s.data(), t.data(), s.size()), *what = "append_batch stale";
        break;
      }
      case 4: {  // admit of more than fits, after prefix hits
        std::vector<int32_t> t = prompts[rng() % prompts.size()];
        t.insert(t.end(), big.begin(), big.end());
        pkv_seq_id id = 0;
        uint64_t c = 0;
        rc = pkv_seq_admit(b, nullptr, t.data(), t.size(), 0, &id, &c), *what = "admit";
        break;
      }
      case 5: {  // free_batch with a repeat
        std::vector<pkv_seq_id> s;
        for (pkv_seq_id id : ib)
          if (id) s.push_back(id);
        if (s.empty()) break;
        s.push_back(s.back());
        rc = pkv_seq_free_batch(b, s.data(), s.size()), *what = "free_batch dup";
        break;
      }
      case 6:  // match_prefix on a sequence that is not empty
        if (have) {
          pkv_seq_info info;
          pkv_seq_info_init(&info);
          pkv_seq_get_info(b, ib[i], &info);
          if (info.num_tokens == 0) break;
          const std::vector<int32_t>& t = prompts[0];
          uint64_t c = 0;
          rc = pkv_seq_match_prefix(b, ib[i], t.data(), t.size(), &c), *what = "match_prefix";
        }
        break;
      case 7:  // truncate beyond the length
        if (have) rc = pkv_seq_truncate(b, ib[i], 1u << 30), *what = "truncate";
        break;
      case 8: {  // prepare over everything with too few queries (uncomputed context)
        std::vector<pkv_seq_id> s;
        std::vector<uint32_t> q;
        for (pkv_seq_id id : ib)
          if (id) s.push_back(id), q.push_back(1);
        if (s.empty()) break;
        s.push_back(stale);
        q.push_back(1);
        pkv_batch* batch = nullptr;
        rc = pkv_batch_prepare(b, s.data(), q.data(), uint32_t(s.size()), nullptr, &batch);
        *what = "prepare stale";
        if (rc == PKV_OK) pkv_batch_destroy(batch);
        break;
      }
      case 9: {  // prepare_decode whose last id repeats
        std::vector<pkv_seq_id> s;
        for (pkv_seq_id id : ib)
          if (id) s.push_back(id);
        if (s.empty()) break;
        s.push_back(s[0]);
        std::vector<int32_t> t(s.size(), 2);
        pkv_batch* batch = nullptr;
        rc =
            pkv_batch_prepare_decode(b, s.data(), t.data(), uint32_t(s.size()), 0, nullptr, &batch);
        *what = "prepare_decode dup";
        if (rc == PKV_OK) pkv_batch_destroy(batch);
        break;
      }
      case 10: {  // prepare_decode over every sequence, the last one stale
        std::vector<pkv_seq_id> s;
        for (pkv_seq_id id : ib)
          if (id) s.push_back(id);
        s.push_back(stale);
        std::vector<int32_t> t(s.size(), 2);
        pkv_batch* batch = nullptr;
        rc =
            pkv_batch_prepare_decode(b, s.data(), t.data(), uint32_t(s.size()), 0, nullptr, &batch);
        *what = "prepare_decode stale";
        if (rc == PKV_OK) pkv_batch_destroy(batch);
        break;
      }
      case 11:  // pins beyond the budget
        if (have && cfg.retention) {
          pkv_retention_range rr = {0, PKV_TOKEN_END, PKV_PRIORITY_PINNED, 0, 0};
          rc = pkv_seq_set_retention(b, ib[i], &rr, 1), *what = "set_retention pin";
          if (rc == PKV_OK) {  // it fit: replayed below
            pkv_seq_set_retention(a, ia[i], &rr, 1);
            *what = "";
            return;
          }
        }
        break;
      case 12: {  // admit_hashes with a wrong first hash
        const std::vector<int32_t>& t = prompts[rng() % prompts.size()];
        std::vector<pkv_block_hash> h(t.size() / cfg.block_size);
        if (h.empty()) break;
        std::memset(h.data(), 0x5a, h.size() * sizeof h[0]);
        pkv_seq_id id = 0;
        uint64_t c = 0;
        rc = pkv_seq_admit_hashes(b, nullptr, t.data(), t.size(), h.data(), h.size(), 0, &id, &c);
        *what = "admit_hashes";
        break;
      }
      case 13:  // reserve beyond the limit
        if (have) rc = pkv_seq_reserve(b, ib[i], uint64_t(1) << 40), *what = "reserve";
        break;
      case 14: {  // prepare_decode of more blocks than are free
        std::vector<pkv_seq_id> s;
        for (pkv_seq_id id : ib)
          if (id) s.push_back(id);
        if (s.empty()) break;
        pkv_pool_stats st;
        pkv_pool_stats_init(&st);
        pkv_pool_get_stats(b, &st);
        if (st.num_free_blocks > 1) break;
        std::vector<int32_t> t(s.size(), 2);
        pkv_batch* batch = nullptr;
        rc =
            pkv_batch_prepare_decode(b, s.data(), t.data(), uint32_t(s.size()), 0, nullptr, &batch);
        *what = "prepare_decode full";
        if (rc == PKV_OK) {  // it fit: replay on a
          pkv_batch* ba = nullptr;
          std::vector<pkv_seq_id> sa;
          for (pkv_seq_id id : ia)
            if (id) sa.push_back(id);
          EXPECT_EQ(pkv_batch_prepare_decode(a, sa.data(), t.data(), uint32_t(sa.size()), 0,
                                             nullptr, &ba),
                    PKV_OK);
          pkv_batch_destroy(ba);
          pkv_batch_destroy(batch);
          *what = "";
          return;
        }
        break;
      }
      case 15: {  // fork of a stale id
        pkv_seq_id c = 0;
        rc = pkv_seq_fork(b, stale, &c), *what = "fork stale";
        break;
      }
    }
    if (rc == PKV_OK && !what->empty()) {
      ADD_FAILURE() << "the failing call '" << *what << "' succeeded";
      what->clear();
    }
  }
};

size_t first_diff(const std::string& x, const std::string& y) {
  size_t i = 0;
  while (i < x.size() && i < y.size() && x[i] == y[i]) ++i;
  return i;
}

void run(const Config& c, uint32_t seeds, uint32_t steps) {
  for (uint32_t seed = 1; seed <= seeds; ++seed) {
    Shadow s(c, seed);
    ASSERT_NE(s.a, nullptr);
    for (uint32_t k = 0; k < steps; ++k) {
      s.op();
      if (testing::Test::HasFailure()) {
        ADD_FAILURE() << c.name << " seed " << seed << " step " << k << " (op)";
        return;
      }
      std::string what;
      const std::string before = observe(s.b, s.ib, c.retention);
      const std::string before_a = observe(s.a, s.ia, c.retention);
      ASSERT_TRUE(before == before_a) << c.name << " seed " << seed << " step " << k
                                      << " differ at byte " << first_diff(before, before_a);
      s.fail_op(&what);
      if (what.empty()) continue;  // nothing failed (or it was replayed)
      const std::string after = observe(s.b, s.ib, c.retention);
      const std::string after_a = observe(s.a, s.ia, c.retention);
      ASSERT_TRUE(after == after_a)
          << "byte " << first_diff(after, after_a) << " " << c.name << " seed " << seed << " step "
          << k << ": failing call '" << what << "' changed the pool";
    }
  }
}

TEST(Shadow, PlainPoolFailuresChangeNothing) {
  run({"plain", 4, 12, 0, true, false, false, false}, 4, 200);
}
TEST(Shadow, RetentionPoolFailuresChangeNothing) {
  run({"retention", 4, 12, 0, true, true, false, false}, 4, 200);
}
TEST(Shadow, PartialReusePoolFailuresChangeNothing) {
  run({"partial", 4, 12, 0, true, false, true, false}, 4, 200);
}
TEST(Shadow, SlidingWindowPoolFailuresChangeNothing) {
  run({"window", 4, 12, 6, true, false, false, false}, 4, 200);
}
TEST(Shadow, StoragePoolFailuresChangeNothing) {
  run({"storage", 4, 12, 0, true, true, true, true}, 4, 200);
}

}  // namespace
