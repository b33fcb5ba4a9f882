// Regression tests through the C ABI for attention defects once listed in
// known_issues_test.cpp (docs/reliability.md, "Defects found").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "one_head_pool.h"
#include "pagedkv/pagedkv.h"

namespace {

using pkvrel::key_at;
using pkvrel::one_head_pool;
using pkvrel::value_at;

// Runs one prefill step of 8 tokens (keys and values by position) on a fresh
// one-head f32 pool and returns the attention output for q (8 x D) under ap.
// before_attention (if set) runs after the cache write, with the pool and
// the sequence.
std::vector<float> attend_prefill(
    const std::vector<float>& q, const pkv_attention_params& ap, pkv_status* st,
    const std::function<void(pkv_pool*, pkv_seq_id)>& before_attention = nullptr) {
  const int bs = 8, D = 64;
  pkv_pool* p = one_head_pool(bs, 4, 0, D);
  EXPECT_NE(p, nullptr) << pkv_last_error_message();
  std::vector<int32_t> tok(8, 3);
  pkv_seq_id s;
  EXPECT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
  EXPECT_EQ(pkv_seq_append(p, s, tok.data(), 8, 0), PKV_OK);
  uint32_t nq = 8;
  pkv_batch* b = nullptr;
  EXPECT_EQ(pkv_batch_prepare(p, &s, &nq, 1, nullptr, &b), PKV_OK);
  std::vector<float> k(8 * D), v(8 * D), qq = q, out(8 * D, -1.f);
  for (int r = 0; r < 8; ++r)
    for (int d = 0; d < D; ++d) {
      k[r * D + d] = key_at(r, d);
      v[r * D + d] = value_at(r, d);
    }
  const int64_t sh[3] = {8, 1, D};
  pkv_tensor kt, vt, qt, ot;
  pkv_tensor_init(k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sh, &kt);
  pkv_tensor_init(v.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sh, &vt);
  pkv_tensor_init(qq.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sh, &qt);
  pkv_tensor_init(out.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sh, &ot);
  EXPECT_EQ(pkv_cache_write(b, 0, &kt, &vt, nullptr), PKV_OK);
  if (before_attention) before_attention(p, s);
  *st = pkv_attention_forward(b, 0, &qt, &ot, nullptr, &ap, nullptr);
  pkv_batch_destroy(b);
  pkv_pool_destroy(p);
  return out;
}

// A key outside a query's sliding window must not influence its output. The
// CPU kernels computed a whole page and masked the keys before the window
// with -inf logits, but the masked keys' V still entered the weighted sum as
// 0 * V: a NaN (or Inf) in such a slot turned the output into NaN. Slots
// hold NaN when their memory was never written (f16/bf16 garbage is NaN/Inf
// for ~3% of bit patterns), so the output of a correct query depended on
// memory it must not read. Found by tests/fuzz (window pools,
// PKV_FUZZ_NAN_POISON=1); fixed in impl/cpu/attention.cpp (Attention::pv_step:
// keys only some rows see go row by row). Here: one page of 8 written tokens,
// then key/value of position 0 set to NaN; with window 3 the queries at
// positions 0..2 see it (NaN out), those at 3..7 must not. The kernel tests
// (AttentionMatrix.MaskedKeysNeverReachOutput) cover every ISA and dtype.
TEST(AttentionRegression, MaskedKeyOutsideWindowDoesNotReachOutput) {
  const int D = 64;
  std::vector<float> q(8 * D);
  for (int r = 0; r < 8; ++r)
    for (int d = 0; d < D; ++d) q[r * D + d] = float((d % 5) - 2) / 4.f;
  pkv_attention_params ap;
  pkv_attention_params_init(&ap);
  ap.sliding_window = 3;
  pkv_status st = PKV_E_INTERNAL;
  // Position 0 (slot 0 of the sequence's block) becomes NaN in K and V.
  const std::vector<float> out = attend_prefill(q, ap, &st, [&](pkv_pool* p, pkv_seq_id s) {
    int32_t blk = 0;
    uint64_t len = 0;
    ASSERT_EQ(pkv_seq_get_block_table(p, s, &blk, 1, &len), PKV_OK);
    for (uint32_t which = 0; which < 2; ++which) {
      pkv_tensor t;
      ASSERT_EQ(pkv_pool_kv_tensor(p, 0, which, &t), PKV_OK);
      float* slot0 = static_cast<float*>(t.data) + int64_t(blk) * t.strides[0];
      std::fill(slot0, slot0 + D, NAN);
    }
  });
  ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
  for (int r = 0; r < 8; ++r)
    for (int d = 0; d < D; ++d) {
      if (r < 3) {
        EXPECT_TRUE(std::isnan(out[r * D + d])) << "position " << r << " sees the NaN key";
      } else {
        ASSERT_TRUE(std::isfinite(out[r * D + d]))
            << "output of position " << r << ", dim " << d << " is " << out[r * D + d];
      }
    }
}

// A subnormal logit_softcap (finite and > 0, so accepted) made the CPU
// kernels' soft cap NaN: they multiplied each logit by 1 / softcap, which
// overflows to +inf, and a logit of 0 gave 0 * inf = NaN (the CUDA kernels
// divide and were right). c * tanh(x / c) lies within [-c, c], so with
// q = 0 every logit is 0 either way and the output must equal the uncapped
// one. Fixed in impl/cpu/kernels_impl.inc (apply_softcap divides when the
// reciprocal overflows).
TEST(AttentionRegression, SubnormalSoftcapIsNotNaN) {
  const std::vector<float> q(8 * 64, 0.f);
  pkv_attention_params ap;
  pkv_attention_params_init(&ap);
  pkv_status st = PKV_E_INTERNAL;
  const std::vector<float> plain = attend_prefill(q, ap, &st);
  ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
  ap.logit_softcap = 1e-40f;  // subnormal: 1 / c overflows float
  const std::vector<float> capped = attend_prefill(q, ap, &st);
  ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
  for (size_t i = 0; i < plain.size(); ++i)
    ASSERT_FLOAT_EQ(capped[i], plain[i]) << "element " << i << " (row " << i / 64 << ")";
}

// sliding_window 2^31 - 1 (the largest accepted) overflowed int32 in the CPU
// attention's work estimate (window + queries - 1), undefined behaviour that
// UBSan aborts on. A window longer than every context is no window.
// Fixed in impl/cpu/attention.cpp (computed in int64).
TEST(AttentionRegression, LargestSlidingWindowIsNoWindow) {
  std::vector<float> q(8 * 64);
  for (size_t i = 0; i < q.size(); ++i) q[i] = float(int(i % 7) - 3) / 4.f;
  pkv_attention_params ap;
  pkv_attention_params_init(&ap);
  pkv_status st = PKV_E_INTERNAL;
  const std::vector<float> plain = attend_prefill(q, ap, &st);
  ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
  ap.sliding_window = 0x7fffffffu;
  const std::vector<float> windowed = attend_prefill(q, ap, &st);
  ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
  for (size_t i = 0; i < plain.size(); ++i)
    ASSERT_FLOAT_EQ(windowed[i], plain[i]) << "element " << i;
}

}  // namespace
