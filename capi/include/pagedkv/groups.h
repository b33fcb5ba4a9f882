/* pagedkv/groups.h: several KV groups in one pool (hybrid models).
 *
 * Gemma 2/3 and gpt-oss interleave sliding-window and full-attention layers;
 * DeepSeek V2/V3 cache one MLA latent per token. A multi-group pool, as
 * vLLM's hybrid allocator, gives each group of layers its own block table
 * per sequence while all groups draw block ids from ONE budget (a block id
 * serves one group at a time):
 *  - PKV_GROUP_FULL / PKV_GROUP_MLA keep every block of a sequence;
 *  - PKV_GROUP_SLIDING_WINDOW releases (to PKV_NULL_BLOCK in its table) the
 *    blocks wholly outside the window of the first token of each append, as
 *    pkv_pool_options.sliding_window does for a single-group pool;
 *  - prefix caching is keyed by (block hash, group), the hash being the same
 *    chained, vLLM-compatible block hash for every group (pagedkv/hash.h). A
 *    hit is the longest prefix that every group can serve: full groups need
 *    every leading block cached, window groups only the blocks holding the
 *    window before the hit point, found by vLLM's coordinator's fixed point.
 *
 * Multi-group pools are manager only (pkv_pool_options.num_layers 0): the
 * engine owns the KV tensors. A block's bytes hold one group's pages for all
 * of that group's layers (groups alias one arena, as vLLM), so a block costs
 * the largest group's page: pkv_pool_bytes_per_block and the stats' kv_bytes_*
 * report that; pkv_pool_group_stats gives each group's page.
 *
 * These existing calls work on a multi-group pool and act on every group,
 * all or nothing: pkv_seq_create, pkv_seq_match_prefix, pkv_seq_append,
 * pkv_seq_blocks_needed (blocks over all groups), pkv_seq_fork,
 * pkv_seq_reserve, pkv_seq_truncate, pkv_seq_free, pkv_seq_get_info (num_blocks counts held
 * blocks of all groups), pkv_seq_get_block_table (group 0's table),
 * pkv_pool_get_options (the base options, num_blocks resolved),
 * pkv_pool_get_stats, pkv_pool_bytes_per_block, pkv_pool_validate,
 * pkv_pool_destroy, and the step-plan calls below. Every other call answers
 * PKV_E_UNSUPPORTED on it.
 *
 * Step plans: pkv_batch_prepare (pkv_batch_prepare_ex with flags 0) builds
 * one plan for the step with per-group arrays, read with
 * pkv_batch_plan_tensor_group. With PKV_PREPARE_PERSISTENT_TABLE every
 * group's page table is a persistent table of padded rows as batch.h
 * describes (row i at PAGE_INDICES[i * stride], stride = PAGE_INDPTR[1],
 * each group its own stride, a recurrent group's rows one page: stride 1),
 * kept by the pool per group across steps; the next such plan rewrites only
 * the rows whose sequence changed, and in them only the appended pages and
 * the pages a sliding window released since (to the null block 0), unless
 * a copy-on-write, state move, truncate or hit changed an earlier entry.
 * pkv_batch_get_info (num_pages: group 0's),
 * pkv_batch_plan_tensor (group 0's arrays), pkv_batch_token_positions,
 * pkv_batch_last_token_indices, pkv_batch_commit, pkv_batch_abort and
 * pkv_batch_destroy work on it; the kernel calls (pkv_cache_write,
 * pkv_attention_forward, MLA) answer PKV_E_UNSUPPORTED. Copy-on-write and
 * state copies are not run by prepare: take them with
 * pkv_pool_group_take_copies after prepare, before the step's writes (a
 * plan over a sequence whose state slot a fork child still starts from
 * moves it to a copy first; PKV_E_OUT_OF_BLOCKS when no block is free for
 * that). The window of a sliding-window group moves with the computed
 * tokens, so uncomputed queries keep their keys. Computed tokens follow
 * manager-only single-group plans (pagedkv/batch.h): from the pool's first
 * plan on, appended tokens count as computed (pkv_seq_info
 * num_computed_tokens), and their full blocks (and state snapshots) enter
 * the prefix cache, only once a committed plan covered them (a plan
 * destroyed with neither commit nor abort counts as committed, as ABI 1).
 * Before any plan, manager calls alone count tokens computed at append. A
 * sequence's first plan takes back, from its first query on, what its
 * appends counted: its blocks there that it holds alone leave the cache.
 * prepare fails with PKV_E_INVALID_STATE when a query's context is not
 * computed (num_computed_tokens says where to start) or a recurrent group
 * has no state slot yet (append first), and PKV_E_INVALID_ARGUMENT when
 * queries would recompute tokens a recurrent state already holds (those
 * that appends before the pool's first plan counted included: a first plan
 * takes them back for attention pages, but a state would apply them twice;
 * only a plan from position 0 restarts it) or need keys a window group
 * released.
 *
 * PKV_GROUP_RECURRENT (Jamba, Qwen3-Next): a block of the group is one
 * state slot. A sequence's table in it holds its live slot alone (taken at
 * its first append). With prefix caching, the state at a block boundary is
 * kept as a snapshot keyed by that block's hash (vLLM's Mamba prefix
 * caching): when a committed plan computes the state up to a boundary (as
 * vLLM's mamba_cache_mode "align" caches a step's running state there),
 * when an append starts at a boundary (the previous tokens are computed by
 * then) or the sequence is freed there, and, with
 * PKV_GROUP_SNAPSHOT_EVERY_BLOCK, at every block boundary inside a
 * committed plan's query chunk (written by the engine's kernel into the
 * slots that PKV_PLAN_SNAPSHOT_* name). A hit in this group
 * needs a snapshot at exactly the hit point; the sequence's first append
 * then copies it into its new slot. A fork child starts from the parent's
 * state the same way (copy at its first append; the parent moves to a copy
 * when it appends first). Fork between steps: the child counts the
 * parent's computed tokens, but its state is the parent's live slot as the
 * kernels left it, so a fork after a step's writes and before its commit
 * gives a child whose state already holds that step's tokens (the next
 * plan would apply them again). All these copies come from
 * pkv_pool_group_take_copies, to run before the next step. A recurrent
 * state cannot be rolled back: pkv_seq_truncate below the sequence's length
 * fails with PKV_E_INVALID_ARGUMENT.
 */
#ifndef PAGEDKV_GROUPS_H
#define PAGEDKV_GROUPS_H

#include "pagedkv/batch.h"
#include "pagedkv/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PKV_GROUP_FULL 0           /* full attention: K and V pages */
#define PKV_GROUP_SLIDING_WINDOW 1 /* attention over the last sliding_window tokens */
#define PKV_GROUP_MLA 2            /* full attention over one latent per token, no V */
#define PKV_GROUP_RECURRENT 3      /* fixed-size state per sequence (Mamba, linear attention) */

typedef struct pkv_kv_group_spec {
  uint32_t struct_size;      /* sizeof(pkv_kv_group_spec); set by _init */
  uint32_t kind;             /* PKV_GROUP_*; default PKV_GROUP_FULL */
  uint32_t num_layers;       /* model layers in this group (1..65536); default 1 */
  uint32_t num_kv_heads;     /* FULL / SLIDING_WINDOW: KV heads per layer */
  uint32_t head_dim;         /* FULL / SLIDING_WINDOW */
  uint32_t sliding_window;   /* SLIDING_WINDOW: tokens (>= 1); 0 otherwise */
  uint32_t kv_lora_rank;     /* MLA: latent width (DeepSeek: 512) */
  uint32_t rope_dim;         /* MLA: decoupled RoPE key width (DeepSeek: 64) */
  uint32_t dtype;            /* PKV_DTYPE_*; default PKV_DTYPE_BF16 */
  uint32_t reserved;         /* 0 */
  uint64_t state_bytes;      /* RECURRENT: bytes of one layer's state (conv + SSM) */
  const uint32_t* layer_ids; /* NULL, or num_layers model layer indices (copied);
                                given for every group or none, each layer once */
  /* Appended after ABI 1's first version (read only when struct_size covers
   * them; an array of specs is walked by groups[0].struct_size, so older
   * binaries' smaller specs work): */
  uint32_t flags;     /* PKV_GROUP_SNAPSHOT_*; default 0 */
  uint32_t reserved1; /* 0 */
} pkv_kv_group_spec;

/* flags of a PKV_GROUP_RECURRENT group (PKV_E_INVALID_ARGUMENT on others):
 * every step plan gives a state snapshot slot at each block boundary inside
 * (or at the end of) each sequence's query chunk, so a prompt prefilled in
 * one chunk can be hit at any of its block boundaries, not only where its
 * appends started. The engine's chunked scan (Mamba2 SSD, chunked linear
 * attention) writes the state after each named query row into the named
 * slot (PKV_PLAN_SNAPSHOT_*, pkv_batch_plan_tensor_group). Without prefix
 * caching the flag gives no snapshots. */
#define PKV_GROUP_SNAPSHOT_EVERY_BLOCK 0x1u

/* Sets defaults. Always call before filling fields. */
PKV_API void pkv_kv_group_spec_init(pkv_kv_group_spec* spec);
/* pkv_kv_group_spec_init's defaults into exactly size bytes (pass sizeof *spec), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_kv_group_spec_init_sized(pkv_kv_group_spec* spec, size_t size);

/* Creates a pool of num_groups (1..64) groups sharing one block budget.
 * base: block_size, num_blocks or memory_budget_bytes (divided by the block
 * bytes described above), hash_algo, hash_seed, enable_prefix_caching,
 * strict_key_domains (PKV_KEY_DOMAINS_*) are read; num_layers and sliding_window must be 0; events,
 * partial reuse and retention are not supported (PKV_E_UNSUPPORTED). Errors name the field
 * (base->..., groups[i].kind, ...). */
PKV_API pkv_status pkv_pool_create_groups(const pkv_pool_options* base,
                                          const pkv_kv_group_spec* groups, uint32_t num_groups,
                                          pkv_pool** out);

/* Number of groups: 1 for a pool from pkv_pool_create. */
PKV_API pkv_status pkv_pool_num_groups(const pkv_pool* pool, uint32_t* out);

/* The group that holds model layer `layer`, and the layer's index among that
 * group's layers (the index into the group's per-layer KV tensors). Layers
 * are those given in layer_ids; when no group gives layer_ids (all or none
 * must), they are numbered through the groups in order: group 0's layers are
 * 0..num_layers-1, group 1's follow, and so on. On a pool from
 * pkv_pool_create, layer L < num_layers is group 0, index L. A layer that no
 * group holds: PKV_E_NOT_FOUND, and the outputs are not written. */
PKV_API pkv_status pkv_pool_group_of_layer(const pkv_pool* pool, uint32_t layer,
                                           uint32_t* out_group, uint32_t* out_index);

/* The block table of group `group` (PKV_NULL_BLOCK where its sliding window
 * released a block). With capacity too small: PKV_E_BUFFER_TOO_SMALL and
 * *out_len set. On a single-group pool, group 0 is pkv_seq_get_block_table. */
PKV_API pkv_status pkv_seq_group_block_table(const pkv_pool* pool, pkv_seq_id seq, uint32_t group,
                                             int32_t* out_blocks, uint64_t capacity,
                                             uint64_t* out_len);

typedef struct pkv_group_stats {
  uint32_t struct_size; /* set by _init; fields past it are not written */
  uint32_t kind;
  uint64_t num_used_blocks;   /* blocks of this group held by sequences */
  uint64_t num_cached_blocks; /* (hash, group) prefix-cache entries */
  uint64_t num_null_entries;  /* table entries its sliding window released */
  uint64_t bytes_per_block;   /* this group's page over its layers */
} pkv_group_stats;

PKV_API void pkv_group_stats_init(pkv_group_stats* stats);
/* pkv_group_stats_init's defaults into exactly size bytes (pass sizeof *stats), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_group_stats_init_sized(pkv_group_stats* stats, size_t size);
/* Per-group stats of a multi-group pool (PKV_E_UNSUPPORTED on others). */
PKV_API pkv_status pkv_pool_group_stats(const pkv_pool* pool, uint32_t group, pkv_group_stats* out);

/* Copy-on-write copies (src[i] -> dst[i], block ids of group `group`)
 * recorded since the last call, oldest first, and forgets them. Both blocks
 * of a copy stay held (counted used) until it is taken here, so a block freed
 * meanwhile cannot move to another group whose copies run first. The engine
 * copies those pages in every layer of the group before the next step
 * writes. An append writes into a copy when the block it writes into is
 * shared (pkv_seq_fork) or cached (a truncated full block). With capacity
 * too small: PKV_E_BUFFER_TOO_SMALL, *out_len set, nothing forgotten. */
PKV_API pkv_status pkv_pool_group_take_copies(pkv_pool* pool, uint32_t group, int32_t* src,
                                              int32_t* dst, uint64_t capacity, uint64_t* out_len);

/* Snapshot arrays of a recurrent group's plan (`which` of
 * pkv_batch_plan_tensor_group; PKV_E_INVALID_ARGUMENT on other groups).
 * CSR over the plan's sequences: snapshots SNAPSHOT_INDPTR[i] ..
 * SNAPSHOT_INDPTR[i + 1] - 1 belong to sequence i, in position order. Each
 * asks the step to save the state after query row SNAPSHOT_ROWS[j] (an index
 * into the plan's query tokens, as pkv_batch_last_token_indices) into the
 * state slot SNAPSHOT_BLOCKS[j] (a block id of the group, as PAGE_INDICES).
 * A snapshot is given for each block boundary k * block_size with
 * start < k * block_size <= context (start = context - query count) that the
 * prefix cache does not hold yet (one per hash within a plan); a group
 * without PKV_GROUP_SNAPSHOT_EVERY_BLOCK gives none (INDPTR all 0). The
 * slots come from the pool's one block budget at prepare (all or nothing:
 * PKV_E_OUT_OF_BLOCKS and nothing changed when they, with the state moves,
 * exceed the free blocks). pkv_batch_commit (or destroying the plan
 * uncommitted, which counts as committed) puts each slot in the prefix
 * cache keyed by its block's hash, as a snapshot kept at an append, unless
 * that hash was cached meanwhile or its sequence was freed or truncated
 * since prepare; pkv_batch_abort returns them all to the free blocks, never
 * hittable. Cached snapshot slots are evicted like any cached block (a
 * sequence's deepest first). pkv_seq_blocks_needed does not count them: a
 * scheduler budgets about one block per block_size query tokens of each
 * such group. The values start at 16 so that batch.h's PKV_PLAN_* can grow
 * without meeting them. */
#define PKV_PLAN_SNAPSHOT_INDPTR 16 /* i32 [num_seqs + 1] */
#define PKV_PLAN_SNAPSHOT_ROWS 17   /* i64 [num_snapshots]: query row after which to save */
#define PKV_PLAN_SNAPSHOT_BLOCKS 18 /* i32 [num_snapshots]: state slot to save it in */

/* Array `which` (PKV_PLAN_*, pagedkv/batch.h) of group `group` of a step
 * plan; read-only host views valid until pkv_batch_destroy. QUERY_INDPTR and
 * CONTEXT_LENS are shared by every group. Per group:
 *  - FULL, MLA, SLIDING_WINDOW: PAGE_INDPTR / PAGE_INDICES the CSR of each
 *    sequence's table of that group over its ceil(context / block_size)
 *    pages, LAST_PAGE_LEN the tokens in the last page, SLOT_MAPPING i64
 *    [num_tokens] block_id * block_size + offset of each query token. A
 *    window group's released pages read as the null block 0 (vLLM's
 *    convention: a page keeps its index, page j holds tokens [j*bs, (j+1)*bs)).
 *  - RECURRENT: one page per sequence, its live state slot: PAGE_INDPTR
 *    [0, 1, ..., num_seqs], PAGE_INDICES and SLOT_MAPPING (i64 [num_seqs])
 *    the slot's block id, LAST_PAGE_LEN 1; and PKV_PLAN_SNAPSHOT_* above.
 * On a single-group plan, group 0 is pkv_batch_plan_tensor and any other
 * group PKV_E_INVALID_ARGUMENT. */
PKV_API pkv_status pkv_batch_plan_tensor_group(const pkv_batch* batch, uint32_t group,
                                               uint32_t which, pkv_tensor* out);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_GROUPS_H */
