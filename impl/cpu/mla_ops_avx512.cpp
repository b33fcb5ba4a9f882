// AVX-512 (F, BW, VL) MLA leaf kernels, compiled for that target inside a
// baseline x86-64 library and only used after the runtime CPU check
// (cpu_isa_supported).
#include "cpu/half.h"
#include "cpu/mla.h"

// GCC 12 reports the _mm512_undefined_ps() operand of its own shuffle and
// extract intrinsics as maybe-uninitialized once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(PKV_OMIT_AVX512)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

namespace pagedkv {
namespace cpu {
namespace mla_avx512 {

struct Ops {
  using V = __m512;
  static constexpr int32_t W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(V a) {
    V x = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, 0x4e));
    x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0xb1));
    __m128 t = _mm512_castps512_ps128(x);
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
  }
};

void widen_impl(const void* src, DType dtype, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  if (dtype == DType::kBF16) {
    for (; i + 16 <= n; i += 16) {
      const __m512i x =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)));
    }
    for (; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(
          dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
    for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  }
}

constexpr CpuIsa kIsa = CpuIsa::kAvx512;

#include "cpu/mla_ops.inc"

}  // namespace mla_avx512

const MlaOps* mla_ops_avx512() { return &mla_avx512::kOps; }

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
const MlaOps* mla_ops_avx512() { return nullptr; }
}  // namespace cpu
}  // namespace pagedkv
#endif
