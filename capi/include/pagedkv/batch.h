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
/* pkv_batch_info_init's defaults into exactly size bytes (pass sizeof *info), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_batch_info_init_sized(pkv_batch_info* info, size_t size);
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
 * slots of layer. The call that completes every layer commits the step.
 * FP8 pools take f32, f16 or bf16 k and v (each its own) and store
 * x / scale (the layer's, or the layer and head's, k or v scale) rounded
 * to nearest even, saturated to the finite maximum (448 for E4M3, 57344
 * for E5M2; infinities too); NaN is stored as the NaN code 0x7f, as CUDA's
 * __NV_SATFINITE conversion does. */
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
/* pkv_attention_params_init's defaults into exactly size bytes (pass sizeof *params), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_attention_params_init_sized(pkv_attention_params* params, size_t size);

/* Paged attention for every query of the plan: q [num_tokens, num_q_heads,
 * head_dim] (num_q_heads a multiple of num_kv_heads: MHA, GQA, MQA), out of
 * the same shape and dtype. Each query attends causally over its sequence's
 * cached tokens and the new ones up to itself. lse (NULL = not wanted) gets
 * f32 [num_tokens, num_q_heads] natural-log sum-exp of the scaled logits.
 * The kernels index a sequence's query rows per KV head with int32: q heads
 * per KV head times the plan's max_query above 2^31 - 1 is
 * PKV_E_INVALID_ARGUMENT.
 * params NULL = defaults. On an FP8 pool q is f32, f16 or bf16 (CUDA pool:
 * f16 or bf16, else PKV_E_UNSUPPORTED) and out has q's dtype; keys and values are read as code *
 * scale (the K scale is folded into q's scaling and the V scale into the output's normalisation,
 * which equals dequantising every element up to f32 rounding). */
PKV_API pkv_status pkv_attention_forward(pkv_batch* batch, uint32_t layer, const pkv_tensor* q,
                                         const pkv_tensor* out, const pkv_tensor* lse,
                                         const pkv_attention_params* params, void* stream);

/* What a model needs besides the page table, as read-only views like the
 * PKV_PLAN_* arrays (on the pool's device, valid until pkv_batch_destroy;
 * the library never reads them). Built on the first call for a plan (steps
 * that never ask pay nothing); on a CUDA pool uploaded then, ordered on the
 * stream given to pkv_batch_prepare.
 *
 * pkv_batch_token_positions: i64 [num_tokens], the position in its
 * sequence (0-based token index) of each query row: the position ids for a
 * model's rotary embedding. Row r of sequence s is position
 * context_lens[s] - (query_indptr[s+1] - r).
 *
 * pkv_batch_last_token_indices: i64 [num_seqs], the query row of each
 * sequence's last scheduled token (query_indptr[s+1] - 1): the rows whose
 * hidden states give the logits to sample from. */
PKV_API pkv_status pkv_batch_token_positions(const pkv_batch* batch, pkv_tensor* out);
PKV_API pkv_status pkv_batch_last_token_indices(const pkv_batch* batch, pkv_tensor* out);

/* ------------------------------------------------ MLA (PKV_KV_LAYOUT_MLA) */

/* Scatters the step's latents into layer's tensor of an MLA pool: kv_c
 * [num_tokens, kv_lora_rank] (the compressed KV, after its RMSNorm) and
 * k_pe [num_tokens, qk_rope_head_dim] (the rotary key, after RoPE), both of
 * the pool's dtype and device, innermost stride 1. Row t goes to slot
 * slot_mapping[t] as [kv_c | k_pe]; padding slots (-1) are skipped. Commits
 * the step like pkv_cache_write: the call that completes every layer (MLA
 * writes only) commits it. PKV_E_INVALID_STATE on a pool that is not MLA. */
PKV_API pkv_status pkv_mla_cache_write(pkv_batch* batch, uint32_t layer, const pkv_tensor* kv_c,
                                       const pkv_tensor* k_pe, void* stream);

/* MLA attention in the absorbed form (DeepSeek-V2 appendix; vLLM's
 * FlashMLA / TRITON_MLA decode): q_latent [num_tokens, num_heads,
 * kv_lora_rank] is q_nope already multiplied by W_UK, q_pe [num_tokens,
 * num_heads, qk_rope_head_dim] the rotary query (any num_heads in
 * [1, 4096]; every head reads the one latent). For each query and head,
 *   x_k = softmax_scale * (q_latent . c_k + q_pe . pe_k)
 *   out_latent = sum_k softmax(x)_k * c_k        [num_tokens, num_heads, kv_lora_rank]
 * over the sequence's cached and new tokens up to itself (causal), as
 * pkv_attention_forward; decode, prefill and chunked prefill in one varlen
 * call through the same plan. The caller applies W_UV to out. q_latent,
 * q_pe and out have the pool's dtype (f32 accumulation, out rounded to
 * nearest even); lse (NULL = not wanted) gets f32 [num_tokens, num_heads]
 * natural-log sum-exp of the scaled logits. params is required:
 * softmax_scale > 0 (the model's, e.g. 1/sqrt(qk_nope_head_dim +
 * qk_rope_head_dim) times YaRN's mscale^2: the latent width does not
 * determine it), sliding_window and logit_softcap 0 (else
 * PKV_E_UNSUPPORTED). PKV_E_INVALID_STATE on a pool that is not MLA. */
PKV_API pkv_status pkv_mla_attention(pkv_batch* batch, uint32_t layer, const pkv_tensor* q_latent,
                                     const pkv_tensor* q_pe, const pkv_tensor* out,
                                     const pkv_tensor* lse, const pkv_attention_params* params,
                                     void* stream);

/* pkv_batch_prepare with flags (0: exactly pkv_batch_prepare).
 *
 * PKV_PREPARE_PERSISTENT_TABLE: the page table is a persistent block table
 * of padded rows, as vLLM's and FlashInfer's persistent batches keep it:
 * row i (the plan's i-th sequence) holds its pages at
 * PAGE_INDICES[i * stride + j], entries past its pages are 0 (the null
 * block), PAGE_INDPTR[i] = i * stride (so stride = PAGE_INDPTR[1]) and
 * num_pages = num_seqs * stride; a row's page count comes from
 * CONTEXT_LENS (or LAST_PAGE_LEN). The other arrays are as in
 * pkv_batch_prepare, and the library's kernels accept both layouts. The
 * pool keeps the table across steps and the next such plan rewrites only
 * the rows whose sequence or block table changed, so keep each sequence at
 * the same index from step to step: a decode step then writes a few rows,
 * not every page id. On a CPU pool the arrays are the kept table itself
 * (zero copy); a CUDA pool uploads the table with the plan. A table is
 * updated in place only when no other plan holds it (a plan's arrays never
 * change while it lives), and the stride grows (one full rewrite) when a
 * sequence outgrows it. The callers' copy (pkv_batch_plan_tensor) is kept
 * the same way: writing into it misleads only the writer's own kernels.
 *
 * On a multi-group pool each group has its own kept table and stride
 * (pagedkv/groups.h, pkv_batch_plan_tensor_group).
 *
 * Errors: those of pkv_batch_prepare; PKV_E_INVALID_ARGUMENT for unknown
 * flags, or a persistent table whose num_seqs * stride would exceed
 * 2^31 - 1 entries. */
#define PKV_PREPARE_PERSISTENT_TABLE 0x1u
PKV_API pkv_status pkv_batch_prepare_ex(pkv_pool* pool, const pkv_seq_id* seqs,
                                        const uint32_t* query_counts, uint32_t num_seqs,
                                        uint32_t flags, void* stream, pkv_batch** out);

/* One decode step in one call: appends tokens[i] to seqs[i] (one token
 * each, as pkv_seq_append_batch) and prepares the plan whose queries are
 * those tokens (as pkv_batch_prepare_ex with every query count 1 and
 * flags, over seqs in that order). The plan, its commit and abort are
 * those of pkv_batch_prepare_ex; only the appends and the plan are made
 * together: every sequence is resolved and checked once, and its appends
 * and plan rows are written in one pass (bench/README.md, decode step).
 *
 * All or nothing, unlike the two calls: when the plan cannot be built (an
 * unknown id: PKV_E_NOT_FOUND; a repeated one: PKV_E_INVALID_ARGUMENT;
 * too few free blocks: PKV_E_OUT_OF_BLOCKS; a context no committed step
 * wrote: PKV_E_INVALID_STATE, naming the sequence and the tokens to
 * compute with pkv_batch_prepare) nothing is appended. Device errors on a
 * CUDA pool (running pending copy-on-write copies, the plan's upload)
 * come after the appends, which then stay, uncomputed, as after a
 * failing pkv_batch_prepare. PKV_E_UNSUPPORTED on a multi-group pool
 * (append there with pkv_seq_append, then pkv_batch_prepare_ex).
 *
 * Speed: a call whose seqs are those of the pool's previous
 * pkv_batch_prepare_decode, in the same order (an engine's running batch
 * between admissions and finishes), with no sequence of the pool freed
 * since, reuses that call's id checks and takes a lean path; the result is
 * the same. Leaner still when, since the previous step, the pool saw only
 * that step's own calls (its layer writes, attention, commit, destroy),
 * reads of the pool (pkv_seq_get_info, pkv_pool_get_stats, block tables
 * and hashes, validate) and event drains: the step then plans from what
 * the previous one left instead of reading every sequence. Any other call
 * on the pool in between (an append, a free, another plan) costs the next
 * step that shortcut, never its result. Reserving each sequence's final
 * length (pkv_seq_reserve) keeps its vectors from moving while it grows
 * (bench/README.md, decode step). */
PKV_API pkv_status pkv_batch_prepare_decode(pkv_pool* pool, const pkv_seq_id* seqs,
                                            const int32_t* tokens, uint32_t num_seqs,
                                            uint32_t flags, void* stream, pkv_batch** out);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_BATCH_H */
