// Device helpers shared by the kernels: dtype conversion, 16-byte cp.async,
// warp reductions. Requires sm_80 or newer (bf16 arithmetic, cp.async).
#pragma once

#ifdef PKV_CUDA_EMULATION
#include "emulation.h"
#else
#define PKV_EXTERN_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace pagedkv {
namespace cuda {

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// FP8 KV storage formats (one byte per element), as template tags: the
// attention kernels widen a page tile to the compute dtype in shared memory,
// the write kernel quantises with the same conversions as impl/cpu/fp8.h.
struct Fp8E4m3 {
  static constexpr __nv_fp8_interpretation_t kInterp = __NV_E4M3;
};
struct Fp8E5m2 {
  static constexpr __nv_fp8_interpretation_t kInterp = __NV_E5M2;
};
template <typename S>
struct IsFp8 : std::false_type {};
template <>
struct IsFp8<Fp8E4m3> : std::true_type {};
template <>
struct IsFp8<Fp8E5m2> : std::true_type {};

// x -> code: round to nearest even, saturating to the largest finite value
// (what the CPU encoder does; Hopper: cvt.rn.satfinite).
template <typename F>
__device__ __forceinline__ uint8_t float_to_fp8(float x) {
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, F::kInterp));
}
template <typename F>
__device__ __forceinline__ float fp8_to_float(uint8_t c) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), F::kInterp)));
}
// Two codes (low byte first) -> two T values at dst (4-byte aligned). Exact:
// every E4M3 and E5M2 value is an f16 and a bf16 value. Hopper: one
// cvt.rn.f16x2.e4m3x2 / e5m2x2.
template <typename T, typename F>
__device__ __forceinline__ void fp8x2_to(uint16_t codes, T* dst) {
  const __half2 h(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes), F::kInterp));
  if constexpr (std::is_same<T, __half>::value) {
    *reinterpret_cast<__half2*>(dst) = h;
  } else {
    dst[0] = __float2bfloat16_rn(__low2float(h));
    dst[1] = __float2bfloat16_rn(__high2float(h));
  }
}

#ifdef PKV_CUDA_EMULATION
inline void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes) {
  ::pkv_emu::check_align(smem_dst, 16, "cp.async destination");
  ::pkv_emu::check_align(gmem_src, 16, "cp.async source");
  if (src_bytes == 16) {
    std::memcpy(smem_dst, gmem_src, 16);
  } else {
    std::memset(smem_dst, 0, 16);
  }
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
inline float warp_max(float v) {
  return ::pkv_emu::warp_reduce(v, [](float a, float b) { return fmaxf(a, b); });
}
inline float warp_sum(float v) {
  return ::pkv_emu::warp_reduce(v, [](float a, float b) { return a + b; });
}
inline float shfl_xor(float v, int mask) { return ::pkv_emu::shfl_xor(v, mask); }
template <bool kTrans>
inline void ldsm_x4(uint32_t (&r)[4], const void* row) {
  ::pkv_emu::ldmatrix_x4(r, row, kTrans);
}
template <typename T>
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ::pkv_emu::mma_m16n8k16<T>(d, a, b0, b1);
}
#else
// 16-byte global -> shared copy that bypasses L1; src_bytes == 0 fills the
// destination with zeros without reading src (used for masked keys, so that
// NaN garbage in unused slots can never reach the arithmetic).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float shfl_xor(float v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}

// ldmatrix .x4: lanes 8i..8i+7 give the 16-byte rows of 8x8 matrix i; each
// lane receives, per matrix, the two 16-bit elements (row lane/4, columns
// 2(lane%4), +1), or with kTrans (rows 2(lane%4), +1; column lane/4).
template <bool kTrans>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
}

// d += a (16x16, row) * b (16x8, col) on tensor cores, f32 accumulation.
// Fragments (g = lane/4, t = lane%4): a = {(g, 2t..2t+1), (g+8, 2t..), (g,
// 2t+8..), (g+8, 2t+8..)}; b = {(k 2t..2t+1, n g), (k 2t+8.., n g)}; d =
// {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same<T, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

#endif  // PKV_CUDA_EMULATION

// Two floats rounded to T, packed as an mma operand register (lo = first).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const T a = from_float<T>(lo), b = from_float<T>(hi);
  uint16_t ua, ub;
  memcpy(&ua, &a, 2);
  memcpy(&ub, &b, 2);
  return uint32_t(ua) | (uint32_t(ub) << 16);
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// f32 and bf16 values reach FLT_MAX, so an unnormalised f32 sum of up to n
// values with weights up to 1 each (P V over n keys, the merge of n splits)
// can overflow although the result, a convex combination, is finite. The
// kernels give such weights a factor 2^-c with 2^c >= 2n (impl/cpu/
// attention.h): this is the smallest such c, 0 for n <= 1.
__device__ __forceinline__ int overflow_exponent(int64_t n) {
  int c = 0;
  while (n > 1 && (int64_t(1) << c) < 2 * n) ++c;
  return c;
}

// Whether the P V weights over pages of stored type S, read as T, carry
// that factor: f32 and bf16 pages (f16 and FP8 values stay far below FLT_MAX).
template <typename T, typename S>
constexpr bool scales_pv() {
  return std::is_same<T, S>::value &&
         (std::is_same<T, float>::value || std::is_same<T, __nv_bfloat16>::value);
}

// One normalised output element, a * inv (a: the f32 sum of P V or of the
// splits' outputs, inv: 1/l and the powers of two above), over pages of
// stored type S. f32/bf16/f16 pages: the exact result is a convex
// combination of finite values, at most FLT_MAX in magnitude, but the
// product rounds a few ulps either side of it, and past FLT_MAX to +-inf,
// where every visible value of a dim is +-FLT_MAX. A finite a that gives inf
// is therefore +-FLT_MAX; an infinite a (an infinite value) stays inf, NaN
// stays NaN: impl/cpu/attention.cpp's finish_row. One compare on the common
// path. FP8 pages: plain a * inv (the V scale in inv can truly carry the
// result past FLT_MAX). f16/bf16 outputs round +-FLT_MAX to +-inf as the CPU
// does; the clamp shows in f32 outputs.
template <typename S>
__device__ __forceinline__ float normalised(float a, float inv) {
  const float x = a * inv;
  if constexpr (IsFp8<S>::value) {
    return x;
  } else {
    return fabsf(x) == INFINITY && fabsf(a) != INFINITY ? copysignf(FLT_MAX, x) : x;
  }
}

__host__ __device__ constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace cuda
}  // namespace pagedkv
