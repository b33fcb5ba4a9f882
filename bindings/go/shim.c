/* shim.c: see shim.h. Each wrapper is one pkv_* call followed by the
 * message capture, all on one OS thread within one cgo call. */
#include "shim.h"

#include <string.h>

void pkvgoshim_probe(const void* p) { (void)p; }

pkvgo_result pkvgo_capture(pkv_status status) {
  pkvgo_result r;
  char small[512];
  uint64_t n;
  r.status = status;
  r.msg = NULL;
  if (status == PKV_OK) return r;
  n = pkv_last_error_copy(small, sizeof small);
  r.msg = (char*)malloc((size_t)n + 1);
  if (r.msg == NULL) return r; /* the Go side falls back to the status text */
  if (n < sizeof small) {
    memcpy(r.msg, small, (size_t)n + 1);
  } else {
    pkv_last_error_copy(r.msg, n + 1);
  }
  return r;
}

#define PKVGO_DEFINE_INIT_SIZED(X) \
  PKVGO_INIT_SIZED(X) { return pkvgo_capture(pkv_##X##_init_sized(s, size)); }
PKVGO_DEFINE_INIT_SIZED(pool_options)
PKVGO_DEFINE_INIT_SIZED(seq_options)
PKVGO_DEFINE_INIT_SIZED(hash_options)
PKVGO_DEFINE_INIT_SIZED(attention_params)
PKVGO_DEFINE_INIT_SIZED(batch_info)
PKVGO_DEFINE_INIT_SIZED(pool_stats)
PKVGO_DEFINE_INIT_SIZED(seq_info)
PKVGO_DEFINE_INIT_SIZED(prefix_match)
PKVGO_DEFINE_INIT_SIZED(event_publisher_options)
PKVGO_DEFINE_INIT_SIZED(event_publisher_stats)
PKVGO_DEFINE_INIT_SIZED(kv_group_spec)
PKVGO_DEFINE_INIT_SIZED(group_stats)
PKVGO_DEFINE_INIT_SIZED(tier_options)
PKVGO_DEFINE_INIT_SIZED(tier_match)
PKVGO_DEFINE_INIT_SIZED(tier_stats)
PKVGO_DEFINE_INIT_SIZED(transfer_options)

pkvgo_result pkvgo_tensor_init(void* data, uint32_t dtype, int32_t device_type, int32_t device_id,
                               int32_t ndim, const int64_t* shape, pkv_tensor* out) {
  return pkvgo_capture(pkv_tensor_init(data, dtype, device_type, device_id, ndim, shape, out));
}

pkvgo_result pkvgo_hash_prefix(const pkv_hash_options* opts, const int32_t* tokens,
                               uint64_t num_tokens, pkv_block_hash* out_hashes, uint64_t capacity,
                               uint64_t* out_num_blocks) {
  return pkvgo_capture(
      pkv_hash_prefix(opts, tokens, num_tokens, out_hashes, capacity, out_num_blocks));
}

pkvgo_result pkvgo_hash_root(uint32_t algo, const char* seed, pkv_block_hash* out) {
  return pkvgo_capture(pkv_hash_root(algo, seed, out));
}

pkvgo_result pkvgo_pool_create(const pkv_pool_options* opts, pkv_pool** out) {
  return pkvgo_capture(pkv_pool_create(opts, out));
}

pkvgo_result pkvgo_pool_get_options(const pkv_pool* pool, pkv_pool_options* out) {
  return pkvgo_capture(pkv_pool_get_options(pool, out));
}

pkvgo_result pkvgo_pool_bytes_per_block(const pkv_pool* pool, uint64_t* out) {
  return pkvgo_capture(pkv_pool_bytes_per_block(pool, out));
}

pkvgo_result pkvgo_pool_set_kv_scales(pkv_pool* pool, const float* k_scales, const float* v_scales,
                                      uint64_t num_scales) {
  return pkvgo_capture(pkv_pool_set_kv_scales(pool, k_scales, v_scales, num_scales));
}

pkvgo_result pkvgo_pool_get_kv_scales(const pkv_pool* pool, float* k_out, float* v_out,
                                      uint64_t capacity, uint64_t* out_len) {
  return pkvgo_capture(pkv_pool_get_kv_scales(pool, k_out, v_out, capacity, out_len));
}

pkvgo_result pkvgo_seq_create(pkv_pool* pool, const pkv_seq_options* opts, pkv_seq_id* out) {
  return pkvgo_capture(pkv_seq_create(pool, opts, out));
}

pkvgo_result pkvgo_seq_match_prefix(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                    uint64_t num_tokens, uint64_t* out_num_cached) {
  return pkvgo_capture(pkv_seq_match_prefix(pool, seq, tokens, num_tokens, out_num_cached));
}

pkvgo_result pkvgo_seq_append(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                              uint64_t num_tokens, uint32_t num_lookahead) {
  return pkvgo_capture(pkv_seq_append(pool, seq, tokens, num_tokens, num_lookahead));
}

pkvgo_result pkvgo_seq_blocks_needed(const pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens,
                                     uint32_t num_lookahead, uint64_t* out_blocks) {
  return pkvgo_capture(pkv_seq_blocks_needed(pool, seq, num_tokens, num_lookahead, out_blocks));
}

pkvgo_result pkvgo_seq_fork(pkv_pool* pool, pkv_seq_id parent, pkv_seq_id* out_child) {
  return pkvgo_capture(pkv_seq_fork(pool, parent, out_child));
}

pkvgo_result pkvgo_seq_truncate(pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens) {
  return pkvgo_capture(pkv_seq_truncate(pool, seq, num_tokens));
}

pkvgo_result pkvgo_seq_reserve(pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens) {
  return pkvgo_capture(pkv_seq_reserve(pool, seq, num_tokens));
}

pkvgo_result pkvgo_seq_free(pkv_pool* pool, pkv_seq_id seq) {
  return pkvgo_capture(pkv_seq_free(pool, seq));
}

pkvgo_result pkvgo_seq_get_info(const pkv_pool* pool, pkv_seq_id seq, pkv_seq_info* out) {
  return pkvgo_capture(pkv_seq_get_info(pool, seq, out));
}

pkvgo_result pkvgo_seq_get_block_table(const pkv_pool* pool, pkv_seq_id seq, int32_t* out_blocks,
                                       uint64_t capacity, uint64_t* out_len) {
  return pkvgo_capture(pkv_seq_get_block_table(pool, seq, out_blocks, capacity, out_len));
}

pkvgo_result pkvgo_seq_get_block_hashes(const pkv_pool* pool, pkv_seq_id seq,
                                        pkv_block_hash* out_hashes, uint64_t capacity,
                                        uint64_t* out_len) {
  return pkvgo_capture(pkv_seq_get_block_hashes(pool, seq, out_hashes, capacity, out_len));
}

pkvgo_result pkvgo_pool_get_stats(const pkv_pool* pool, pkv_pool_stats* out) {
  return pkvgo_capture(pkv_pool_get_stats(pool, out));
}

pkvgo_result pkvgo_pool_drain_events(pkv_pool* pool, pkv_event* out, uint64_t capacity,
                                     uint64_t* out_count) {
  return pkvgo_capture(pkv_pool_drain_events(pool, out, capacity, out_count));
}

pkvgo_result pkvgo_pool_reset_prefix_cache(pkv_pool* pool) {
  return pkvgo_capture(pkv_pool_reset_prefix_cache(pool));
}

pkvgo_result pkvgo_pool_validate(const pkv_pool* pool) {
  return pkvgo_capture(pkv_pool_validate(pool));
}

pkvgo_result pkvgo_pool_kv_tensor(const pkv_pool* pool, uint32_t layer, uint32_t which,
                                  pkv_tensor* out) {
  return pkvgo_capture(pkv_pool_kv_tensor(pool, layer, which, out));
}

pkvgo_result pkvgo_pool_copy_blocks(pkv_pool* pool, const int32_t* src, const int32_t* dst,
                                    uint64_t num_pairs, void* stream) {
  return pkvgo_capture(pkv_pool_copy_blocks(pool, src, dst, num_pairs, stream));
}

pkvgo_result pkvgo_pool_swap_blocks(pkv_pool* pool, const int32_t* blocks, uint64_t num_blocks,
                                    void* host_buffer, uint64_t host_bytes, uint32_t direction,
                                    void* stream) {
  return pkvgo_capture(
      pkv_pool_swap_blocks(pool, blocks, num_blocks, host_buffer, host_bytes, direction, stream));
}

pkvgo_result pkvgo_batch_prepare(pkv_pool* pool, const pkv_seq_id* seqs,
                                 const uint32_t* query_counts, uint32_t num_seqs, void* stream,
                                 pkv_batch** out) {
  return pkvgo_capture(pkv_batch_prepare(pool, seqs, query_counts, num_seqs, stream, out));
}

pkvgo_result pkvgo_batch_prepare_ex(pkv_pool* pool, const pkv_seq_id* seqs,
                                    const uint32_t* query_counts, uint32_t num_seqs,
                                    uint32_t flags, void* stream, pkv_batch** out) {
  return pkvgo_capture(
      pkv_batch_prepare_ex(pool, seqs, query_counts, num_seqs, flags, stream, out));
}

pkvgo_result pkvgo_batch_prepare_decode(pkv_pool* pool, const pkv_seq_id* seqs,
                                        const int32_t* tokens, uint32_t num_seqs, uint32_t flags,
                                        void* stream, pkv_batch** out) {
  return pkvgo_capture(
      pkv_batch_prepare_decode(pool, seqs, tokens, num_seqs, flags, stream, out));
}

pkvgo_result pkvgo_batch_commit(pkv_batch* batch) { return pkvgo_capture(pkv_batch_commit(batch)); }

pkvgo_result pkvgo_batch_abort(pkv_batch* batch) { return pkvgo_capture(pkv_batch_abort(batch)); }

pkvgo_result pkvgo_batch_get_info(const pkv_batch* batch, pkv_batch_info* out) {
  return pkvgo_capture(pkv_batch_get_info(batch, out));
}

pkvgo_result pkvgo_batch_plan_tensor(const pkv_batch* batch, uint32_t which, pkv_tensor* out) {
  return pkvgo_capture(pkv_batch_plan_tensor(batch, which, out));
}

pkvgo_result pkvgo_batch_plan_tensor_group(const pkv_batch* batch, uint32_t group, uint32_t which,
                                          pkv_tensor* out) {
  return pkvgo_capture(pkv_batch_plan_tensor_group(batch, group, which, out));
}

pkvgo_result pkvgo_batch_token_positions(const pkv_batch* batch, pkv_tensor* out) {
  return pkvgo_capture(pkv_batch_token_positions(batch, out));
}

pkvgo_result pkvgo_batch_last_token_indices(const pkv_batch* batch, pkv_tensor* out) {
  return pkvgo_capture(pkv_batch_last_token_indices(batch, out));
}

pkvgo_result pkvgo_cache_write(pkv_batch* batch, uint32_t layer, const pkv_tensor* k,
                               const pkv_tensor* v, void* stream) {
  return pkvgo_capture(pkv_cache_write(batch, layer, k, v, stream));
}

pkvgo_result pkvgo_attention_forward(pkv_batch* batch, uint32_t layer, const pkv_tensor* q,
                                     const pkv_tensor* out, const pkv_tensor* lse,
                                     const pkv_attention_params* params, void* stream) {
  return pkvgo_capture(pkv_attention_forward(batch, layer, q, out, lse, params, stream));
}

pkvgo_result pkvgo_cache_write_host(pkv_batch* batch, uint32_t layer, uint32_t dtype, void* k,
                                    void* v, int64_t rows, int64_t heads, int64_t head_dim) {
  pkv_tensor tk, tv;
  const int64_t shape[3] = {rows, heads, head_dim};
  pkv_status st = pkv_tensor_init(k, dtype, PKV_DEVICE_CPU, 0, 3, shape, &tk);
  if (st == PKV_OK) st = pkv_tensor_init(v, dtype, PKV_DEVICE_CPU, 0, 3, shape, &tv);
  if (st == PKV_OK) st = pkv_cache_write(batch, layer, &tk, &tv, NULL);
  return pkvgo_capture(st);
}

pkvgo_result pkvgo_attention_host(pkv_batch* batch, uint32_t layer, uint32_t dtype, void* q,
                                  void* out, float* lse, int64_t rows, int64_t heads,
                                  int64_t head_dim, const pkv_attention_params* params) {
  pkv_tensor tq, tout, tlse;
  const int64_t shape[3] = {rows, heads, head_dim};
  pkv_status st = pkv_tensor_init(q, dtype, PKV_DEVICE_CPU, 0, 3, shape, &tq);
  if (st == PKV_OK) st = pkv_tensor_init(out, dtype, PKV_DEVICE_CPU, 0, 3, shape, &tout);
  if (st == PKV_OK && lse != NULL) {
    st = pkv_tensor_init(lse, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, shape, &tlse);
  }
  if (st == PKV_OK) {
    st = pkv_attention_forward(batch, layer, &tq, &tout, lse != NULL ? &tlse : NULL, params, NULL);
  }
  return pkvgo_capture(st);
}

pkvgo_result pkvgo_seq_match_prefix_partial(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                            uint64_t num_tokens, pkv_prefix_match* out) {
  return pkvgo_capture(pkv_seq_match_prefix_partial(pool, seq, tokens, num_tokens, out));
}

pkvgo_result pkvgo_seq_set_retention(pkv_pool* pool, pkv_seq_id seq,
                                     const pkv_retention_range* ranges, uint64_t num_ranges) {
  return pkvgo_capture(pkv_seq_set_retention(pool, seq, ranges, num_ranges));
}

pkvgo_result pkvgo_pool_set_clock(pkv_pool* pool, uint64_t now_ns) {
  return pkvgo_capture(pkv_pool_set_clock(pool, now_ns));
}

pkvgo_result pkvgo_pool_get_priority_counts(const pkv_pool* pool, uint64_t* out_counts,
                                            uint64_t capacity, uint64_t* out_len) {
  return pkvgo_capture(pkv_pool_get_priority_counts(pool, out_counts, capacity, out_len));
}

pkvgo_result pkvgo_seq_append_batch(pkv_pool* pool, const pkv_seq_id* seqs, const int32_t* tokens,
                                    uint64_t num_seqs) {
  return pkvgo_capture(pkv_seq_append_batch(pool, seqs, tokens, num_seqs));
}

pkvgo_result pkvgo_seq_free_batch(pkv_pool* pool, const pkv_seq_id* seqs, uint64_t num_seqs) {
  return pkvgo_capture(pkv_seq_free_batch(pool, seqs, num_seqs));
}

pkvgo_result pkvgo_seq_admit(pkv_pool* pool, const pkv_seq_options* opts, const int32_t* tokens,
                             uint64_t num_tokens, uint32_t num_lookahead, pkv_seq_id* out_seq,
                             uint64_t* out_num_cached) {
  return pkvgo_capture(
      pkv_seq_admit(pool, opts, tokens, num_tokens, num_lookahead, out_seq, out_num_cached));
}

pkvgo_result pkvgo_seq_match_prefix_hashes(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                           uint64_t num_tokens, const pkv_block_hash* hashes,
                                           uint64_t num_hashes, uint64_t* out_num_cached) {
  return pkvgo_capture(pkv_seq_match_prefix_hashes(pool, seq, tokens, num_tokens, hashes,
                                                   num_hashes, out_num_cached));
}

pkvgo_result pkvgo_seq_admit_hashes(pkv_pool* pool, const pkv_seq_options* opts,
                                    const int32_t* tokens, uint64_t num_tokens,
                                    const pkv_block_hash* hashes, uint64_t num_hashes,
                                    uint32_t num_lookahead, pkv_seq_id* out_seq,
                                    uint64_t* out_num_cached) {
  return pkvgo_capture(pkv_seq_admit_hashes(pool, opts, tokens, num_tokens, hashes, num_hashes,
                                            num_lookahead, out_seq, out_num_cached));
}

pkvgo_result pkvgo_pool_drain_events_v2(pkv_pool* pool, pkv_event_v2* out, uint64_t capacity,
                                        int32_t* token_buf, uint64_t token_capacity,
                                        uint64_t* out_count) {
  return pkvgo_capture(
      pkv_pool_drain_events_v2(pool, out, capacity, token_buf, token_capacity, out_count));
}

pkvgo_result pkvgo_event_publisher_create(pkv_pool* pool, const char* endpoint,
                                          const char* replay_endpoint,
                                          const pkv_event_publisher_options* opts,
                                          pkv_event_publisher** out) {
  return pkvgo_capture(pkv_event_publisher_create(pool, endpoint, replay_endpoint, opts, out));
}

pkvgo_result pkvgo_event_publisher_publish(pkv_event_publisher* pub, uint64_t* out_num_events) {
  return pkvgo_capture(pkv_event_publisher_publish(pub, out_num_events));
}

pkvgo_result pkvgo_event_publisher_get_stats(const pkv_event_publisher* pub,
                                             pkv_event_publisher_stats* out) {
  return pkvgo_capture(pkv_event_publisher_get_stats(pub, out));
}

pkvgo_result pkvgo_event_publisher_endpoint(const pkv_event_publisher* pub, uint32_t which,
                                            char* buf, uint64_t capacity, uint64_t* out_len) {
  return pkvgo_capture(pkv_event_publisher_endpoint(pub, which, buf, capacity, out_len));
}

pkvgo_result pkvgo_mla_cache_write(pkv_batch* batch, uint32_t layer, const pkv_tensor* kv_c,
                                   const pkv_tensor* k_pe, void* stream) {
  return pkvgo_capture(pkv_mla_cache_write(batch, layer, kv_c, k_pe, stream));
}

pkvgo_result pkvgo_mla_attention(pkv_batch* batch, uint32_t layer, const pkv_tensor* q_latent,
                                 const pkv_tensor* q_pe, const pkv_tensor* out,
                                 const pkv_tensor* lse, const pkv_attention_params* params,
                                 void* stream) {
  return pkvgo_capture(pkv_mla_attention(batch, layer, q_latent, q_pe, out, lse, params, stream));
}

pkvgo_result pkvgo_mla_cache_write_host(pkv_batch* batch, uint32_t layer, uint32_t dtype,
                                        void* kv_c, void* k_pe, int64_t rows, int64_t rank,
                                        int64_t rope) {
  pkv_tensor tc, tp;
  const int64_t cs[2] = {rows, rank}, ps[2] = {rows, rope};
  pkv_status st = pkv_tensor_init(kv_c, dtype, PKV_DEVICE_CPU, 0, 2, cs, &tc);
  if (st == PKV_OK) st = pkv_tensor_init(k_pe, dtype, PKV_DEVICE_CPU, 0, 2, ps, &tp);
  if (st == PKV_OK) st = pkv_mla_cache_write(batch, layer, &tc, k_pe != NULL ? &tp : NULL, NULL);
  return pkvgo_capture(st);
}

pkvgo_result pkvgo_mla_attention_host(pkv_batch* batch, uint32_t layer, uint32_t dtype,
                                      void* q_latent, void* q_pe, void* out, float* lse,
                                      int64_t rows, int64_t heads, int64_t rank, int64_t rope,
                                      const pkv_attention_params* params) {
  pkv_tensor tq, tp, to, tl;
  const int64_t qs[3] = {rows, heads, rank}, ps[3] = {rows, heads, rope}, ls[2] = {rows, heads};
  pkv_status st = pkv_tensor_init(q_latent, dtype, PKV_DEVICE_CPU, 0, 3, qs, &tq);
  if (st == PKV_OK) st = pkv_tensor_init(q_pe, dtype, PKV_DEVICE_CPU, 0, 3, ps, &tp);
  if (st == PKV_OK) st = pkv_tensor_init(out, dtype, PKV_DEVICE_CPU, 0, 3, qs, &to);
  if (st == PKV_OK && lse != NULL) st = pkv_tensor_init(lse, PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, ls, &tl);
  if (st == PKV_OK) {
    st = pkv_mla_attention(batch, layer, &tq, q_pe != NULL ? &tp : NULL, &to,
                           lse != NULL ? &tl : NULL, params, NULL);
  }
  return pkvgo_capture(st);
}

/* tiers.h */
pkvgo_result pkvgo_pool_attach_tiers(pkv_pool* pool, const pkv_tier_options* opts) {
  return pkvgo_capture(pkv_pool_attach_tiers(pool, opts));
}

pkvgo_result pkvgo_seq_match_prefix_tiered(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                           uint64_t num_tokens, pkv_tier_match* out) {
  return pkvgo_capture(pkv_seq_match_prefix_tiered(pool, seq, tokens, num_tokens, out));
}

pkvgo_result pkvgo_seq_match_prefix_hashes_tiered(pkv_pool* pool, pkv_seq_id seq,
                                                  const int32_t* tokens, uint64_t num_tokens,
                                                  const pkv_block_hash* hashes, uint64_t num_hashes,
                                                  pkv_tier_match* out) {
  return pkvgo_capture(
      pkv_seq_match_prefix_hashes_tiered(pool, seq, tokens, num_tokens, hashes, num_hashes, out));
}

pkvgo_result pkvgo_seq_admit_tiered(pkv_pool* pool, const pkv_seq_options* opts,
                                    const int32_t* tokens, uint64_t num_tokens,
                                    const pkv_block_hash* hashes, uint64_t num_hashes,
                                    uint32_t num_lookahead, pkv_seq_id* out_seq,
                                    pkv_tier_match* out) {
  return pkvgo_capture(pkv_seq_admit_tiered(pool, opts, tokens, num_tokens, hashes, num_hashes,
                                            num_lookahead, out_seq, out));
}

pkvgo_result pkvgo_pool_get_tier_stats(const pkv_pool* pool, uint32_t medium, pkv_tier_stats* out) {
  return pkvgo_capture(pkv_pool_get_tier_stats(pool, medium, out));
}

pkvgo_result pkvgo_pool_flush_tiers(pkv_pool* pool) {
  return pkvgo_capture(pkv_pool_flush_tiers(pool));
}

/* groups.h */
pkvgo_result pkvgo_pool_create_groups(const pkv_pool_options* base, const pkv_kv_group_spec* groups,
                                      uint32_t num_groups, pkv_pool** out) {
  return pkvgo_capture(pkv_pool_create_groups(base, groups, num_groups, out));
}

pkvgo_result pkvgo_pool_num_groups(const pkv_pool* pool, uint32_t* out) {
  return pkvgo_capture(pkv_pool_num_groups(pool, out));
}

pkvgo_result pkvgo_pool_group_of_layer(const pkv_pool* pool, uint32_t layer, uint32_t* out_group,
                                       uint32_t* out_index) {
  return pkvgo_capture(pkv_pool_group_of_layer(pool, layer, out_group, out_index));
}

pkvgo_result pkvgo_seq_group_block_table(const pkv_pool* pool, pkv_seq_id seq, uint32_t group,
                                         int32_t* out_blocks, uint64_t capacity, uint64_t* out_len) {
  return pkvgo_capture(pkv_seq_group_block_table(pool, seq, group, out_blocks, capacity, out_len));
}

pkvgo_result pkvgo_pool_group_stats(const pkv_pool* pool, uint32_t group, pkv_group_stats* out) {
  return pkvgo_capture(pkv_pool_group_stats(pool, group, out));
}

pkvgo_result pkvgo_pool_group_take_copies(pkv_pool* pool, uint32_t group, int32_t* src, int32_t* dst,
                                          uint64_t capacity, uint64_t* out_len) {
  return pkvgo_capture(pkv_pool_group_take_copies(pool, group, src, dst, capacity, out_len));
}
