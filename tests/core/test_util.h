// Helpers shared by the core tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kv_pool.h"
#include "step_plan.h"

namespace pagedkv::test {

inline PoolOptions manager_options(uint32_t block_size, uint64_t num_blocks) {
  PoolOptions o;
  o.block_size = block_size;
  o.num_blocks = num_blocks;
  o.enable_events = true;
  return o;
}

// A pool with one layer of f32 storage, one KV head of head_dim, one
// kernel thread: for tests of the storage-byte stats.
inline PoolOptions storage_options(uint32_t block_size, uint64_t num_blocks, uint32_t head_dim) {
  PoolOptions o = manager_options(block_size, num_blocks);
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = head_dim;
  o.dtype = DType::kF32;
  o.num_threads = 1;
  return o;
}

inline std::vector<int32_t> iota_tokens(size_t n, int32_t first = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline std::vector<int32_t> table(const Pool& p, SeqId id) {
  std::vector<int32_t> t(p.block_table(id, nullptr, 0));
  p.block_table(id, t.data(), t.size());
  return t;
}

inline std::vector<int32_t> free_queue(const Pool& p) {
  std::vector<int32_t> q;
  p.block_pool().queue().for_each([&](int32_t id) { q.push_back(id); });
  return q;
}

inline std::vector<Event> drain(Pool& p) {
  std::vector<Event> out(1024);
  out.resize(p.drain_events(out.data(), out.size()));
  return out;
}

inline void append(Pool& p, SeqId id, const std::vector<int32_t>& t, uint32_t lookahead = 0) {
  p.append(id, t.data(), t.size(), lookahead);
}

// One engine step over id: a plan whose queries are its last q tokens (0 =
// all of them), destroyed at once: on these manager-only pools that commits
// it (ABI 1), so they count as computed: the sliding window releases
// relative to them and their blocks can be hit and stay cached when id goes.
inline void step(const std::shared_ptr<Pool>& p, SeqId id, uint32_t q = 0) {
  if (q == 0) q = uint32_t(p->seq_info(id).num_tokens);
  Batch::prepare(p, &id, &q, 1, nullptr);
}

// A step over the tokens id has not computed yet (none: nothing to do).
inline void step_rest(const std::shared_ptr<Pool>& p, SeqId id) {
  const SeqInfo i = p->seq_info(id);
  if (i.num_tokens > i.num_computed_tokens)
    step(p, id, uint32_t(i.num_tokens - i.num_computed_tokens));
}

// The code of the Error f throws, or Errc(0) when it returns.
inline Errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return Errc(0);
}

// An f32 [n0, n1, n2] host tensor over data (dense).
inline TensorArg rows(std::vector<float>& data, int64_t n0, int64_t n1, int64_t n2) {
  TensorArg t;
  t.data = data.data();
  t.dtype = uint32_t(DType::kF32);
  t.device_type = kDeviceCpu;
  t.ndim = 3;
  t.shape[0] = n0;
  t.shape[1] = n1;
  t.shape[2] = n2;
  return t;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace pagedkv::test

// Every scenario step is followed by a full invariant check.
#define EXPECT_VALID(pool) EXPECT_EQ((pool).validate(), "")
