/* shim.h: C helpers for the Go binding.
 *
 * Every fallible pkv_* call goes through a pkvgo_* wrapper that returns the
 * status together with a malloc'ed copy of the error message, taken with
 * pkv_last_error_copy inside the same C call: a goroutine may move to another
 * OS thread between two cgo calls, so reading the thread-local message in a
 * second call could return another goroutine's message.
 */
#ifndef PAGEDKV_GO_SHIM_H
#define PAGEDKV_GO_SHIM_H

#include <stdlib.h>

#include <pagedkv/pagedkv.h>

typedef struct pkvgo_result {
  pkv_status status;
  char* msg; /* NULL on success; else malloc'ed, freed by the Go side */
} pkvgo_result;

pkvgo_result pkvgo_capture(pkv_status status);

/* Does nothing. The Go side passes each caller-supplied pointer of a call
 * that cgo's pointer check refused (a Tensor descriptor holding a Go
 * pointer, a stream or host buffer pointing at Go memory that holds Go
 * pointers) through it, to name the argument in its error. */
void pkvgoshim_probe(const void* p);

/* Versioned structs: pkvgo_X_init_sized(s, size) is pkv_X_init_sized, which
 * the binding calls with its own C.sizeof_pkv_X (docs/conventions.md,
 * "Versioned structs"). */
#define PKVGO_INIT_SIZED(X) pkvgo_result pkvgo_##X##_init_sized(pkv_##X* s, size_t size)
PKVGO_INIT_SIZED(pool_options);
PKVGO_INIT_SIZED(seq_options);
PKVGO_INIT_SIZED(hash_options);
PKVGO_INIT_SIZED(attention_params);
PKVGO_INIT_SIZED(batch_info);
PKVGO_INIT_SIZED(pool_stats);
PKVGO_INIT_SIZED(seq_info);
PKVGO_INIT_SIZED(prefix_match);
PKVGO_INIT_SIZED(event_publisher_options);
PKVGO_INIT_SIZED(event_publisher_stats);
PKVGO_INIT_SIZED(kv_group_spec);
PKVGO_INIT_SIZED(group_stats);
PKVGO_INIT_SIZED(tier_options);
PKVGO_INIT_SIZED(tier_match);
PKVGO_INIT_SIZED(tier_stats);
PKVGO_INIT_SIZED(transfer_options);

/* common.h */
pkvgo_result pkvgo_tensor_init(void* data, uint32_t dtype, int32_t device_type, int32_t device_id,
                               int32_t ndim, const int64_t* shape, pkv_tensor* out);

/* hash.h */
pkvgo_result pkvgo_hash_prefix(const pkv_hash_options* opts, const int32_t* tokens,
                               uint64_t num_tokens, pkv_block_hash* out_hashes, uint64_t capacity,
                               uint64_t* out_num_blocks);
pkvgo_result pkvgo_hash_root(uint32_t algo, const char* seed, pkv_block_hash* out);

/* pool.h */
pkvgo_result pkvgo_pool_create(const pkv_pool_options* opts, pkv_pool** out);
pkvgo_result pkvgo_pool_get_options(const pkv_pool* pool, pkv_pool_options* out);
pkvgo_result pkvgo_pool_bytes_per_block(const pkv_pool* pool, uint64_t* out);
pkvgo_result pkvgo_pool_set_kv_scales(pkv_pool* pool, const float* k_scales, const float* v_scales,
                                      uint64_t num_scales);
pkvgo_result pkvgo_pool_get_kv_scales(const pkv_pool* pool, float* k_out, float* v_out,
                                      uint64_t capacity, uint64_t* out_len);
pkvgo_result pkvgo_seq_create(pkv_pool* pool, const pkv_seq_options* opts, pkv_seq_id* out);
pkvgo_result pkvgo_seq_match_prefix(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                    uint64_t num_tokens, uint64_t* out_num_cached);
pkvgo_result pkvgo_seq_append(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                              uint64_t num_tokens, uint32_t num_lookahead);
pkvgo_result pkvgo_seq_blocks_needed(const pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens,
                                     uint32_t num_lookahead, uint64_t* out_blocks);
pkvgo_result pkvgo_seq_fork(pkv_pool* pool, pkv_seq_id parent, pkv_seq_id* out_child);
pkvgo_result pkvgo_seq_truncate(pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens);
pkvgo_result pkvgo_seq_reserve(pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens);
pkvgo_result pkvgo_seq_free(pkv_pool* pool, pkv_seq_id seq);
pkvgo_result pkvgo_seq_get_info(const pkv_pool* pool, pkv_seq_id seq, pkv_seq_info* out);
pkvgo_result pkvgo_seq_get_block_table(const pkv_pool* pool, pkv_seq_id seq, int32_t* out_blocks,
                                       uint64_t capacity, uint64_t* out_len);
pkvgo_result pkvgo_seq_get_block_hashes(const pkv_pool* pool, pkv_seq_id seq,
                                        pkv_block_hash* out_hashes, uint64_t capacity,
                                        uint64_t* out_len);
pkvgo_result pkvgo_pool_get_stats(const pkv_pool* pool, pkv_pool_stats* out);
pkvgo_result pkvgo_pool_drain_events(pkv_pool* pool, pkv_event* out, uint64_t capacity,
                                     uint64_t* out_count);
pkvgo_result pkvgo_pool_reset_prefix_cache(pkv_pool* pool);
pkvgo_result pkvgo_pool_validate(const pkv_pool* pool);
pkvgo_result pkvgo_pool_kv_tensor(const pkv_pool* pool, uint32_t layer, uint32_t which,
                                  pkv_tensor* out);
pkvgo_result pkvgo_pool_copy_blocks(pkv_pool* pool, const int32_t* src, const int32_t* dst,
                                    uint64_t num_pairs, void* stream);
pkvgo_result pkvgo_pool_swap_blocks(pkv_pool* pool, const int32_t* blocks, uint64_t num_blocks,
                                    void* host_buffer, uint64_t host_bytes, uint32_t direction,
                                    void* stream);

/* batch.h */
pkvgo_result pkvgo_batch_prepare(pkv_pool* pool, const pkv_seq_id* seqs,
                                 const uint32_t* query_counts, uint32_t num_seqs, void* stream,
                                 pkv_batch** out);
pkvgo_result pkvgo_batch_prepare_ex(pkv_pool* pool, const pkv_seq_id* seqs,
                                    const uint32_t* query_counts, uint32_t num_seqs,
                                    uint32_t flags, void* stream, pkv_batch** out);
pkvgo_result pkvgo_batch_prepare_decode(pkv_pool* pool, const pkv_seq_id* seqs,
                                        const int32_t* tokens, uint32_t num_seqs, uint32_t flags,
                                        void* stream, pkv_batch** out);
pkvgo_result pkvgo_batch_get_info(const pkv_batch* batch, pkv_batch_info* out);
pkvgo_result pkvgo_batch_commit(pkv_batch* batch);
pkvgo_result pkvgo_batch_abort(pkv_batch* batch);
pkvgo_result pkvgo_batch_plan_tensor(const pkv_batch* batch, uint32_t which, pkv_tensor* out);
pkvgo_result pkvgo_batch_plan_tensor_group(const pkv_batch* batch, uint32_t group, uint32_t which,
                                          pkv_tensor* out);
pkvgo_result pkvgo_batch_token_positions(const pkv_batch* batch, pkv_tensor* out);
pkvgo_result pkvgo_batch_last_token_indices(const pkv_batch* batch, pkv_tensor* out);
pkvgo_result pkvgo_cache_write(pkv_batch* batch, uint32_t layer, const pkv_tensor* k,
                               const pkv_tensor* v, void* stream);
pkvgo_result pkvgo_attention_forward(pkv_batch* batch, uint32_t layer, const pkv_tensor* q,
                                     const pkv_tensor* out, const pkv_tensor* lse,
                                     const pkv_attention_params* params, void* stream);

/* Host-memory variants: the Go side passes the data pointers of its slices
 * as plain arguments and the descriptors are built here, on the C stack, so
 * no Go memory ever holds a pointer to Go memory (cgo's pointer rules). The
 * extents are [rows, heads, head_dim]; lse (may be NULL) is f32 [rows, heads]. */
pkvgo_result pkvgo_cache_write_host(pkv_batch* batch, uint32_t layer, uint32_t dtype, void* k,
                                    void* v, int64_t rows, int64_t heads, int64_t head_dim);
pkvgo_result pkvgo_attention_host(pkv_batch* batch, uint32_t layer, uint32_t dtype, void* q,
                                  void* out, float* lse, int64_t rows, int64_t heads,
                                  int64_t head_dim, const pkv_attention_params* params);

/* pool.h: partial-block hits and retention priorities */
pkvgo_result pkvgo_seq_match_prefix_partial(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                            uint64_t num_tokens, pkv_prefix_match* out);
pkvgo_result pkvgo_seq_set_retention(pkv_pool* pool, pkv_seq_id seq,
                                     const pkv_retention_range* ranges, uint64_t num_ranges);
pkvgo_result pkvgo_pool_set_clock(pkv_pool* pool, uint64_t now_ns);
pkvgo_result pkvgo_pool_get_priority_counts(const pkv_pool* pool, uint64_t* out_counts,
                                            uint64_t capacity, uint64_t* out_len);
pkvgo_result pkvgo_seq_append_batch(pkv_pool* pool, const pkv_seq_id* seqs, const int32_t* tokens,
                                    uint64_t num_seqs);
pkvgo_result pkvgo_seq_free_batch(pkv_pool* pool, const pkv_seq_id* seqs, uint64_t num_seqs);
pkvgo_result pkvgo_seq_admit(pkv_pool* pool, const pkv_seq_options* opts, const int32_t* tokens,
                             uint64_t num_tokens, uint32_t num_lookahead, pkv_seq_id* out_seq,
                             uint64_t* out_num_cached);
pkvgo_result pkvgo_seq_match_prefix_hashes(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                           uint64_t num_tokens, const pkv_block_hash* hashes,
                                           uint64_t num_hashes, uint64_t* out_num_cached);
pkvgo_result pkvgo_seq_admit_hashes(pkv_pool* pool, const pkv_seq_options* opts,
                                    const int32_t* tokens, uint64_t num_tokens,
                                    const pkv_block_hash* hashes, uint64_t num_hashes,
                                    uint32_t num_lookahead, pkv_seq_id* out_seq,
                                    uint64_t* out_num_cached);

/* pagedkv/events.h */
pkvgo_result pkvgo_pool_drain_events_v2(pkv_pool* pool, pkv_event_v2* out, uint64_t capacity,
                                        int32_t* token_buf, uint64_t token_capacity,
                                        uint64_t* out_count);
pkvgo_result pkvgo_event_publisher_create(pkv_pool* pool, const char* endpoint,
                                          const char* replay_endpoint,
                                          const pkv_event_publisher_options* opts,
                                          pkv_event_publisher** out);
pkvgo_result pkvgo_event_publisher_publish(pkv_event_publisher* pub, uint64_t* out_num_events);
pkvgo_result pkvgo_event_publisher_get_stats(const pkv_event_publisher* pub,
                                             pkv_event_publisher_stats* out);
pkvgo_result pkvgo_event_publisher_endpoint(const pkv_event_publisher* pub, uint32_t which,
                                            char* buf, uint64_t capacity, uint64_t* out_len);


/* MLA (batch.h): tensor calls and f32 host helpers over row-major buffers. */
pkvgo_result pkvgo_mla_cache_write(pkv_batch* batch, uint32_t layer, const pkv_tensor* kv_c,
                                   const pkv_tensor* k_pe, void* stream);
pkvgo_result pkvgo_mla_attention(pkv_batch* batch, uint32_t layer, const pkv_tensor* q_latent,
                                 const pkv_tensor* q_pe, const pkv_tensor* out,
                                 const pkv_tensor* lse, const pkv_attention_params* params,
                                 void* stream);
pkvgo_result pkvgo_mla_cache_write_host(pkv_batch* batch, uint32_t layer, uint32_t dtype,
                                        void* kv_c, void* k_pe, int64_t rows, int64_t rank,
                                        int64_t rope);
pkvgo_result pkvgo_mla_attention_host(pkv_batch* batch, uint32_t layer, uint32_t dtype,
                                      void* q_latent, void* q_pe, void* out, float* lse,
                                      int64_t rows, int64_t heads, int64_t rank, int64_t rope,
                                      const pkv_attention_params* params);
/* tiers.h */
pkvgo_result pkvgo_pool_attach_tiers(pkv_pool* pool, const pkv_tier_options* opts);
pkvgo_result pkvgo_seq_match_prefix_tiered(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                           uint64_t num_tokens, pkv_tier_match* out);
pkvgo_result pkvgo_seq_match_prefix_hashes_tiered(pkv_pool* pool, pkv_seq_id seq,
                                                  const int32_t* tokens, uint64_t num_tokens,
                                                  const pkv_block_hash* hashes, uint64_t num_hashes,
                                                  pkv_tier_match* out);
pkvgo_result pkvgo_seq_admit_tiered(pkv_pool* pool, const pkv_seq_options* opts,
                                    const int32_t* tokens, uint64_t num_tokens,
                                    const pkv_block_hash* hashes, uint64_t num_hashes,
                                    uint32_t num_lookahead, pkv_seq_id* out_seq,
                                    pkv_tier_match* out);
pkvgo_result pkvgo_pool_get_tier_stats(const pkv_pool* pool, uint32_t medium, pkv_tier_stats* out);
pkvgo_result pkvgo_pool_flush_tiers(pkv_pool* pool);
/* groups.h */
pkvgo_result pkvgo_pool_create_groups(const pkv_pool_options* base, const pkv_kv_group_spec* groups,
                                      uint32_t num_groups, pkv_pool** out);
pkvgo_result pkvgo_pool_num_groups(const pkv_pool* pool, uint32_t* out);
pkvgo_result pkvgo_pool_group_of_layer(const pkv_pool* pool, uint32_t layer, uint32_t* out_group,
                                       uint32_t* out_index);
pkvgo_result pkvgo_seq_group_block_table(const pkv_pool* pool, pkv_seq_id seq, uint32_t group,
                                         int32_t* out_blocks, uint64_t capacity, uint64_t* out_len);
pkvgo_result pkvgo_pool_group_stats(const pkv_pool* pool, uint32_t group, pkv_group_stats* out);
pkvgo_result pkvgo_pool_group_take_copies(pkv_pool* pool, uint32_t group, int32_t* src, int32_t* dst,
                                          uint64_t capacity, uint64_t* out_len);

#endif /* PAGEDKV_GO_SHIM_H */
