// MLA (multi-head latent attention, DeepSeek V2/V3) on the CPU: the latent
// cache write and absorbed attention. The kernels take a latent plane and a
// page table, never a pool, so a pool holding several KV groups can call
// them on any group with MLA geometry.
//
// Storage. One plane per layer, [num_blocks, block_size, R + P] of dtype T
// (f32, f16, bf16): row slot % bs of block slot / bs holds the token's
// latent c (R = kv_lora_rank) followed by its rotary key pe (P =
// qk_rope_head_dim).
//
// Write: for each token t with slot = slot_mapping[t] >= 0, kv_c[t] and
// k_pe[t] are copied bit-exact into that row; -1 is padding. Nothing else
// is written.
//
// Attention (absorbed). q_latent [N, H, R], q_pe [N, H, P], out [N, H, R]
// of T; positions and causal visibility as impl/cpu/attention.h (query row
// i of a sequence with L tokens and n_q queries is position L - n_q + i and
// sees keys 0..p). With s = softmax_scale, in f32:
//   x_k = (s * q_latent) . c_k + (s * q_pe) . pe_k
//   out = sum_k softmax(x)_k c_k   (online softmax, keys in position order)
// On f32 and bf16 planes the weights in that sum carry a factor 2^-e (2^e
// >= twice the keys the item's last query sees, undone at the end): exact
// short of underflow, it keeps latents near FLT_MAX from overflowing the
// f32 accumulator (as impl/cpu/attention.h).
//   lse = m + log(l)               (natural log, optional)
// out rounded to T (nearest even). Only rows < L are read, so NaN in unused
// slots of the last page cannot leak.
//
// Threads: items (sequence, tile of up to 8 queries, block of up to 16
// heads); each widens a chunk of keys to f32 once and scores it against
// every (query, head) row of the item, so one latent load serves up to 128
// dot products.
#pragma once

#include <cstdint>

#include "cpu/cpu_backend.h"
#include "cpu/thread_pool.h"
#include "kernel_types.h"

namespace pagedkv {
namespace cpu {

// One layer's latent plane.
struct MlaCache {
  void* base;
  int32_t num_blocks, block_size;
  int32_t rank, rope;  // R, P; row width R + P
  DType dtype;
};

// Vector leaf kernels (mla_ops_*.cpp), f32 throughout.
struct MlaOps {
  // s[r * lds + j] = q_r . c_j for r < rows, j < nk; q rows and c rows are
  // d floats apart and d long.
  void (*scores)(const float* q, int32_t rows, const float* c, int32_t nk, int32_t d, float* s,
                 int32_t lds);
  // acc_r[0..w) = alpha[r] * acc_r + sum_j p[r * ldp + j] c_j[0..w); acc
  // rows w apart, c rows d apart.
  void (*accumulate)(const float* p, int32_t rows, int32_t ldp, const float* c, int32_t nk,
                     int32_t d, int32_t w, const float* alpha, float* acc);
  // dst[0..n) = src widened to f32 (src f16 or bf16).
  void (*widen)(const void* src, DType dtype, float* dst, int64_t n);
  // The attention kernels' ISA: mla_attend runs its online-softmax step
  // (KernelTable::softmax, vectorised exp) on the scores.
  CpuIsa isa;
};

const MlaOps& mla_ops(CpuIsa resolved);
const MlaOps& mla_ops_scalar();
const MlaOps* mla_ops_avx2();    // nullptr where not compiled
const MlaOps* mla_ops_avx512();  // nullptr where not compiled

void mla_write(ThreadPool& pool, const MlaCache& cache, const PlanView& plan, const Tensor3& kv_c,
               const Tensor3& k_pe);
void mla_attend(ThreadPool& pool, const MlaOps& ops, const MlaCache& cache, const PlanView& plan,
                const Tensor3& q_latent, const Tensor3& q_pe, const Tensor3& out,
                const AttentionArgs& args);

// The latent plane of layer in an MLA arena whose rows are rank + rope wide.
inline MlaCache mla_cache(const KvArena& arena, int32_t layer, int32_t rank) {
  const KvLayout& l = arena.layout;
  return MlaCache{arena.plane(layer, 0), l.num_blocks, l.block_size, rank,
                  l.head_dim - rank,     l.dtype};
}

}  // namespace cpu
}  // namespace pagedkv
