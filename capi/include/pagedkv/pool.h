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
 * copy (the source's state), by a pkv_swap_blocks swap-in, by the load of
 * an offload-tier hit (tiers.h, in the next pkv_batch_prepare) and, for the
 * copied slots, by a partial prefix hit (pkv_seq_match_prefix_partial).
 * A sequence's tokens count as computed when their slots are written
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
 * included, leaves the pool, its sequences, stats and events as they were
 * (exceptions: a failed plan on a pool with tiers may have run the
 * tiers' pending loads first, tiers.h; and retention priorities whose
 * duration ran out fall back when the clock says so, applied with their
 * PKV_EVENT_BLOCK_PRIORITY events by whichever call comes next, a read or
 * a failing one included: time passed, not the call).
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
                           kernels alike; the CUDA kernels are emulation-tested with
                           8..64, not yet run on a GPU). Default 16 */
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
  uint32_t enable_events;         /* 1 = record KV events for pkv_pool_drain_events
                                     (and _v2, or a publisher: events.h); a pending
                                     stored event keeps its block's token ids,
                                     4 * block_size bytes */
  uint32_t max_events;            /* events kept before the oldest are dropped;
                                     default 65536 */
  /* KV storage. num_layers == 0 makes a manager-only pool without storage
     (block tables, hashing, plans without cache writes or attention). */
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;    /* 1..4096 on a CPU pool; 64, 80, 96, 128 or 256 on a CUDA pool
                           (what its kernels are compiled for); ignored without storage */
  uint32_t dtype;       /* PKV_DTYPE_F32, F16, BF16 (default), FP8_E4M3 or FP8_E5M2
                           (FP8: cache writes then take f32, f16 or bf16 k and v,
                           attention f32, f16 or bf16 q and out on a CPU pool and
                           f16 or bf16 on a CUDA pool) */
  int32_t device_type;  /* PKV_DEVICE_CPU (default) or PKV_DEVICE_CUDA */
  int32_t device_id;    /* CUDA ordinal; 0 for CPU */
  uint32_t num_threads; /* CPU kernel threads; 0 = hardware concurrency; more than
                           1024 runs 1024 (pkv_pool_get_options returns the value given) */
  /* Appended (read only when struct_size covers it; older callers get 0). */
  uint32_t strict_key_domains; /* PKV_KEY_DOMAINS_*. 1 (STRICT) = a cache
                              salt, a LoRA name and a multimodal item hash
                              never hash alike (blocks of such pools differ
                              from vLLM's). 0 (default) = vLLM's untagged
                              encoding, where an unsalted request whose
                              LoRA name equals a salt shares that salt's
                              first block: keep salts secret and
                              high-entropy and never take adapter names or
                              item hashes from tenants (README, "Cache
                              salts"). 2 (VLLM_TAGGED) = vLLM 0.33's tagged
                              keys, ("lora", lora_name, lora_path), ("mm",
                              hash, offset), ("cache_salt", salt): domains
                              kept apart as STRICT does, and the bytes of
                              that vLLM's hashes (pkv_seq_options.lora_path). */
  /* Appended (read only when struct_size covers them; older callers get the
     defaults): dequantisation scales of an FP8 pool (dtype
     PKV_DTYPE_FP8_E4M3 or PKV_DTYPE_FP8_E5M2), as vLLM's k_scale/v_scale:
     a stored code c means the value c * scale; pkv_cache_write stores
     x / scale. Other dtypes take no scales (num_kv_scales must be 0). */
  uint32_t kv_scale_granularity; /* PKV_KV_SCALE_PER_TENSOR (default): one K and one V
                                    scale per layer; PKV_KV_SCALE_PER_HEAD: one per layer
                                    and KV head */
  uint32_t num_kv_scales;        /* entries of k_scales and of v_scales: num_layers (per
                                    tensor) or num_layers * num_kv_heads (per head, layer
                                    major); 0 (default) = every scale 1.0, with both
                                    pointers NULL */
  const float* k_scales;         /* copied; each finite and > 0. NULL in
                                    pkv_pool_get_options (read them with
                                    pkv_pool_get_kv_scales) */
  const float* v_scales;         /* as k_scales */
  /* Appended (read only when struct_size covers it; older callers get 0). */
  uint32_t enable_partial_reuse; /* 1 = pkv_seq_match_prefix_partial may reuse the
                                    first k tokens of a cached block (partial
                                    hit, copied into a new block). Keeps the
                                    token ids of every cached block:
                                    4 * block_size + at most 57 bytes
                                    per block
                                    (README, "Partial-block hits"). 0 (default):
                                    full blocks only. Needs prefix caching:
                                    without it nothing is cached, so 1 has no
                                    effect (accepted, as ever). */
  uint32_t enable_retention;     /* 1 = retention priorities
                                    (pkv_seq_set_retention): the free queue
                                    evicts lower priorities first, LRU within
                                    one. 0 (default) = LRU only. */
  uint64_t max_pinned_blocks;    /* with enable_retention: the most cached
                                    blocks pinned (PKV_PRIORITY_PINNED, never
                                    evicted) at once; below num_blocks - 1.
                                    0 (default) = no pinning. */
  /* Appended (read only when struct_size covers them; older callers get the
     defaults): the KV page layout. PKV_KV_LAYOUT_MHA (0, default): K and V
     per layer, [num_blocks, num_kv_heads, block_size, head_dim] each.
     PKV_KV_LAYOUT_MLA (1): multi-head latent attention (DeepSeek V2/V3,
     Kimi), as vLLM's MLA backends and FlashMLA store it: per layer ONE
     tensor [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim] holding
     each token's compressed latent c_kv followed by its rotary key k_pe; no
     V. num_kv_heads must then be 0 or 1 and head_dim 0 or kv_lora_rank +
     qk_rope_head_dim (the pool reports 1 and that sum); dtype f32, f16 or
     bf16. Bytes per block, stats and memory_budget_bytes count the one
     tensor. Write with pkv_mla_cache_write, attend with pkv_mla_attention
     (batch.h); pkv_cache_write and pkv_attention_forward fail on it. */
  uint32_t kv_layout;        /* PKV_KV_LAYOUT_* */
  uint32_t kv_lora_rank;     /* MLA: latent width, 1..4096 (DeepSeek-V3: 512); else 0 */
  uint32_t qk_rope_head_dim; /* MLA: rotary key width, 0..1024 (DeepSeek-V3: 64); else 0.
                                A CUDA MLA pool takes any head_dim sum and kv_lora_rank up
                                to 1024 */
} pkv_pool_options;

#define PKV_KV_LAYOUT_MHA 0
#define PKV_KV_LAYOUT_MLA 1

#define PKV_KV_SCALE_PER_TENSOR 0
#define PKV_KV_SCALE_PER_HEAD 1

/* Sets every default. Always call before filling fields. */
PKV_API void pkv_pool_options_init(pkv_pool_options* opts);
/* pkv_pool_options_init's defaults into exactly size bytes (pass sizeof *opts), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_pool_options_init_sized(pkv_pool_options* opts, size_t size);

/* Creates a pool. The caller destroys it with pkv_pool_destroy. */
PKV_API pkv_status pkv_pool_create(const pkv_pool_options* opts, pkv_pool** out);

/* Frees the pool and its sequences, and lets go of its storage. NULL is a
 * no-op. Step plans created from it stay valid objects: a kernel of one that
 * is running on another thread finishes (its storage lives until it
 * returns), and every later call on them that needs the pool (commit, the
 * kernels) fails with PKV_E_INVALID_STATE, while their arrays, info and
 * positions stay readable and pkv_batch_abort succeeds (nothing is left to
 * count); the memory is freed when the last of them lets go
 * (docs/threading.md). */
PKV_API void pkv_pool_destroy(pkv_pool* pool);

/* The options the pool was created with, num_blocks resolved. out->hash_seed
 * points at the pool's own copy of the seed: valid until pkv_pool_destroy. */
PKV_API pkv_status pkv_pool_get_options(const pkv_pool* pool, pkv_pool_options* out);

/* Bytes of K plus V storage one block takes over all layers (0 without
 * storage); on an MLA pool, of the latent tensor of every layer. */
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
  /* Appended (read only when struct_size covers it): */
  const char* lora_path; /* NULL = ""; the adapter's path (vLLM's lora_request.lora_path),
                            keyed with lora_name on a pool with strict_key_domains
                            PKV_KEY_DOMAINS_VLLM_TAGGED (vLLM 0.33 keys both, so that a name
                            pointed at another adapter does not reuse its KV); unused on
                            other pools and without lora_name */
} pkv_seq_options;

PKV_API void pkv_seq_options_init(pkv_seq_options* opts);
/* pkv_seq_options_init's defaults into exactly size bytes (pass sizeof *opts), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_seq_options_init_sized(pkv_seq_options* opts, size_t size);

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

/* Capacity hint: makes room in seq's host memory (its token ids, block
 * table and block hashes) for num_tokens tokens in all, so that appends up
 * to that length never reallocate them. Engines call it at admission with
 * the prompt plus the most tokens the request may generate: its decode
 * steps then copy no growing vectors and touch no fresh memory
 * (bench/README.md, decode step). Takes no KV blocks and changes nothing a
 * caller can observe; a num_tokens at or below the current room is a
 * no-op, and one above what the sequence could ever hold (without a
 * sliding window: the pool's num_blocks * block_size tokens), or above
 * 2^24 tokens, reserves that much. PKV_E_INVALID_ARGUMENT above
 * 2^31 - 1 tokens,
 * PKV_E_OUT_OF_MEMORY when the host memory cannot be had. */
PKV_API pkv_status pkv_seq_reserve(pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens);

/* Creates a child sharing every block of parent (parallel sampling, beam
 * search). Writing into a shared partial block later copies it first
 * (copy-on-write, executed by the next pkv_batch_prepare, before that step's
 * cache writes) when the tokens there differ. The child counts as computed
 * what the parent did. Tokens the parent appended before the fork are the
 * child's too: a step of the parent (prepared before or after the fork)
 * writes their K/V once, into the block both hold, and both count them as
 * computed when it commits. */
PKV_API pkv_status pkv_seq_fork(pkv_pool* pool, pkv_seq_id parent, pkv_seq_id* out_child);

/* Drops tokens from the tail so num_tokens remain, releasing blocks that
 * become empty (speculative-decoding rollback). Released full blocks stay
 * cached if their K/V is written; unwritten ones that no other sequence
 * holds leave the cache (PKV_EVENT_BLOCK_REMOVED) and go to the head of the
 * free queue. A block left partial and held by this sequence alone leaves
 * the cache too. A step prepared before the truncate no longer counts for
 * this sequence when committed (its slots may hold other tokens now).
 * PKV_E_INVALID_ARGUMENT for num_tokens above the sequence's length, or
 * one whose next token would need keys a sliding window already released. */
PKV_API pkv_status pkv_seq_truncate(pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens);

/* Releases the sequence and its blocks (tail first); the id becomes stale.
 * Full blocks whose K/V is written (a committed step, prefix hits) stay
 * cached at the tail of the free queue; unwritten full blocks that no
 * other sequence holds leave the cache (PKV_EVENT_BLOCK_REMOVED) and go to
 * the head. Blocks without a hash go to the head as one run in the order
 * freed, so the sequence's tail block is reused first (vLLM 0.33's
 * free_blocks). */
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
/* pkv_seq_info_init's defaults into exactly size bytes (pass sizeof *info), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_seq_info_init_sized(pkv_seq_info* info, size_t size);
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

/* ------------------------------------------------ partial hits, retention */

/* What pkv_seq_match_prefix_partial attached. */
typedef struct pkv_prefix_match {
  uint32_t struct_size;    /* set by _init; fields past it are not written */
  uint32_t partial_tokens; /* k: tokens of a partial hit, 0 = none */
  uint64_t num_cached;     /* tokens attached: full blocks + partial_tokens */
  int32_t copy_src;        /* with a partial hit: the cached block whose first
                              partial_tokens slots the sequence reuses... */
  int32_t copy_dst;        /* ...and the sequence's new block that receives
                              them. PKV_NULL_BLOCK (both) when no copy is
                              needed. A pool with storage copies the K/V
                              itself (every layer, before the next step's
                              cache writes: pkv_batch_prepare,
                              pkv_pool_copy_blocks and pkv_pool_swap_blocks
                              run it first); a manager-only pool's engine
                              copies slots [0, partial_tokens) of copy_src to
                              copy_dst in every layer before its next step's
                              cache writes. */
} pkv_prefix_match;

PKV_API void pkv_prefix_match_init(pkv_prefix_match* out);
/* pkv_prefix_match_init's defaults into exactly size bytes (pass sizeof *out), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_prefix_match_init_sized(pkv_prefix_match* out, size_t size);

/* pkv_seq_match_prefix, then, on a pool created with enable_partial_reuse,
 * a partial hit: if a cached, written block whose parent is the last full
 * hit (or the root) matches the next tokens in its first k (1 <= k <
 * block_size, at least one token left to compute) with the sequence's
 * extra keys (salt, LoRA, multimodal items), the sequence gets a fresh
 * block holding a copy of those k slots; the k tokens count as computed
 * (written slots, DESIGN.md §9) and the rest of the block is unwritten.
 * The longest match wins. No partial hit without a free block. Counted in
 * pkv_pool_stats (num_partial_hits, partial_hit_tokens; prefix_hit_tokens
 * includes them). Without enable_partial_reuse it is pkv_seq_match_prefix.
 * pkv_seq_match_prefix itself never makes partial hits. */
PKV_API pkv_status pkv_seq_match_prefix_partial(pkv_pool* pool, pkv_seq_id seq,
                                                const int32_t* tokens, uint64_t num_tokens,
                                                pkv_prefix_match* out);

#define PKV_PRIORITY_MIN 0
#define PKV_PRIORITY_DEFAULT 35 /* every block without a range (TensorRT-LLM's default) */
#define PKV_PRIORITY_MAX 100
#define PKV_PRIORITY_PINNED 100 /* never evicted; limited by max_pinned_blocks */
#define PKV_RETENTION_MAX_RANGES 64
#define PKV_TOKEN_END UINT64_MAX /* token_end for "to the end of the sequence" */

/* A retention priority for tokens [token_begin, token_end) of a sequence. */
typedef struct pkv_retention_range {
  uint64_t token_begin;
  uint64_t token_end;   /* PKV_TOKEN_END = every later token too */
  uint32_t priority;    /* PKV_PRIORITY_MIN..PKV_PRIORITY_MAX */
  uint32_t reserved;    /* 0 */
  uint64_t duration_ns; /* how long the priority lasts once the block is
                           free (no sequence holds it); then it falls back to
                           PKV_PRIORITY_DEFAULT. 0 = for good. */
} pkv_retention_range;

/* Replaces the sequence's retention ranges (num_ranges 0: the default for
 * all of it; at most PKV_RETENTION_MAX_RANGES). A cached block of the
 * sequence gets the highest priority of the ranges touching its tokens:
 * exactly, when this sequence filled it; when it was a prefix hit or is
 * shared, only if that raises its priority (another request may count on
 * it). Set ranges before appending: blocks take them as they are cached.
 * Evicting takes the free blocks of the lowest priority first, least
 * recently used first within one; a block whose priority ran out joins the
 * default level where its last release puts it. Pinned blocks are
 * never evicted; at most max_pinned_blocks are: a call whose ranges would
 * pin more of the sequence's cached blocks than the budget has left (pins
 * the call drops from blocks this sequence filled and holds alone count as
 * left) fails with PKV_E_OUT_OF_BLOCKS and changes nothing; a block cached later when
 * the budget is spent gets PKV_PRIORITY_PINNED - 1 instead (counted in
 * pkv_pool_stats.num_pins_degraded). PKV_E_INVALID_STATE on a pool created
 * without enable_retention. Changes of a cached block's priority are
 * PKV_EVENT_BLOCK_PRIORITY events. Forks inherit the ranges. */
PKV_API pkv_status pkv_seq_set_retention(pkv_pool* pool, pkv_seq_id seq,
                                         const pkv_retention_range* ranges, uint64_t num_ranges);

/* Sets the pool's clock for retention durations to now_ns and keeps it
 * there (tests, simulations): from the first call on, the pool reads time
 * only from here (a value below the last one is taken as the last one);
 * before it, the steady clock. Applies the expiries now due. */
PKV_API pkv_status pkv_pool_set_clock(pkv_pool* pool, uint64_t now_ns);

/* Cached blocks per retention priority: out_counts[p] for p in
 * [0, PKV_PRIORITY_MAX]; capacity at least PKV_PRIORITY_MAX + 1 (else
 * PKV_E_BUFFER_TOO_SMALL; *out_len is set either way). Without
 * enable_retention every cached block is at PKV_PRIORITY_DEFAULT. */
PKV_API pkv_status pkv_pool_get_priority_counts(const pkv_pool* pool, uint64_t* out_counts,
                                                uint64_t capacity, uint64_t* out_len);

/* Batched and fused calls, for engines that loop over sequences. Each is
 * all or nothing: on any error nothing changes, and the message names the
 * offending index (seqs[i]). One pool lock for the whole call. */

/* Decode append: tokens[i] (one token) to seqs[i], for num_seqs distinct
 * sequences, as pkv_seq_append(pool, seqs[i], &tokens[i], 1, 0) in order.
 * PKV_E_NOT_FOUND for a stale id, PKV_E_INVALID_ARGUMENT for an id given
 * twice, PKV_E_OUT_OF_BLOCKS when the appends up to seqs[i] need more blocks
 * than are free; num_seqs 0 is a no-op. */
PKV_API pkv_status pkv_seq_append_batch(pkv_pool* pool, const pkv_seq_id* seqs,
                                        const int32_t* tokens, uint64_t num_seqs);

/* Frees num_seqs distinct sequences, as pkv_seq_free of each in order. A
 * stale or repeated id fails the whole call. */
PKV_API pkv_status pkv_seq_free_batch(pkv_pool* pool, const pkv_seq_id* seqs, uint64_t num_seqs);

/* Admission: pkv_seq_create(opts), pkv_seq_match_prefix of the prompt, the
 * blocks-needed check and pkv_seq_append of the rest (+ num_lookahead
 * slots) in one call. PKV_E_OUT_OF_BLOCKS when the prompt does not fit
 * (counting the cached hits that leave the free queue); then no sequence is
 * created and no hit is taken. *out_seq is the new sequence and
 * *out_num_cached the tokens found cached (computed; a multiple of
 * block_size, at most num_tokens - 1). */
PKV_API pkv_status pkv_seq_admit(pkv_pool* pool, const pkv_seq_options* opts, const int32_t* tokens,
                                 uint64_t num_tokens, uint32_t num_lookahead, pkv_seq_id* out_seq,
                                 uint64_t* out_num_cached);

/* pkv_seq_match_prefix with the prompt's block hashes computed beforehand
 * (pkv_hash_prefix with the pool's algorithm, seed and strict_key_domains
 * and the sequence's LoRA, salt and multimodal items, e.g. when the request
 * arrived, as vLLM does), so the lookup does not hash again. hashes[0,
 * num_hashes) cover the first num_hashes full blocks of tokens (num_hashes
 * at most num_tokens / block_size; fewer limits the lookup). Only written
 * blocks hit, as on the token path. The key domain is part of every hash;
 * the pool recomputes the first block's hash and the last link it uses and
 * fails with PKV_E_INVALID_ARGUMENT naming hashes[i] when they differ (a
 * hash of another seed, algorithm, key-domain mode, salt, LoRA or item, or
 * hashes of other tokens). The links in between are the caller's word:
 * compute them in the engine, never take them from clients. */
PKV_API pkv_status pkv_seq_match_prefix_hashes(pkv_pool* pool, pkv_seq_id seq,
                                               const int32_t* tokens, uint64_t num_tokens,
                                               const pkv_block_hash* hashes, uint64_t num_hashes,
                                               uint64_t* out_num_cached);

/* pkv_seq_admit with precomputed block hashes, checked as by
 * pkv_seq_match_prefix_hashes. */
PKV_API pkv_status pkv_seq_admit_hashes(pkv_pool* pool, const pkv_seq_options* opts,
                                        const int32_t* tokens, uint64_t num_tokens,
                                        const pkv_block_hash* hashes, uint64_t num_hashes,
                                        uint32_t num_lookahead, pkv_seq_id* out_seq,
                                        uint64_t* out_num_cached);

/* ------------------------------------------------------------ stats, events */

typedef struct pkv_pool_stats {
  uint32_t struct_size; /* set by _init; fields past it are not written */
  uint32_t block_size;
  uint64_t num_blocks;        /* total, incl. the null block */
  uint64_t num_free_blocks;   /* in the free queue (incl. cached ones;
                                 pinned ones, never allocated, excluded) */
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
                                   fullest holder (a shared block keeps that
                                   fill when holders truncate it or go away,
                                   even the fullest: the fill is settled when
                                   its last holder truncates it or appends
                                   to it) */
  uint64_t kv_bytes_wasted;     /* the other slots of used blocks (partial
                                   tails, lookahead reservations) */
  /* Appended (written when struct_size covers them): */
  uint64_t num_partial_hits;   /* partial-block hits (enable_partial_reuse) */
  uint64_t partial_hit_tokens; /* tokens they reused (also in prefix_hit_tokens) */
  uint64_t num_pinned_blocks;  /* cached blocks at PKV_PRIORITY_PINNED */
  uint64_t num_pins_degraded;  /* pins the budget refused (given PINNED - 1) */
} pkv_pool_stats;

PKV_API void pkv_pool_stats_init(pkv_pool_stats* stats);
/* pkv_pool_stats_init's defaults into exactly size bytes (pass sizeof *stats), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_pool_stats_init_sized(pkv_pool_stats* stats, size_t size);
PKV_API pkv_status pkv_pool_get_stats(const pkv_pool* pool, pkv_pool_stats* out);

#define PKV_EVENT_BLOCK_STORED 1  /* a full block entered the prefix cache */
#define PKV_EVENT_BLOCK_REMOVED 2 /* a cached block was evicted */
#define PKV_EVENT_ALL_CLEARED 3   /* the prefix cache was reset */
/* A cached block's retention priority changed (enable_retention);
 * num_tokens holds the new priority. */
#define PKV_EVENT_BLOCK_PRIORITY 4

typedef struct pkv_event {
  uint64_t seq_no; /* 1, 2, 3... per pool, gap-free unless dropped */
  uint32_t type;   /* PKV_EVENT_* */
  int32_t block_id;
  pkv_block_hash block_hash;
  pkv_block_hash parent_hash; /* meaningful when has_parent */
  uint32_t has_parent;        /* 0 for the first block of a sequence */
  uint32_t num_tokens;        /* tokens in the block (stored); the new
                                 priority (PKV_EVENT_BLOCK_PRIORITY) */
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
 * block_size, head_dim], for interop. Valid until the pool is destroyed.
 * An MLA pool (PKV_KV_LAYOUT_MLA) has one tensor per layer, returned for
 * PKV_KV_KEY with shape [num_blocks, block_size, kv_lora_rank +
 * qk_rope_head_dim] (latent first, then the rotary key); PKV_KV_VALUE is
 * PKV_E_INVALID_ARGUMENT there. */
PKV_API pkv_status pkv_pool_kv_tensor(const pkv_pool* pool, uint32_t layer, uint32_t which,
                                      pkv_tensor* out);

/* Copies blocks src[i] -> dst[i] in every layer, K and V, in one launch.
 * The pairs are copied at once, so they must be independent: a block that
 * is the destination of one pair may be neither the destination nor the
 * source of another (PKV_E_INVALID_ARGUMENT, nothing copied); a pair whose
 * source is its destination is allowed and changes nothing. A destination
 * takes the source's written slots; a cached destination leaves the prefix
 * cache (PKV_EVENT_BLOCK_REMOVED) unless it is then fully written and the
 * source is cached under the same hash (it holds the K/V of other tokens).
 * stream: a cudaStream_t for CUDA pools, ignored (NULL) on CPU. */
PKV_API pkv_status pkv_pool_copy_blocks(pkv_pool* pool, const int32_t* src, const int32_t* dst,
                                        uint64_t num_pairs, void* stream);

#define PKV_SWAP_OUT 0 /* pool blocks -> host buffer */
#define PKV_SWAP_IN 1  /* host buffer -> pool blocks */

/* Moves the contents of blocks between the pool and a host buffer laid out
 * [num_blocks][num_layers][2 (K,V)][num_kv_heads][block_size][head_dim] of
 * the pool's dtype (an MLA pool: [num_blocks][num_layers][block_size]
 * [kv_lora_rank + qk_rope_head_dim]) (pinned memory for CUDA pools, for asynchronous copies).
 * host_bytes must be at least num_blocks * bytes_per_block. Block ids and
 * ref counts are the caller's business; this moves bytes only. A swap-in
 * writes its blocks at once, so a block may appear once in its list
 * (PKV_E_INVALID_ARGUMENT otherwise); a swap-out may read one twice. A
 * swap-in marks each block's slots written up to its fill (the tokens it
 * holds now), whatever the buffer held for them: swap out only blocks
 * whose tokens were computed, else the swapped-in sequence counts tokens
 * as computed whose K/V no step wrote. */
PKV_API pkv_status pkv_pool_swap_blocks(pkv_pool* pool, const int32_t* blocks, uint64_t num_blocks,
                                        void* host_buffer, uint64_t host_bytes, uint32_t direction,
                                        void* stream);

/* ------------------------------------------------------------ FP8 scales */

/* Replaces the K and V scales of an FP8 pool: num_scales entries each, as
 * many as the pool has (pkv_pool_options.num_kv_scales semantics with the
 * granularity it was created with; per tensor: num_layers). Every scale
 * finite and > 0, checked before anything changes. The call holds the
 * pool's KV lock exclusively (docs/threading.md), so a cache write or an
 * attention running on another thread finishes with the old scales and
 * every later one uses the new ones; on a CUDA pool it also waits for the
 * device, so kernels queued before it keep the old scales. K/V already
 * stored keeps its codes: it is read with the new scales from now on.
 * PKV_E_INVALID_STATE on a pool that is not FP8. */
PKV_API pkv_status pkv_pool_set_kv_scales(pkv_pool* pool, const float* k_scales,
                                          const float* v_scales, uint64_t num_scales);

/* Copies the current scales (the granularity the pool was created with)
 * into k_out and v_out, capacity entries each. *out_len = the number of
 * scales; PKV_E_BUFFER_TOO_SMALL when capacity is below it.
 * PKV_E_INVALID_STATE on a pool that is not FP8. */
PKV_API pkv_status pkv_pool_get_kv_scales(const pkv_pool* pool, float* k_out, float* v_out,
                                          uint64_t capacity, uint64_t* out_len);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_POOL_H */
