// The paged attention kernel for f16/bf16 pages, laid out as
// FlashAttention-2 does it: the same work decomposition, masks and semantics
// as paged_attention_kernel (attention.cuh), which keeps f32 and FP8 pages.
//
// Why a second kernel: the generic one keeps O in shared memory (so that the
// online-softmax rescale needs no fragment layout) and runs the softmax one
// warp per row, a shared-memory round trip of O and six barriers per 32
// keys; it ran prefill at 3-6 % of contiguous SDPA and decode at 54-73 % of
// read bandwidth on an H100 (bench/results/nvidia-h100.md). Here S = Q K^T
// and O += P V are mma.sync m16n8k16 with operands from ldmatrix; Q, S, P,
// O and the running max/sum stay in registers, P goes from S's accumulator
// fragment to the A operand of P V without leaving the thread, and a tile
// costs two barriers. K/V tiles of KT keys are double-buffered with cp.async
// exactly as in the generic kernel (masked keys zero-filled, never read).
//
// Two modes of one template:
//  - prefill (kDecode = false): each of the 4 warps owns 32 rows (two 16-row
//    m-tiles; 16 at head dim 256) for the whole key range, 128 (64) per CTA;
//  - decode (kDecode = true): 16 rows per CTA (a decode token's GQA group),
//    each warp takes a quarter of every key tile with its own running
//    max/sum/O, merged across the warps at the end through shared memory
//    (flash-decoding inside the CTA: every K/V byte is loaded once for all
//    rows, and the 4 warps work on different keys instead of padding rows).
// Tiles that every row sees whole (most of a long context) skip the
// per-element masks.
//
// Fragment layouts (g = lane / 4, t = lane % 4) are those of the PTX ISA for
// m16n8k16 (see mma_16816 in common.cuh): a lane holds S and O for rows g
// and g + 8 of each of its warp's m-tiles, columns 2t and 2t + 1 of every
// 8-wide tile.
#pragma once

#include <type_traits>

#include "attention_cta.cuh"
#include "common.cuh"
#include "launch.h"

namespace pagedkv {
namespace cuda {

constexpr int kMmaThreads = 128;
constexpr int kMmaWarps = kMmaThreads / 32;

template <typename T, int D, bool kDecode>
struct MmaSmem {
  // 16-row m-tiles per warp: two in prefill up to head dim 128, so that every
  // K/V fragment read from shared memory feeds four mma instead of two
  // (ldmatrix bandwidth, not the tensor cores, bounded the one-m-tile tile).
  static constexpr int kMT = !kDecode && D <= 128 ? 2 : 1;
  static constexpr int kRows = kDecode ? 16 : 64 * kMT;
  // Keys per tile: S is kMT * KT/2 floats per lane in prefill (KT/8 in
  // decode). With two m-tiles, 48 (32 at head dim 128) keeps two CTAs per
  // SM (shared memory) and the registers within 255 without spills.
  static constexpr int kKT = kDecode ? 64 : kMT == 2 ? (D >= 128 ? 32 : 48) : D >= 256 ? 32 : 64;
  static constexpr int kKW = kDecode ? kKT / kMmaWarps : kKT;  // keys per warp per tile
  // Rows padded by 16 bytes: the 8 row addresses of an ldmatrix phase then
  // fall in distinct bank groups.
  static constexpr int kLd = D + 8;
  static constexpr int kLdP = kKT + 8;
  // cp.async stages. Three for decode (two tiles in flight while one is
  // computed) measured within run-to-run noise of two on an H200 (64 x 4096
  // decode at 64-67 % of read bandwidth against 62-64 %) and would not fit
  // the 99 KB of sm_86/sm_89 parts at head dim 128, so two everywhere.
  static constexpr int kStages = 2;
  static constexpr size_t kStage = size_t(kKT) * kLd * sizeof(T);
  static constexpr size_t kK = 0;  // the stages of K, then those of V
  static constexpr size_t kV = kStages * kStage;
  static constexpr size_t kQ = 2 * kStages * kStage;
  // P of one m-tile of every warp, written only when a tile needs the
  // add-back below.
  static constexpr size_t kP = align_up(kQ + size_t(kRows) * kLd * sizeof(T), 128);
  static constexpr size_t kValid = align_up(kP + size_t(kMmaWarps * 16) * kLdP * sizeof(T), 128);
  static constexpr size_t kBad = kValid + size_t(kStages) * kKT * sizeof(int);
  static constexpr size_t kBytes = align_up(kBad + (kKT + 1) * sizeof(int), 128);
  // Decode: each warp's O, max and sum, over the K/V stages once the loop is done.
  static constexpr int kLdO = D + 4;
  static constexpr size_t kMergeO = 0;
  static constexpr size_t kMergeML = size_t(kMmaWarps) * kRows * kLdO * 4;
  static_assert(!kDecode || kMergeML + 2 * kMmaWarps * kRows * 4 <= kQ, "merge fits the stages");
  static_assert(D % 16 == 0 && kKW % 16 == 0, "mma tiles");
  static_assert((kLd * sizeof(T)) % 16 == 0, "ldmatrix rows are 16-byte aligned");
};

template <typename T, int D, bool kDecode>
__global__ void __launch_bounds__(kMmaThreads) paged_attention_mma_kernel(const AttnParams p) {
  static_assert(sizeof(T) == 2, "f16 / bf16 only");
  using L = MmaSmem<T, D, kDecode>;
  constexpr int kRows = L::kRows;
  constexpr int KT = L::kKT;
  constexpr int KW = L::kKW;
  constexpr int kLd = L::kLd;
  constexpr int kVec = 8;  // elements per 16 bytes
  constexpr int kChunks = D / kVec;
  constexpr int kNT = KW / 8;  // 8-key column tiles of this warp's S
  constexpr int kDT = D / 8;   // 8-wide column tiles of O
  constexpr int kKS = D / 16;  // k-steps of Q K^T
  constexpr int kMT = L::kMT;
  constexpr bool kQInRegs = kMT == 1 && D <= 128;
  constexpr int kStages = L::kStages;

  PKV_EXTERN_SMEM(smem);
  T* k_s = reinterpret_cast<T*>(smem + L::kK);
  T* v_s = reinterpret_cast<T*>(smem + L::kV);
  T* q_s = reinterpret_cast<T*>(smem + L::kQ);
  T* p_s = reinterpret_cast<T*>(smem + L::kP);
  int* valid_s = reinterpret_cast<int*>(smem + L::kValid);
  int* bad_s = reinterpret_cast<int*>(smem + L::kBad);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int wrow = kDecode ? 0 : warp * 16 * kMT;  // this warp's first row in the CTA
  const int wkey = kDecode ? warp * KW : 0;        // this warp's first key in a tile
  CtaWork w;
  if (!cta_work<kRows, KT, D>(p, w)) return;  // uniform: this tile has no rows
  const int q_begin = w.q_begin, group = w.group, row0 = w.row0, n_rows = w.n_rows;
  const int first_pos = w.first_pos, kvh = w.kvh;
  const int split = w.split, s_begin = w.s_begin, n_tiles = w.n_tiles, bs = w.bs;
  const int* pages = w.pages;
  const int64_t head_off = w.head_off, block_elems = w.block_elems;
  const T* k_plane = static_cast<const T*>(p.k_plane);
  const T* v_plane = static_cast<const T*>(p.v_plane);

  // Returns whether any key this thread loaded is masked (past the chunk,
  // null page): such a tile takes the masked path.
  auto load_tile = [&](int stage, int key0) {
    int masked = 0;
    for (int e = tid; e < KT * kChunks; e += kMmaThreads) {
      const int jj = e / kChunks, c = e % kChunks;
      int64_t off = 0;
      const bool ok = key_row<D>(w, key0 + jj, off);
      if (ok) off += c * kVec;
      masked |= !ok;
      const int n = ok ? 16 : 0;
      cp_async16(k_s + (stage * KT + jj) * kLd + c * kVec, k_plane + off, n);
      cp_async16(v_s + (stage * KT + jj) * kLd + c * kVec, v_plane + off, n);
      if (c == 0) valid_s[stage * KT + jj] = ok;
    }
    cp_async_commit();
    return masked;
  };

  // Bit s: a key this thread loaded into stage s is masked (a register,
  // not an array indexed at run time, which would live in local memory).
  int masked_bits = 0;
  auto load_or_skip = [&](int tile_index) {
    if (tile_index < n_tiles) {
      const int st = tile_index % kStages;
      const int m = load_tile(st, s_begin + tile_index * KT);
      masked_bits = (masked_bits & ~(1 << st)) | (m << st);
    } else {
      cp_async_commit();  // an empty group keeps the wait counts uniform
    }
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) load_or_skip(st);

  fill_q_tile<T, D, kRows, kMmaThreads>(p, w, q_s, kLd);

  // This lane's rows: m-tile mt, h = 0: row g of its 16, h = 1: row g + 8.
  int pos_r[kMT][2];
  bool live_r[kMT][2];
  float m_r[kMT][2], l_r[kMT][2];  // l: this lane's share of the row sum
  float o[kMT][kDT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wrow + mt * 16 + g + 8 * h;
      live_r[mt][h] = r < n_rows;
      pos_r[mt][h] = first_pos + (row0 + r) / group;
      m_r[mt][h] = -INFINITY;
      l_r[mt][h] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < kDT; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }

  const float scale = p.softmax_scale;
  const float scale_log2 = scale * kLog2e;
  const float cap = p.softcap;
  const int window = p.window;
  // bf16 pages: the weights enter P V times 2^-pc, 2^pc >= twice the keys
  // of this split (overflow_exponent), folded into the softmax's offset: the
  // running max is kept as max + pc, so every weight 2^(x - m) and the sum l
  // carry 2^-pc alike and o / l and m + log2 l are unchanged; one add per
  // row and tile. A split's partial output carries 2^-mc on top (2^mc >=
  // twice the splits), which merge_splits_kernel undoes.
  constexpr bool kScaleP = scales_pv<T, T>();
  const float pc = kScaleP ? float(overflow_exponent(w.s_end - w.s_begin)) : 0.f;
  const float unscale = ldexpf(1.f, -overflow_exponent(p.num_splits));
  const T* q_row = q_s + (wrow + (lane & 15)) * kLd + (lane >> 4) * 8;
  __syncthreads();
  uint32_t qf[kQInRegs ? kKS : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int k = 0; k < kKS; ++k) ldsm_x4<false>(qf[k], q_row + k * 16);
  }

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % kStages;
    const int key0 = s_begin + t * KT;
    // Into the stage tile t - 1 used: every thread passed its closing barrier.
    load_or_skip(t + kStages - 1);
    cp_async_wait<kStages - 1>();  // tile t's group is complete
    const bool any_masked = __syncthreads_or((masked_bits >> stage) & 1) != 0;
    const T* kt = k_s + stage * KT * kLd;
    T* const vt = v_s + stage * KT * kLd;
    const int* valid = valid_s + stage * KT;

    // Partly visible keys (see zero_partly_visible): a non-finite V that
    // some rows must not see is zeroed, its contribution added back after
    // P V for the rows that see it, as in the generic kernel.
    const bool partly = tile_partly_visible<KT>(w, key0, window);
    const bool full = !partly && !any_masked;  // every row sees every key of the tile
    if (partly) {
      zero_partly_visible<T, D, KT, kMmaThreads>(w, key0, window, vt, kLd, valid, bad_s);
    }

    // ---- S = Q K^T (kMT x 16 rows x KW keys per warp)
    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int n = 0; n < kNT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < kKS; ++k) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kQInRegs) {
          a[mt][0] = qf[k][0], a[mt][1] = qf[k][1], a[mt][2] = qf[k][2], a[mt][3] = qf[k][3];
        } else {
          ldsm_x4<false>(a[mt], q_row + mt * 16 * kLd + k * 16);
        }
      }
#pragma unroll
      for (int n2 = 0; n2 < kNT / 2; ++n2) {
        // Keys wkey + n2*16 .. +15, dims 16k .. +15: b of column tiles 2 n2, 2 n2 + 1.
        uint32_t b[4];
        ldsm_x4<false>(b, kt + (wkey + n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * kLd + k * 16 +
                              ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(s[mt][2 * n2], a[mt], b[0], b[1]);
          mma_16816<T>(s[mt][2 * n2 + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // ---- online softmax over this lane's rows
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
        if (full) {
#pragma unroll
          for (int n = 0; n < kNT; ++n) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float x = s[mt][n][2 * h + c];
              x = cap > 0.f ? cap * tanhf(x * scale / cap) * kLog2e : x * scale_log2;
              s[mt][n][2 * h + c] = x;
              mx = fmaxf(mx, x);
            }
          }
        } else {
#pragma unroll
          for (int n = 0; n < kNT; ++n) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int jj = wkey + n * 8 + 2 * t4 + c, j = key0 + jj;
              const int pos = pos_r[mt][h];
              float x = -INFINITY;
              if (live_r[mt][h] && valid[jj] && j <= pos && (window <= 0 || j > pos - window)) {
                const float y = s[mt][n][2 * h + c];
                x = cap > 0.f ? cap * tanhf(y * scale / cap) * kLog2e : y * scale_log2;
              }
              s[mt][n][2 * h + c] = x;
              mx = fmaxf(mx, x);
            }
          }
        }
        mx = fmaxf(mx, shfl_xor(mx, 1));
        mx = fmaxf(mx, shfl_xor(mx, 2));
        if constexpr (kScaleP) mx += pc;  // -inf stays -inf
        const float m_new = fmaxf(m_r[mt][h], mx);
        alpha[h] = m_r[mt][h] == m_new ? 1.f : exp2f(m_r[mt][h] - m_new);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float x = s[mt][n][2 * h + c];
            const float pr = x == -INFINITY ? 0.f : exp2f(x - m_new);
            s[mt][n][2 * h + c] = pr;
            sum += pr;
          }
        }
        l_r[mt][h] = l_r[mt][h] * alpha[h] + sum;
        m_r[mt][h] = m_new;
      }
#pragma unroll
      for (int n = 0; n < kDT; ++n) {
        o[mt][n][0] *= alpha[0];
        o[mt][n][1] *= alpha[0];
        o[mt][n][2] *= alpha[1];
        o[mt][n][3] *= alpha[1];
      }
    }

    // ---- O += P V: S's accumulator fragments of column tiles 2j and
    // 2j + 1 are the A fragment of the warp's keys 16j .. 16j + 15.
#pragma unroll
    for (int j = 0; j < KW / 16; ++j) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = pack2<T>(s[mt][2 * j][0], s[mt][2 * j][1]);
        a[mt][1] = pack2<T>(s[mt][2 * j][2], s[mt][2 * j][3]);
        a[mt][2] = pack2<T>(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
        a[mt][3] = pack2<T>(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
      }
#pragma unroll
      for (int n2 = 0; n2 < kDT / 2; ++n2) {
        // Keys (rows of V) wkey + 16j .. +15, dims n2*16 .. +15, transposed.
        uint32_t b[4];
        ldsm_x4<true>(b, vt + (wkey + j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + n2 * 16 +
                             (lane >> 4) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(o[mt][2 * n2], a[mt], b[0], b[1]);
          mma_16816<T>(o[mt][2 * n2 + 1], a[mt], b[2], b[3]);
        }
      }
    }

    if (partly && bad_s[KT]) {
      // The zeroed values, read again from the cache, times P as the tensor
      // cores saw it (rounded to T), for the rows that see them; one m-tile
      // at a time through the warp's 16 rows of P in shared memory.
      T* pw = p_s + warp * 16 * L::kLdP;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t w = pack2<T>(s[mt][n][2 * h], s[mt][n][2 * h + 1]);
            memcpy(pw + (g + 8 * h) * L::kLdP + wkey + n * 8 + 2 * t4, &w, 4);
          }
        }
        __syncthreads();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!live_r[mt][h]) continue;
          const int pos = pos_r[mt][h];
          const T* prow = pw + (g + 8 * h) * L::kLdP;
          for (int jj = wkey; jj < wkey + KW; ++jj) {
            const int j = key0 + jj;
            if (!bad_s[jj] || j > pos || (window > 0 && j <= pos - window)) continue;
            const float pj = to_float(prow[jj]);
            const int64_t base =
                int64_t(pages[j / bs]) * block_elems + head_off + int64_t(j % bs) * D;
#pragma unroll
            for (int n = 0; n < kDT; ++n) {
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                o[mt][n][2 * h + c] =
                    fmaf(pj, to_float(v_plane[base + n * 8 + 2 * t4 + c]), o[mt][n][2 * h + c]);
              }
            }
          }
        }
        __syncthreads();  // the next m-tile's P goes where this one was
      }
    }
    __syncthreads();  // the stage is free for the load issued next iteration
  }

  // This lane's full row sums (the 4 lanes of a row hold a share each).
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_r[mt][h] += shfl_xor(l_r[mt][h], 1);
      l_r[mt][h] += shfl_xor(l_r[mt][h], 2);
    }
  }

  if constexpr (kDecode) {
    // Merge the warps' partial results (each saw a quarter of every tile):
    // O = sum_w 2^(m_w - m) O_w, l = sum_w 2^(m_w - m) l_w. The K/V stages
    // are free (the loop ended on a barrier, or never ran).
    float* mo = reinterpret_cast<float*>(smem + L::kMergeO);
    float* mm = reinterpret_cast<float*>(smem + L::kMergeML);
    float* ml = mm + kMmaWarps * kRows;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      if (t4 == 0) {
        mm[warp * kRows + r] = m_r[0][h];
        ml[warp * kRows + r] = l_r[0][h];
      }
#pragma unroll
      for (int n = 0; n < kDT; ++n) {
        mo[(warp * kRows + r) * L::kLdO + n * 8 + 2 * t4] = o[0][n][2 * h];
        mo[(warp * kRows + r) * L::kLdO + n * 8 + 2 * t4 + 1] = o[0][n][2 * h + 1];
      }
    }
    __syncthreads();
    for (int e = tid; e < n_rows * D; e += kMmaThreads) {
      const int r = e / D, d = e % D;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) m = fmaxf(m, mm[w * kRows + r]);
      float l = 0.f, acc = 0.f;
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) {
        // 0 for a warp that saw no finite logit, whose l and O are 0 (no
        // key) or NaN (NaN logits: the max skips them, the sum does not),
        // which 0 * NaN keeps; with no finite logit in any warp, their sum.
        const float wt = m == -INFINITY ? 1.f : exp2f(mm[w * kRows + r] - m);
        l = fmaf(wt, ml[w * kRows + r], l);
        acc = fmaf(wt, mo[(w * kRows + r) * L::kLdO + d], acc);
      }
      const int flat = row0 + r;
      const int64_t token = q_begin + flat / group;
      const int64_t head = int64_t(kvh) * group + flat % group;
      const float inv = l > 0.f ? 1.f / l * unscale : 0.f;
      const float lse2 = row_lse2(m, l);
      if (p.num_splits == 1) {
        T* out = static_cast<T*>(p.out) + token * p.o_s0 + head * p.o_s1;
        out[d] = from_float<T>(normalised<T>(acc, inv));
        if (p.lse != nullptr && d == 0) p.lse[token * p.lse_s0 + head] = lse2 * kLn2;
      } else {
        const int64_t prow = (int64_t(split) * p.num_tokens + token) * p.num_q_heads + head;
        p.part_o[prow * D + d] = acc * inv;
        if (d == 0) p.part_lse[prow] = lse2;
      }
    }
  } else {
    // ---- normalise and store (directly, or as this split's partial result)
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!live_r[mt][h]) continue;
        const float l = l_r[mt][h];
        const int flat = row0 + wrow + mt * 16 + g + 8 * h;
        const int64_t token = q_begin + flat / group;
        const int64_t head = int64_t(kvh) * group + flat % group;
        const float inv = l > 0.f ? 1.f / l * unscale : 0.f;
        const float lse2 = row_lse2(m_r[mt][h], l);
        if (p.num_splits == 1) {
          T* out = static_cast<T*>(p.out) + token * p.o_s0 + head * p.o_s1;
#pragma unroll
          for (int n = 0; n < kDT; ++n) {
            out[n * 8 + 2 * t4] = from_float<T>(normalised<T>(o[mt][n][2 * h], inv));
            out[n * 8 + 2 * t4 + 1] = from_float<T>(normalised<T>(o[mt][n][2 * h + 1], inv));
          }
          if (p.lse != nullptr && t4 == 0) p.lse[token * p.lse_s0 + head] = lse2 * kLn2;
        } else {
          const int64_t prow = (int64_t(split) * p.num_tokens + token) * p.num_q_heads + head;
          float* po = p.part_o + prow * D;
#pragma unroll
          for (int n = 0; n < kDT; ++n) {
            po[n * 8 + 2 * t4] = o[mt][n][2 * h] * inv;
            po[n * 8 + 2 * t4 + 1] = o[mt][n][2 * h + 1] * inv;
          }
          if (t4 == 0) p.part_lse[prow] = lse2;
        }
      }
    }
  }
}

}  // namespace cuda
}  // namespace pagedkv
