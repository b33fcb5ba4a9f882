// The plan arrays a caller gets from pkv_batch_plan_tensor are the caller's
// copy (DESIGN.md section 9): whatever is written into them, cache writes
// and attention keep to the plan the library built. Run under ASan, a kernel
// that still read the caller's copy would be reported as an overflow.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

pkv_tensor tensor3(float* data, int64_t n0, int64_t n1, int64_t n2) {
  const int64_t shape[3] = {n0, n1, n2};
  pkv_tensor t;
  EXPECT_EQ(pkv_tensor_init(data, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t), PKV_OK);
  return t;
}

struct Step {
  pkv_pool* pool = nullptr;
  pkv_seq_id seqs[2] = {};
  pkv_batch* batch = nullptr;
  int64_t rows = 0;
  std::vector<float> k, v, q;

  explicit Step(uint32_t seed) {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = 8;
    o.num_blocks = 24;
    o.num_layers = 1;
    o.num_kv_heads = 2;
    o.head_dim = 16;
    o.dtype = PKV_DTYPE_F32;
    o.num_threads = 1;
    EXPECT_EQ(pkv_pool_create(&o, &pool), PKV_OK) << pkv_last_error_message();
    std::mt19937 rng(seed);
    const uint32_t lens[2] = {21, 13}, queries[2] = {5, 13};
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(pkv_seq_create(pool, nullptr, &seqs[i]), PKV_OK);
      std::vector<int32_t> tokens(lens[i]);
      for (auto& t : tokens) t = int32_t(rng() % 1000);
      EXPECT_EQ(pkv_seq_append(pool, seqs[i], tokens.data(), tokens.size(), 0), PKV_OK);
    }
    EXPECT_EQ(pkv_batch_prepare(pool, seqs, queries, 2, nullptr, &batch), PKV_OK);
    rows = queries[0] + queries[1];
    std::uniform_real_distribution<float> d(-1, 1);
    k.resize(size_t(rows) * 2 * 16);
    v.resize(k.size());
    q.resize(size_t(rows) * 4 * 16);
    for (auto* buf : {&k, &v, &q})
      for (auto& x : *buf) x = d(rng);
  }
  ~Step() {
    pkv_batch_destroy(batch);
    pkv_pool_destroy(pool);
  }

  // Writes this step's K and V, then returns attention's out and lse.
  std::vector<float> run() {
    pkv_tensor kt = tensor3(k.data(), rows, 2, 16), vt = tensor3(v.data(), rows, 2, 16);
    EXPECT_EQ(pkv_cache_write(batch, 0, &kt, &vt, nullptr), PKV_OK) << pkv_last_error_message();
    std::vector<float> out(q.size() + size_t(rows) * 4, -7.f);
    pkv_tensor qt = tensor3(q.data(), rows, 4, 16), ot = tensor3(out.data(), rows, 4, 16), lt;
    const int64_t lshape[2] = {rows, 4};
    EXPECT_EQ(
        pkv_tensor_init(out.data() + q.size(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, lshape, &lt),
        PKV_OK);
    EXPECT_EQ(pkv_attention_forward(batch, 0, &qt, &ot, &lt, nullptr, nullptr), PKV_OK)
        << pkv_last_error_message();
    return out;
  }
};

// Every array overwritten with values that would send a kernel trusting
// them far outside q, out and the KV storage.
void tamper(pkv_batch* batch, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint32_t which = PKV_PLAN_SLOT_MAPPING; which <= PKV_PLAN_CONTEXT_LENS; ++which) {
    pkv_tensor t;
    ASSERT_EQ(pkv_batch_plan_tensor(batch, which, &t), PKV_OK);
    char* base = static_cast<char*>(t.data) + t.byte_offset;
    for (int64_t i = 0; i < t.shape[0]; ++i) {
      if (t.dtype == PKV_DTYPE_I64)
        reinterpret_cast<int64_t*>(base)[i] = int64_t(rng()) << 20;
      else
        reinterpret_cast<int32_t*>(base)[i] = 1000 + int32_t(rng() % 100000);
    }
  }
}

TEST(PlanTamper, WritesIntoPlanArraysChangeNothingTheKernelsDo) {
  Step clean(7), tampered(7);
  const std::vector<float> want = clean.run();
  tamper(tampered.batch, 11);
  // The caller's copy holds what the caller wrote...
  pkv_tensor t;
  ASSERT_EQ(pkv_batch_plan_tensor(tampered.batch, PKV_PLAN_QUERY_INDPTR, &t), PKV_OK);
  EXPECT_GE(static_cast<const int32_t*>(t.data)[1], 1000);
  // ...and the kernels never looked at it.
  const std::vector<float> got = tampered.run();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
  EXPECT_EQ(pkv_pool_validate(tampered.pool), PKV_OK) << pkv_last_error_message();
}

// The issue's two repros: query_indptr[1] = 1000 (q read and out written
// past their ends) and page_indptr[1] = 1000 (the plan check itself read
// past page_indices).
TEST(PlanTamper, IssueReprosQueryAndPageIndptr) {
  for (uint32_t which : {uint32_t(PKV_PLAN_QUERY_INDPTR), uint32_t(PKV_PLAN_PAGE_INDPTR)}) {
    Step clean(3), tampered(3);
    const std::vector<float> want = clean.run();
    pkv_tensor t;
    ASSERT_EQ(pkv_batch_plan_tensor(tampered.batch, which, &t), PKV_OK);
    static_cast<int32_t*>(t.data)[1] = 1000;
    EXPECT_EQ(tampered.run(), want) << "array " << which;
  }
}

}  // namespace
