// f32 and bf16 values reach FLT_MAX, so the unnormalised f32 sum of P V (or
// of p c in MLA) over n keys, weights up to 1 each, can overflow although
// the output, a convex combination, is finite (impl/cpu/attention.h). The
// CPU kernels give the weights a factor 2^-c, 2^c >= 2n, and multiply 2^c
// back when normalising; the CUDA kernels do the same (cuda/common.cuh).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace pagedkv {
namespace cpu {

// The smallest c with 2^c >= 2n; 0 for n <= 1 (one key needs no factor).
inline int overflow_exponent(int64_t n) {
  int c = 0;
  while (n > 1 && (int64_t(1) << c) < 2 * n) ++c;
  return c;
}

// acc * inv for an accumulator of finite values whose exact normalised
// result is at most FLT_MAX: a rounding past it gives +-FLT_MAX, not inf
// (an infinite acc, from an infinite value, stays inf; NaN stays NaN).
inline float normalised(float acc, float inv) {
  const float x = acc * inv;
  return std::isinf(x) && std::isfinite(acc) ? std::copysign(std::numeric_limits<float>::max(), x)
                                             : x;
}

}  // namespace cpu
}  // namespace pagedkv
