// What one CTA of either paged attention kernel (attention.cuh: generic,
// attention_mma.cuh: f16/bf16 on mma.sync) works on, and the steps both
// take the same way: its rows and key range, the page lookup of a key, the
// query tile, and the zeroing of non-finite V values some of its rows must
// not see. One definition, so that the two kernels cannot drift apart on
// the semantics the CPU backend defines.
#pragma once

#include "common.cuh"
#include "launch.h"

namespace pagedkv {
namespace cuda {

struct CtaWork {
  int kvh, split;
  int q_begin, group, row0, n_rows;
  int first_pos;       // position of the sequence's first query
  int pos_lo, pos_hi;  // positions of the CTA's first and last rows
  // This split's share of the keys any row of the CTA can see, in tiles.
  int s_begin, s_end, n_tiles;
  const int* pages;  // the sequence's page table
  int bs;
  int64_t head_off, block_elems;
};

// Fills w for the CTA (ROWS rows, KT-key tiles); false when its tile has no
// rows (uniform across the CTA: it returns at once).
template <int ROWS, int KT, int D>
__device__ __forceinline__ bool cta_work(const AttnParams& p, CtaWork& w) {
  const int seq = blockIdx.x / p.tiles_per_seq;
  const int tile = blockIdx.x % p.tiles_per_seq;
  w.kvh = blockIdx.y;
  w.split = blockIdx.z;
  w.q_begin = p.query_indptr[seq];
  const int n_q = p.query_indptr[seq + 1] - w.q_begin;
  w.group = p.group;
  w.row0 = tile * ROWS;
  if (w.row0 >= n_q * w.group) return false;
  w.n_rows = min(ROWS, n_q * w.group - w.row0);
  w.first_pos = p.context_lens[seq] - n_q;
  w.pos_lo = w.first_pos + w.row0 / w.group;
  w.pos_hi = w.first_pos + (w.row0 + w.n_rows - 1) / w.group;
  const int kv_begin = p.window > 0 ? max(0, w.pos_lo - p.window + 1) : 0;
  const int kv_end = w.pos_hi + 1;
  int chunk = (kv_end - kv_begin + p.num_splits - 1) / p.num_splits;
  chunk = (chunk + KT - 1) / KT * KT;
  w.s_begin = kv_begin + w.split * chunk;
  w.s_end = min(kv_end, w.s_begin + chunk);
  w.n_tiles = w.s_begin < w.s_end ? (w.s_end - w.s_begin + KT - 1) / KT : 0;
  w.pages = p.page_indices + p.page_indptr[seq];
  w.bs = p.block_size;
  w.head_off = int64_t(w.kvh) * w.bs * D;
  w.block_elems = int64_t(p.num_kv_heads) * w.bs * D;
  return true;
}

// Whether key j is loaded: not past the split's keys, not on a null page;
// then off is the element offset of its row (this CTA's KV head) in a plane.
template <int D>
__device__ __forceinline__ bool key_row(const CtaWork& w, int j, int64_t& off) {
  if (j >= w.s_end) return false;
  const int page = w.pages[j / w.bs];
  if (page == 0) return false;
  off = int64_t(page) * w.block_elems + w.head_off + int64_t(j % w.bs) * D;
  return true;
}

// The CTA's query rows into q_s (rows of ld elements), zero beyond n_rows.
template <typename T, int D, int ROWS, int kThreads>
__device__ __forceinline__ void fill_q_tile(const AttnParams& p, const CtaWork& w, T* q_s, int ld) {
  const T* q = static_cast<const T*>(p.q);
  for (int e = threadIdx.x; e < ROWS * D; e += kThreads) {
    const int r = e / D, d = e % D;
    T val = from_float<T>(0.f);
    if (r < w.n_rows) {
      const int flat = w.row0 + r;
      const int64_t token = w.q_begin + flat / w.group;
      const int64_t head = int64_t(w.kvh) * w.group + flat % w.group;
      val = q[token * p.q_s0 + head * p.q_s1 + d];
    }
    q_s[r * ld + d] = val;
  }
}

// Whether some rows of the CTA see a key of the tile at key0 and others do
// not (the causal diagonal, the window's first keys; never in decode, where
// all rows share one position).
template <int KT>
__device__ __forceinline__ bool tile_partly_visible(const CtaWork& w, int key0, int window) {
  return key0 + KT - 1 > w.pos_lo || (window > 0 && key0 <= w.pos_hi - window);
}

// P V adds 0 * V for a key a row cannot see, which is NaN when that V holds
// NaN or Inf (a never-written slot), and tensor cores cannot skip it per
// row. So in a partly visible tile, a non-finite V of a key not every row
// sees is zeroed in the tile (vt, rows of ld elements); bad_s[jj] marks it
// and bad_s[KT] says any was, for the kernels to add its exact contribution
// back for the rows that see it. Called by every thread; two barriers.
template <typename T, int D, int KT, int kThreads>
__device__ __forceinline__ void zero_partly_visible(const CtaWork& w, int key0, int window, T* vt,
                                                    int ld, const int* valid, int* bad_s) {
  for (int jj = threadIdx.x; jj <= KT; jj += kThreads) bad_s[jj] = 0;
  __syncthreads();
  for (int e = threadIdx.x; e < KT * D; e += kThreads) {
    const int jj = e / D, d = e % D, j = key0 + jj;
    const bool all_see = j <= w.pos_lo && (window <= 0 || j > w.pos_hi - window);
    if (!valid[jj] || all_see) continue;
    const float x = to_float(vt[jj * ld + d]);
    if (x - x != 0.f) {  // NaN or +-Inf
      vt[jj * ld + d] = from_float<T>(0.f);
      bad_s[jj] = 1;
      bad_s[KT] = 1;
    }
  }
  __syncthreads();
}

// A row's log2-LSE from its running max and sum: -inf for a row that saw
// no key (l = 0), NaN for one whose logits held NaN (l is NaN: the max skips
// NaN, the sum does not), as the CPU backend reports them.
__device__ __forceinline__ float row_lse2(float m, float l) {
  return l > 0.f ? m + log2f(l) : l == 0.f ? -INFINITY : l;
}

}  // namespace cuda
}  // namespace pagedkv
