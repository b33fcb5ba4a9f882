// AVX2 + FMA + F16C MLA leaf kernels, compiled for that target inside a
// baseline x86-64 library and only used after the runtime CPU check
// (cpu_isa_supported).
#include "cpu/half.h"
#include "cpu/mla.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(PKV_OMIT_AVX2)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace pagedkv {
namespace cpu {
namespace mla_avx2 {

struct Ops {
  using V = __m256;
  static constexpr int32_t W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(V a) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
};

void widen_impl(const void* src, DType dtype, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  if (dtype == DType::kBF16) {
    for (; i + 8 <= n; i += 8) {
      const __m256i x =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
    }
    for (; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  }
}

constexpr CpuIsa kIsa = CpuIsa::kAvx2;

#include "cpu/mla_ops.inc"

}  // namespace mla_avx2

const MlaOps* mla_ops_avx2() { return &mla_avx2::kOps; }

}  // namespace cpu
}  // namespace pagedkv

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
namespace pagedkv {
namespace cpu {
const MlaOps* mla_ops_avx2() { return nullptr; }
}  // namespace cpu
}  // namespace pagedkv
#endif
