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
#include <cuda_runtime.h>

#include <cstdint>

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

#endif  // PKV_CUDA_EMULATION

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__host__ __device__ constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace cuda
}  // namespace pagedkv
