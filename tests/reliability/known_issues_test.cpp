// Minimal reproductions of library defects found by the reliability work.
// A defect not fixed yet is kept as DISABLED_ (so CI stays green) and run with
//   test_reliability_capi --gtest_also_run_disabled_tests --gtest_filter='KnownIssues.*'
// the prefix goes with the fix, and the test stays as a regression test.
// docs/reliability.md lists them.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "one_head_pool.h"
#include "pagedkv/pagedkv.h"

namespace {

using pkvrel::key_at;
using pkvrel::one_head_pool;
using pkvrel::value_at;

// Sliding-window pool, block 8, window 8. After 24 tokens and one more append
// the window releases blocks 0 and 1 (positions 0..15). A plan with 9 queries
// (positions 16..24) needs keys 9..15 of released block 1 for its first
// query. It used to pass pkv_batch_prepare (whose check looked only at the
// query's own block) and attention silently read the null block instead;
// fixed in d986e98: the plan is rejected with PKV_E_INVALID_ARGUMENT.
TEST(KnownIssues, WindowPlanReachingReleasedBlockIsRejectedOrCorrect) {
  const int bs = 8, w = 8, D = 64;
  pkv_pool* p = one_head_pool(bs, 16, w, D);
  ASSERT_NE(p, nullptr) << pkv_last_error_message();
  std::vector<int32_t> tok(32, 3);
  pkv_seq_id s;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
  // Returns the max error of the query at position 16, or -1 if the plan was rejected.
  auto step = [&](int n, uint32_t q) -> double {
    pkv_batch* b = nullptr;
    const pkv_status st = pkv_batch_prepare(p, &s, &q, 1, nullptr, &b);
    if (st == PKV_E_INVALID_ARGUMENT) return -1;
    EXPECT_EQ(st, PKV_OK);
    std::vector<float> k(q * D), v(q * D), qq(q * D), out(q * D);
    for (uint32_t r = 0; r < q; ++r)
      for (int d = 0; d < D; ++d) {
        k[r * D + d] = key_at(n - int(q) + int(r), d);
        v[r * D + d] = value_at(n - int(q) + int(r), d);
        qq[r * D + d] = float((d % 5) - 2) / 4.f;
      }
    const int64_t sh[3] = {q, 1, D};
    pkv_tensor kt, vt, qt, ot;
    pkv_tensor_init(k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sh, &kt);
    pkv_tensor_init(v.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sh, &vt);
    pkv_tensor_init(qq.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sh, &qt);
    pkv_tensor_init(out.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, sh, &ot);
    EXPECT_EQ(pkv_cache_write(b, 0, &kt, &vt, nullptr), PKV_OK);
    pkv_attention_params ap;
    pkv_attention_params_init(&ap);
    ap.sliding_window = w;
    EXPECT_EQ(pkv_attention_forward(b, 0, &qt, &ot, nullptr, &ap, nullptr), PKV_OK);
    pkv_batch_destroy(b);
    const int pos = 16, r = pos - (n - int(q));
    std::vector<double> lg;
    double mx = -1e30, sum = 0, err = 0;
    for (int kp = pos - w + 1; kp <= pos; ++kp) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += qq[r * D + d] * key_at(kp, d);
      lg.push_back(dot / std::sqrt(double(D)));
      mx = std::max(mx, lg.back());
    }
    for (double& x : lg) sum += (x = std::exp(x - mx));
    for (int d = 0; d < D; ++d) {
      double ref = 0;
      for (int i = 0; i < w; ++i) ref += lg[i] * value_at(pos - w + 1 + i, d);
      err = std::max(err, std::fabs(ref / sum - out[r * D + d]));
    }
    return err;
  };
  ASSERT_EQ(pkv_seq_append(p, s, tok.data(), 24, 0), PKV_OK);
  EXPECT_LT(step(24, 24), 1e-5);  // before the window releases anything: correct
  ASSERT_EQ(pkv_seq_append(p, s, tok.data(), 1, 0), PKV_OK);
  const double err = step(25, 9);
  EXPECT_TRUE(err < 0 || err < 1e-5) << "plan accepted and attention off by " << err;
  pkv_pool_destroy(p);
}

}  // namespace
