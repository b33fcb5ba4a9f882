// AVX-512 (F/BW/VL) + FMA + F16C kernels, compiled for that target inside a
// baseline x86-64 library and only called after a runtime CPU check.
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/half.h"
#include "cpu/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PKV_HAVE_AVX512 1
#if !defined(__clang__)
// GCC 12 warns inside its own avx512fintrin.h (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
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
namespace avx512_isa {

struct Ops {
  using V = __m512;
  static constexpr int W = 16;
  static constexpr int kAcc = 16;  // of 32 zmm registers
  static constexpr bool kHasReduce16 = true;
  static constexpr bool kPairBf16 = true;
  static void load_bf16_pair(const uint16_t* p, V* even, V* odd) {
    const __m512i x = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(int32_t(0xffff0000u))));
  }
  // out[i] = sum of the lanes of x[i], i < 16: a transpose-and-add tree
  // (45 instructions instead of 16 separate reductions). Fed in 4x4
  // transposed order, the tree's lane 4i+k sum of y[4k+i] comes out as
  // x[4i+k], i.e. in natural order.
  static void reduce16(const V* x, float* out) {
    V y[16];
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 4; ++i) y[4 * k + i] = x[4 * i + k];
    V c[8], e[4], g[2];
    for (int m = 0; m < 8; ++m) {
      c[m] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * m], y[2 * m + 1], 0x44),
                           _mm512_shuffle_f32x4(y[2 * m], y[2 * m + 1], 0xEE));
    }
    for (int m = 0; m < 4; ++m) {
      e[m] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * m], c[2 * m + 1], 0x88),
                           _mm512_shuffle_f32x4(c[2 * m], c[2 * m + 1], 0xDD));
    }
    for (int m = 0; m < 2; ++m) {
      g[m] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * m], e[2 * m + 1], 0x44),
                           _mm512_shuffle_ps(e[2 * m], e[2 * m + 1], 0xEE));
    }
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], 0x88),
                                        _mm512_shuffle_ps(g[0], g[1], 0xDD)));
  }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(V v) {
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
  }
  static float hmax(V v) { return _mm512_reduce_max_ps(v); }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load_bf16(const uint16_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void store_f16(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store_bf16(uint16_t* p, V v) {
    // Integer rounding rather than vcvtneps2bf16, which flushes subnormals:
    // every path must give the scalar path's bits.
    const __m512i x = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb);
    r = _mm512_srli_epi32(r, 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  // exp: Cody-Waite reduction to r in [-ln2/2, ln2/2], degree-5 minimax
  // polynomial (about 1-2 ulp), 2^n via the exponent bits. Below -87.3
  // (including -inf) the result is exactly 0; NaN stays NaN.
  static V exp(V x) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), x);
    x = _mm512_max_ps(_mm512_set1_ps(-87.33f), x);
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    V y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_mask_blend_ps(under, y, _mm512_setzero_ps());
  }
  // tanh |x| = (1 - t) / (1 + t) with t = exp(-2|x|) <= 1 (no overflow).
  static V tanh(V x) {
    const __m512i sign_mask = _mm512_set1_epi32(int32_t(0x80000000u));
    const __m512i xi = _mm512_castps_si512(x);
    const V ax = _mm512_castsi512_ps(_mm512_andnot_si512(sign_mask, xi));
    const V t = exp(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
    const V one = _mm512_set1_ps(1.0f);
    const V y = _mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t));
    return _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_castps_si512(y), _mm512_and_si512(xi, sign_mask)));
  }
};

#include "cpu/kernels_impl.inc"

const KernelTable& table() {
  static const KernelTable t = build_table(CpuIsa::kAvx512, "avx512", 16);
  return t;
}

}  // namespace avx512_isa
}  // namespace cpu
}  // namespace pagedkv

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace pagedkv {
namespace cpu {
const KernelTable* avx512_table() {
#ifdef PKV_HAVE_AVX512
  return &avx512_isa::table();
#else
  return nullptr;
#endif
}
}  // namespace cpu
}  // namespace pagedkv
