// Block manager throughput, one thread. Rows:
//   alloc_free/pool       BlockPool allocate + release pairs (free queue, ref
//                         counts, hash check): items/s = pairs/s
//   alloc_free/stack      baseline: a bare std::vector free stack, the cheapest
//                         possible allocator, measured in the same run
//   decode_step/<algo>    pkv_seq_append of 1 token to each of 1024 decode
//                         sequences through the C ABI (lock, id lookup, block
//                         allocation every 16 tokens, hashing of the block that
//                         fills); time per step; 1/16 of appends fill a block
//   match_prefix/<algo>   pkv_seq_create + pkv_seq_match_prefix + pkv_seq_free
//                         on a warm cache for an 8k-token prompt (511 blocks
//                         hit); tokens/s
//   hash_only/<algo>      pkv_hash_prefix of the same prompt: the hashing
//                         ceiling match_prefix cannot beat
//   prefix_cache/random   PrefixCache::find of each of 20,000 mapped 32-byte
//                         digests (random): lookups/s; the table's keyed hash
//                         plus probing
//   prefix_cache/aimed    the same with digests whose first 8 bytes share
//                         their low 20 bits (what an unkeyed table probed on:
//                         hash flooding, issue 14); should match random
//   decode_step_plan/*    the full decode step of issue 16: 1 token appended to
//                         each of 1024 sequences of ~1000 tokens (one call per
//                         sequence, or pkv_seq_append_batch), then the step
//                         plan built, committed and destroyed; *_only = the
//                         batched appends alone (plan = the difference);
//                         persistent_table = batched appends and a
//                         PKV_PREPARE_PERSISTENT_TABLE plan; prepare_decode
//                         = both in one pkv_batch_prepare_decode; *_xxh3 = the
//                         same with XXH3-128 block hashes (others SHA-256);
//                         faults_per_step = minor page faults in the loop
// Counters: vs_target = measured / goal (>= 1 meets it: 20M pairs/s; 50 us
// per 1024-sequence step; 30 us per decode_step_plan step); vs_hash =
// match_prefix tokens/s over hash_only.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "block_pool.h"
#include "pagedkv/pagedkv.h"
#include "prefix_cache.h"

namespace {

constexpr uint32_t kBlockSize = 16;

void BM_AllocFreePool(benchmark::State& state) {
  const int32_t batch = int32_t(state.range(0));
  pagedkv::EventQueue events(false, 0);
  pagedkv::BlockPool pool(1 << 20, true, &events);
  std::vector<int32_t> ids(batch);
  for (auto _ : state) {
    for (int32_t i = 0; i < batch; ++i) ids[i] = pool.allocate();
    for (int32_t i = batch; i-- > 0;) pool.release(ids[i]);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetItemsProcessed(state.iterations() * batch);
  const double pairs_per_s = double(state.iterations()) * batch;
  state.counters["vs_target"] = benchmark::Counter(pairs_per_s / 20e6, benchmark::Counter::kIsRate);
}

void BM_AllocFreeStack(benchmark::State& state) {
  const int32_t batch = int32_t(state.range(0));
  std::vector<int32_t> free_ids(1 << 20);
  for (size_t i = 0; i < free_ids.size(); ++i) free_ids[i] = int32_t(free_ids.size() - i);
  std::vector<int32_t> ids(batch);
  for (auto _ : state) {
    for (int32_t i = 0; i < batch; ++i) {
      ids[i] = free_ids.back();
      free_ids.pop_back();
    }
    for (int32_t i = batch; i-- > 0;) free_ids.push_back(ids[i]);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

pkv_pool* make_pool(uint32_t algo, uint64_t num_blocks) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBlockSize;
  o.num_blocks = num_blocks;
  o.hash_algo = algo;
  pkv_pool* pool = nullptr;
  if (pkv_pool_create(&o, &pool) != PKV_OK) return nullptr;
  return pool;
}

std::vector<int32_t> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, 152063);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Minor page faults of this process so far.
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

constexpr int kSeqs = 1024;
constexpr int kPlanSteps = 1024;  // decode_step_plan's iterations
constexpr int kSteps = 4096;

// Per-step counters of the decode rows: us_per_step and vs_target (goal_us
// per step).
void step_counters(benchmark::State& state, double goal_us) {
  state.SetItemsProcessed(state.iterations() * kSeqs);
  state.counters["us_per_step"] = benchmark::Counter(
      double(state.iterations()) * 1e-6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["vs_target"] =
      benchmark::Counter(double(state.iterations()) * goal_us * 1e-6, benchmark::Counter::kIsRate);
}

void BM_DecodeStep(benchmark::State& state) {
  const uint32_t algo = uint32_t(state.range(0));
  // Room for 1024 prompts of 500 tokens plus every step's token.
  const uint64_t blocks = uint64_t(kSeqs) * ((500 + kSteps) / kBlockSize + 2) + 2;
  pkv_pool* pool = make_pool(algo, blocks);
  if (!pool) {
    state.SkipWithError(pkv_last_error_message());
    return;
  }
  std::vector<pkv_seq_id> seqs(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    pkv_seq_create(pool, nullptr, &seqs[i]);
    auto prompt = random_tokens(500 + i % 16, uint32_t(i));  // fill points staggered
    pkv_seq_append(pool, seqs[i], prompt.data(), prompt.size(), 0);
  }
  // Sampled tokens come from a cheap hash of (step, sequence): no timer
  // pauses (each costs syscalls) and no RNG inside the timed loop.
  uint32_t step = 0;
  for (auto _ : state) {
    ++step;
    for (int i = 0; i < kSeqs; ++i) {
      const int32_t tok = int32_t((step * 2654435761u + uint32_t(i) * 40503u) % 152064u);
      if (pkv_seq_append(pool, seqs[i], &tok, 1, 0) != PKV_OK) {
        state.SkipWithError(pkv_last_error_message());
        break;
      }
    }
  }
  step_counters(state, 50);
  pkv_pool_destroy(pool);
}

// A full C decode step as an engine runs it on a manager-only pool: one
// token appended to each of 1024 sequences of ~1000 tokens, the step plan
// built for them (1 query each, ~64k pages), committed and destroyed.
// Arg 0: one pkv_seq_append per sequence; 1: pkv_seq_append_batch;
// 2: pkv_seq_append_batch and a persistent-table plan (only changed rows
// rewritten); 3: the batched appends alone (the plan's share is the
// difference); 4: pkv_batch_prepare_decode (appends and persistent-table
// plan in one call; from the second step on, the steady path of
// step_plan_steady.cpp); 5: the same after pkv_seq_reserve of each
// sequence's final length at admission (its vectors never move).
void BM_DecodeStepPlan(benchmark::State& state) {
  const int mode = int(state.range(0));
  const uint32_t algo = state.range(1) ? uint32_t(state.range(1)) : PKV_HASH_SHA256_CBOR;
  constexpr int kCtx = 1000;
  const uint64_t blocks = uint64_t(kSeqs) * ((kCtx + 16 + kSteps) / kBlockSize + 2) + 2;
  pkv_pool* pool = make_pool(algo, blocks);
  if (!pool) {
    state.SkipWithError(pkv_last_error_message());
    return;
  }
  std::vector<pkv_seq_id> seqs(kSeqs);
  std::vector<uint32_t> ones(kSeqs, 1), prompts(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    pkv_seq_create(pool, nullptr, &seqs[i]);
    auto prompt = random_tokens(kCtx + i % 16, uint32_t(i));  // fill points staggered
    pkv_seq_append(pool, seqs[i], prompt.data(), prompt.size(), 0);
    prompts[i] = uint32_t(prompt.size());
    // Mode 5: the engine reserved prompt + max_tokens at admission.
    if (mode == 5 && pkv_seq_reserve(pool, seqs[i], prompt.size() + kPlanSteps + 16) != PKV_OK) {
      state.SkipWithError(pkv_last_error_message());
      return;
    }
  }
  pkv_batch* b = nullptr;  // the prompts' step: later plans' context is written
  if (pkv_batch_prepare(pool, seqs.data(), prompts.data(), kSeqs, nullptr, &b) != PKV_OK ||
      pkv_batch_commit(b) != PKV_OK) {
    state.SkipWithError(pkv_last_error_message());
    return;
  }
  pkv_batch_destroy(b);
  std::vector<int32_t> toks(kSeqs);
  uint32_t step = 0;
  const long faults0 = minor_faults();
  for (auto _ : state) {
    ++step;
    for (int i = 0; i < kSeqs; ++i)
      toks[i] = int32_t((step * 2654435761u + uint32_t(i) * 40503u) % 152064u);
    pkv_status st = PKV_OK;
    if (mode == 4 || mode == 5) {
      st = pkv_batch_prepare_decode(pool, seqs.data(), toks.data(), kSeqs,
                                    PKV_PREPARE_PERSISTENT_TABLE, nullptr, &b);
      if (st == PKV_OK) {
        st = pkv_batch_commit(b);
        pkv_batch_destroy(b);
      }
    } else if (mode == 0) {
      for (int i = 0; i < kSeqs && st == PKV_OK; ++i)
        st = pkv_seq_append(pool, seqs[i], &toks[i], 1, 0);
    } else {
      st = pkv_seq_append_batch(pool, seqs.data(), toks.data(), kSeqs);
    }
    if (st == PKV_OK && mode < 3)
      st = pkv_batch_prepare_ex(pool, seqs.data(), ones.data(), kSeqs,
                                mode == 2 ? PKV_PREPARE_PERSISTENT_TABLE : 0, nullptr, &b);
    if (st == PKV_OK && mode < 3) {
      st = pkv_batch_commit(b);
      pkv_batch_destroy(b);
    }
    if (st != PKV_OK) {
      state.SkipWithError(pkv_last_error_message());
      break;
    }
  }
  // Page faults inside the timed loop (fresh heap pages: growing vectors,
  // memory the allocator gave back and takes again), per step.
  state.counters["faults_per_step"] =
      double(minor_faults() - faults0) / double(std::max<int64_t>(state.iterations(), 1));
  step_counters(state, 30);
  pkv_pool_destroy(pool);
}

constexpr size_t kPrompt = 8192;

void BM_MatchPrefix(benchmark::State& state) {
  const uint32_t algo = uint32_t(state.range(0));
  pkv_pool* pool = make_pool(algo, 2048);
  auto prompt = random_tokens(kPrompt, 7);
  pkv_seq_id warm;
  pkv_seq_create(pool, nullptr, &warm);
  pkv_seq_append(pool, warm, prompt.data(), prompt.size(), 0);
  // The warm prompt's step: only written blocks are hit (DESIGN.md section 9).
  const uint32_t q = uint32_t(prompt.size());
  pkv_batch* b = nullptr;
  if (pkv_batch_prepare(pool, &warm, &q, 1, nullptr, &b) != PKV_OK ||
      pkv_batch_commit(b) != PKV_OK) {
    state.SkipWithError(pkv_last_error_message());
    return;
  }
  pkv_batch_destroy(b);
  uint64_t cached = 0;
  for (auto _ : state) {
    pkv_seq_id s;
    pkv_seq_create(pool, nullptr, &s);
    pkv_seq_match_prefix(pool, s, prompt.data(), prompt.size(), &cached);
    pkv_seq_free(pool, s);
  }
  if (cached != kPrompt - kBlockSize) state.SkipWithError("the warm prompt did not hit");
  state.SetItemsProcessed(state.iterations() * int64_t(kPrompt));
  pkv_pool_destroy(pool);
}

void BM_HashOnly(benchmark::State& state) {
  pkv_hash_options ho;
  pkv_hash_options_init(&ho);
  ho.algo = uint32_t(state.range(0));
  ho.block_size = kBlockSize;
  auto prompt = random_tokens(kPrompt, 7);
  std::vector<pkv_block_hash> out(kPrompt / kBlockSize);
  uint64_t n = 0;
  for (auto _ : state) {
    pkv_hash_prefix(&ho, prompt.data(), kPrompt - 1, out.data(), out.size(), &n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * int64_t(kPrompt));
}

void BM_PrefixCacheFind(benchmark::State& state) {
  const bool aimed = state.range(0) != 0;
  const int32_t n = 20000;
  std::vector<pagedkv::BlockHash> hashes(n);
  std::mt19937_64 rng(3);
  for (auto& h : hashes) {
    h.size = 32;
    for (size_t i = 0; i < 32; i += 8) {
      const uint64_t r = rng();
      std::memcpy(h.bytes.data() + i, &r, 8);
    }
    if (aimed) {  // low 20 bits of the first 8 bytes fixed
      h.bytes[0] = 0xab;
      h.bytes[1] = 0xcd;
      h.bytes[2] = uint8_t((h.bytes[2] & 0xf0) | 0x7);
    }
  }
  pagedkv::PrefixCache cache(hashes.data(), n);
  for (int32_t b = 0; b < n; ++b) cache.insert(b);
  int64_t found = 0;
  for (auto _ : state)
    for (int32_t b = 0; b < n; ++b) found += cache.find(hashes[b]) == b;
  if (found != int64_t(state.iterations()) * n)
    state.SkipWithError("a mapped digest was not found");
  state.SetItemsProcessed(state.iterations() * n);
}

BENCHMARK(BM_AllocFreePool)->Name("alloc_free/pool")->Arg(1)->Arg(64);
BENCHMARK(BM_AllocFreeStack)->Name("alloc_free/stack")->Arg(1)->Arg(64);
BENCHMARK(BM_DecodeStep)
    ->Name("decode_step/sha256_cbor")
    ->Arg(PKV_HASH_SHA256_CBOR)
    ->Iterations(kSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStep)
    ->Name("decode_step/xxh3_128")
    ->Arg(PKV_HASH_XXH3_128)
    ->Iterations(kSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/append_each")
    ->Args({0, 0})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/append_batch")
    ->Args({1, 0})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/persistent_table")
    ->Args({2, 0})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/prepare_decode")
    ->Args({4, 0})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/append_batch_only")
    ->Args({3, 0})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
// The same two rows with XXH3-128 block hashes (trusted tenants: no
// SHA-256 of the 64 blocks that fill per step).
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/persistent_table_xxh3")
    ->Args({2, PKV_HASH_XXH3_128})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/prepare_decode_xxh3")
    ->Args({4, PKV_HASH_XXH3_128})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/prepare_decode_reserved")
    ->Args({5, 0})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/prepare_decode_reserved_xxh3")
    ->Args({5, PKV_HASH_XXH3_128})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStepPlan)
    ->Name("decode_step_plan/append_batch_only_xxh3")
    ->Args({3, PKV_HASH_XXH3_128})
    ->Iterations(kPlanSteps)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatchPrefix)
    ->Name("match_prefix/sha256_cbor")
    ->Arg(PKV_HASH_SHA256_CBOR)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HashOnly)
    ->Name("hash_only/sha256_cbor")
    ->Arg(PKV_HASH_SHA256_CBOR)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatchPrefix)
    ->Name("match_prefix/xxh3_128")
    ->Arg(PKV_HASH_XXH3_128)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HashOnly)
    ->Name("hash_only/xxh3_128")
    ->Arg(PKV_HASH_XXH3_128)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PrefixCacheFind)->Name("prefix_cache/random")->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PrefixCacheFind)->Name("prefix_cache/aimed")->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
