// pkv_batch_token_positions / pkv_batch_last_token_indices: every query row's
// position and every sequence's last row, for random mixes of decode,
// prefill and chunked prefill, checked against the engine's own bookkeeping
// (not against the plan's other arrays).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

struct Pool {
  pkv_pool* p = nullptr;
  explicit Pool(uint32_t num_layers) {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = 4;
    o.num_blocks = 512;
    o.num_layers = num_layers;
    o.num_kv_heads = 1;
    o.head_dim = 8;
    o.dtype = PKV_DTYPE_F32;
    o.num_threads = 1;
    EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  }
  ~Pool() { pkv_pool_destroy(p); }
};

std::vector<int64_t> read_i64(const pkv_tensor& t, int64_t n) {
  EXPECT_EQ(t.dtype, uint32_t(PKV_DTYPE_I64));
  EXPECT_EQ(t.device_type, PKV_DEVICE_CPU);
  EXPECT_EQ(t.ndim, 1);
  EXPECT_EQ(t.shape[0], n);
  EXPECT_EQ(t.strides[0], 1);
  const auto* d =
      reinterpret_cast<const int64_t*>(static_cast<const char*>(t.data) + t.byte_offset);
  return std::vector<int64_t>(d, d + n);
}

// Several steps over 1..9 sequences, each scheduling a random chunk of its
// uncomputed tokens (a whole prompt, part of one, or one decode token).
void run_steps(uint32_t num_layers, uint32_t seed) {
  Pool pool(num_layers);
  std::mt19937 rng(seed);
  for (int step_set = 0; step_set < 6; ++step_set) {
    const uint32_t n = 1 + rng() % 9;
    std::vector<pkv_seq_id> seqs(n);
    std::vector<uint64_t> computed(n, 0), total(n);
    for (uint32_t i = 0; i < n; ++i) {
      ASSERT_EQ(pkv_seq_create(pool.p, nullptr, &seqs[i]), PKV_OK);
      total[i] = 1 + rng() % 23;
      std::vector<int32_t> toks(total[i]);
      for (auto& t : toks) t = int32_t(rng() % 5000);
      ASSERT_EQ(pkv_seq_append(pool.p, seqs[i], toks.data(), toks.size(), 0), PKV_OK);
    }
    for (int step = 0; step < 8; ++step) {
      std::vector<pkv_seq_id> sched;
      std::vector<uint32_t> q;
      std::vector<uint64_t> first;
      for (uint32_t i = 0; i < n; ++i) {
        if (computed[i] == total[i]) {  // decode: one new token
          const int32_t t = int32_t(rng() % 5000);
          ASSERT_EQ(pkv_seq_append(pool.p, seqs[i], &t, 1, 0), PKV_OK);
          ++total[i];
        }
        if (rng() % 4 == 0 && !(i + 1 == n && sched.empty())) continue;  // not this step
        const uint64_t left = total[i] - computed[i];
        sched.push_back(seqs[i]);
        // A chunk from the first uncomputed token: queries are the last
        // tokens of the sequence, so a chunk shorter than `left` needs the
        // sequence truncated to its end (chunked prefill over a prompt that
        // is appended chunk by chunk is the same thing).
        const uint64_t chunk = 1 + rng() % left;
        if (chunk < left) {
          ASSERT_EQ(pkv_seq_truncate(pool.p, seqs[i], computed[i] + chunk), PKV_OK);
          total[i] = computed[i] + chunk;
        }
        q.push_back(uint32_t(chunk));
        first.push_back(computed[i]);
        computed[i] += chunk;
      }
      pkv_batch* b = nullptr;
      ASSERT_EQ(
          pkv_batch_prepare(pool.p, sched.data(), q.data(), uint32_t(sched.size()), nullptr, &b),
          PKV_OK)
          << pkv_last_error_message();
      std::vector<int64_t> want_pos, want_last;
      for (size_t s = 0; s < sched.size(); ++s) {
        for (uint32_t j = 0; j < q[s]; ++j) want_pos.push_back(int64_t(first[s] + j));
        want_last.push_back(int64_t(want_pos.size()) - 1);
      }
      pkv_tensor pt, lt, pt2;
      ASSERT_EQ(pkv_batch_token_positions(b, &pt), PKV_OK);
      ASSERT_EQ(pkv_batch_last_token_indices(b, &lt), PKV_OK);
      EXPECT_EQ(read_i64(pt, int64_t(want_pos.size())), want_pos);
      EXPECT_EQ(read_i64(lt, int64_t(want_last.size())), want_last);
      // A view of the plan's own memory: the same address on every call.
      ASSERT_EQ(pkv_batch_token_positions(b, &pt2), PKV_OK);
      EXPECT_EQ(pt2.data, pt.data);
      if (num_layers == 0) {
        ASSERT_EQ(pkv_batch_commit(b), PKV_OK);
      } else {
        std::vector<float> kv(want_pos.size() * 8);
        for (auto& x : kv) x = float(rng() % 1000) / 500.0f - 1.0f;
        const int64_t shape[3] = {int64_t(want_pos.size()), 1, 8};
        pkv_tensor t;
        ASSERT_EQ(pkv_tensor_init(kv.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &t),
                  PKV_OK);
        for (uint32_t l = 0; l < num_layers; ++l)
          ASSERT_EQ(pkv_cache_write(b, l, &t, &t, nullptr), PKV_OK) << pkv_last_error_message();
      }
      pkv_batch_destroy(b);
    }
    for (auto s : seqs) ASSERT_EQ(pkv_seq_free(pool.p, s), PKV_OK);
  }
}

TEST(PlanPositions, ManagerOnlyPool) {
  for (uint32_t seed = 1; seed <= 20; ++seed) run_steps(0, seed);
}

TEST(PlanPositions, StoragePool) {
  for (uint32_t seed = 100; seed <= 110; ++seed) run_steps(2, seed);
}

// The views stay as they were when the caller writes into them (they are the
// caller's; nothing reads them back) and agree with the plan's query offsets.
TEST(PlanPositions, AgreeWithPlanArrays) {
  Pool pool(0);
  pkv_seq_id a, b;
  ASSERT_EQ(pkv_seq_create(pool.p, nullptr, &a), PKV_OK);
  ASSERT_EQ(pkv_seq_create(pool.p, nullptr, &b), PKV_OK);
  const int32_t toks[9] = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  ASSERT_EQ(pkv_seq_append(pool.p, a, toks, 9, 0), PKV_OK);
  ASSERT_EQ(pkv_seq_append(pool.p, b, toks, 3, 0), PKV_OK);
  pkv_seq_id seqs[2] = {a, b};
  uint32_t q[2] = {9, 3};
  pkv_batch* batch = nullptr;
  ASSERT_EQ(pkv_batch_prepare(pool.p, seqs, q, 2, nullptr, &batch), PKV_OK);
  ASSERT_EQ(pkv_batch_commit(batch), PKV_OK);
  pkv_batch_destroy(batch);
  ASSERT_EQ(pkv_seq_append(pool.p, a, toks, 1, 0), PKV_OK);
  ASSERT_EQ(pkv_seq_append(pool.p, b, toks, 4, 0), PKV_OK);
  q[0] = 1;
  q[1] = 4;
  ASSERT_EQ(pkv_batch_prepare(pool.p, seqs, q, 2, nullptr, &batch), PKV_OK);
  pkv_tensor pt, lt, qp, cl;
  ASSERT_EQ(pkv_batch_token_positions(batch, &pt), PKV_OK);
  ASSERT_EQ(pkv_batch_last_token_indices(batch, &lt), PKV_OK);
  ASSERT_EQ(pkv_batch_plan_tensor(batch, PKV_PLAN_QUERY_INDPTR, &qp), PKV_OK);
  ASSERT_EQ(pkv_batch_plan_tensor(batch, PKV_PLAN_CONTEXT_LENS, &cl), PKV_OK);
  EXPECT_EQ(read_i64(pt, 5), (std::vector<int64_t>{9, 3, 4, 5, 6}));
  EXPECT_EQ(read_i64(lt, 2), (std::vector<int64_t>{0, 4}));
  const auto* qptr = static_cast<const int32_t*>(qp.data);
  const auto* ctx = static_cast<const int32_t*>(cl.data);
  const auto* pos = static_cast<int64_t*>(pt.data);
  for (int s = 0; s < 2; ++s)
    for (int r = qptr[s]; r < qptr[s + 1]; ++r) EXPECT_EQ(pos[r], ctx[s] - (qptr[s + 1] - r));
  static_cast<int64_t*>(pt.data)[0] = -7;  // the caller's copy
  ASSERT_EQ(pkv_batch_token_positions(batch, &pt), PKV_OK);
  EXPECT_EQ(static_cast<const int64_t*>(pt.data)[0], -7);
  ASSERT_EQ(pkv_batch_commit(batch), PKV_OK);
  pkv_batch_destroy(batch);
}

}  // namespace
