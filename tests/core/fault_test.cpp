// All-or-nothing under allocation failure: for every pool operation, the Nth
// heap allocation inside it throws, for N = 1, 2, ... until the operation
// runs without reaching N. Each failure must return PKV_E_OUT_OF_MEMORY and
// leave the pool exactly as it was: validate clean, the same free queue, ref
// counts, cached blocks, pending copies, stats, block tables, hashes and
// pending events. Its own executable: the operator new below replaces the
// global one for everything linked into it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "capi_util.h"

#include "../fault_alloc.h"

namespace {

struct Ctx {
  pkv_pool* pool = nullptr;
  std::vector<pkv_seq_id> seqs;
};

struct Cfg {
  uint32_t block_size = 4;
  uint64_t num_blocks = 32;
  uint32_t window = 0;
  bool storage = false;
  bool reuse = false;  // partial-block hits and retention priorities on
};

std::vector<int32_t> toks(int n, int first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// Token ids equal their index: operations under test take pointers into it
// and allocate nothing themselves.
const std::vector<int32_t> g_tokens = toks(10000, 0);

pkv_seq_id make_seq(Ctx& c, uint64_t lora = 0, const char* salt = nullptr, bool mm = false) {
  pkv_seq_options so;
  pkv_seq_options_init(&so);
  so.lora_id = lora;
  so.cache_salt = salt;
  pkv_mm_item item{};
  if (mm) {
    item.offset = 2;
    item.length = 5;
    item.hash = "image-0123456789abcdef";
    so.mm_items = &item;
    so.num_mm_items = 1;
  }
  pkv_seq_id id = 0;
  EXPECT_EQ(pkv_seq_create(c.pool, &so, &id), PKV_OK);
  c.seqs.push_back(id);
  return id;
}

void append(Ctx& c, pkv_seq_id s, int n, int first, uint32_t lookahead = 0) {
  auto t = toks(n, first);
  ASSERT_EQ(pkv_seq_append(c.pool, s, t.data(), t.size(), lookahead), PKV_OK)
      << pkv_last_error_message();
}

// Prepares a plan over the last q tokens of s: they count as computed.
void step(Ctx& c, pkv_seq_id s, uint32_t q) {
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(c.pool, &s, &q, 1, nullptr, &b), PKV_OK) << pkv_last_error_message();
  ASSERT_EQ(pkv_batch_commit(b), PKV_OK) << pkv_last_error_message();
  pkv_batch_destroy(b);
}

// Four sequences of 7-10 tokens, each computed: a decode batch.
void computed_seqs(Ctx& c) {
  for (int n : {7, 8, 9, 10}) {
    pkv_seq_id s = make_seq(c);
    append(c, s, n, 100 * n);
    step(c, s, uint32_t(n));
  }
}

// Everything observable about the pool, as text (built with faults off).
std::string snapshot(const Ctx& c) {
  const pagedkv::Pool& p = *c.pool->impl;
  const pagedkv::BlockPool& bp = p.block_pool();
  std::string s = "queue:";
  bp.queue().for_each([&](int32_t id) { s += std::to_string(id) + ","; });
  s += "\nref:";
  for (int32_t i = 0; i < bp.num_blocks(); ++i)
    s += std::to_string(bp.ref(i)) + (bp.hash(i).empty() ? "" : "h") + "w" +
         std::to_string(bp.written(i)) + ",";
  s += "\npending copies:" + std::to_string(p.pending_copies().size());
  s += " events:" + std::to_string(p.num_pending_events());
  pagedkv::PoolStats st = p.stats();
  s += "\nstats: free " + std::to_string(st.num_free_blocks) + " used " +
       std::to_string(st.num_used_blocks) + " cached " + std::to_string(st.num_cached_blocks) +
       " seqs " + std::to_string(st.num_seqs) + " tokens " + std::to_string(st.num_tokens) +
       " query " + std::to_string(st.prefix_query_tokens) + " hit " +
       std::to_string(st.prefix_hit_tokens) + " evictions " + std::to_string(st.num_evictions) +
       " cow " + std::to_string(st.num_cow_copies) + " dropped " +
       std::to_string(st.num_events_dropped) + " used bytes " + std::to_string(st.kv_bytes_used) +
       " wasted " + std::to_string(st.kv_bytes_wasted) + " partial " +
       std::to_string(st.num_partial_hits) + " pinned " + std::to_string(st.num_pinned_blocks);
  if (bp.retention())
    for (int32_t i = 1; i < bp.num_blocks(); ++i) s += " p" + std::to_string(bp.priority(i));
  for (pkv_seq_id id : c.seqs) {
    s += "\nseq " + std::to_string(id) + ": ";
    try {
      pagedkv::SeqInfo i = p.seq_info(id);
      s += "tokens " + std::to_string(i.num_tokens) + " cached " +
           std::to_string(i.num_cached_tokens) + " computed " +
           std::to_string(i.num_computed_tokens) + " table ";
      std::vector<int32_t> t(p.block_table(id, nullptr, 0));
      p.block_table(id, t.data(), t.size());
      for (int32_t b : t) s += std::to_string(b) + ",";
      std::vector<pagedkv::BlockHash> h(p.block_hashes(id, nullptr, 0));
      p.block_hashes(id, h.data(), h.size());
      s += " hashes";
      for (const auto& x : h)
        s += " " + std::to_string(x.bytes[0]) + "." + std::to_string(x.bytes[1]);
    } catch (const pagedkv::Error&) {
      s += "gone";
    }
  }
  return s;
}

struct Case {
  const char* name;
  Cfg cfg;
  std::function<void(Ctx&)> setup;
  std::function<pkv_status(Ctx&)> op;
};

pkv_pool* make_pool(const Cfg& cfg) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = cfg.block_size;
  o.num_blocks = cfg.num_blocks;
  o.sliding_window = cfg.window;
  o.enable_events = 1;
  o.max_events = 1 << 16;
  o.enable_partial_reuse = cfg.reuse;
  o.enable_retention = cfg.reuse;
  o.max_pinned_blocks = cfg.reuse ? 4 : 0;
  if (cfg.storage) {
    o.num_layers = 1;
    o.num_kv_heads = 1;
    o.head_dim = 8;
    o.dtype = PKV_DTYPE_F32;
    o.num_threads = 1;
  }
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

// Runs one case for N = 1, 2, ...; returns the allocation points it tried.
long run_case(const Case& k) {
  for (long n = 1; n < 100000; ++n) {
    Ctx c;
    c.pool = make_pool(k.cfg);
    if (!c.pool) return -1;
    k.setup(c);
    c.pool->impl->shrink_events_for_testing();  // events of the operation grow the ring
    EXPECT_EQ(pkv_pool_validate(c.pool), PKV_OK) << k.name << ": setup";
    const std::string before = snapshot(c);
    g_count = 0;
    g_fail_at = n;
    const pkv_status st = k.op(c);
    const bool reached = g_count >= n;
    g_fail_at = -1;
    if (!reached) {  // the operation needs fewer allocations: done
      EXPECT_EQ(st, PKV_OK) << k.name << ": " << pkv_last_error_message();
      EXPECT_EQ(pkv_pool_validate(c.pool), PKV_OK) << k.name << ": " << pkv_last_error_message();
      pkv_pool_destroy(c.pool);
      return n - 1;
    }
    if (st == PKV_OK) {
      // The failed allocation was not needed for the result (an event
      // dropped and counted, an error message): the pool must still be sound.
      EXPECT_EQ(pkv_pool_validate(c.pool), PKV_OK) << k.name << " alloc #" << n;
    } else {
      EXPECT_EQ(st, PKV_E_OUT_OF_MEMORY) << k.name << " alloc #" << n;
      EXPECT_EQ(pkv_pool_validate(c.pool), PKV_OK)
          << k.name << " alloc #" << n << ": " << pkv_last_error_message();
      EXPECT_EQ(snapshot(c), before) << k.name << " alloc #" << n << " changed the pool";
    }
    pkv_pool_destroy(c.pool);
    if (::testing::Test::HasFailure()) return n;
  }
  ADD_FAILURE() << k.name << ": never finished";
  return 0;
}

void run_all(const std::vector<Case>& cases) {
  for (const Case& k : cases) {
    const long points = run_case(k);
    EXPECT_GT(points, 0) << k.name << ": no allocation inside it was failed";
    if (::testing::Test::HasFailure()) return;
  }
}

pkv_status do_append(Ctx& c, size_t i, int n, int first, uint32_t lookahead = 0) {
  return pkv_seq_append(c.pool, c.seqs[i], g_tokens.data() + first, n, lookahead);
}

pkv_status do_match(Ctx& c, size_t i, int n, int first) {
  uint64_t hit = 0;
  return pkv_seq_match_prefix(c.pool, c.seqs[i], g_tokens.data() + first, n, &hit);
}

TEST(Faults, SequenceCreateAndFork) {
  run_all({
      {"seq_create",
       {},
       [](Ctx&) {},
       [](Ctx& c) {
         pkv_seq_id id;
         return pkv_seq_create(c.pool, nullptr, &id);
       }},
      {"seq_create lora salt mm",
       {},
       [](Ctx&) {},
       [](Ctx& c) {
         pkv_seq_options so;
         pkv_seq_options_init(&so);
         so.lora_id = 3;
         so.cache_salt = "tenant";
         pkv_mm_item item{1, 4, "image-hash"};
         so.mm_items = &item;
         so.num_mm_items = 1;
         pkv_seq_id id;
         return pkv_seq_create(c.pool, &so, &id);
       }},
      {"fork",
       {},
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c, 5, "s");
         append(c, a, 18, 1, 2);
       },
       [](Ctx& c) {
         pkv_seq_id child;
         return pkv_seq_fork(c.pool, c.seqs[0], &child);
       }},
  });
}

TEST(Faults, MatchPrefix) {
  // A computed sequence was freed: its full blocks sit cached in the queue.
  auto cached = [](uint64_t lora, const char* salt, bool mm) {
    return [=](Ctx& c) {
      make_seq(c, lora, salt, mm);  // a fresh slot: its vectors must grow
      pkv_seq_id a = make_seq(c, lora, salt, mm);
      append(c, a, 22, 1);
      step(c, a, 22);
      pkv_seq_free(c.pool, a);
      c.seqs.pop_back();
    };
  };
  run_all({
      {"match_prefix", {}, cached(0, nullptr, false), [](Ctx& c) { return do_match(c, 0, 22, 1); }},
      {"match_prefix lora salt",
       {},
       cached(9, "salt", false),
       [](Ctx& c) { return do_match(c, 0, 22, 1); }},
      {"match_prefix mm",
       {},
       cached(0, nullptr, true),
       [](Ctx& c) { return do_match(c, 0, 22, 1); }},

  });
}

// Partial-block hits and retention ranges (issue 22).
TEST(Faults, PartialMatchAndRetention) {
  Cfg reuse;
  reuse.reuse = true;
  auto computed = [](Ctx& c) {
    make_seq(c, 0, nullptr);  // a fresh slot: its vectors must grow
    pkv_seq_id a = make_seq(c, 0, nullptr);
    append(c, a, 22, 1);
    step(c, a, 22);
  };
  run_all({
      {"match_prefix_partial", reuse, computed,
       [](Ctx& c) {
         pkv_prefix_match m;
         pkv_prefix_match_init(&m);
         // 16 tokens of full blocks, then 3 of the fifth block.
         return pkv_seq_match_prefix_partial(c.pool, c.seqs[0], g_tokens.data() + 1, 20, &m);
       }},
      {"set_retention", reuse, computed,
       [](Ctx& c) {
         const pkv_retention_range r[2] = {{0, 8, PKV_PRIORITY_PINNED, 0, 0},
                                           {8, PKV_TOKEN_END, 80, 0, 1000}};
         return pkv_seq_set_retention(c.pool, c.seqs[1], r, 2);
       }},
  });
}

TEST(Faults, Append) {
  run_all({
      {"append prefill",
       {},
       [](Ctx& c) { make_seq(c); },
       [](Ctx& c) { return do_append(c, 0, 30, 1); }},
      {"append prefill lora salt mm",
       {},
       [](Ctx& c) { make_seq(c, 4, "salt", true); },
       [](Ctx& c) { return do_append(c, 0, 30, 1); }},
      {"append decode filling a block",
       {},
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c, 4);
         append(c, a, 7, 1);
       },
       [](Ctx& c) { return do_append(c, 0, 1, 100); }},
      {"append decode into a new block, evicting",
       {},
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c);
         append(c, a, 31 * 4, 1);  // every usable block, all full
         step(c, a, 31 * 4);
         pkv_seq_free(c.pool, a);  // all cached, in the queue
         c.seqs.clear();
         pkv_seq_id b = make_seq(c);
         append(c, b, 8, 1000);  // two blocks evicted
       },
       [](Ctx& c) { return do_append(c, 0, 1, 2000); }},
      {"append evicting with events (event ring grows)",
       {},
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c);
         append(c, a, 31 * 4, 1);
         step(c, a, 31 * 4);
         pkv_seq_free(c.pool, a);  // 31 STORED events pending
         c.seqs.clear();
         make_seq(c);
       },
       [](Ctx& c) { return do_append(c, 0, 100, 5000); }},  // 25 REMOVED + 25 STORED
      {"append after fork (copy-on-write) with lookahead",
       {},
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c);
         append(c, a, 10, 1);
         pkv_seq_id child;
         ASSERT_EQ(pkv_seq_fork(c.pool, a, &child), PKV_OK);
         c.seqs.push_back(child);
       },
       [](Ctx& c) { return do_append(c, 1, 5, 900, 3); }},
      {"append lookahead only",
       {},
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c);
         append(c, a, 6, 1);
       },
       [](Ctx& c) { return do_append(c, 0, 0, 0, 9); }},
      {"append sliding window",
       {4, 32, 8},
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c, 2);
         append(c, a, 21, 1);
         step(c, a, 21);
       },
       [](Ctx& c) { return do_append(c, 0, 6, 100); }},
  });
}

TEST(Faults, TruncateFreeReset) {
  // 30 tokens of which the first 12 were computed: the full blocks past
  // them are uncached when they leave (REMOVED events).
  auto partly_planned = [](Ctx& c) {
    pkv_seq_id a = make_seq(c, 1);
    append(c, a, 12, 1);
    step(c, a, 12);
    append(c, a, 18, 13, 2);
  };
  run_all({
      {"truncate",
       {},
       partly_planned,
       [](Ctx& c) { return pkv_seq_truncate(c.pool, c.seqs[0], 5); }},
      {"free", {}, partly_planned, [](Ctx& c) { return pkv_seq_free(c.pool, c.seqs[0]); }},
      {"reset prefix cache",
       {},
       partly_planned,
       [](Ctx& c) { return pkv_pool_reset_prefix_cache(c.pool); }},
  });
}

TEST(Faults, BatchPrepareWithCopies) {
  Cfg storage;
  storage.block_size = 8;
  storage.storage = true;
  run_all({
      {"batch prepare with copy-on-write copies", storage,
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c);
         append(c, a, 21, 1);
         step(c, a, 21);
         pkv_seq_id b, d;
         ASSERT_EQ(pkv_seq_fork(c.pool, a, &b), PKV_OK);
         ASSERT_EQ(pkv_seq_fork(c.pool, a, &d), PKV_OK);
         c.seqs.push_back(b);
         c.seqs.push_back(d);
         append(c, b, 1, 50);  // copies of the shared partial block
         append(c, d, 1, 60);
       },
       [](Ctx& c) {
         pkv_batch* batch = nullptr;
         uint32_t q[3] = {1, 1, 1};
         pkv_status st = pkv_batch_prepare(c.pool, c.seqs.data(), q, 3, nullptr, &batch);
         pkv_batch_destroy(batch);
         return st;
       }},
      // A commit that fails marks nothing (the storage pool's plan is then
      // destroyed unwritten: aborted).
      {"batch commit", storage,
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c);
         append(c, a, 16, 1);
         step(c, a, 16);
         append(c, a, 5, 17);
       },
       [](Ctx& c) {
         pkv_batch* batch = nullptr;
         uint32_t q = 5;
         pkv_status st = pkv_batch_prepare(c.pool, c.seqs.data(), &q, 1, nullptr, &batch);
         if (st == PKV_OK) st = pkv_batch_commit(batch);
         pkv_batch_destroy(batch);
         return st;
       }},
  });
}

// The fused decode step, all or nothing under allocation failure (its
// copy-on-write copies run after the appends: their room is made before).
TEST(Faults, PrepareDecode) {
  Cfg storage;
  storage.block_size = 8;
  storage.storage = true;
  Cfg manager;
  for (const Cfg& cfg : {storage, manager})
    for (uint32_t flags : {0u, 1u})
      run_all({
          {"prepare_decode with copy-on-write", cfg,
           [](Ctx& c) {
             pkv_seq_id a = make_seq(c);
             append(c, a, 21, 1);
             step(c, a, 21);
             pkv_seq_id b, d;
             ASSERT_EQ(pkv_seq_fork(c.pool, a, &b), PKV_OK);
             ASSERT_EQ(pkv_seq_fork(c.pool, a, &d), PKV_OK);
             c.seqs.push_back(b);
             c.seqs.push_back(d);
           },
           [flags](Ctx& c) {
             pkv_batch* batch = nullptr;
             const int32_t t[3] = {50, 60, 70};
             pkv_status st =
                 pkv_batch_prepare_decode(c.pool, c.seqs.data(), t, 3, flags, nullptr, &batch);
             pkv_batch_destroy(batch);
             return st;
           }},
          // The steady path (step_plan_steady.cpp): the previous decode
          // step's ids again; one sequence opens a block, one fills one.
          {"prepare_decode over the previous step's ids", cfg,
           [flags](Ctx& c) {
             computed_seqs(c);
             pkv_batch* batch = nullptr;
             const int32_t t[4] = {1, 2, 3, 4};
             ASSERT_EQ(
                 pkv_batch_prepare_decode(c.pool, c.seqs.data(), t, 4, flags, nullptr, &batch),
                 PKV_OK)
                 << pkv_last_error_message();
             ASSERT_EQ(pkv_batch_commit(batch), PKV_OK);
             pkv_batch_destroy(batch);
           },
           [flags](Ctx& c) {
             pkv_batch* batch = nullptr;
             const int32_t t[4] = {5, 6, 7, 8};
             pkv_status st =
                 pkv_batch_prepare_decode(c.pool, c.seqs.data(), t, 4, flags, nullptr, &batch);
             const bool steady = batch && batch->impl->steady_for_testing();
             // The set-up's step was committed and nothing ran since: the
             // decode lane (step_plan_steady.cpp).
             const bool lane = batch && batch->impl->lane_for_testing();
             pkv_batch_destroy(batch);
             if (st == PKV_OK && !steady) ADD_FAILURE() << "the steady path did not run";
             if (st == PKV_OK && !lane) ADD_FAILURE() << "the decode lane did not run";
             return st;
           }},
          // The steady path over ids it has not seen (it remembers them for
          // the next step, which may fail), committed: the decode lane
          // stands only if they were remembered.
          {"prepare_decode over new ids, committed", cfg, [](Ctx& c) { computed_seqs(c); },
           [flags](Ctx& c) {
             pkv_batch* batch = nullptr;
             const int32_t t[4] = {5, 6, 7, 8};
             pkv_status st =
                 pkv_batch_prepare_decode(c.pool, c.seqs.data(), t, 4, flags, nullptr, &batch);
             const bool steady = batch && batch->impl->steady_for_testing();
             if (batch) pkv_batch_commit(batch);  // may fail too (out of memory): safe
             pkv_batch_destroy(batch);
             if (st == PKV_OK && !steady) ADD_FAILURE() << "the steady path did not run";
             return st;
           }},
      });
}

// The publisher drains the pool's events before it encodes them: a failed
// allocation after the drain must keep them for the next publish, not drop
// them (the pool has already let them go).
struct Published {
  pkv_pool* pool = nullptr;
  pkv_event_publisher* pub = nullptr;
  pkv_status made = PKV_OK;
  explicit Published(long n) {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = 4;
    o.num_blocks = 32;
    o.enable_events = 1;
    EXPECT_EQ(pkv_pool_create(&o, &pool), PKV_OK);
    const std::string ep = "inproc://pkv-fault-" + std::to_string(n);
    made = pkv_event_publisher_create(pool, ep.c_str(), nullptr, nullptr, &pub);
    if (made != PKV_OK) return;
    // Four full blocks stored (events), kept cached after the free.
    pkv_seq_id s = 0;
    EXPECT_EQ(pkv_seq_create(pool, nullptr, &s), PKV_OK);
    EXPECT_EQ(pkv_seq_append(pool, s, g_tokens.data(), 16, 0), PKV_OK);
    uint32_t q = 16;
    pkv_batch* b = nullptr;
    EXPECT_EQ(pkv_batch_prepare(pool, &s, &q, 1, nullptr, &b), PKV_OK);
    EXPECT_EQ(pkv_batch_commit(b), PKV_OK);
    pkv_batch_destroy(b);
    EXPECT_EQ(pkv_seq_free(pool, s), PKV_OK);
  }
  ~Published() {
    pkv_event_publisher_destroy(pub);
    pkv_pool_destroy(pool);
  }
};

TEST(Faults, PublisherKeepsWhatItDrained) {
  uint64_t expected = 0;
  {
    Published ref(0);
    if (ref.made == PKV_E_UNSUPPORTED) GTEST_SKIP() << "built without PAGEDKV_EVENTS";
    ASSERT_EQ(ref.made, PKV_OK) << pkv_last_error_message();
    ASSERT_EQ(pkv_event_publisher_publish(ref.pub, &expected), PKV_OK);
    ASSERT_GT(expected, 0u);
  }
  for (long n = 1; n < 10000; ++n) {
    Published p(n);
    ASSERT_EQ(p.made, PKV_OK) << pkv_last_error_message();
    uint64_t first = 0, second = 0;
    g_count = 0;
    g_fail_at = n;
    const pkv_status st = pkv_event_publisher_publish(p.pub, &first);
    const bool reached = g_count >= n;
    g_fail_at = -1;
    if (st == PKV_OK) {
      EXPECT_EQ(first, expected) << "alloc #" << n;
    } else {
      EXPECT_EQ(st, PKV_E_OUT_OF_MEMORY) << "alloc #" << n;
      EXPECT_EQ(pkv_event_publisher_publish(p.pub, &second), PKV_OK) << pkv_last_error_message();
      EXPECT_EQ(second, expected) << "alloc #" << n << ": events the failed call drained were lost";
    }
    pkv_event_publisher_stats es;
    pkv_event_publisher_stats_init(&es);
    ASSERT_EQ(pkv_event_publisher_get_stats(p.pub, &es), PKV_OK);
    EXPECT_EQ(es.pool_events_published, expected) << "alloc #" << n;
    if (!reached) {
      EXPECT_GT(n, 1) << "no allocation inside publish was failed";
      return;
    }
    if (::testing::Test::HasFailure()) return;
  }
  ADD_FAILURE() << "never finished";
}

// Multi-group pools (pagedkv/groups.h) are held to the same rule: a call
// failing for want of memory leaves the pool as it was.
pkv_pool* make_group_pool() {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 4;
  o.num_blocks = 64;
  pkv_kv_group_spec g[2];
  for (auto& x : g) {
    pkv_kv_group_spec_init(&x);
    x.num_kv_heads = 1;
    x.head_dim = 8;
  }
  g[1].kind = PKV_GROUP_SLIDING_WINDOW;
  g[1].sliding_window = 4;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create_groups(&o, g, 2, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

std::string group_snapshot(const Ctx& c) {
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  EXPECT_EQ(pkv_pool_get_stats(c.pool, &st), PKV_OK);
  std::string s =
      "free " + std::to_string(st.num_free_blocks) + " used " + std::to_string(st.num_used_blocks) +
      " cached " + std::to_string(st.num_cached_blocks) + " seqs " + std::to_string(st.num_seqs) +
      " tokens " + std::to_string(st.num_tokens) + " cow " + std::to_string(st.num_cow_copies);
  for (uint32_t g = 0; g < 2; ++g) {
    pkv_group_stats gs;
    pkv_group_stats_init(&gs);
    EXPECT_EQ(pkv_pool_group_stats(c.pool, g, &gs), PKV_OK);
    s += "\ngroup " + std::to_string(g) + ": used " + std::to_string(gs.num_used_blocks) +
         " cached " + std::to_string(gs.num_cached_blocks) + " null " +
         std::to_string(gs.num_null_entries);
  }
  for (pkv_seq_id id : c.seqs) {
    pkv_seq_info i;
    pkv_seq_info_init(&i);
    if (pkv_seq_get_info(c.pool, id, &i) != PKV_OK) {
      s += "\nseq gone";
      continue;
    }
    s += "\nseq tokens " + std::to_string(i.num_tokens) + " cached " +
         std::to_string(i.num_cached_tokens) + " computed " +
         std::to_string(i.num_computed_tokens) + " blocks " + std::to_string(i.num_blocks);
    for (uint32_t g = 0; g < 2; ++g) {
      int32_t t[64];
      uint64_t n = 0;
      EXPECT_EQ(pkv_seq_group_block_table(c.pool, id, g, t, 64, &n), PKV_OK);
      s += " |";
      for (uint64_t j = 0; j < n; ++j) s += " " + std::to_string(t[j]);
    }
  }
  return s;
}

TEST(Faults, GroupMatchAndAppend) {
  struct GroupCase {
    const char* name;
    std::function<void(Ctx&)> setup;
    std::function<pkv_status(Ctx&)> op;
  };
  const std::vector<GroupCase> cases = {
      {"group match prefix",
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c);
         append(c, a, 13, 1);
         step(c, a, 13);
         make_seq(c);
       },
       [](Ctx& c) { return do_match(c, 1, 13, 1); }},
      {"group append prefill (full blocks cached)", [](Ctx& c) { make_seq(c); },
       [](Ctx& c) { return do_append(c, 0, 30, 1); }},
      {"group append after a plan (window releases)",
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c);
         append(c, a, 10, 1);
         step(c, a, 10);
       },
       [](Ctx& c) { return do_append(c, 0, 9, 100); }},
      {"group append after fork (copy-on-write)",
       [](Ctx& c) {
         pkv_seq_id a = make_seq(c);
         append(c, a, 10, 1);
         pkv_seq_id child;
         ASSERT_EQ(pkv_seq_fork(c.pool, a, &child), PKV_OK);
         c.seqs.push_back(child);
       },
       [](Ctx& c) { return do_append(c, 1, 5, 900); }},
  };
  for (const GroupCase& k : cases) {
    long n = 1;
    for (; n < 100000; ++n) {
      Ctx c;
      c.pool = make_group_pool();
      ASSERT_NE(c.pool, nullptr);
      k.setup(c);
      ASSERT_EQ(pkv_pool_validate(c.pool), PKV_OK) << k.name << ": setup";
      const std::string before = group_snapshot(c);
      g_count = 0;
      g_fail_at = n;
      const pkv_status st = k.op(c);
      const bool reached = g_count >= n;
      g_fail_at = -1;
      if (st != PKV_OK) {
        EXPECT_EQ(st, PKV_E_OUT_OF_MEMORY) << k.name << " alloc #" << n;
        EXPECT_EQ(group_snapshot(c), before) << k.name << " alloc #" << n << " changed the pool";
      }
      EXPECT_EQ(pkv_pool_validate(c.pool), PKV_OK)
          << k.name << " alloc #" << n << ": " << pkv_last_error_message();
      pkv_pool_destroy(c.pool);
      if (!reached || ::testing::Test::HasFailure()) break;
    }
    EXPECT_GT(n, 1) << k.name << ": no allocation inside it was failed";
    if (::testing::Test::HasFailure()) return;
  }
}

// pkv_hash_prefix under allocation failure: PKV_E_OUT_OF_MEMORY or the
// hashes, and nothing leaked (LeakSanitizer: the hasher's state was lost
// when its buffer could not be allocated).
TEST(Faults, HashPrefix) {
  pkv_hash_options o;
  pkv_hash_options_init(&o);
  o.block_size = 4;
  pkv_block_hash want[4], got[4];
  uint64_t n = 0;
  ASSERT_EQ(pkv_hash_prefix(&o, g_tokens.data(), 16, want, 4, &n), PKV_OK);
  long points = 0;
  for (long k = 1; k < 1000; ++k) {
    g_count = 0;
    g_fail_at = k;
    const pkv_status st = pkv_hash_prefix(&o, g_tokens.data(), 16, got, 4, &n);
    const bool reached = g_count >= k;
    g_fail_at = -1;
    if (st == PKV_OK) {
      EXPECT_EQ(std::memcmp(got, want, sizeof want), 0) << "alloc #" << k;
    } else {
      EXPECT_EQ(st, PKV_E_OUT_OF_MEMORY) << "alloc #" << k;
    }
    if (!reached) break;
    points = k;
  }
  EXPECT_GT(points, 0);
}

}  // namespace
