/* pagedkv/tiers.h: offload tiers for the prefix cache (host memory, and a
 * file below it).
 *
 * Opt-in per pool. When a cached, written block is evicted from the pool
 * (its id reused by an allocation), its K/V of every layer is copied, on a
 * copy thread, into the host tier; when the host tier is full its least
 * recently used block moves down to the file tier (or is dropped when there
 * is none; the file tier drops its own LRU block). The allocation only
 * queues the copy: it never waits. The pool waits for queued copies only
 * before it next writes into its storage (pkv_batch_prepare,
 * pkv_pool_copy_blocks, pkv_pool_swap_blocks, pkv_pool_flush_tiers).
 * A block whose copy has not finished is in no tier.
 *
 * pkv_seq_match_prefix_tiered continues the device hits with tier hits
 * (same block hashes: cache salts, LoRA and multimodal keys keep tenants
 * apart in every tier): each gets a fresh device block, cached and counted
 * in the sequence's cached tokens but not yet written. The next
 * pkv_batch_prepare loads them (CPU pools: a copy) before anything reads
 * them; then they are written blocks. Every block carries an xxh3
 * checksum taken when it was offloaded and verified on load; a mismatch or
 * an I/O error makes the hit a miss: the block stays unwritten and leaves
 * the prefix cache, the tier entry is dropped, the failure is counted, and
 * the plan fails with PKV_E_INVALID_STATE naming the tokens to compute
 * (see "Written blocks" in pool.h), so the bytes are never served.
 *
 * pkv_pool_reset_prefix_cache clears the tiers too. Tier events (STORED,
 * REMOVED, ALL_CLEARED of medium host/file) are recorded internally;
 * pkv_pool_drain_events returns device events only, as before.
 *
 * CUDA pools: the host tier is page-locked memory (cudaHostAlloc) and
 * bytes move by DMA that the host does not wait for. An eviction queues
 * the block as on CPU; the copy thread issues its device-to-host copy on a
 * stream of the tiers' own, ordered (an event recorded at the eviction,
 * on the evicting call's thread) after the work queued so far on the
 * stream the pool last planned on: the stream given to the last
 * pkv_batch_prepare (_ex,
 * _decode), pkv_pool_copy_blocks or pkv_pool_swap_blocks
 * (the legacy default stream before the first). So the step that wrote a
 * block must have queued its writes on that stream, or on one ordered
 * before it, as pkv_batch_commit already asks. The slot's checksum is
 * taken once the copy completed; only then is the block in the tier. The
 * next writer does not wait on the host for offloads, only until the copy
 * thread issued them (microseconds; longer after a burst of evictions
 * beyond the free host slots, docs/tiers.md): its stream waits on the
 * device for the last copy (cudaStreamWaitEvent). Tier hits are verified on the host
 * and copied to the device on the stream given to the next
 * pkv_batch_prepare, before the plan's own work; a host slot (or the
 * pinned staging buffer a file slot is read into) is not reused until
 * that copy completed. pkv_pool_flush_tiers queues pending loads on the
 * stream the pool last planned on and then waits on the host for every
 * copy. The stream the pool last planned on must stay valid until the
 * pool's next call that takes a stream returned (or pkv_pool_destroy):
 * evictions, that call's own included, record an event on it. When the pool plans on a new stream,
 * the new one is first ordered after the previous one. Destroying the
 * pool waits for the tiers' copies already queued (a load's copy, queued
 * on the plan's stream, after the work before it there), then frees the
 * slots.
 *
 * Implemented for CPU and CUDA pools with storage; a manager-only pool
 * (num_layers 0) or a pool without prefix caching returns
 * PKV_E_INVALID_STATE.
 */
#ifndef PAGEDKV_TIERS_H
#define PAGEDKV_TIERS_H

#include "pagedkv/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PKV_MEDIUM_DEVICE 0
#define PKV_MEDIUM_HOST 1
#define PKV_MEDIUM_FILE 2

typedef struct pkv_tier_options {
  uint32_t struct_size; /* sizeof(pkv_tier_options); set by _init */
  uint32_t flags;       /* reserved: 0 */
  uint64_t host_bytes;  /* host tier size; holds host_bytes / bytes_per_block blocks (>= 1).
                           0 with file_dir set: no host tier; an evicted block goes
                           straight from the pool's storage into the file tier, hashed
                           as it is written (one pass instead of a copy into the host
                           tier and, later, a write of that copy) */
  const char* file_dir; /* directory of the file tier; NULL or "" = none. One file of
                           fixed slots is created there and unlinked at once (it goes with
                           the pool), allocated in full at attach (fallocate: a full disk
                           is PKV_E_INVALID_ARGUMENT there, not I/O errors later); read
                           and written with preadv/pwritev */
  uint64_t file_bytes;  /* file tier size (>= one block when file_dir is set) */
} pkv_tier_options;

PKV_API void pkv_tier_options_init(pkv_tier_options* opts);
/* pkv_tier_options_init's defaults into exactly size bytes (pass sizeof *opts), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_tier_options_init_sized(pkv_tier_options* opts, size_t size);

/* Attaches the tiers to a pool, once. opts is copied. */
PKV_API pkv_status pkv_pool_attach_tiers(pkv_pool* pool, const pkv_tier_options* opts);

typedef struct pkv_tier_match {
  uint32_t struct_size; /* sizeof(pkv_tier_match); set by _init */
  uint32_t reserved;
  uint64_t num_cached; /* device_tokens + host_tokens + file_tokens */
  uint64_t device_tokens;
  uint64_t host_tokens;
  uint64_t file_tokens;
} pkv_tier_match;

PKV_API void pkv_tier_match_init(pkv_tier_match* out);
/* pkv_tier_match_init's defaults into exactly size bytes (pass sizeof *out), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_tier_match_init_sized(pkv_tier_match* out, size_t size);

/* pkv_seq_match_prefix, then the blocks after the device hits found in the
 * tiers (as many as there are free blocks for). Without tiers it equals
 * pkv_seq_match_prefix. */
PKV_API pkv_status pkv_seq_match_prefix_tiered(pkv_pool* pool, pkv_seq_id seq,
                                               const int32_t* tokens, uint64_t num_tokens,
                                               pkv_tier_match* out);

/* pkv_seq_match_prefix_hashes continued into the tiers as
 * pkv_seq_match_prefix_tiered does: hashes[0, num_hashes) are the
 * engine's block hashes of tokens (checked as there; the tier lookup
 * follows them too, as far as they go), and out says what came from which
 * tier. All or nothing as pkv_seq_match_prefix_hashes: on an error nothing
 * is attached and no tier entry is taken. */
PKV_API pkv_status pkv_seq_match_prefix_hashes_tiered(pkv_pool* pool, pkv_seq_id seq,
                                                      const int32_t* tokens, uint64_t num_tokens,
                                                      const pkv_block_hash* hashes,
                                                      uint64_t num_hashes, pkv_tier_match* out);

/* pkv_seq_admit (hashes NULL) or pkv_seq_admit_hashes, whose lookup goes on
 * into the tiers after the device hits, as pkv_seq_match_prefix_tiered
 * does: the tier hits' blocks are among the blocks the prompt needs anyway,
 * so the prompt fits exactly when it fits pkv_seq_admit, and then every
 * tier hit is taken (PKV_E_OUT_OF_BLOCKS otherwise: no sequence, no hit).
 * out->num_cached tokens need no prefill; the next pkv_batch_prepare loads
 * the host_tokens + file_tokens (a failed load is a miss there, as for
 * pkv_seq_match_prefix_tiered). Without tiers it equals pkv_seq_admit(_hashes)
 * with out->device_tokens its out_num_cached. The ABI-1 admit and hash
 * lookup stay device-only: their out_num_cached counts computed tokens. */
PKV_API pkv_status pkv_seq_admit_tiered(pkv_pool* pool, const pkv_seq_options* opts,
                                        const int32_t* tokens, uint64_t num_tokens,
                                        const pkv_block_hash* hashes, uint64_t num_hashes,
                                        uint32_t num_lookahead, pkv_seq_id* out_seq,
                                        pkv_tier_match* out);

typedef struct pkv_tier_stats {
  uint32_t struct_size; /* sizeof(pkv_tier_stats); set by _init */
  uint32_t medium;      /* PKV_MEDIUM_HOST or PKV_MEDIUM_FILE */
  uint64_t capacity_blocks;
  uint64_t num_blocks; /* held now */
  uint64_t bytes;      /* held now */
  uint64_t num_stored; /* blocks copied in (offloads; demotions for the file tier) */
  uint64_t num_removed;
  uint64_t num_hits;   /* blocks a tiered match found here */
  uint64_t num_loaded; /* blocks loaded back into the pool, checksum verified */
  uint64_t bytes_stored;
  uint64_t bytes_loaded;
  uint64_t load_ns; /* total time of the loads (bytes_loaded / load_ns = load bandwidth) */
  uint64_t num_checksum_failures;
  uint64_t num_io_errors;
  uint64_t num_dropped; /* offloads not made: queue full, or every entry pinned */
} pkv_tier_stats;

PKV_API void pkv_tier_stats_init(pkv_tier_stats* stats);
/* pkv_tier_stats_init's defaults into exactly size bytes (pass sizeof *stats), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_tier_stats_init_sized(pkv_tier_stats* stats, size_t size);
/* PKV_E_INVALID_STATE when the pool has no such tier. */
PKV_API pkv_status pkv_pool_get_tier_stats(const pkv_pool* pool, uint32_t medium,
                                           pkv_tier_stats* out);

/* Waits until queued offloads are in their tier and runs pending loads
 * (tests, benchmarks, a clean shutdown). Engines need not call it. CUDA
 * pools: the loads go on the stream the pool last planned on, and the call
 * returns once every copy of the tiers completed. */
PKV_API pkv_status pkv_pool_flush_tiers(pkv_pool* pool);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_TIERS_H */
