// CPU paged attention and cache writes: the reference semantics. The CUDA
// kernels implement exactly this; their tests compare against these.
//
// Shapes. One layer's K and V planes are [num_blocks, Hkv, bs, D] of the
// cache dtype T (f32, f16 or bf16). q and out are [num_tokens, Hq, D]
// (strided token/head dims, unit innermost); Hq = G * Hkv, G >= 1. Query
// head h reads KV head h / G (consecutive query heads share a KV head: MHA
// G = 1, GQA, MQA Hkv = 1).
//
// Positions. Sequence s has L = context_lens[s] tokens and
// n_q = query_indptr[s+1] - query_indptr[s] queries (n_q <= L); query row
// t = query_indptr[s] + i, 0 <= i < n_q, is the token at position
// p = L - n_q + i. Decode (n_q = 1), prefill (n_q = L) and chunked prefill
// over a cached prefix (1 < n_q < L) are the same rule. The key/value at
// position k < L is row k % bs of block page_indices[page_indptr[s] + k/bs].
//
// Visibility. Query p sees key k iff k <= p (causal) and, with a sliding
// window W > 0, k > p - W; i.e. max(0, p - W + 1) <= k <= p. Every query
// sees at least its own key.
//
// Logits (all arithmetic in f32; T values are widened exactly):
//   x = (scale * q) . k              scale = AttentionArgs::softmax_scale
//   x = c * tanh(x / c)              only if c = logit_softcap > 0
// (the avx512bf16 kernels compute scale * (q . k) for bf16 q and a bf16 or
// FP8 cache, FP8 widened to bf16 exactly: the same up to f32 rounding;
// vdpbf16ps reads bf16 subnormals as 0),
// i.e. the softmax scale is applied BEFORE the soft-cap, as FlashAttention,
// FlashInfer, vLLM and Gemma-2 do; the softmax itself then uses no further
// scale. Invisible keys get weight exactly 0 (their logits are -inf after
// the cap, never c * tanh(-inf)).
//
// Output: out[t, h] = sum_k softmax(x)_k * v_k over the visible keys, with
// an online softmax (running max m, running sum l, f32 accumulator), keys
// in increasing position order, rounded to out's dtype (round to nearest
// even; f16 overflows to inf). On f32 and bf16 caches the weights in P V
// carry a factor 2^-c (2^c >= twice the most keys a row sees, undone at the
// end) so that V values near FLT_MAX cannot overflow the f32 accumulator.
//
// LSE (optional): lse[t * lse_stride0 + h] = m + log(l) = natural log of
// sum_k exp(x_k) over the visible keys of the final (scaled, capped)
// logits, in f32. Not log2, not of the unscaled q . k.
//
// Work items. A (sequence, KV head, row tile) each; a decode-like sequence
// (its rows fit one tile per head) takes up to 8 KV heads in one item when
// the step has enough items for the threads and the sequence is a small
// share of the step's work (attention.cpp, build_tiles): such an item walks
// each step's pages head after head, reading a block's adjacent K and V
// slices in runs. Split-KV. When there are fewer items than 4 per thread,
// a one-head item may be split along its pages; partial states merge as
// M = max m_i, l = sum l_i e^(m_i - M), out = sum acc_i e^(m_i - M) / l,
// lse = M + log(l). Results are deterministic for a given backend
// configuration; they differ across thread counts only by f32 rounding.
//
// Memory touched. Only positions < L are read, and for a query tile only
// pages holding a position in [max(0, p_first - W + 1), p_last]. In
// particular a page wholly before the window of the step's first query of
// its sequence (where the pool puts the null block 0) is never read, nor
// are the unused slots after position L - 1 in the last page. NaN there
// cannot leak into the output.
//
// Cache write: for each token t with slot = slot_mapping[t] >= 0, k[t, h]
// and v[t, h] are copied (bit-exact, same dtype) to row slot % bs of block
// slot / bs, KV head h, for every h. slot -1 is padding: skipped. Nothing
// else is written.
//
// FP8 caches (E4M3, E5M2; fp8.h): the write stores each value divided by
// its head's scale (KvArena::scales), encoded round-to-nearest-even and
// saturating; attention reads code * scale, with the K scale folded into
// q's scaling (x = (scale * k_scale * q) . code, or (scale * k_scale) *
// (q . code) on the bf16 dot-product path) and the V scale into the
// output's normalisation: the same as dequantising every element, up to
// f32 rounding. q and out are f32, f16 or bf16.
#pragma once

#include <cstdint>

#include "backend.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

namespace pagedkv {
namespace cpu {

struct AttentionConfig {
  const KernelTable* table;
  int32_t min_split_keys;
};

void attend(ThreadPool& pool, const AttentionConfig& config, const KvArena& arena, int32_t layer,
            const PlanView& plan, const Tensor3& q, const Tensor3& out, const AttentionArgs& args);

void write_kv(ThreadPool& pool, const KvArena& arena, int32_t layer, const PlanView& plan,
              const Tensor3& k, const Tensor3& v);

// FP8 cache (fp8.h): k and v are f32, f16 or bf16 (each its own); each
// row is divided by its head's scale and encoded, round to nearest even,
// saturating. Slots and shapes as write_kv.
void write_kv_fp8(ThreadPool& pool, const KernelTable& table, const KvArena& arena, int32_t layer,
                  const PlanView& plan, const Tensor3& k, const Tensor3& v);

// Error kInvalidArgument unless every slot_mapping entry is -1 or a slot.
void check_write_slots(const KvArena& arena, const PlanView& plan);

void copy_blocks(ThreadPool& pool, const KvArena& arena, const int32_t* src, const int32_t* dst,
                 int64_t num_pairs);

void swap_blocks(ThreadPool& pool, const KvArena& arena, const int32_t* blocks, int64_t num_blocks,
                 void* host, bool to_host);

}  // namespace cpu
}  // namespace pagedkv
