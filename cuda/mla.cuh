// MLA kernels (semantics: impl/cpu/mla.h). The write copies each token's
// [kv_c | k_pe] row into its slot. Attention: one CTA per (query token,
// head); warps score a tile of keys (q . row over rank + rope, warp sums),
// then every thread updates the online softmax and accumulates its slice of
// the latent dims. Plain element loads: correctness first, emulation-tested
// (tests/gpu/mla_emulation_test.cpp); tensor-core / FlashMLA-style tiling
// is future work.
#pragma once

#include "common.cuh"
#include "mla_launch.h"

namespace pagedkv {
namespace cuda {

// One CTA per token (grid-stride), threads over the row's elements.
template <typename U>
__global__ void __launch_bounds__(128) mla_write_kernel(const MlaWriteParams p) {
  const int32_t d = p.rank + p.rope;
  U* plane = reinterpret_cast<U*>(p.plane);
  const U* c = reinterpret_cast<const U*>(p.kv_c);
  const U* pe = reinterpret_cast<const U*>(p.k_pe);
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;  // padding token
    U* row = plane + slot * d;
    for (int32_t e = threadIdx.x; e < d; e += blockDim.x)
      row[e] = e < p.rank ? c[t * p.c_s0 + e] : pe[t * p.pe_s0 + e - p.rank];
  }
}

template <typename T>
__device__ __forceinline__ const T* mla_key_row(const MlaParams& p, const int32_t* pages,
                                                int32_t k) {
  const int64_t block = pages[k / p.block_size];
  return reinterpret_cast<const T*>(p.plane) +
         (block * p.block_size + k % p.block_size) * int64_t(p.rank + p.rope);
}

template <typename T>
__global__ void __launch_bounds__(kMlaThreads) mla_attention_kernel(const MlaParams p) {
  const int64_t t = blockIdx.x;
  const int32_t h = int32_t(blockIdx.y);
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int nwarps = int(blockDim.x) / 32;
  // The token's sequence: the last s with query_indptr[s] <= t.
  int32_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (p.query_indptr[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int32_t s = lo;
  const int32_t nq = p.query_indptr[s + 1] - p.query_indptr[s];
  const int32_t pos = p.context_lens[s] - nq + int32_t(t - p.query_indptr[s]);
  const int32_t* pages = p.page_indices + p.page_indptr[s];
  const int32_t D = p.rank + p.rope;

  PKV_EXTERN_SMEM(smem);
  float* qs = reinterpret_cast<float*>(smem);  // [D] scaled query
  float* sc = qs + D;                          // [kMlaKeyTile] scores
  const T* ql = reinterpret_cast<const T*>(p.q_lat) + t * p.ql_s0 + h * p.ql_s1;
  const T* qp = reinterpret_cast<const T*>(p.q_pe) + t * p.qp_s0 + h * p.qp_s1;
  for (int32_t d = tid; d < D; d += blockDim.x)
    qs[d] = p.scale * (d < p.rank ? to_float(ql[d]) : to_float(qp[d - p.rank]));
  __syncthreads();

  float acc[kMlaMaxPerThread];
  for (int k = 0; k < kMlaMaxPerThread; ++k) acc[k] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  // f32/bf16 latents: the weights enter the sum of p c times 2^-pc, 2^pc >=
  // twice the pos + 1 keys (overflow_exponent), and the normalisation
  // multiplies 2^pc back (as impl/cpu/mla.h); l keeps the unscaled weights.
  const int pc = scales_pv<T, T>() ? overflow_exponent(int64_t(pos) + 1) : 0;
  const float p_scale = ldexpf(1.0f, -pc);
  for (int32_t k0 = 0; k0 <= pos; k0 += kMlaKeyTile) {
    const int32_t nk = min(kMlaKeyTile, pos + 1 - k0);
    // Every warp runs the same number of rounds (warp sums are uniform).
    for (int32_t j0 = 0; j0 < kMlaKeyTile; j0 += nwarps) {
      const int32_t j = j0 + warp;
      float part = 0.0f;
      if (j < nk) {
        const T* row = mla_key_row<T>(p, pages, k0 + j);
        for (int32_t d = lane; d < D; d += 32) part += qs[d] * to_float(row[d]);
      }
      const float dot = warp_sum(part);
      if (lane == 0 && j < nk) sc[j] = dot;
    }
    __syncthreads();
    float mx = m;
    for (int32_t j = 0; j < nk; ++j) mx = fmaxf(mx, sc[j]);
    const float alpha = expf(m - mx);  // 0 on the first tile (m = -inf)
    for (int k = 0; k < kMlaMaxPerThread; ++k) acc[k] *= alpha;
    float sum = 0.0f;
    for (int32_t j = 0; j < nk; ++j) {
      const float w = expf(sc[j] - mx);
      sum += w;
      const float wp = w * p_scale;
      const T* row = mla_key_row<T>(p, pages, k0 + j);
      for (int k = 0; k < kMlaMaxPerThread; ++k) {
        const int32_t d = tid + k * int32_t(blockDim.x);
        if (d < p.rank) acc[k] += wp * to_float(row[d]);
      }
    }
    l = l * alpha + sum;
    m = mx;
    __syncthreads();  // sc is rewritten by the next tile
  }
  T* out = reinterpret_cast<T*>(p.out) + t * p.o_s0 + h * p.o_s1;
  const float inv = 1.0f / l * ldexpf(1.0f, pc);
  for (int k = 0; k < kMlaMaxPerThread; ++k) {
    const int32_t d = tid + k * int32_t(blockDim.x);
    if (d < p.rank) out[d] = from_float<T>(normalised<T>(acc[k], inv));
  }
  if (p.lse != nullptr && tid == 0) p.lse[t * p.lse_s0 + h] = m + logf(l);
}

}  // namespace cuda
}  // namespace pagedkv
