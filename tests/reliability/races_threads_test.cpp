// Races (run under TSan by scripts/test-sanitizers.sh, label threads): the
// parts of the pool that tests/reliability/stress_test.cpp and
// tests/capi/*threads_test.cpp do not drive from several threads at once:
// multi-group pools with persistent plans, fork and take_copies; tiers with
// steps, flushes, resets and a destroy while a kernel runs; the events
// publisher while the pool is used and destroyed; pkv_batch_prepare_decode's
// steady path while sequences come and go; plan arrays read while later
// plans are prepared; retention and clock ticks; kernels on a plan whose
// sequence another thread frees. Each test checks statuses and that the pool
// validates; TSan checks the rest (no data race, no lock-order inversion).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/pagedkv.h"
#include "sanitizers.h"

#ifdef PKV_TEST_ZMQ
#include <zmq.h>
#endif

namespace {

#ifdef PKV_TSAN
constexpr int kScale = 3;
#else
constexpr int kScale = 12;
#endif

constexpr uint32_t kBs = 4, kDim = 8;

// Statuses a racing thread may see; anything else is a failure.
bool benign(pkv_status s) {
  return s == PKV_OK || s == PKV_E_OUT_OF_BLOCKS || s == PKV_E_INVALID_STATE ||
         s == PKV_E_NOT_FOUND;
}

struct Failures {
  std::atomic<int> n{0};
  std::string first;
  std::mutex mu;
  void add(const std::string& what) {
    std::lock_guard<std::mutex> l(mu);
    if (n++ == 0) first = what;
  }
  void check(pkv_status s, const char* call) {
    if (!benign(s))
      add(std::string(call) + ": " + std::to_string(s) + " " + pkv_last_error_message());
  }
};

// Plans prepared and kernels run, so that each test can tell it did work.
std::atomic<uint64_t> g_plans{0}, g_kernels{0};

// Prints the plans and kernels a test ran (what it exercised).
struct Work {
  uint64_t p0 = g_plans, k0 = g_kernels;
  ~Work() {
    std::printf("  plans %llu, kernel runs %llu\n", (unsigned long long)(g_plans - p0),
                (unsigned long long)(g_kernels - k0));
  }
};

#define CHECK_BENIGN(f, call) (f).check((call), #call)

int32_t tok(uint32_t family, uint64_t pos) {
  return int32_t((family * 7919 + pos * 31) % 30000 + 1);
}

std::vector<int32_t> prompt(uint32_t family, uint32_t n, int32_t last) {
  std::vector<int32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = tok(family, i);
  t.back() = last;
  return t;
}

pkv_seq_info info_of(pkv_pool* pool, pkv_seq_id s, pkv_status* st) {
  pkv_seq_info i;
  pkv_seq_info_init_sized(&i, sizeof i);
  *st = pkv_seq_get_info(pool, s, &i);
  return i;
}

// Reads every element of a plan array (a data race with a library write
// into it is what TSan looks for).
int64_t read_tensor(const pkv_tensor& t) {
  int64_t n = 1, sum = 0;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  const char* base = static_cast<const char*>(t.data) + t.byte_offset;
  for (int64_t i = 0; i < n; ++i) {
    if (t.dtype == PKV_DTYPE_I64)
      sum += reinterpret_cast<const int64_t*>(base)[i];
    else
      sum += reinterpret_cast<const int32_t*>(base)[i];
  }
  return sum;
}

int64_t read_plan(const pkv_batch* b, uint32_t groups) {
  int64_t sum = 0;
  for (uint32_t g = 0; g < groups; ++g)
    for (uint32_t w : {0u, 1u, 2u, 3u, 4u, 5u, 16u, 17u, 18u}) {
      pkv_tensor t;
      if (pkv_batch_plan_tensor_group(b, g, w, &t) == PKV_OK) sum += read_tensor(t);
    }
  return sum;
}

pkv_pool_options storage_options(uint32_t blocks) {
  pkv_pool_options o;
  pkv_pool_options_init_sized(&o, sizeof o);
  o.block_size = kBs;
  o.num_blocks = blocks;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = kDim;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 2;
  return o;
}

pkv_pool_options manager_options(uint32_t blocks) {
  pkv_pool_options o;
  pkv_pool_options_init_sized(&o, sizeof o);
  o.block_size = kBs;
  o.num_blocks = blocks;
  return o;
}

pkv_tensor rows(float* data, int64_t n) {
  const int64_t shape[3] = {n, 1, kDim};
  pkv_tensor t;
  pkv_tensor_init(data, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t);
  return t;
}

// Writes and attends the plan's queries (storage pools); returns the first
// non-OK status.
pkv_status run_kernels(pkv_batch* b) {
  pkv_batch_info bi;
  pkv_batch_info_init(&bi);
  pkv_status st = pkv_batch_get_info(b, &bi);
  if (st != PKV_OK) return st;
  std::vector<float> k(bi.num_tokens * kDim, 0.5f), q(k.size(), 0.25f), out(k.size());
  pkv_tensor kt = rows(k.data(), int64_t(bi.num_tokens)),
             qt = rows(q.data(), int64_t(bi.num_tokens)),
             ot = rows(out.data(), int64_t(bi.num_tokens));
  st = pkv_cache_write(b, 0, &kt, &kt, nullptr);
  if (st != PKV_OK) return st;
  st = pkv_attention_forward(b, 0, &qt, &ot, nullptr, nullptr, nullptr);
  if (st == PKV_OK) ++g_kernels;
  return st;
}

// A sequence of `n` tokens whose prompt is computed (a committed plan).
pkv_status admit_computed(pkv_pool* pool, uint32_t family, uint32_t n, int32_t last, bool kernels,
                          pkv_seq_id* out) {
  std::vector<int32_t> t = prompt(family, n, last);
  uint64_t cached = 0;
  pkv_status st = pkv_seq_admit(pool, nullptr, t.data(), n, 0, out, &cached);
  if (st != PKV_OK) return st;
  const uint32_t q = uint32_t(n - cached);
  pkv_batch* b = nullptr;
  st = pkv_batch_prepare(pool, out, &q, 1, nullptr, &b);
  if (st == PKV_OK) ++g_plans;
  if (st == PKV_OK) st = kernels ? run_kernels(b) : pkv_batch_commit(b);
  pkv_batch_destroy(b);
  if (st != PKV_OK) pkv_seq_free(pool, *out);
  return st;
}

// ------------------------------------------------------------ multi-group

pkv_pool* make_group_pool(uint32_t blocks) {
  pkv_pool_options base = manager_options(blocks);
  pkv_kv_group_spec g[3];
  for (auto& s : g) pkv_kv_group_spec_init_sized(&s, sizeof s);
  g[0].kind = PKV_GROUP_FULL;
  g[0].num_kv_heads = 1;
  g[0].head_dim = kDim;
  g[1].kind = PKV_GROUP_SLIDING_WINDOW;
  g[1].num_kv_heads = 1;
  g[1].head_dim = kDim;
  g[1].sliding_window = 64;
  g[2].kind = PKV_GROUP_RECURRENT;
  g[2].state_bytes = 64;
  g[2].flags = PKV_GROUP_SNAPSHOT_EVERY_BLOCK;
  pkv_pool* pool = nullptr;
  EXPECT_EQ(pkv_pool_create_groups(&base, g, 3, &pool), PKV_OK) << pkv_last_error_message();
  if (!pool) return nullptr;
  // The pool's first plan (from position 0): from here on appended tokens
  // count as uncomputed until a plan over them is committed (groups.h).
  pkv_seq_id s = 0;
  std::vector<int32_t> t = prompt(99, 4, 1);
  const uint32_t q = 4;
  pkv_batch* b = nullptr;
  EXPECT_EQ(pkv_seq_create(pool, nullptr, &s), PKV_OK);
  EXPECT_EQ(pkv_seq_append(pool, s, t.data(), 4, 0), PKV_OK);
  EXPECT_EQ(pkv_batch_prepare_ex(pool, &s, &q, 1, 0, nullptr, &b), PKV_OK)
      << pkv_last_error_message();
  EXPECT_EQ(pkv_batch_commit(b), PKV_OK);
  pkv_batch_destroy(b);
  EXPECT_EQ(pkv_seq_free(pool, s), PKV_OK);
  return pool;
}

// A manager-only pool (groups 1) or make_group_pool's; null on failure.
pkv_pool* make_pool(int groups, uint32_t blocks) {
  if (groups > 1) return make_group_pool(blocks);
  pkv_pool_options o = manager_options(blocks);
  pkv_pool* p = nullptr;
  return pkv_pool_create(&o, &p) == PKV_OK ? p : nullptr;
}

void take_all_copies(pkv_pool* pool, Failures& f) {
  for (uint32_t g = 0; g < 3; ++g) {
    std::vector<int32_t> src(8), dst(8);
    uint64_t len = 0;
    pkv_status st;
    while ((st = pkv_pool_group_take_copies(pool, g, src.data(), dst.data(), src.size(), &len)) ==
           PKV_E_BUFFER_TOO_SMALL) {
      src.resize(len);
      dst.resize(len);
    }
    f.check(st, "pkv_pool_group_take_copies");
  }
}

// Readers of a pool: stats, per-group stats, validation, and now and then a
// prefix-cache reset. Runs until stop.
void pool_reader(pkv_pool* pool, uint32_t groups, std::atomic<bool>& stop, Failures& f,
                 bool reset) {
  std::mt19937 rng(99);
  while (!stop) {
    pkv_pool_stats s;
    pkv_pool_stats_init_sized(&s, sizeof s);
    CHECK_BENIGN(f, pkv_pool_get_stats(pool, &s));
    for (uint32_t g = 0; groups > 1 && g < groups; ++g) {
      pkv_group_stats gs;
      pkv_group_stats_init_sized(&gs, sizeof gs);
      CHECK_BENIGN(f, pkv_pool_group_stats(pool, g, &gs));
    }
    const pkv_status v = pkv_pool_validate(pool);
    if (v != PKV_OK) f.add(std::string("validate: ") + pkv_last_error_message());
    if (reset && rng() % 8 == 0) CHECK_BENIGN(f, pkv_pool_reset_prefix_cache(pool));
    std::this_thread::yield();
  }
}

// One thread's steps on a multi-group pool: its own sequences, persistent or
// CSR plans, arrays read before and after commit or abort, forks with
// take_copies, frees with prefix hits on re-admission.
void group_worker(pkv_pool* pool, int id, int steps, Failures& f) {
  std::mt19937 rng(1000 + id);
  std::vector<pkv_seq_id> seqs;
  auto fresh = [&]() {
    pkv_seq_id s = 0;
    if (pkv_seq_create(pool, nullptr, &s) != PKV_OK) return;
    const uint32_t fam = rng() % 4;
    std::vector<int32_t> t = prompt(fam, 9 + rng() % 8, int32_t(40000 + id));
    uint64_t cached = 0;
    CHECK_BENIGN(f, pkv_seq_match_prefix(pool, s, t.data(), t.size(), &cached));
    const pkv_status st = pkv_seq_append(pool, s, t.data() + cached, t.size() - cached, 0);
    if (st != PKV_OK) {
      f.check(st, "pkv_seq_append");
      CHECK_BENIGN(f, pkv_seq_free(pool, s));
      return;
    }
    seqs.push_back(s);
  };
  auto in_len = [&](pkv_seq_id x) {
    pkv_status st;
    return info_of(pool, x, &st).num_tokens;
  };
  for (int step = 0; step < steps; ++step) {
    while (seqs.size() < 3) {
      const size_t before = seqs.size();
      fresh();
      if (seqs.size() == before) break;
    }
    if (seqs.empty()) continue;
    std::vector<uint32_t> q(seqs.size());
    bool ok = true;
    for (size_t i = 0; i < seqs.size() && ok; ++i) {
      pkv_status st;
      pkv_seq_info in = info_of(pool, seqs[i], &st);
      if (st != PKV_OK) {
        f.check(st, "pkv_seq_get_info");
        ok = false;
        break;
      }
      q[i] = uint32_t(in.num_tokens - in.num_computed_tokens);
      if (q[i] == 0) {
        const int32_t t = tok(uint32_t(id), in.num_tokens);
        st = pkv_seq_append(pool, seqs[i], &t, 1, 0);
        if (st != PKV_OK) {
          f.check(st, "pkv_seq_append");
          ok = false;
        }
        q[i] = 1;
      }
    }
    const uint32_t flags = rng() % 3 ? PKV_PREPARE_PERSISTENT_TABLE : 0;
    pkv_batch* b = nullptr;
    pkv_status st = ok ? pkv_batch_prepare_ex(pool, seqs.data(), q.data(), uint32_t(seqs.size()),
                                              flags, nullptr, &b)
                       : PKV_E_INVALID_STATE;
    if (st == PKV_OK) {
      ++g_plans;
      take_all_copies(pool, f);
      volatile int64_t sink = read_plan(b, 3);
      if (rng() % 4)
        CHECK_BENIGN(f, pkv_batch_commit(b));
      else
        CHECK_BENIGN(f, pkv_batch_abort(b));
      // The arrays stay valid until destroy, commit or not.
      sink = sink + read_plan(b, 3);
      (void)sink;
      pkv_batch_destroy(b);
    } else {
      if (st != PKV_E_OUT_OF_BLOCKS && st != PKV_E_INVALID_STATE && st != PKV_E_INVALID_ARGUMENT)
        f.check(st, "pkv_batch_prepare_ex");
      // Start over with new sequences.
      for (pkv_seq_id s : seqs) CHECK_BENIGN(f, pkv_seq_free(pool, s));
      seqs.clear();
      continue;
    }
    const uint32_t r = rng() % 10;
    if (r == 0) {  // fork, append to the child (copy-on-write), take, free
      pkv_seq_id child = 0;
      if (pkv_seq_fork(pool, seqs[0], &child) == PKV_OK) {
        const int32_t t = 7;
        CHECK_BENIGN(f, pkv_seq_append(pool, child, &t, 1, 0));
        take_all_copies(pool, f);
        CHECK_BENIGN(f, pkv_seq_free(pool, child));
      }
    } else if (r == 1 || in_len(seqs.back()) > 40) {  // a finished request
      CHECK_BENIGN(f, pkv_seq_free(pool, seqs.back()));
      seqs.pop_back();
    } else if (r == 2) {
      uint64_t len = 0;
      std::vector<int32_t> tab(256);
      CHECK_BENIGN(
          f, pkv_seq_group_block_table(pool, seqs[0], rng() % 3, tab.data(), tab.size(), &len));
    }
  }
  for (pkv_seq_id s : seqs) CHECK_BENIGN(f, pkv_seq_free(pool, s));
  take_all_copies(pool, f);
}

TEST(Races, MultiGroupPoolPlansForksCopiesAndResets) {
  Work work;
  pkv_pool* pool = make_group_pool(160);
  ASSERT_NE(pool, nullptr);
  Failures f;
  std::atomic<bool> stop{false};
  std::thread reader([&] { pool_reader(pool, 3, stop, f, false); });  // no reset: UNSUPPORTED there
  std::vector<std::thread> ws;
  for (int i = 0; i < 3; ++i) ws.emplace_back([&, i] { group_worker(pool, i, 150 * kScale, f); });
  for (auto& w : ws) w.join();
  stop = true;
  reader.join();
  EXPECT_EQ(f.n.load(), 0) << f.first;
  EXPECT_EQ(pkv_pool_validate(pool), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(pool);
}

// A live plan's arrays never change, while other threads prepare persistent
// plans (which update the pool's kept table in place when no plan holds it)
// and destroy theirs, committed or aborted first.
TEST(Races, PersistentPlanArraysStayWhileOtherPlansArePrepared) {
  Work work;
  for (int groups : {1, 3}) {
    pkv_pool* pool = make_pool(groups, 128);
    ASSERT_NE(pool, nullptr) << pkv_last_error_message();
    Failures f;
    auto worker = [&](int id) {
      std::mt19937 rng(7 + id);
      pkv_seq_id s[2] = {0, 0};
      for (auto& x : s) {
        std::vector<int32_t> t = prompt(uint32_t(id), 6, 1);
        if (pkv_seq_create(pool, nullptr, &x) != PKV_OK ||
            pkv_seq_append(pool, x, t.data(), t.size(), 0) != PKV_OK)
          return f.add("setup");
      }
      uint32_t q[2] = {6, 6};
      for (int it = 0; it < 120 * kScale; ++it) {
        pkv_batch* b = nullptr;
        pkv_status st =
            pkv_batch_prepare_ex(pool, s, q, 2, PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b);
        if (st != PKV_OK) return f.check(st == PKV_E_OUT_OF_BLOCKS ? PKV_OK : st, "prepare_ex");
        ++g_plans;
        if (groups > 1) take_all_copies(pool, f);
        const int64_t before = read_plan(b, uint32_t(groups));
        pkv_tensor pos, last;
        CHECK_BENIGN(f, pkv_batch_token_positions(b, &pos));
        CHECK_BENIGN(f, pkv_batch_last_token_indices(b, &last));
        const bool commit = rng() % 4 != 0;
        CHECK_BENIGN(f, commit ? pkv_batch_commit(b) : pkv_batch_abort(b));
        std::this_thread::yield();
        if (read_plan(b, uint32_t(groups)) != before) f.add("a live plan's arrays changed");
        pkv_batch_destroy(b);
        for (int i = 0; i < 2; ++i) {
          if (!commit) continue;  // the same queries again
          const int32_t t = tok(uint32_t(id), uint64_t(it));
          st = pkv_seq_append(pool, s[i], &t, 1, 0);
          if (st != PKV_OK) return f.check(st == PKV_E_OUT_OF_BLOCKS ? PKV_OK : st, "append");
          q[i] = 1;
        }
      }
      for (auto x : s) CHECK_BENIGN(f, pkv_seq_free(pool, x));
    };
    std::vector<std::thread> ws;
    for (int i = 0; i < 3; ++i) ws.emplace_back(worker, i);
    for (auto& w : ws) w.join();
    EXPECT_EQ(f.n.load(), 0) << "groups " << groups << ": " << f.first;
    EXPECT_EQ(pkv_pool_validate(pool), PKV_OK) << pkv_last_error_message();
    pkv_pool_destroy(pool);
  }
}

// One thread reads its persistent plan's arrays after the commit (they stay
// valid until destroy), then destroys it; another thread, told so through a
// relaxed flag (no ordering of its own), prepares the next persistent plan,
// which may update the pool's kept table in place. The library must order
// that update after the destroy.
TEST(Races, PersistentTableReusedAfterAPlanCommittedAndDestroyedOnAnotherThread) {
  Work work;
  for (int groups : {1, 3}) {
    pkv_pool* pool = make_pool(groups, 64);
    ASSERT_NE(pool, nullptr) << pkv_last_error_message();
    pkv_seq_id s[2];
    for (int i = 0; i < 2; ++i) {
      std::vector<int32_t> t = prompt(uint32_t(i), 5, 1);
      ASSERT_EQ(pkv_seq_create(pool, nullptr, &s[i]), PKV_OK);
      ASSERT_EQ(pkv_seq_append(pool, s[i], t.data(), t.size(), 0), PKV_OK);
    }
    std::atomic<int> turn{0};  // relaxed: hands the pool over, orders nothing
    Failures f;
    const int rounds = 60 * kScale;
    auto step = [&](int me) {
      uint32_t q = 5;
      for (int r = 0; r < rounds; ++r) {
        while (turn.load(std::memory_order_relaxed) % 2 != me) std::this_thread::yield();
        pkv_batch* b = nullptr;
        const pkv_status st = q == 0
                                  ? PKV_E_OUT_OF_BLOCKS
                                  : pkv_batch_prepare_ex(pool, &s[me], &q, 1,
                                                         PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b);
        if (st != PKV_OK) {
          f.check(st == PKV_E_OUT_OF_BLOCKS ? PKV_OK : st, "prepare_ex");
        } else {
          ++g_plans;
          if (groups > 1) take_all_copies(pool, f);
          CHECK_BENIGN(f, pkv_batch_commit(b));
          volatile int64_t sink = read_plan(b, uint32_t(groups));  // after the commit
          (void)sink;
          pkv_batch_destroy(b);
          const int32_t t = int32_t(r + 1);
          const pkv_status as = pkv_seq_append(pool, s[me], &t, 1, 0);
          CHECK_BENIGN(f, as);
          q = as == PKV_OK ? 1 : 0;  // out of blocks: nothing more to plan
        }
        turn.fetch_add(1, std::memory_order_relaxed);
      }
    };
    std::thread a(step, 0), b(step, 1);
    a.join();
    b.join();
    EXPECT_EQ(f.n.load(), 0) << "groups " << groups << ": " << f.first;
    pkv_pool_destroy(pool);
  }
}

// Two threads ask one plan for its positions and last-token indices at once
// (built on the first call, once).
TEST(Races, PlanPositionsAskedByTwoThreadsAtOnce) {
  Work work;
  pkv_pool_options o = manager_options(64);
  pkv_pool* pool = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK);
  pkv_seq_id s = 0;
  std::vector<int32_t> t = prompt(1, 30, 2);
  ASSERT_EQ(pkv_seq_create(pool, nullptr, &s), PKV_OK);
  ASSERT_EQ(pkv_seq_append(pool, s, t.data(), t.size(), 0), PKV_OK);
  for (int it = 0; it < 50 * kScale; ++it) {
    const uint32_t q = 30;
    pkv_batch* b = nullptr;
    ASSERT_EQ(pkv_batch_prepare_ex(pool, &s, &q, 1, it % 2, nullptr, &b), PKV_OK);
    int64_t sums[2] = {0, 0};
    auto ask = [&](int i) {
      pkv_tensor p, l, c;
      if (pkv_batch_token_positions(b, &p) == PKV_OK) sums[i] += read_tensor(p);
      if (pkv_batch_last_token_indices(b, &l) == PKV_OK) sums[i] += read_tensor(l);
      if (pkv_batch_plan_tensor(b, PKV_PLAN_PAGE_INDICES, &c) == PKV_OK) sums[i] += read_tensor(c);
    };
    std::thread a(ask, 0), c(ask, 1);
    a.join();
    c.join();
    EXPECT_EQ(sums[0], sums[1]);
    pkv_batch_destroy(b);
  }
  pkv_pool_destroy(pool);
}

// ------------------------------------------------- decode steady path / memo

TEST(Races, PrepareDecodeSteadyPathWhileOthersCreateAndFree) {
  Work work;
  // Manager-only; with storage; with storage and tiers attached (host and
  // file) while the steps run, so that the steps' allocations offload.
  for (int mode : {0, 1, 2}) {
    const bool storage = mode > 0;
    pkv_pool_options o = storage ? storage_options(mode == 2 ? 48 : 160) : manager_options(160);
    pkv_pool* pool = nullptr;
    ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK);
    Failures f;
    std::atomic<bool> stop{false};
    // Decoders: each its own running batch, decoded step after step
    // (pkv_batch_prepare_decode's memo path when the previous call was its
    // own), with now and then a finished request replaced.
    auto decoder = [&](int id) {
      std::mt19937 rng(31 + id);
      std::vector<pkv_seq_id> run;
      for (int it = 0; it < 100 * kScale; ++it) {
        while (run.size() < 4) {
          pkv_seq_id s = 0;
          const pkv_status st =
              admit_computed(pool, rng() % 3, 5 + rng() % 6, int32_t(500 + id), storage, &s);
          if (st != PKV_OK) {
            f.check(st, "admit_computed");
            break;
          }
          run.push_back(s);
        }
        if (run.empty()) continue;
        std::vector<int32_t> toks(run.size(), int32_t(3 + id));
        pkv_batch* b = nullptr;
        const uint32_t flags = (id % 2) ? PKV_PREPARE_PERSISTENT_TABLE : 0;
        pkv_status st = pkv_batch_prepare_decode(pool, run.data(), toks.data(),
                                                 uint32_t(run.size()), flags, nullptr, &b);
        if (st == PKV_OK) {
          ++g_plans;
          volatile int64_t sink = read_plan(b, 1);
          (void)sink;
          st = storage ? run_kernels(b) : pkv_batch_commit(b);
          CHECK_BENIGN(f, st);
          pkv_batch_destroy(b);
        } else {
          f.check(st, "pkv_batch_prepare_decode");
        }
        if (st != PKV_OK || rng() % 6 == 0) {  // finished (or could not grow)
          const size_t i = rng() % run.size();
          CHECK_BENIGN(f, pkv_seq_free(pool, run[i]));
          run.erase(run.begin() + long(i));
        }
      }
      for (pkv_seq_id s : run) CHECK_BENIGN(f, pkv_seq_free(pool, s));
    };
    // Churn: sequences created, forked and freed all the time, so that no
    // decoder's memo outlives a free for long.
    auto churn = [&] {
      std::mt19937 rng(5);
      while (!stop) {
        pkv_seq_id s = 0, c = 0;
        if (admit_computed(pool, rng() % 3, 9, 77, storage, &s) != PKV_OK) continue;
        if (pkv_seq_fork(pool, s, &c) == PKV_OK) CHECK_BENIGN(f, pkv_seq_free(pool, c));
        CHECK_BENIGN(f, pkv_seq_free(pool, s));
      }
    };
    std::thread ch(churn), rd([&] { pool_reader(pool, 1, stop, f, mode == 2); });
    std::vector<std::thread> ws;
    for (int i = 0; i < 2; ++i) ws.emplace_back(decoder, i);
    if (mode == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      uint64_t bpb = 0;
      EXPECT_EQ(pkv_pool_bytes_per_block(pool, &bpb), PKV_OK);
      pkv_tier_options t;
      pkv_tier_options_init_sized(&t, sizeof t);
      t.host_bytes = 4 * bpb;
      const std::string dir = ::testing::TempDir();
      t.file_dir = dir.c_str();
      t.file_bytes = 8 * bpb;
      EXPECT_EQ(pkv_pool_attach_tiers(pool, &t), PKV_OK) << pkv_last_error_message();
      for (int i = 0; i < 20; ++i) {
        CHECK_BENIGN(f, pkv_pool_flush_tiers(pool));
        std::this_thread::yield();
      }
    }
    for (auto& w : ws) w.join();
    stop = true;
    ch.join();
    rd.join();
    EXPECT_EQ(f.n.load(), 0) << "mode " << mode << ": " << f.first;
    EXPECT_EQ(pkv_pool_validate(pool), PKV_OK) << pkv_last_error_message();
    pkv_pool_destroy(pool);
  }
}

// ------------------------------------------------------------------ tiers

TEST(Races, TiersOffloadLoadWithStepsFlushesResetsThenDestroyDuringAttention) {
  Work work;
  for (int layout = 0; layout < 2; ++layout) {  // host + file; file alone
    pkv_pool_options o = storage_options(20);
    o.enable_events = 1;
    pkv_pool* pool = nullptr;
    ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK);
    uint64_t bpb = 0;
    ASSERT_EQ(pkv_pool_bytes_per_block(pool, &bpb), PKV_OK);
    pkv_tier_options t;
    pkv_tier_options_init_sized(&t, sizeof t);
    t.host_bytes = layout == 0 ? 6 * bpb : 0;
    const std::string dir = ::testing::TempDir();
    t.file_dir = dir.c_str();
    t.file_bytes = 8 * bpb;
    ASSERT_EQ(pkv_pool_attach_tiers(pool, &t), PKV_OK) << pkv_last_error_message();
    Failures f;
    std::atomic<bool> stop{false};
    auto worker = [&](int id) {
      std::mt19937 rng(3 + id);
      for (int it = 0; it < 60 * kScale; ++it) {
        std::vector<int32_t> toks = prompt(rng() % 6, 13, int32_t(900 + id));
        pkv_seq_id s = 0;
        pkv_tier_match m;
        pkv_tier_match_init_sized(&m, sizeof m);
        pkv_status st =
            pkv_seq_admit_tiered(pool, nullptr, toks.data(), toks.size(), nullptr, 0, 0, &s, &m);
        if (st != PKV_OK) {
          f.check(st, "pkv_seq_admit_tiered");
          continue;
        }
        const uint32_t q = uint32_t(toks.size() - m.num_cached);
        pkv_batch* b = nullptr;
        st = pkv_batch_prepare(pool, &s, &q, 1, nullptr, &b);
        if (st == PKV_OK)
          CHECK_BENIGN(f, run_kernels(b));
        else
          f.check(st, "pkv_batch_prepare");
        pkv_batch_destroy(b);
        CHECK_BENIGN(f, pkv_seq_free(pool, s));
      }
    };
    auto side = [&] {
      std::mt19937 rng(17);
      std::vector<pkv_event_v2> ev(16);
      std::vector<int32_t> tb(16 * kBs);
      while (!stop) {
        const uint32_t r = rng() % 6;
        if (r == 0) CHECK_BENIGN(f, pkv_pool_flush_tiers(pool));
        if (r == 1 && rng() % 4 == 0) CHECK_BENIGN(f, pkv_pool_reset_prefix_cache(pool));
        if (r == 2) {
          for (auto& e : ev) e.struct_size = sizeof e;
          uint64_t n = 0;
          CHECK_BENIGN(
              f, pkv_pool_drain_events_v2(pool, ev.data(), ev.size(), tb.data(), tb.size(), &n));
        }
        for (uint32_t med : {uint32_t(PKV_MEDIUM_HOST), uint32_t(PKV_MEDIUM_FILE)}) {
          pkv_tier_stats ts;
          pkv_tier_stats_init_sized(&ts, sizeof ts);
          CHECK_BENIGN(f, pkv_pool_get_tier_stats(pool, med, &ts));
        }
        std::this_thread::yield();
      }
    };
    std::thread sd(side), rd([&] { pool_reader(pool, 1, stop, f, false); });
    std::vector<std::thread> ws;
    for (int i = 0; i < 3; ++i) ws.emplace_back(worker, i);
    for (auto& w : ws) w.join();
    stop = true;
    sd.join();
    rd.join();
    EXPECT_EQ(f.n.load(), 0) << "layout " << layout << ": " << f.first;
    for (uint32_t med : {uint32_t(PKV_MEDIUM_HOST), uint32_t(PKV_MEDIUM_FILE)}) {
      pkv_tier_stats ts;
      pkv_tier_stats_init_sized(&ts, sizeof ts);
      if (pkv_pool_get_tier_stats(pool, med, &ts) == PKV_OK)
        std::printf("  medium %u: stored %llu, hits %llu, loaded %llu\n", med,
                    (unsigned long long)ts.num_stored, (unsigned long long)ts.num_hits,
                    (unsigned long long)ts.num_loaded);
    }
    EXPECT_EQ(pkv_pool_validate(pool), PKV_OK) << pkv_last_error_message();

    // Now destroy the pool while a plan's attention runs on another thread
    // and evictions have copies queued: the plan fails cleanly afterwards.
    pkv_seq_id s = 0;
    ASSERT_EQ(admit_computed(pool, 9, 13, 5, true, &s), PKV_OK) << pkv_last_error_message();
    for (int i = 0; i < 3; ++i) {  // evict (offload) the older prompts
      pkv_seq_id e = 0;
      if (admit_computed(pool, uint32_t(20 + i), 13, 6, true, &e) == PKV_OK) pkv_seq_free(pool, e);
    }
    const uint32_t one = 1;
    pkv_batch* b = nullptr;
    const int32_t nt = 11;
    ASSERT_EQ(pkv_seq_append(pool, s, &nt, 1, 0), PKV_OK);
    ASSERT_EQ(pkv_batch_prepare(pool, &s, &one, 1, nullptr, &b), PKV_OK);
    std::atomic<int> runs{0};
    std::atomic<pkv_status> last{PKV_OK};
    std::thread runner([&] {
      std::vector<float> q(kDim, 0.5f), out(kDim);
      pkv_tensor qt = rows(q.data(), 1), ot = rows(out.data(), 1);
      pkv_tensor kt = rows(q.data(), 1);
      if ((last = pkv_cache_write(b, 0, &kt, &kt, nullptr)) != PKV_OK) return;
      while ((last = pkv_attention_forward(b, 0, &qt, &ot, nullptr, nullptr, nullptr)) == PKV_OK)
        ++runs;
    });
    while (runs < 3 && last == PKV_OK) std::this_thread::yield();
    pkv_pool_destroy(pool);
    runner.join();
    EXPECT_EQ(last, PKV_E_INVALID_STATE);
    pkv_batch_destroy(b);
  }
}

// ------------------------------------------------------------- retention

TEST(Races, RetentionRangesAndClockTicks) {
  Work work;
  pkv_pool_options o = manager_options(48);
  o.enable_retention = 1;
  o.max_pinned_blocks = 6;
  o.enable_events = 1;
  pkv_pool* pool = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK);
  Failures f;
  std::atomic<bool> stop{false};
  auto worker = [&](int id) {
    std::mt19937 rng(11 + id);
    for (int it = 0; it < 400 * kScale; ++it) {
      pkv_seq_id s = 0;
      if (pkv_seq_create(pool, nullptr, &s) != PKV_OK) {
        f.add(std::string("pkv_seq_create: ") + pkv_last_error_message());
        continue;
      }
      pkv_retention_range r[2];
      std::memset(r, 0, sizeof r);
      r[0].token_begin = 0;
      r[0].token_end = 8;
      r[0].priority = rng() % 3 == 0 ? PKV_PRIORITY_PINNED : rng() % 100;
      r[0].duration_ns = rng() % 2 ? 0 : 1000 + rng() % 100000;
      r[1].token_begin = 8;
      r[1].token_end = PKV_TOKEN_END;
      r[1].priority = rng() % 100;
      r[1].duration_ns = rng() % 50000;
      CHECK_BENIGN(f, pkv_seq_set_retention(pool, s, r, 2));
      std::vector<int32_t> t = prompt(rng() % 5, 17, int32_t(id));
      uint64_t cached = 0;
      CHECK_BENIGN(f, pkv_seq_match_prefix(pool, s, t.data(), t.size(), &cached));
      pkv_status st = pkv_seq_append(pool, s, t.data() + cached, t.size() - cached, 0);
      if (st == PKV_OK) {
        const uint32_t q = uint32_t(t.size() - cached);
        pkv_batch* b = nullptr;
        st = pkv_batch_prepare(pool, &s, &q, 1, nullptr, &b);
        if (st == PKV_OK) ++g_plans;
        if (st == PKV_OK) CHECK_BENIGN(f, pkv_batch_commit(b));
        pkv_batch_destroy(b);
      }
      CHECK_BENIGN(f, st);
      if (rng() % 3 == 0) CHECK_BENIGN(f, pkv_seq_set_retention(pool, s, r + 1, 1));
      CHECK_BENIGN(f, pkv_seq_free(pool, s));
    }
  };
  auto clock = [&] {
    uint64_t now = 1;
    std::vector<pkv_event> ev(32);
    while (!stop) {
      now += 7919;
      CHECK_BENIGN(f, pkv_pool_set_clock(pool, now));
      uint64_t counts[PKV_PRIORITY_MAX + 1], len = 0;
      CHECK_BENIGN(f, pkv_pool_get_priority_counts(pool, counts, PKV_PRIORITY_MAX + 1, &len));
      uint64_t n = 0;
      CHECK_BENIGN(f, pkv_pool_drain_events(pool, ev.data(), ev.size(), &n));
      std::this_thread::yield();
    }
  };
  std::thread ck(clock), rd([&] { pool_reader(pool, 1, stop, f, true); });
  std::vector<std::thread> ws;
  for (int i = 0; i < 3; ++i) ws.emplace_back(worker, i);
  for (auto& w : ws) w.join();
  stop = true;
  ck.join();
  rd.join();
  EXPECT_EQ(f.n.load(), 0) << f.first;
  EXPECT_EQ(pkv_pool_validate(pool), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(pool);
}

// ----------------------------------------------------------------- events

TEST(Races, EventsPublisherWhilePoolIsUsedThenDestroyed) {
  Work work;
  pkv_pool_options o = manager_options(40);
  o.enable_events = 1;
  pkv_pool* pool = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK);
  pkv_event_publisher_options po;
  pkv_event_publisher_options_init_sized(&po, sizeof po);
  po.buffer_steps = 64;
  pkv_event_publisher* pub = nullptr;
  const pkv_status cs =
      pkv_event_publisher_create(pool, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", &po, &pub);
  if (cs == PKV_E_UNSUPPORTED) {
    pkv_pool_destroy(pool);
    GTEST_SKIP() << "built without PAGEDKV_EVENTS";
  }
  ASSERT_EQ(cs, PKV_OK) << pkv_last_error_message();
  Failures f;
  std::atomic<bool> stop_users{false}, stop_pub{false};
  std::thread publisher([&] {
    while (!stop_pub) {
      uint64_t n = 0;
      CHECK_BENIGN(f, pkv_event_publisher_publish(pub, &n));
      pkv_event_publisher_stats st;
      pkv_event_publisher_stats_init_sized(&st, sizeof st);
      CHECK_BENIGN(f, pkv_event_publisher_get_stats(pub, &st));
      std::this_thread::yield();
    }
  });
#ifdef PKV_TEST_ZMQ
  std::thread replayer([&] {  // asks for replays while batches are buffered
    char ep[256];
    uint64_t len = 0;
    if (pkv_event_publisher_endpoint(pub, 1, ep, sizeof ep, &len) != PKV_OK) return;
    void* ctx = zmq_ctx_new();
    void* d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, timeout = 200;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_connect(d, ep);
    while (!stop_pub) {
      const char start[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      zmq_send(d, "", 0, ZMQ_SNDMORE);
      zmq_send(d, start, 8, 0);
      for (;;) {  // until the end marker (an empty payload) or a timeout
        char buf[1 << 16];
        int more = 1, frames = 0, last = -1;
        size_t ms = sizeof more;
        while (more) {
          last = zmq_recv(d, buf, sizeof buf, 0);
          if (last < 0) break;
          ++frames;
          zmq_getsockopt(d, ZMQ_RCVMORE, &more, &ms);
        }
        if (last <= 0) break;
      }
    }
    zmq_close(d);
    zmq_ctx_term(ctx);
  });
#endif
  auto user = [&](int id) {
    std::mt19937 rng(50 + id);
    for (int it = 0; it < 300 * kScale; ++it) {
      pkv_seq_id s = 0;
      const pkv_status st = admit_computed(pool, rng() % 8, 9 + rng() % 8, int32_t(id), false, &s);
      if (st != PKV_OK) {
        f.check(st, "admit_computed");
        continue;
      }
      if (rng() % 16 == 0) CHECK_BENIGN(f, pkv_pool_reset_prefix_cache(pool));
      CHECK_BENIGN(f, pkv_seq_free(pool, s));
    }
  };
  std::vector<std::thread> ws;
  for (int i = 0; i < 2; ++i) ws.emplace_back(user, i);
  for (auto& w : ws) w.join();
  // The publisher keeps the pool alive: destroying the pool while it
  // publishes is defined.
  pkv_pool_destroy(pool);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop_pub = true;
  publisher.join();
#ifdef PKV_TEST_ZMQ
  replayer.join();
#endif
  pkv_event_publisher_destroy(pub);
  EXPECT_EQ(f.n.load(), 0) << f.first;
}

// ---------------------------------------------------- kernels vs. frees

// A plan's kernels run again and again while another thread frees the
// plan's sequence and writes new sequences into the blocks it let go:
// every call either runs or fails with PKV_E_INVALID_STATE.
TEST(Races, KernelsOnAPlanWhoseSequenceAnotherThreadFrees) {
  Work work;
  for (int round = 0; round < 4 * kScale; ++round) {
    pkv_pool_options o = storage_options(24);
    pkv_pool* pool = nullptr;
    ASSERT_EQ(pkv_pool_create(&o, &pool), PKV_OK);
    pkv_seq_id s = 0;
    ASSERT_EQ(admit_computed(pool, 1, 40, 3, true, &s), PKV_OK) << pkv_last_error_message();
    const int32_t nt = 5;
    ASSERT_EQ(pkv_seq_append(pool, s, &nt, 1, 0), PKV_OK);
    const uint32_t one = 1;
    pkv_batch* b = nullptr;
    ASSERT_EQ(pkv_batch_prepare(pool, &s, &one, 1, nullptr, &b), PKV_OK);
    std::atomic<int> runs{0};
    std::atomic<pkv_status> last{PKV_OK};
    std::thread runner([&] {
      std::vector<float> q(kDim, 0.5f), out(kDim);
      pkv_tensor qt = rows(q.data(), 1), ot = rows(out.data(), 1);
      for (;;) {
        last = (runs % 2) ? pkv_attention_forward(b, 0, &qt, &ot, nullptr, nullptr, nullptr)
                          : pkv_cache_write(b, 0, &qt, &qt, nullptr);
        if (last != PKV_OK) break;
        ++runs;
      }
    });
    while (runs < 2 && last == PKV_OK) std::this_thread::yield();
    EXPECT_EQ(pkv_seq_free(pool, s), PKV_OK);
    Failures f;
    for (int i = 0; i < 4; ++i) {  // new content in the freed blocks
      pkv_seq_id e = 0;
      const pkv_status st = admit_computed(pool, uint32_t(10 + i), 30, 4, true, &e);
      f.check(st, "admit_computed");
      if (st == PKV_OK) pkv_seq_free(pool, e);
    }
    runner.join();
    EXPECT_EQ(last, PKV_E_INVALID_STATE) << pkv_last_error_message();
    EXPECT_EQ(f.n.load(), 0) << f.first;
    if (round % 2) {  // and once the pool is gone too
      pkv_pool_destroy(pool);
      pkv_batch_destroy(b);
    } else {
      pkv_batch_destroy(b);
      EXPECT_EQ(pkv_pool_validate(pool), PKV_OK) << pkv_last_error_message();
      pkv_pool_destroy(pool);
    }
  }
}

}  // namespace
