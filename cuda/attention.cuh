// Paged attention over the CSR page table: decode, prefill and chunked
// prefill in one varlen kernel, with split-KV and a merge kernel.
//
// Work decomposition. A "row" is one (query token, q head of its GQA group)
// pair; rows of a sequence are numbered qi * group + g, so the G rows of a
// decode token are adjacent and one CTA covers the whole group: every K/V
// byte it loads serves all G heads. A CTA owns ROWS consecutive rows of one
// sequence for one KV head, and one of num_splits contiguous chunks of the
// keys those rows can see (flash-decoding: the chunks' partial results are
// merged by merge_splits_kernel). Keys are visited in tiles of KT keys,
// double-buffered in shared memory with cp.async (16-byte copies, coalesced
// within a page's head row); masked keys (past the chunk, null pages) are
// zero-filled, never read.
//
// Per tile: S = Q K^T (tensor cores via WMMA for f16/bf16, CUDA cores for
// f32), then the online softmax in the log2 domain (one warp per row, lanes
// over keys), then O += P V (tensor cores / CUDA cores). O lives in shared
// memory as f32 so that the per-row rescale needs no knowledge of fragment
// layouts. Semantics mirror impl/cpu: the queries of a sequence are its last
// n_q positions; query at position p sees key k iff k <= p, p - W < k when a
// window W is set, and k's page is not the null block; logits are
// scale * q.k, soft-capped as c * tanh(logit / c); LSE is natural-log.
//
// FP8 pages (S = Fp8E4m3 / Fp8E5m2, T = f16 or bf16 of q and out): cp.async
// brings the raw codes into their own double-buffered stage, and each tile
// is widened (exactly) into a single T tile before the products, so the
// tensor-core path is the f16/bf16 one. The K scale of the head multiplies
// the softmax scale, the V scale the output normalisation, as on the CPU.
#pragma once

#ifndef PKV_CUDA_EMULATION
#include <mma.h>
#endif

#include <atomic>
#include <type_traits>

#include "attention_cta.cuh"
#include "attention_mma.cuh"
#include "common.cuh"
#include "launch.h"

namespace pagedkv {
namespace cuda {

constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kSmallRows = 16;

// f16/bf16 pages run paged_attention_mma_kernel (attention_mma.cuh); FP8
// pages and f32 keep the generic kernel below.
template <typename T, typename S>
constexpr bool uses_mma_kernel() {
  return sizeof(T) == 2 && std::is_same<T, S>::value;
}

// Keys per tile: 32, or 16 where a key row is 1 KiB (f32 x 256) so that two
// stages of K and V still fit next to the query tile on an A100.
template <typename T, int D>
constexpr int kv_tile() {
  return sizeof(T) * D >= 1024 ? 16 : 32;
}
// Rows of the prefill tile: 64, or 32 for wide rows (shared memory).
constexpr int large_rows(int dtype_bytes, int head_dim) {
  return dtype_bytes * head_dim >= 512 ? 32 : 64;
}

template <typename T, int D, int ROWS, int KT, bool FP8 = false>
struct AttnSmem {
  static constexpr int kVec = 16 / int(sizeof(T));  // elements per 16 bytes
  // Rows padded by 16 bytes: 16-byte accesses of consecutive rows then hit
  // distinct bank groups, and WMMA's ldm constraints hold.
  static constexpr int kLdKV = D + kVec;
  static constexpr int kLdQ = D + kVec;
  static constexpr int kLdO = D + 4;
  static constexpr int kLdS = KT + 4;
  static constexpr int kLdP = KT + kVec;
  static constexpr size_t kStage = size_t(KT) * kLdKV * sizeof(T);
  // FP8: one widened T tile (the raw codes are the double buffer).
  static constexpr int kTStages = FP8 ? 1 : 2;
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + kTStages * kStage;
  static constexpr size_t kQ = align_up(kV + kTStages * kStage, 128);
  static constexpr size_t kO = align_up(kQ + size_t(ROWS) * kLdQ * sizeof(T), 128);
  static constexpr size_t kS = align_up(kO + size_t(ROWS) * kLdO * 4, 128);
  // f32: P overwrites S in place (the same stride; the softmax's thread of
  // an element reads its logit before it writes its weight, and nothing
  // reads S after), which lets the head-dim-256 decode tile fit the 99 KB
  // of sm_86/sm_89 parts.
  static constexpr bool kPInS = std::is_same<T, float>::value;
  static constexpr size_t kP = kPInS ? kS : align_up(kS + size_t(ROWS) * kLdS * 4, 128);
  static constexpr size_t kValid = align_up(kP + size_t(ROWS) * kLdP * sizeof(T), 128);
  // Per key of the current tile: its V held a non-finite value that was
  // zeroed (see "partly visible keys" below); entry KT: any such key.
  static constexpr size_t kBad = kValid + 2 * KT * sizeof(int);
  // FP8: raw codes, per stage K then V, KT rows of D bytes (unpadded).
  static constexpr size_t kRaw = align_up(kBad + (KT + 1) * sizeof(int), 128);
  static constexpr size_t kRawStage = size_t(KT) * D;
  static constexpr size_t kBytes = FP8 ? kRaw + 4 * kRawStage : kRaw;
  static_assert(KT <= 32, "softmax maps one key per lane");
  static_assert(!kPInS || kLdP == kLdS, "P in place of S: the same element per key");
  static_assert(ROWS % (kAttnThreads / KT) == 0, "CUDA-core QK mapping");
  static_assert(ROWS % 16 == 0 && KT % 16 == 0 && D % 16 == 0, "WMMA tiles");
};

template <typename T, int D, int ROWS, int KT, typename S = T>
__global__ void __launch_bounds__(kAttnThreads) paged_attention_kernel(const AttnParams p) {
  constexpr bool kFp8 = IsFp8<S>::value;
  using L = AttnSmem<T, D, ROWS, KT, kFp8>;
  using SE = std::conditional_t<kFp8, uint8_t, T>;  // stored element
  constexpr int kVec = L::kVec;
  constexpr int kSVec = 16 / int(sizeof(SE));  // stored elements per 16 bytes
  constexpr int kChunks = D / kSVec;           // 16-byte chunks per key row
  constexpr int kRowsPerWarp = ROWS / kAttnWarps;
  constexpr bool kTensorCores = !std::is_same<T, float>::value;

  PKV_EXTERN_SMEM(smem);
  T* k_s = reinterpret_cast<T*>(smem + L::kK);
  T* v_s = reinterpret_cast<T*>(smem + L::kV);
  T* q_s = reinterpret_cast<T*>(smem + L::kQ);
  float* o_s = reinterpret_cast<float*>(smem + L::kO);
  float* s_s = reinterpret_cast<float*>(smem + L::kS);
  T* p_s = reinterpret_cast<T*>(smem + L::kP);
  int* valid_s = reinterpret_cast<int*>(smem + L::kValid);
  int* bad_s = reinterpret_cast<int*>(smem + L::kBad);
  [[maybe_unused]] uint8_t* raw_s = smem + L::kRaw;  // FP8 only

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  CtaWork w;
  if (!cta_work<ROWS, KT, D>(p, w)) return;  // uniform: this tile has no rows
  const int q_begin = w.q_begin, group = w.group, row0 = w.row0, n_rows = w.n_rows;
  const int first_pos = w.first_pos, kvh = w.kvh;
  const int split = w.split, s_begin = w.s_begin, n_tiles = w.n_tiles, bs = w.bs;
  const int* pages = w.pages;
  const int64_t head_off = w.head_off, block_elems = w.block_elems;
  const SE* k_plane = static_cast<const SE*>(p.k_plane);
  const SE* v_plane = static_cast<const SE*>(p.v_plane);

  auto load_tile = [&](int stage, int key0) {
    for (int e = tid; e < KT * kChunks; e += kAttnThreads) {
      const int jj = e / kChunks, c = e % kChunks;
      // Inline rather than key_row (attention_cta.cuh): with the helper, the
      // f32 x 256 large tile spills 24 bytes (sm_90).
      const int j = key0 + jj;
      int64_t off = 0;
      bool ok = false;
      if (j < w.s_end) {
        const int page = pages[j / bs];
        if (page != 0) {
          ok = true;
          off = int64_t(page) * block_elems + head_off + int64_t(j % bs) * D + c * kSVec;
        }
      }
      const int n = ok ? 16 : 0;
      if constexpr (kFp8) {
        uint8_t* kd = raw_s + stage * 2 * L::kRawStage;
        cp_async16(kd + jj * D + c * 16, k_plane + off, n);
        cp_async16(kd + L::kRawStage + jj * D + c * 16, v_plane + off, n);
      } else {
        cp_async16(k_s + (stage * KT + jj) * L::kLdKV + c * kVec, k_plane + off, n);
        cp_async16(v_s + (stage * KT + jj) * L::kLdKV + c * kVec, v_plane + off, n);
      }
      if (c == 0) valid_s[stage * KT + jj] = ok;
    }
    cp_async_commit();
  };

  if (n_tiles > 0) load_tile(0, s_begin);

  // Query rows (zero beyond n_rows) and the f32 output accumulator.
  fill_q_tile<T, D, ROWS, kAttnThreads>(p, w, q_s, L::kLdQ);
  for (int e = tid; e < ROWS * D; e += kAttnThreads) o_s[e / D * L::kLdO + e % D] = 0.f;

  // Running max (log2 domain) and sum of each row this warp owns.
  float m_row[kRowsPerWarp], l_row[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m_row[i] = -INFINITY;
    l_row[i] = 0.f;
  }
  // FP8: dequantisation folded in (q.(s k) = s (q.k); sum p (s v) = s sum p v).
  const float scale = kFp8 ? p.softmax_scale * p.k_scales[kvh] : p.softmax_scale;
  const float v_scale = kFp8 ? p.v_scales[kvh] : 1.f;
  const float cap = p.softcap;
  const int window = p.window;
  // f32/bf16 pages: the weights enter P V times 2^-pc, 2^pc >= twice the
  // keys of this split (overflow_exponent); the normalisation multiplies
  // 2^pc back, and for a split's partial output 2^-mc on top, 2^mc >= twice
  // the splits, which merge_splits_kernel undoes. Powers of two: exact short
  // of underflow.
  constexpr bool kScaleP = scales_pv<T, S>();
  const int pc = kScaleP ? overflow_exponent(w.s_end - w.s_begin) : 0;
  const float p_scale = ldexpf(1.f, -pc);
  const float unscale = ldexpf(1.f, pc - overflow_exponent(p.num_splits));
  __syncthreads();

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1;
    const int key0 = s_begin + t * KT;
    if (t + 1 < n_tiles) {
      load_tile(stage ^ 1, key0 + KT);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (kFp8) {
      // Widen the stage's codes into the T tile (free since the previous
      // tile's closing barrier); masked keys were zero-filled: code 0 = 0.
      const uint8_t* raw = raw_s + stage * 2 * L::kRawStage;
      constexpr int kRawChunks = int(L::kRawStage / 16);
      for (int e = tid; e < 2 * kRawChunks; e += kAttnThreads) {
        const int which = e / kRawChunks, c = e % kRawChunks;
        const int jj = c / (D / 16), d = c % (D / 16) * 16;
        const uint4 w = *reinterpret_cast<const uint4*>(raw + which * L::kRawStage + c * 16);
        T* dst = (which == 0 ? k_s : v_s) + jj * L::kLdKV + d;
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          fp8x2_to<T, S>(uint16_t(words[i] & 0xffffu), dst + 4 * i);
          fp8x2_to<T, S>(uint16_t(words[i] >> 16), dst + 4 * i + 2);
        }
      }
      __syncthreads();
    }
    const int tstage = kFp8 ? 0 : stage;
    const T* kt = k_s + tstage * KT * L::kLdKV;
    T* const vt = v_s + tstage * KT * L::kLdKV;

    // ---- partly visible keys (see zero_partly_visible): a non-finite V
    // that some rows of the CTA must not see is zeroed, its contribution
    // added back after P V for the rows that see it.
    const bool partly = tile_partly_visible<KT>(w, key0, window);
    if (partly) {
      zero_partly_visible<T, D, KT, kAttnThreads>(w, key0, window, vt, L::kLdKV,
                                                  valid_s + stage * KT, bad_s);
    }

    // ---- S = Q K^T
    if constexpr (kTensorCores) {
      using namespace nvcuda;
      constexpr int kColTiles = KT / 16;
      for (int w = warp; w < (ROWS / 16) * kColTiles; w += kAttnWarps) {
        const int rt = w / kColTiles, ct = w % kColTiles;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.f);
#pragma unroll
        for (int k = 0; k < D; k += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
          wmma::load_matrix_sync(a, q_s + rt * 16 * L::kLdQ + k, L::kLdQ);
          wmma::load_matrix_sync(b, kt + ct * 16 * L::kLdKV + k, L::kLdKV);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(s_s + rt * 16 * L::kLdS + ct * 16, acc, L::kLdS,
                                wmma::mem_row_major);
      }
    } else {
      constexpr int kStep = kAttnThreads / KT;
      constexpr int kMine = ROWS / kStep;
      const int jj = tid % KT, rb = tid / KT;
      float acc[kMine];
#pragma unroll
      for (int i = 0; i < kMine; ++i) acc[i] = 0.f;
      const T* krow = kt + jj * L::kLdKV;
#pragma unroll 2
      for (int d = 0; d < D; d += kVec) {
        float kf[kVec];
#pragma unroll
        for (int v = 0; v < kVec; ++v) kf[v] = to_float(krow[d + v]);
#pragma unroll
        for (int i = 0; i < kMine; ++i) {
          const T* qr = q_s + (rb + i * kStep) * L::kLdQ + d;
#pragma unroll
          for (int v = 0; v < kVec; ++v) acc[i] = fmaf(to_float(qr[v]), kf[v], acc[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kMine; ++i) s_s[(rb + i * kStep) * L::kLdS + jj] = acc[i];
    }
    __syncthreads();

    // ---- online softmax: one warp per row, one key per lane
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + i * kAttnWarps;
      const int pos = first_pos + (row0 + r) / group;
      float x = -INFINITY;
      if (lane < KT && r < n_rows) {
        const int j = key0 + lane;
        const bool visible =
            valid_s[stage * KT + lane] && j <= pos && (window <= 0 || j > pos - window);
        if (visible) {
          float logit = s_s[r * L::kLdS + lane] * scale;
          if (cap > 0.f) logit = cap * tanhf(logit / cap);
          x = logit * kLog2e;
        }
      }
      const float m_new = fmaxf(m_row[i], warp_max(x));
      const float pr = x == -INFINITY ? 0.f : exp2f(x - m_new);
      const float alpha = m_row[i] == m_new ? 1.f : exp2f(m_row[i] - m_new);
      l_row[i] = l_row[i] * alpha + warp_sum(pr);
      m_row[i] = m_new;
      if (lane < KT) p_s[r * L::kLdP + lane] = from_float<T>(kScaleP ? pr * p_scale : pr);
      if (alpha != 1.f) {
        for (int d = lane; d < D; d += 32) o_s[r * L::kLdO + d] *= alpha;
      }
    }
    __syncthreads();

    // ---- O += P V
    if constexpr (kTensorCores) {
      using namespace nvcuda;
      constexpr int kColTiles = D / 16;
      for (int w = warp; w < (ROWS / 16) * kColTiles; w += kAttnWarps) {
        const int rt = w / kColTiles, ct = w % kColTiles;
        float* o_tile = o_s + rt * 16 * L::kLdO + ct * 16;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::load_matrix_sync(acc, o_tile, L::kLdO, wmma::mem_row_major);
#pragma unroll
        for (int k = 0; k < KT; k += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
          wmma::load_matrix_sync(a, p_s + rt * 16 * L::kLdP + k, L::kLdP);
          wmma::load_matrix_sync(b, vt + k * L::kLdKV + ct * 16, L::kLdKV);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(o_tile, acc, L::kLdO, wmma::mem_row_major);
      }
    } else {
      for (int e = tid; e < ROWS * D; e += kAttnThreads) {
        const int r = e / D, d = e % D;
        float acc = o_s[r * L::kLdO + d];
        const T* pr = p_s + r * L::kLdP;
#pragma unroll 8
        for (int jj = 0; jj < KT; ++jj)
          acc = fmaf(to_float(pr[jj]), to_float(vt[jj * L::kLdKV + d]), acc);
        o_s[r * L::kLdO + d] = acc;
      }
    }
    __syncthreads();  // stage is free for the load issued next iteration
    if (partly && bad_s[KT]) {
      // The zeroed values, read again from the cache, for the rows that see them.
      for (int e = tid; e < n_rows * D; e += kAttnThreads) {
        const int r = e / D, d = e % D;
        const int pos = first_pos + (row0 + r) / group;
        float acc = o_s[r * L::kLdO + d];
        for (int jj = 0; jj < KT; ++jj) {
          const int j = key0 + jj;
          if (!bad_s[jj] || j > pos || (window > 0 && j <= pos - window)) continue;
          const int64_t off =
              int64_t(pages[j / bs]) * block_elems + head_off + int64_t(j % bs) * D + d;
          float vx;
          if constexpr (kFp8) {
            vx = fp8_to_float<S>(v_plane[off]);
          } else {
            vx = to_float(v_plane[off]);
          }
          acc = fmaf(to_float(p_s[r * L::kLdP + jj]), vx, acc);
        }
        o_s[r * L::kLdO + d] = acc;
      }
      __syncthreads();
    }
  }

  // ---- normalise and store (directly, or as this split's partial result)
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + i * kAttnWarps;
    if (r >= n_rows) continue;
    const int flat = row0 + r;
    const int64_t token = q_begin + flat / group;
    const int64_t head = int64_t(kvh) * group + flat % group;
    const float l = l_row[i];
    const float inv = l > 0.f ? v_scale / l * unscale : 0.f;
    const float lse2 = row_lse2(m_row[i], l);
    if (p.num_splits == 1) {
      T* o = static_cast<T*>(p.out) + token * p.o_s0 + head * p.o_s1;
      for (int d = lane; d < D; d += 32)
        o[d] = from_float<T>(normalised<S>(o_s[r * L::kLdO + d], inv));
      if (p.lse != nullptr && lane == 0) p.lse[token * p.lse_s0 + head] = lse2 * kLn2;
    } else {  // carries 2^-mc, mc >= 2: far below FLT_MAX
      const int64_t prow = (int64_t(split) * p.num_tokens + token) * p.num_q_heads + head;
      float* po = p.part_o + prow * D;
      for (int d = lane; d < D; d += 32) po[d] = o_s[r * L::kLdO + d] * inv;
      if (lane == 0) p.part_lse[prow] = lse2;
    }
  }
}

// Combines the splits of every (token, q head) row: weights 2^(lse_s - max).
// One warp per row. The partial outputs carry 2^-mc (2^mc >= twice the
// splits, overflow_exponent), so that the sum of up to num_splits outputs
// near FLT_MAX cannot overflow; the normalisation multiplies 2^mc back
// (normalised: S, the stored page type, as the attention kernel's).
template <typename T, typename S>
__global__ void __launch_bounds__(128) merge_splits_kernel(const AttnParams p, int head_dim) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t num_rows = p.num_tokens * p.num_q_heads;
  const int64_t row = int64_t(blockIdx.x) * 4 + warp;
  if (row >= num_rows) return;
  const int64_t token = row / p.num_q_heads;
  const int64_t head = row % p.num_q_heads;
  float m = -INFINITY;
  // A NaN split (NaN logits) makes the row NaN; fmaxf would drop it.
  for (int s = 0; s < p.num_splits; ++s) {
    const float x = p.part_lse[s * num_rows + row];
    m = x != x || m != m ? x + m : fmaxf(m, x);
  }
  float wsum = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) wsum += exp2f(p.part_lse[s * num_rows + row] - m);
  }
  const float inv = wsum > 0.f ? 1.f / wsum * ldexpf(1.f, overflow_exponent(p.num_splits)) : 0.f;
  T* o = static_cast<T*>(p.out) + token * p.o_s0 + head * p.o_s1;
  for (int d = lane; d < head_dim; d += 32) {
    float acc = 0.f;
    if (m != -INFINITY) {
      for (int s = 0; s < p.num_splits; ++s) {
        const float w = exp2f(p.part_lse[s * num_rows + row] - m);
        acc = fmaf(w, p.part_o[(s * num_rows + row) * head_dim + d], acc);
      }
    }
    o[d] = from_float<T>(normalised<S>(acc, inv));
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[token * p.lse_s0 + head] = row_lse2(m, wsum) * kLn2;
  }
}

#ifndef PKV_CUDA_EMULATION
// Raises a kernel's dynamic shared-memory limit once per device.
template <typename Kernel>
cudaError_t ensure_smem(Kernel kernel, size_t bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (err == cudaSuccess && bit != 0) done.fetch_or(bit, std::memory_order_release);
  return err;
}

// One attention launch over the plan's grid (sequence x row tile, KV head,
// split), then the merge of the splits; either kernel. S: the stored page type.
template <typename T, int D, typename S, typename Kernel>
cudaError_t launch_over_plan(Kernel kernel, int threads, size_t smem,
                             std::atomic<uint64_t>& configured, const AttnParams& p,
                             const AttnLaunch& l, cudaStream_t s) {
  cudaError_t err = ensure_smem(kernel, smem, configured);
  if (err != cudaSuccess) return err;
  const dim3 grid(unsigned(l.num_seqs) * unsigned(p.tiles_per_seq), unsigned(p.num_kv_heads),
                  unsigned(p.num_splits));
  kernel<<<grid, threads, smem, s>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits <= 1) return err;
  const int64_t rows = p.num_tokens * p.num_q_heads;
  merge_splits_kernel<T, S><<<unsigned((rows + 3) / 4), 128, 0, s>>>(p, D);
  return cudaGetLastError();
}

template <typename T, int D, int ROWS, typename S>
cudaError_t launch_attention_rows(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  constexpr int KT = kv_tile<T, D>();
  static std::atomic<uint64_t> configured{0};
  return launch_over_plan<T, D, S>(paged_attention_kernel<T, D, ROWS, KT, S>, kAttnThreads,
                                   AttnSmem<T, D, ROWS, KT, IsFp8<S>::value>::kBytes, configured, p,
                                   l, s);
}

template <typename T, int D, bool kDecode>
cudaError_t launch_mma(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  static std::atomic<uint64_t> configured{0};
  return launch_over_plan<T, D, T>(paged_attention_mma_kernel<T, D, kDecode>, kMmaThreads,
                                   MmaSmem<T, D, kDecode>::kBytes, configured, p, l, s);
}

template <typename T, int D, typename S>
cudaError_t launch_attention_dim(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  // f16/bf16 pages run the mma.sync kernel (attention_mma.cuh) in both tiles.
  if constexpr (uses_mma_kernel<T, S>()) {
    if constexpr (D == 256) {  // the planner's fallback where the mma tiles do not fit
      if (l.generic) {
        return l.large_tile ? launch_attention_rows<T, D, large_rows(2, D), S>(p, l, s)
                            : launch_attention_rows<T, D, kSmallRows, S>(p, l, s);
      }
    }
    return l.large_tile ? launch_mma<T, D, false>(p, l, s) : launch_mma<T, D, true>(p, l, s);
  } else {
    constexpr int kLarge = large_rows(int(sizeof(T)), D);
    return l.large_tile ? launch_attention_rows<T, D, kLarge, S>(p, l, s)
                        : launch_attention_rows<T, D, kSmallRows, S>(p, l, s);
  }
}

// Head dims are compile-time (register/shared tiles); block size is not.
// S: the stored element (T, or an FP8 tag).
template <typename T, typename S = T>
cudaError_t launch_attention_typed(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  switch (l.head_dim) {
    case 64:
      return launch_attention_dim<T, 64, S>(p, l, s);
    case 80:
      return launch_attention_dim<T, 80, S>(p, l, s);
    case 96:
      return launch_attention_dim<T, 96, S>(p, l, s);
    case 128:
      return launch_attention_dim<T, 128, S>(p, l, s);
    case 256:
      return launch_attention_dim<T, 256, S>(p, l, s);
    default:
      return cudaErrorInvalidValue;
  }
}

#endif  // PKV_CUDA_EMULATION

}  // namespace cuda
}  // namespace pagedkv
