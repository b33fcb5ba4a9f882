// Faults: real allocation failures (no injection hooks), exhaustion in the
// middle of a step, and preempt-and-resume cycles that keep their prefix-cache
// hits.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"
#include "sanitizers.h"

namespace {

std::vector<int32_t> tokens_of(int family, size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((family * 7919 + i * 31) % 50000);
  return t;
}

std::vector<int32_t> table_of(const pkv_pool* p, pkv_seq_id s) {
  uint64_t n = 0;
  pkv_seq_get_block_table(p, s, nullptr, 0, &n);
  std::vector<int32_t> t(n);
  if (n) EXPECT_EQ(pkv_seq_get_block_table(p, s, t.data(), n, &n), PKV_OK);
  return t;
}

std::vector<std::string> hashes_of(const pkv_pool* p, pkv_seq_id s) {
  uint64_t n = 0;
  pkv_seq_get_block_hashes(p, s, nullptr, 0, &n);
  std::vector<pkv_block_hash> h(n);
  if (n) EXPECT_EQ(pkv_seq_get_block_hashes(p, s, h.data(), n, &n), PKV_OK);
  std::vector<std::string> out;
  for (const auto& x : h)
    out.emplace_back(reinterpret_cast<const char*>(x.bytes), PKV_HASH_MAX_BYTES);
  return out;
}

pkv_pool_stats stats_of(const pkv_pool* p) {
  pkv_pool_stats s;
  pkv_pool_stats_init(&s);
  EXPECT_EQ(pkv_pool_get_stats(p, &s), PKV_OK);
  return s;
}

bool same_stats(const pkv_pool_stats& a, const pkv_pool_stats& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

uint64_t drain(pkv_pool* p) {
  pkv_event ev[64];
  uint64_t total = 0, n = 0;
  do {
    EXPECT_EQ(pkv_pool_drain_events(p, ev, 64, &n), PKV_OK);
    total += n;
  } while (n == 64);
  return total;
}

// ------------------------------------------------------------ allocation failure

// A memory budget far beyond the machine: the pool derives 131072 blocks of
// 256 MiB each (32 TiB) and the arena allocation fails.
TEST(Faults, PoolMemoryBudgetBeyondMemoryIsOutOfMemory) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 64;
  o.num_blocks = 0;
  o.memory_budget_bytes = uint64_t(1) << 45;
  o.num_layers = 64;
  o.num_kv_heads = 64;
  o.head_dim = 256;
  o.dtype = PKV_DTYPE_F16;
  o.num_threads = 1;
  pkv_pool* sentinel = reinterpret_cast<pkv_pool*>(&o);
  pkv_pool* p = sentinel;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_E_OUT_OF_MEMORY);
  EXPECT_EQ(p, sentinel) << "a failed create wrote its out-parameter";
  EXPECT_NE(std::string(pkv_last_error_message()).find("memory"), std::string::npos)
      << pkv_last_error_message();
  // The same options with an affordable budget work: nothing was left broken.
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 64;
  o.memory_budget_bytes = 1 << 20;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
  pkv_pool_destroy(p);
}

// 4096 blocks of 16 GiB (64 TiB): the bookkeeping is small, the arena fails.
TEST(Faults, PoolExplicitBlocksBeyondMemoryIsOutOfMemory) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.num_blocks = 4096;
  o.num_layers = 256;
  o.num_kv_heads = 256;
  o.head_dim = 256;
  o.block_size = 256;
  o.num_threads = 1;
  pkv_pool* p = nullptr;
  const pkv_status s = pkv_pool_create(&o, &p);
  EXPECT_EQ(s, PKV_E_OUT_OF_MEMORY) << pkv_last_error_message();
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(pkv_last_error_message()[0], '\0');
}

#ifndef PKV_SANITIZED
// Runs body in a child process whose address space is capped a little above
// what it uses now, so that the next large allocation really fails. The child
// reports through its exit status. (Sanitizers reserve terabytes of shadow
// address space, so this runs in the plain build only.)
template <class F>
void in_capped_child(size_t headroom, F&& body) {
  std::fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string err = body([headroom] {
      long pages = 0;
      FILE* f = std::fopen("/proc/self/statm", "r");
      if (!f || std::fscanf(f, "%ld", &pages) != 1) _exit(3);
      std::fclose(f);
      rlimit r;
      r.rlim_cur = r.rlim_max = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + headroom;
      if (setrlimit(RLIMIT_AS, &r) != 0) _exit(4);
    });
    if (!err.empty()) {
      std::fprintf(stderr, "child: %s\n", err.c_str());
      _exit(1);
    }
    _exit(0);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st)) << "the child crashed (signal " << WTERMSIG(st) << ")";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "see the child's message above";
}

// Pool creation whose bookkeeping (per-block arrays for 2^31 - 4 blocks)
// cannot be allocated: PKV_E_OUT_OF_MEMORY, and every partial allocation is
// given back (heap in use before == after).
TEST(Faults, PoolCreateBookkeepingAllocationFailsCleanly) {
  in_capped_child(size_t(64) << 20, [](auto cap) -> std::string {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = 16;
    o.num_blocks = (uint64_t(1) << 31) - 4;
    // Warm up before measuring: one-time global initialisation (the hash
    // libraries' tables, the thread-local message) is not a leak.
    {
      pkv_pool_options small = o;
      small.num_blocks = 64;
      pkv_pool* warm = nullptr;
      if (pkv_pool_create(&small, &warm) != PKV_OK) return "warm-up pool failed";
      pkv_pool_destroy(warm);
    }
    pkv_pool_validate(nullptr);
    cap();
    const size_t before = mallinfo2().uordblks;
    pkv_pool* p = nullptr;
    const pkv_status s = pkv_pool_create(&o, &p);
    if (s != PKV_E_OUT_OF_MEMORY)
      return "status " + std::to_string(s) + ": " + pkv_last_error_message();
    if (p) return "out-parameter written";
    const size_t after = mallinfo2().uordblks;
    // The error message lives in a thread-local string: allow its bytes.
    if (after > before + 256) return "leaked " + std::to_string(after - before) + " heap bytes";
    o.num_blocks = 64;  // a small pool still works under the cap
    if (pkv_pool_create(&o, &p) != PKV_OK) return "small pool failed";
    pkv_pool_destroy(p);
    return "";
  });
}

// A step plan too big for the remaining address space fails with
// PKV_E_OUT_OF_MEMORY and changes nothing; a smaller plan then succeeds.
TEST(Faults, BatchPrepareAllocationFailsCleanly) {
  in_capped_child(size_t(8) << 20, [](auto cap) -> std::string {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = 16;
    o.num_blocks = (uint64_t(1) << 17) + 16;
    o.hash_algo = PKV_HASH_XXH3_128;
    pkv_pool* p = nullptr;
    if (pkv_pool_create(&o, &p) != PKV_OK) return "create";
    // 8 sequences of ~2^18 tokens: a plan over all of them as prefill needs
    // 8 * 2^18 * 8 bytes of slot mapping (16 MiB) plus page tables.
    std::vector<pkv_seq_id> ids(8);
    std::vector<uint32_t> qc(8, (1u << 18) - 3);
    std::vector<int32_t> toks = tokens_of(1, (1 << 18) - 3);
    for (auto& id : ids) {
      if (pkv_seq_create(p, nullptr, &id) != PKV_OK) return "seq_create";
      if (pkv_seq_append(p, id, toks.data(), toks.size(), 0) != PKV_OK) return "append";
    }
    {  // computed once, so that the decode plan below has written context
      pkv_batch* first = nullptr;
      if (pkv_batch_prepare(p, ids.data(), qc.data(), 8, nullptr, &first) != PKV_OK)
        return "first step";
      if (pkv_batch_commit(first) != PKV_OK) return "commit";
      pkv_batch_destroy(first);
    }
    pkv_seq_id child;
    if (pkv_seq_fork(p, ids[0], &child) != PKV_OK) return "fork";
    int32_t t = 5;
    if (pkv_seq_append(p, child, &t, 1, 0) != PKV_OK) return "append child";
    const pkv_pool_stats before = stats_of(p);
    std::vector<int32_t> table_before = table_of(p, ids[0]);
    pkv_pool_validate(nullptr);
    cap();
    pkv_batch* b = nullptr;
    const pkv_status s = pkv_batch_prepare(p, ids.data(), qc.data(), 8, nullptr, &b);
    if (s != PKV_E_OUT_OF_MEMORY)
      return "prepare returned " + std::to_string(s) + ": " + pkv_last_error_message();
    if (b) return "out-parameter written";
    if (pkv_pool_validate(p) != PKV_OK) return pkv_last_error_message();
    if (!same_stats(before, stats_of(p))) return "stats changed";
    if (table_of(p, ids[0]) != table_before) return "table changed";
    // A decode plan fits.
    std::vector<uint32_t> one(8, 1);
    if (pkv_batch_prepare(p, ids.data(), one.data(), 8, nullptr, &b) != PKV_OK)
      return std::string("decode plan: ") + pkv_last_error_message();
    pkv_batch_destroy(b);
    pkv_pool_destroy(p);
    return "";
  });
}
#endif  // PKV_SANITIZED

// ------------------------------------------------------------ exhaustion mid-step

struct Snapshot {
  pkv_pool_stats stats;
  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<std::string>> hashes;
  std::vector<uint64_t> tokens;
};

Snapshot snapshot(const pkv_pool* p, const std::vector<pkv_seq_id>& ids) {
  Snapshot s;
  s.stats = stats_of(p);
  for (pkv_seq_id id : ids) {
    s.tables.push_back(table_of(p, id));
    s.hashes.push_back(hashes_of(p, id));
    pkv_seq_info i;
    pkv_seq_info_init(&i);
    EXPECT_EQ(pkv_seq_get_info(p, id, &i), PKV_OK);
    s.tokens.push_back(i.num_tokens);
  }
  return s;
}

void expect_same(const Snapshot& a, const Snapshot& b) {
  EXPECT_TRUE(same_stats(a.stats, b.stats)) << "stats changed";
  EXPECT_EQ(a.tables, b.tables);
  EXPECT_EQ(a.hashes, b.hashes);
  EXPECT_EQ(a.tokens, b.tokens);
}

// A decode step over many sequences where the pool runs dry half-way: every
// append that fits succeeds, the first that does not returns
// PKV_E_OUT_OF_BLOCKS with the pool exactly as before that call (no event, no
// table change, no stat change), blocks_needed predicted it, and after
// preempting a victim the retry succeeds.
TEST(Faults, ExhaustionMidStepChangesNothing) {
  for (uint32_t lookahead : {0u, 3u}) {
    for (int caching = 0; caching < 2; ++caching) {
      SCOPED_TRACE("lookahead " + std::to_string(lookahead) + " caching " +
                   std::to_string(caching));
      pkv_pool_options o;
      pkv_pool_options_init(&o);
      o.block_size = 4;
      o.num_blocks = 41;
      o.enable_prefix_caching = uint32_t(caching);
      o.enable_events = 1;
      pkv_pool* p = nullptr;
      ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK);
      std::vector<pkv_seq_id> ids(10);
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(pkv_seq_create(p, nullptr, &ids[i]), PKV_OK);
        auto t = tokens_of(int(i), 7);
        ASSERT_EQ(pkv_seq_append(p, ids[i], t.data(), t.size(), 0), PKV_OK);
      }
      // Forks share partial blocks: their next token needs a copy-on-write block.
      pkv_seq_id f1, f2;
      ASSERT_EQ(pkv_seq_fork(p, ids[0], &f1), PKV_OK);
      ASSERT_EQ(pkv_seq_fork(p, ids[1], &f2), PKV_OK);
      ids.push_back(f1);
      ids.push_back(f2);
      int failures = 0, steps = 0;
      std::vector<bool> alive(ids.size(), true);
      while (failures < 6 && steps < 200) {
        ++steps;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (!alive[i]) continue;
          int32_t tok = int32_t(1000 + steps * 13 + i);
          uint64_t need = 0;
          ASSERT_EQ(pkv_seq_blocks_needed(p, ids[i], 1, lookahead, &need), PKV_OK);
          const pkv_pool_stats st = stats_of(p);
          drain(p);
          std::vector<pkv_seq_id> live;
          for (size_t j = 0; j < ids.size(); ++j)
            if (alive[j]) live.push_back(ids[j]);
          const Snapshot before = snapshot(p, live);
          const pkv_status s = pkv_seq_append(p, ids[i], &tok, 1, lookahead);
          if (need > st.num_free_blocks) {
            ASSERT_EQ(s, PKV_E_OUT_OF_BLOCKS) << "need " << need << " free " << st.num_free_blocks;
            ASSERT_NE(pkv_last_error_message()[0], '\0');
            ++failures;
            expect_same(before, snapshot(p, live));
            EXPECT_EQ(drain(p), 0u) << "a failed append emitted events";
            ASSERT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
            // Preempt the longest other sequence, then the retry fits.
            size_t victim = ids.size();
            uint64_t longest = 0;
            for (size_t j = 0; j < ids.size(); ++j) {
              if (j == i || !alive[j]) continue;
              pkv_seq_info info;
              pkv_seq_info_init(&info);
              ASSERT_EQ(pkv_seq_get_info(p, ids[j], &info), PKV_OK);
              if (info.num_blocks >= longest) {
                longest = info.num_blocks;
                victim = j;
              }
            }
            ASSERT_LT(victim, ids.size());
            ASSERT_EQ(pkv_seq_free(p, ids[victim]), PKV_OK);
            alive[victim] = false;
            ASSERT_EQ(pkv_seq_blocks_needed(p, ids[i], 1, lookahead, &need), PKV_OK);
            if (need <= stats_of(p).num_free_blocks)
              ASSERT_EQ(pkv_seq_append(p, ids[i], &tok, 1, lookahead), PKV_OK);
          } else {
            ASSERT_EQ(s, PKV_OK) << pkv_last_error_message();
          }
          ASSERT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
        }
        // Revive preempted slots with fresh sequences so the pool stays full.
        for (size_t i = 0; i < ids.size(); ++i)
          if (!alive[i] && stats_of(p).num_free_blocks > 4) {
            ASSERT_EQ(pkv_seq_create(p, nullptr, &ids[i]), PKV_OK);
            auto t = tokens_of(int(i + 100 * steps), 5);
            ASSERT_EQ(pkv_seq_append(p, ids[i], t.data(), t.size(), 0), PKV_OK);
            alive[i] = true;
          }
      }
      EXPECT_GE(failures, 6) << "the pool never ran dry";
      pkv_pool_destroy(p);
    }
  }
}

// A whole-prompt append that does not fit after a prefix hit: nothing
// changes, and the hit blocks stay attached to the sequence.
TEST(Faults, ExhaustionAfterPrefixHitKeepsTheHit) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 8;
  o.num_blocks = 9;
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK);
  auto prompt = tokens_of(3, 40);
  pkv_seq_id a, b;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, a, prompt.data(), 33, 0), PKV_OK);  // 5 blocks, 4 full
  pkv_batch* step = nullptr;  // computed: hits need written blocks
  const uint32_t q33 = 33;
  ASSERT_EQ(pkv_batch_prepare(p, &a, &q33, 1, nullptr, &step), PKV_OK);
  ASSERT_EQ(pkv_batch_commit(step), PKV_OK);
  pkv_batch_destroy(step);
  ASSERT_EQ(pkv_seq_create(p, nullptr, &b), PKV_OK);
  uint64_t cached = 0;
  ASSERT_EQ(pkv_seq_match_prefix(p, b, prompt.data(), 40, &cached), PKV_OK);
  EXPECT_EQ(cached, 32u);
  const Snapshot before = snapshot(p, {a, b});
  // 3 free blocks; 48 more tokens need 6.
  auto more = tokens_of(4, 48);
  EXPECT_EQ(pkv_seq_append(p, b, more.data(), more.size(), 0), PKV_E_OUT_OF_BLOCKS);
  expect_same(before, snapshot(p, {a, b}));
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
  EXPECT_EQ(pkv_seq_append(p, b, more.data(), 8, 0), PKV_OK);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
  pkv_pool_destroy(p);
}

// ------------------------------------------------------------ preempt and resume

// A long request is preempted (freed) whenever a burst of other work needs
// its blocks, then resumed by matching its tokens again. Its full blocks go
// back to the free queue's tail with their hashes, last block first, so the
// burst evicts them from the end: the resumed request finds exactly the
// leading blocks the burst did not take, and finds all of them when the burst
// fit in the blocks that were never cached.
TEST(Faults, PreemptAndResumeKeepsPrefixHits) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 16;
  o.num_blocks = 65;  // 64 usable
  o.enable_events = 1;
  o.max_events = 1 << 16;
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK);
  std::mt19937 rng(7);
  auto req = tokens_of(42, 16 * 40 + 5);  // 40 full blocks + 5
  // Tokens count as computed (and their blocks stay cached past a free)
  // once a plan covering them was prepared: one step per append.
  auto compute = [&](pkv_seq_id s, uint64_t q) {
    pkv_batch* b = nullptr;
    const uint32_t q32 = uint32_t(q);
    ASSERT_EQ(pkv_batch_prepare(p, &s, &q32, 1, nullptr, &b), PKV_OK);
    pkv_batch_destroy(b);
  };
  pkv_seq_id a;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, a, req.data(), 16 * 24 + 3, 0), PKV_OK);
  compute(a, 16 * 24 + 3);
  uint64_t done = 16 * 24 + 3;
  int full_hits = 0, partial_hits = 0;
  for (int cycle = 0; cycle < 30; ++cycle) {
    // Decode a few tokens of the request.
    const uint64_t step = std::min<uint64_t>(1 + rng() % 20, req.size() - done);
    ASSERT_EQ(pkv_seq_append(p, a, req.data() + done, step, 0), PKV_OK);
    compute(a, step);
    done += step;
    const std::vector<int32_t> old_table = table_of(p, a);
    const std::vector<std::string> old_hashes = hashes_of(p, a);
    const uint64_t full = done / 16;
    ASSERT_EQ(old_hashes.size(), full);
    // Preempt.
    ASSERT_EQ(pkv_seq_free(p, a), PKV_OK);
    // A burst of other work; sometimes it fits in the free blocks that queue
    // ahead of the request's, sometimes it reaches into the request's.
    const uint64_t fit = stats_of(p).num_free_blocks - full;
    const uint64_t burst_blocks = cycle % 3 == 0 ? fit : fit + 1 + rng() % (full / 2 + 1);
    pkv_seq_id burst;
    ASSERT_EQ(pkv_seq_create(p, nullptr, &burst), PKV_OK);
    auto other = tokens_of(1000 + cycle, burst_blocks * 16);
    ASSERT_EQ(pkv_seq_append(p, burst, other.data(), other.size(), 0), PKV_OK)
        << pkv_last_error_message();
    const std::vector<int32_t> burst_table = table_of(p, burst);
    std::set<int32_t> taken(burst_table.begin(), burst_table.end());
    // Which of the request's full blocks did the burst take? They must be a
    // suffix (evicted tail first).
    uint64_t survive = 0;
    while (survive < full && !taken.count(old_table[survive])) ++survive;
    for (uint64_t j = survive; j < full; ++j)
      EXPECT_TRUE(taken.count(old_table[j])) << "block " << j << " evicted out of LRU order";
    ASSERT_EQ(pkv_seq_free(p, burst), PKV_OK);
    // Resume.
    ASSERT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
    uint64_t cached = 0;
    ASSERT_EQ(pkv_seq_match_prefix(p, a, req.data(), done, &cached), PKV_OK);
    const uint64_t expect_blocks = std::min<uint64_t>(survive, (done - 1) / 16);
    EXPECT_EQ(cached, expect_blocks * 16) << "cycle " << cycle;
    const std::vector<int32_t> new_table = table_of(p, a);
    for (uint64_t j = 0; j < new_table.size(); ++j) EXPECT_EQ(new_table[j], old_table[j]);
    ASSERT_EQ(pkv_seq_append(p, a, req.data() + cached, done - cached, 0), PKV_OK);
    compute(a, done - cached);
    EXPECT_EQ(hashes_of(p, a), old_hashes) << "the recomputed blocks hash differently";
    if (survive >= full)
      ++full_hits;
    else
      ++partial_hits;
    ASSERT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
    if (done == req.size()) {
      done = 16 * 24 + 3;
      ASSERT_EQ(pkv_seq_truncate(p, a, done), PKV_OK);
    }
  }
  EXPECT_GE(full_hits, 5);
  EXPECT_GE(partial_hits, 5);
  const pkv_pool_stats st = stats_of(p);
  EXPECT_GT(st.prefix_hit_tokens, 0u);
  ASSERT_EQ(pkv_seq_free(p, a), PKV_OK);
  EXPECT_EQ(stats_of(p).num_used_blocks, 0u);
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
  pkv_pool_destroy(p);
}

}  // namespace
