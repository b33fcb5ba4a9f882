/* pagedkv/pool.h: the block pool, prefix cache, sequences, stats and events.
 *
 * A pool owns N fixed-size blocks of KV storage (block 0 is the null block,
 * never handed out) and the sequences that reference them. Every function
 * here may be called from any thread; the pool serialises them. The block
 * manager contract (allocation order, eviction, hashing) is DESIGN.md §3.
 *
 * Written blocks (DESIGN.md §9): the pool tracks, per block, which slots
 * hold written K/V. Slots become written when the step that computes them
 * is committed (pkv_batch_commit, or pkv_cache_write of every layer of a
 * pool with storage; see batch.h), by a copy-on-write or pkv_copy_blocks
 * copy (the source's state) and by a pkv_swap_blocks swap-in. A sequence's
 * tokens count as computed when their slots are written
 * (pkv_seq_info.num_computed_tokens); only then does the sliding window
 * release what lies behind them. A prefix lookup attaches only fully
 * written blocks, so two requests admitted in the same step never share a
 * block that neither has computed yet (the second computes its own copy);
 * a full block that leaves its last holder unwritten also leaves the
 * prefix cache (PKV_EVENT_BLOCK_REMOVED). A sequence whose shared blocks
 * were never written (a fork before its parent's step, whose step was then
 * aborted or whose parent went away) sees it in num_computed_tokens, and a
 * plan that would attend over such slots fails with PKV_E_INVALID_STATE
 * naming the sequence and tokens: the engine schedules them as queries.
 * No read of K/V that nobody wrote is possible through this API.
 *
 * Failures change nothing: a call that returns an error, PKV_E_OUT_OF_MEMORY
 * included, leaves the pool, its sequences, stats and events as they were.
 */
#ifndef PAGEDKV_POOL_H
#define PAGEDKV_POOL_H

#include "pagedkv/common.h"
#include "pagedkv/hash.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_pool pkv_pool;

/* A sequence handle, opaque: compare it, store it, pass it back to the pool
 * that made it. It names its pool as well as a slot and a generation (the
 * layout is in docs/conventions.md and may change), so a freed id, an id of
 * another live pool and a never-issued id yield PKV_E_NOT_FOUND, never a
 * crash; a slot is retired rather than ever naming a new sequence with an
 * old id. Never 0. */
typedef uint64_t pkv_seq_id;
#define PKV_SEQ_ID_INVALID ((pkv_seq_id)0)

/* The block id used in tables for positions outside a sliding window. */
#define PKV_NULL_BLOCK 0

/* ------------------------------------------------------------ pool create */

typedef struct pkv_pool_options {
  uint32_t struct_size; /* sizeof(pkv_pool_options); set by _init */
  uint32_t block_size;  /* tokens per block: 1..1024 (manager-only pools, and the CPU and CUDA
                           kernels alike; GPU-tested 8..64). Default 16 */
  uint64_t num_blocks;  /* total blocks incl. the null block (>= 2);
                           0 = derive from memory_budget_bytes */
  uint64_t memory_budget_bytes;   /* KV bytes to spend when num_blocks == 0 */
  uint32_t hash_algo;             /* PKV_HASH_*; default PKV_HASH_SHA256_CBOR */
  uint32_t enable_prefix_caching; /* 1 (default) or 0 */
  const char* hash_seed;          /* root seed string; copied; default "" */
  uint32_t sliding_window;        /* tokens; 0 = none. An append of new tokens
                                     releases to the null block the blocks wholly
                                     outside the window of the sequence's first
                                     token not yet computed, i.e. not covered by a
                                     committed step (so every token not yet
                                     computed stays queryable) */
  uint32_t enable_events;         /* 1 = record KV events for pkv_pool_drain_events */
  uint32_t max_events;            /* events kept before the oldest are dropped;
                                     default 65536 */
  /* KV storage. num_layers == 0 makes a manager-only pool without storage
     (block tables, hashing, plans without cache writes or attention). */
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;    /* 1..4096 on a CPU pool; 64, 80, 96, 128 or 256 on a CUDA pool
                           (what its kernels are compiled for); ignored without storage */
  uint32_t dtype;       /* PKV_DTYPE_F32, F16 or BF16; default BF16 */
  int32_t device_type;  /* PKV_DEVICE_CPU (default) or PKV_DEVICE_CUDA */
  int32_t device_id;    /* CUDA ordinal; 0 for CPU */
  uint32_t num_threads; /* CPU kernel threads; 0 = hardware concurrency */
  /* Appended (read only when struct_size covers it; older callers get 0). */
  uint32_t strict_key_domains; /* 1 = a cache salt, a LoRA name and a
                              multimodal item hash never hash alike (blocks
                              of such pools differ from vLLM's). 0 (default)
                              = vLLM's encoding, where an unsalted request
                              whose LoRA name equals a salt shares that
                              salt's first block: keep salts secret and
                              high-entropy and never take adapter names or
                              item hashes from tenants (README, "Cache
                              salts"). */
} pkv_pool_options;

/* Sets every default. Always call before filling fields. */
PKV_API void pkv_pool_options_init(pkv_pool_options* opts);

/* Creates a pool. The caller destroys it with pkv_pool_destroy. */
PKV_API pkv_status pkv_pool_create(const pkv_pool_options* opts, pkv_pool** out);

/* Frees the pool and its sequences, and lets go of its storage. NULL is a
 * no-op. Step plans created from it stay valid objects: a kernel of one that
 * is running on another thread finishes (its storage lives until it
 * returns), and every later call on them fails with PKV_E_INVALID_STATE;
 * the memory is freed when the last of them lets go (docs/threading.md). */
PKV_API void pkv_pool_destroy(pkv_pool* pool);

/* The options the pool was created with, num_blocks resolved. */
PKV_API pkv_status pkv_pool_get_options(const pkv_pool* pool, pkv_pool_options* out);

/* Bytes of K plus V storage one block takes over all layers (0 without
 * storage). */
PKV_API pkv_status pkv_pool_bytes_per_block(const pkv_pool* pool, uint64_t* out);

/* ---------------------------------------------------------------- sequences */

typedef struct pkv_seq_options {
  uint32_t struct_size;        /* sizeof(pkv_seq_options); set by _init */
  int32_t priority;            /* kept for the caller's scheduler */
  uint64_t lora_id;            /* 0 = base model; part of every block hash */
  const char* cache_salt;      /* NULL/"" = none; hashed into the first block */
  const pkv_mm_item* mm_items; /* multimodal items of the prompt; copied */
  uint32_t num_mm_items;
  uint32_t reserved0;
  /* Appended after version 1 (read only when struct_size covers it): */
  const char* lora_name; /* NULL/"" = none; the LoRA adapter's name, a UTF-8 key of every
                            block hash, as current vLLM keys adapters (lora_request.lora_name).
                            Independent of lora_id: set one (both: id first, then name). */
} pkv_seq_options;

PKV_API void pkv_seq_options_init(pkv_seq_options* opts);

/* Creates an empty sequence. opts may be NULL for defaults. */
PKV_API pkv_status pkv_seq_create(pkv_pool* pool, const pkv_seq_options* opts, pkv_seq_id* out);

/* For an empty sequence: attaches the longest run of leading full blocks of
 * tokens[0, num_tokens) already in the prefix cache, capped so at least one
 * token is left to compute. Those tokens become the sequence's first tokens
 * and count as computed; *out_num_cached tells how many (a multiple of
 * block_size). Never allocates new blocks; hit blocks in the free queue
 * leave it.
 *
 * Admission is match_prefix, then pkv_seq_append of the rest. To know
 * whether the append will fit before making it, call pkv_seq_blocks_needed
 * after match_prefix (the hits are attached then and no longer count as
 * free) and compare with pkv_pool_get_stats().num_free_blocks; if an append
 * fails anyway, pkv_seq_free gives the hits back (to the tail of the free
 * queue, as the most recently used cached blocks). */
PKV_API pkv_status pkv_seq_match_prefix(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                        uint64_t num_tokens, uint64_t* out_num_cached);

/* Appends num_tokens tokens (their KV is written by the next step) and makes
 * room for num_lookahead further slots (speculative tokens), allocating
 * blocks as needed. Blocks that become full are hashed and registered in the
 * prefix cache at once (as vLLM does, so KV events keep its order), but a
 * lookup skips them until their step is committed; if the sequence lets them
 * go unwritten, they leave the cache again (pkv_seq_truncate, pkv_seq_free).
 * Slots receiving new tokens count as unwritten until their step commits. All or
 * nothing: PKV_E_OUT_OF_BLOCKS (more blocks needed than free, net of what
 * the sliding window gives back) and PKV_E_OUT_OF_MEMORY change nothing. */
PKV_API pkv_status pkv_seq_append(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                  uint64_t num_tokens, uint32_t num_lookahead);

/* Blocks an append of num_tokens (+ num_lookahead) would take from the free
 * queue, for schedulers deciding what fits: new blocks plus copy-on-write
 * copies, minus the blocks the sliding window would give back first (0 if
 * those cover it). The append fits exactly when this is at most
 * pkv_pool_get_stats().num_free_blocks. */
PKV_API pkv_status pkv_seq_blocks_needed(const pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens,
                                         uint32_t num_lookahead, uint64_t* out_blocks);

/* Creates a child sharing every block of parent (parallel sampling, beam
 * search). Writing into a shared partial block later copies it first
 * (copy-on-write, executed by the next pkv_batch_prepare, before that step's
 * cache writes). Fork after the step that computed the parent's tokens: a
 * fork before it gives the child a copy of the partial block as it was
 * before the parent's new tokens were written (their K/V lands only in the
 * parent's block). The child counts as computed what the parent did. */
PKV_API pkv_status pkv_seq_fork(pkv_pool* pool, pkv_seq_id parent, pkv_seq_id* out_child);

/* Drops tokens from the tail so num_tokens remain, releasing blocks that
 * become empty (speculative-decoding rollback). Released full blocks stay
 * cached if their K/V is written; unwritten ones that no other sequence
 * holds leave the cache (PKV_EVENT_BLOCK_REMOVED) and go to the head of the
 * free queue. A block left partial and held by this sequence alone leaves
 * the cache too. A step prepared before the truncate no longer counts for
 * this sequence when committed (its slots may hold other tokens now). */
PKV_API pkv_status pkv_seq_truncate(pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens);

/* Releases the sequence and its blocks (tail first); the id becomes stale.
 * Full blocks whose K/V is written (a committed step, prefix hits) stay
 * cached at the tail of the free queue; unwritten full blocks that no
 * other sequence holds leave the cache (PKV_EVENT_BLOCK_REMOVED) and go to
 * the head. */
PKV_API pkv_status pkv_seq_free(pkv_pool* pool, pkv_seq_id seq);

typedef struct pkv_seq_info {
  uint32_t struct_size;
  int32_t priority;
  uint64_t num_tokens;        /* tokens appended (incl. cached prefix) */
  uint64_t num_cached_tokens; /* tokens attached by pkv_seq_match_prefix */
  uint64_t num_blocks;        /* entries in the block table */
  uint64_t num_slots;         /* capacity incl. lookahead: num_blocks * block_size */
  uint64_t lora_id;
  /* Appended field (read when struct_size covers it): leading tokens whose K/V is written
   * (committed steps, written prefix hits, copies, swap-ins). A plan's
   * queries must include every token from here on: query_count >=
   * num_tokens - num_computed_tokens. Can shrink without a call on this
   * sequence when a fork relative it shared unwritten blocks with is freed
   * or its step aborted. */
  uint64_t num_computed_tokens;
} pkv_seq_info;

PKV_API void pkv_seq_info_init(pkv_seq_info* info);
PKV_API pkv_status pkv_seq_get_info(const pkv_pool* pool, pkv_seq_id seq, pkv_seq_info* out);

/* Copies the block table (PKV_NULL_BLOCK where a sliding window released a
 * block). With capacity too small: PKV_E_BUFFER_TOO_SMALL and *out_len set. */
PKV_API pkv_status pkv_seq_get_block_table(const pkv_pool* pool, pkv_seq_id seq,
                                           int32_t* out_blocks, uint64_t capacity,
                                           uint64_t* out_len);

/* Hashes of the sequence's full blocks, in order. */
PKV_API pkv_status pkv_seq_get_block_hashes(const pkv_pool* pool, pkv_seq_id seq,
                                            pkv_block_hash* out_hashes, uint64_t capacity,
                                            uint64_t* out_len);

/* ------------------------------------------------------------ stats, events */

typedef struct pkv_pool_stats {
  uint32_t struct_size; /* set by _init; fields past it are not written */
  uint32_t block_size;
  uint64_t num_blocks;        /* total, incl. the null block */
  uint64_t num_free_blocks;   /* in the free queue (incl. cached ones) */
  uint64_t num_used_blocks;   /* ref count > 0 */
  uint64_t num_cached_blocks; /* holding a hash in the prefix cache */
  uint64_t num_seqs;
  uint64_t num_tokens;          /* over all sequences */
  double usage;                 /* used / usable blocks, in [0, 1] */
  uint64_t prefix_query_tokens; /* tokens asked of pkv_seq_match_prefix */
  uint64_t prefix_hit_tokens;   /* tokens it found cached */
  uint64_t num_evictions;       /* cached blocks reused for new content */
  uint64_t num_cow_copies;      /* copy-on-write copies recorded */
  uint64_t num_events_dropped;  /* events lost to max_events */
  uint64_t kv_bytes_per_block;  /* K+V over all layers */
  uint64_t kv_bytes_allocated;  /* the whole arena */
  uint64_t kv_bytes_used;       /* bytes of the slots holding tokens: a used
                                   block counts once, with the tokens of its
                                   fullest holder (a shared block truncated
                                   by one holder keeps its fill until the
                                   holder that fills it lets it go, or its
                                   last holder truncates it) */
  uint64_t kv_bytes_wasted;     /* the other slots of used blocks (partial
                                   tails, lookahead reservations) */
} pkv_pool_stats;

PKV_API void pkv_pool_stats_init(pkv_pool_stats* stats);
PKV_API pkv_status pkv_pool_get_stats(const pkv_pool* pool, pkv_pool_stats* out);

#define PKV_EVENT_BLOCK_STORED 1  /* a full block entered the prefix cache */
#define PKV_EVENT_BLOCK_REMOVED 2 /* a cached block was evicted */
#define PKV_EVENT_ALL_CLEARED 3   /* the prefix cache was reset */

typedef struct pkv_event {
  uint64_t seq_no; /* 1, 2, 3... per pool, gap-free unless dropped */
  uint32_t type;   /* PKV_EVENT_* */
  int32_t block_id;
  pkv_block_hash block_hash;
  pkv_block_hash parent_hash; /* meaningful when has_parent */
  uint32_t has_parent;        /* 0 for the first block of a sequence */
  uint32_t num_tokens;        /* tokens in the block (stored) */
  uint64_t lora_id;
} pkv_event;

/* Moves up to capacity oldest events into out, in order. */
PKV_API pkv_status pkv_pool_drain_events(pkv_pool* pool, pkv_event* out, uint64_t capacity,
                                         uint64_t* out_count);

/* Forgets every cached hash (blocks in use stay allocated, but stop being
 * shareable) and records PKV_EVENT_ALL_CLEARED. */
PKV_API pkv_status pkv_pool_reset_prefix_cache(pkv_pool* pool);

/* Checks every invariant: ref counts equal table references, nothing both
 * free and referenced, queue links consistent, hash map consistent with the
 * blocks' hashes. PKV_E_INVARIANT with a message naming the broken one. */
PKV_API pkv_status pkv_pool_validate(const pkv_pool* pool);

/* ------------------------------------------------------------ storage access */

#define PKV_KV_KEY 0
#define PKV_KV_VALUE 1

/* A view of one layer's K or V storage, shape [num_blocks, num_kv_heads,
 * block_size, head_dim], for interop. Valid until the pool is destroyed. */
PKV_API pkv_status pkv_pool_kv_tensor(const pkv_pool* pool, uint32_t layer, uint32_t which,
                                      pkv_tensor* out);

/* Copies blocks src[i] -> dst[i] in every layer, K and V, in one launch.
 * stream: a cudaStream_t for CUDA pools, ignored (NULL) on CPU. */
PKV_API pkv_status pkv_pool_copy_blocks(pkv_pool* pool, const int32_t* src, const int32_t* dst,
                                        uint64_t num_pairs, void* stream);

#define PKV_SWAP_OUT 0 /* pool blocks -> host buffer */
#define PKV_SWAP_IN 1  /* host buffer -> pool blocks */

/* Moves the contents of blocks between the pool and a host buffer laid out
 * [num_blocks][num_layers][2 (K,V)][num_kv_heads][block_size][head_dim] of
 * the pool's dtype (pinned memory for CUDA pools, for asynchronous copies).
 * host_bytes must be at least num_blocks * bytes_per_block. Block ids and
 * ref counts are the caller's business; this moves bytes only. */
PKV_API pkv_status pkv_pool_swap_blocks(pkv_pool* pool, const int32_t* blocks, uint64_t num_blocks,
                                        void* host_buffer, uint64_t host_bytes, uint32_t direction,
                                        void* stream);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_POOL_H */
