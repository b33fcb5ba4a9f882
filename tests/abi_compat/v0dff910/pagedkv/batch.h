/* pagedkv/batch.h: step plans, cache writes and paged attention.
 *
 * One engine step: append tokens to the scheduled sequences, build one step
 * plan for them with pkv_batch_prepare (slot mapping, CSR page table,
 * context lengths, query offsets; pending copy-on-write copies run here),
 * then per layer pkv_cache_write followed by pkv_attention_forward. Decode,
 * prefill and chunked prefill mix freely in one plan.
 *
 * When tokens count as computed: when the engine says the step's writes
 * happened, never at prepare. For a pool with storage, a plan on which
 * pkv_cache_write succeeded for every layer is committed by that last
 * write; pkv_batch_commit commits explicitly (K/V written by other means);
 * a plan destroyed otherwise counts as aborted. A manager-only pool
 * (num_layers 0: the engine writes K/V elsewhere) needs pkv_batch_commit,
 * or pkv_batch_abort if the step failed; for ABI-1 callers a manager-only
 * plan destroyed with neither counts as committed. So an engine loop that
 * destroys its plan on an exception caches nothing it did not write, except
 * a manager-only engine that neither commits nor aborts. Commit the step
 * before preparing the next one over the same sequences: the next plan's
 * context must be written (see pkv_batch_prepare).
 */
#ifndef PAGEDKV_BATCH_H
#define PAGEDKV_BATCH_H

#include "pagedkv/common.h"
#include "pagedkv/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_batch pkv_batch;

/* Builds the plan for seqs[i] with query_counts[i] new tokens each: the last
 * query_counts[i] tokens of each sequence (1 for decode, the chunk for
 * prefill) are the queries, attending over all of the sequence's tokens.
 * Runs pending copy-on-write block copies on stream (a cudaStream_t for CUDA
 * pools; NULL on CPU). The plan keeps the pool's internals alive; if one of
 * its sequences is appended to, truncated or freed afterwards, the plan is
 * stale and its calls return PKV_E_INVALID_STATE.
 *
 * Nothing counts as computed until the plan is committed (above). Every
 * context token (before a sequence's queries) must have written K/V (a
 * committed step, a written prefix hit, a copy or swap-in) or be a query of
 * another sequence of this same plan; otherwise PKV_E_INVALID_STATE names
 * the sequence and the token range, and the engine reschedules those
 * tokens as queries (pkv_seq_info.num_computed_tokens tells where to
 * start). With a sliding window, queries whose keys the window released are
 * rejected (PKV_E_INVALID_ARGUMENT). */
PKV_API pkv_status pkv_batch_prepare(pkv_pool* pool, const pkv_seq_id* seqs,
                                     const uint32_t* query_counts, uint32_t num_seqs, void* stream,
                                     pkv_batch** out);

/* The step's cache writes happened (on the engine's streams, in order
 * before any later plan's reads): its query tokens count as computed, their
 * slots are written, full blocks become prefix hits, the sliding window can
 * advance. Sequences freed or truncated since prepare (and blocks their
 * tables no longer name) are skipped: their tokens stay uncomputed.
 * Idempotent; PKV_E_INVALID_STATE after pkv_batch_abort or when the pool
 * was destroyed. A pool with storage commits by itself when
 * pkv_cache_write succeeded for every layer. */
PKV_API pkv_status pkv_batch_commit(pkv_batch* batch);

/* The step failed before its writes (e.g. the model raised): nothing of it
 * counts as computed. Undoes nothing else: appended tokens stay, uncomputed,
 * and the next plan must compute them. Idempotent; PKV_E_INVALID_STATE if
 * the step was already committed (its writes happened; they stay valid). */
PKV_API pkv_status pkv_batch_abort(pkv_batch* batch);

/* NULL is a no-op. Without a prior commit or abort: a pool with storage
 * counts the step as aborted unless every layer was written; a manager-only
 * pool counts it as committed (ABI 1). On a CUDA pool the plan's device arrays are released
 * stream-ordered on the stream given to pkv_batch_prepare (no device
 * synchronisation): kernels that read the plan on other streams must be
 * ordered before later work on that stream, as with any stream-ordered
 * allocation. */
PKV_API void pkv_batch_destroy(pkv_batch* batch);

typedef struct pkv_batch_info {
  uint32_t struct_size;
  uint32_t num_seqs;
  uint64_t num_tokens;  /* total queries = rows of q, k, v, out */
  uint64_t num_pages;   /* entries in the CSR page table */
  uint64_t max_context; /* longest sequence in the plan */
  uint32_t max_query;   /* largest query count */
  uint32_t block_size;
} pkv_batch_info;

PKV_API void pkv_batch_info_init(pkv_batch_info* info);
PKV_API pkv_status pkv_batch_get_info(const pkv_batch* batch, pkv_batch_info* out);

/* The plan's arrays, for engines bringing their own kernels. All live on the
 * pool's device and stay valid until pkv_batch_destroy. They are READ-ONLY
 * (treat out->data as const): they are the callers' copy, and the library's
 * own kernels and checks use a private copy, so a write into them can never
 * make a library call read or write out of bounds (it only misleads the
 * writer's own kernels). */
#define PKV_PLAN_SLOT_MAPPING 0  /* i64 [num_tokens]: block_id*block_size+offset */
#define PKV_PLAN_QUERY_INDPTR 1  /* i32 [num_seqs+1]: query row offsets */
#define PKV_PLAN_PAGE_INDPTR 2   /* i32 [num_seqs+1]: offsets into page ids */
#define PKV_PLAN_PAGE_INDICES 3  /* i32 [num_pages]: block ids in order */
#define PKV_PLAN_LAST_PAGE_LEN 4 /* i32 [num_seqs]: tokens in each last page */
#define PKV_PLAN_CONTEXT_LENS 5  /* i32 [num_seqs]: tokens of each sequence */

PKV_API pkv_status pkv_batch_plan_tensor(const pkv_batch* batch, uint32_t which, pkv_tensor* out);

/* Every tensor argument below is checked before a kernel sees it: dtype,
 * device, shape, innermost stride 1, non-negative strides, an extent
 * (byte_offset and the last element) that fits int64 and the address space,
 * data + byte_offset aligned to the dtype, sizes within int32; outputs (out,
 * lse) with no two elements on one byte and overlapping neither q, each
 * other nor the pool's KV storage; k and v not overlapping the storage of
 * the layer they are written to (another layer's storage may be read).
 * PKV_E_INVALID_ARGUMENT names the argument.
 *
 * Threads: cache writes take the pool's KV lock exclusively, attention (and
 * pkv_pool_swap_blocks out) shared, so a read of a block never sees half of
 * a write another thread makes on a CPU pool (docs/threading.md). */

/* Scatters the step's new keys and values, k and v [num_tokens, num_kv_heads,
 * head_dim] of the pool's dtype and device (innermost stride 1), into their
 * slots of layer. The call that completes every layer commits the step. */
PKV_API pkv_status pkv_cache_write(pkv_batch* batch, uint32_t layer, const pkv_tensor* k,
                                   const pkv_tensor* v, void* stream);

typedef struct pkv_attention_params {
  uint32_t struct_size;    /* set by _init */
  float softmax_scale;     /* 0 = 1/sqrt(head_dim) */
  uint32_t sliding_window; /* tokens; 0 = none. A query at position p sees
                              keys k with p - sliding_window < k <= p */
  float logit_softcap;     /* 0 = none; else logits = c * tanh(logits / c) */
} pkv_attention_params;

PKV_API void pkv_attention_params_init(pkv_attention_params* params);

/* Paged attention for every query of the plan: q [num_tokens, num_q_heads,
 * head_dim] (num_q_heads a multiple of num_kv_heads: MHA, GQA, MQA), out of
 * the same shape and dtype. Each query attends causally over its sequence's
 * cached tokens and the new ones up to itself. lse (NULL = not wanted) gets
 * f32 [num_tokens, num_q_heads] natural-log sum-exp of the scaled logits.
 * params NULL = defaults. */
PKV_API pkv_status pkv_attention_forward(pkv_batch* batch, uint32_t layer, const pkv_tensor* q,
                                         const pkv_tensor* out, const pkv_tensor* lse,
                                         const pkv_attention_params* params, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_BATCH_H */
