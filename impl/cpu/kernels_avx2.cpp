// AVX2 + FMA + F16C kernels (CPUs without AVX-512), compiled for that
// target inside a baseline x86-64 library and only called after a runtime
// CPU check.
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/fp8.h"
#include "cpu/half.h"
#include "cpu/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(PKV_OMIT_AVX2)
#define PKV_HAVE_AVX2 1
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace pagedkv {
namespace cpu {
namespace avx2_isa {

struct Ops {
  using V = __m256;
  static constexpr int W = 8;
  static constexpr int kAcc = 8;  // of 16 ymm registers
  static constexpr int kQkRows = 2;
  static constexpr int kRegs = 16;  // vector registers
  static constexpr int kReduceN = 8;
  static constexpr bool kPairBf16 = true;
  __attribute__((always_inline)) static void load_bf16_pair(const uint16_t* p, V* even, V* odd) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(int32_t(0xffff0000u))));
  }
  // Lane i = sum of the lanes of x[i], i < 8 (an add tree, 9 instructions
  // for what 8 separate reductions do in 48).
  __attribute__((always_inline)) static V reduce8v(const V* x) {
    const V a0 = _mm256_hadd_ps(x[0], x[1]), a1 = _mm256_hadd_ps(x[2], x[3]);
    const V a2 = _mm256_hadd_ps(x[4], x[5]), a3 = _mm256_hadd_ps(x[6], x[7]);
    // b0 lanes: x0..x3 over elements 0-3, then x0..x3 over elements 4-7.
    const V b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20),
                         _mm256_permute2f128_ps(b0, b1, 0x31));
  }
  // out[r * ldl + u] = sum of the lanes of x[r * KU + u], for the 8 / KU
  // rows r and u < KU.
  template <int KU>
  __attribute__((always_inline)) static void reduce_rows(const V* x, float* out, int32_t ldl) {
    const V s = reduce8v(x);
    if constexpr (KU == 8) {
      _mm256_storeu_ps(out, s);
    } else if constexpr (KU == 4) {
      _mm_storeu_ps(out, _mm256_castps256_ps128(s));
      _mm_storeu_ps(out + ldl, _mm256_extractf128_ps(s, 1));
    } else {  // f32 pages, whose 4-row tiles keep one pass (kernels_impl.inc)
      alignas(32) float sums[8];
      _mm256_store_ps(sums, s);
#pragma GCC unroll 8
      for (int r = 0; r < 8 / KU; ++r)
#pragma GCC unroll 2
        for (int u = 0; u < KU; ++u) out[r * ldl + u] = sums[r * KU + u];
    }
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(V v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
  }
  static float hmax(V v) {
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    t = _mm_max_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
  }
  static V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V load_bf16(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store_f16(uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static void store_bf16(uint16_t* p, V v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb);
    r = _mm256_srli_epi32(r, 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // Values fit 16 bits: pack within lanes, then gather the two halves.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  // Same algorithm as the AVX-512 exp (see there).
  static V exp(V x) {
    const V under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
    x = _mm256_max_ps(_mm256_set1_ps(-87.33f), x);
    const V n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    V y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
  }
  static V tanh(V x) {
    const V sign_mask = _mm256_set1_ps(-0.0f);
    const V ax = _mm256_andnot_ps(sign_mask, x);
    const V t = exp(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    const V one = _mm256_set1_ps(1.0f);
    const V y = _mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t));
    return _mm256_or_ps(y, _mm256_and_ps(x, sign_mask));
  }
};

#include "cpu/fp8_ops_avx2.inc"  // after Ops

#include "cpu/fp8_kernels.inc"  // after Fp8Ops

#include "cpu/kernels_impl.inc"

const KernelTable& table() {
  static const KernelTable t = build_table(CpuIsa::kAvx2, "avx2", 8);
  return t;
}

}  // namespace avx2_isa
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
const KernelTable* avx2_table() {
#ifdef PKV_HAVE_AVX2
  return &avx2_isa::table();
#else
  return nullptr;
#endif
}
}  // namespace cpu
}  // namespace pagedkv
