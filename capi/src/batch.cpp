// pagedkv/batch.h: step plans, cache writes, attention.
#include "capi_util.h"

namespace pc = pkv_capi;
using pagedkv::Errc;
using pagedkv::fail;

namespace {

pagedkv::Batch& batch_of(const pkv_batch* b) {
  pc::require(b, "batch");
  if (!b->impl)
    fail(Errc::kUnsupported,
         "batch is a plan over a multi-group pool, which is manager only: the engine writes and "
         "attends with its own kernels (pagedkv/groups.h)");
  return *b->impl;
}

void check_prepare_flags(uint32_t flags) {
  if (flags & ~uint32_t(PKV_PREPARE_PERSISTENT_TABLE))
    fail(Errc::kInvalidArgument,
         "flags " + std::to_string(flags) + " has bits that are not PKV_PREPARE_* flags");
}

void prepare(pkv_pool* pool, const pkv_seq_id* seqs, const uint32_t* query_counts,
             uint32_t num_seqs, uint32_t flags, void* stream, pkv_batch** out) {
  pc::require(pool, "pool");
  if (num_seqs > 0) {
    pc::require(seqs, "seqs");
    pc::require(query_counts, "query_counts");
  }
  pc::require(out, "out");
  check_prepare_flags(flags);
  auto b = std::make_unique<pkv_batch>();
  if (pool->groups) {
    b->groups = pagedkv::GroupBatch::prepare(pool->groups, seqs, query_counts, num_seqs,
                                             (flags & PKV_PREPARE_PERSISTENT_TABLE) != 0);
    *out = b.release();
    return;
  }
  b->impl = pagedkv::Batch::prepare(pool->impl, seqs, query_counts, num_seqs, stream,
                                    (flags & PKV_PREPARE_PERSISTENT_TABLE) != 0);
  *out = b.release();
}

}  // namespace

extern "C" {

pkv_status pkv_batch_prepare(pkv_pool* pool, const pkv_seq_id* seqs, const uint32_t* query_counts,
                             uint32_t num_seqs, void* stream, pkv_batch** out) {
  PKV_GUARD(prepare(pool, seqs, query_counts, num_seqs, 0, stream, out));
}

pkv_status pkv_batch_prepare_ex(pkv_pool* pool, const pkv_seq_id* seqs,
                                const uint32_t* query_counts, uint32_t num_seqs, uint32_t flags,
                                void* stream, pkv_batch** out) {
  PKV_GUARD(prepare(pool, seqs, query_counts, num_seqs, flags, stream, out));
}

pkv_status pkv_batch_prepare_decode(pkv_pool* pool, const pkv_seq_id* seqs, const int32_t* tokens,
                                    uint32_t num_seqs, uint32_t flags, void* stream,
                                    pkv_batch** out) {
  PKV_GUARD({
    pc::require(pool, "pool");
    if (num_seqs > 0) {
      pc::require(seqs, "seqs");
      pc::require(tokens, "tokens");
    }
    pc::require(out, "out");
    check_prepare_flags(flags);
    if (pool->groups)
      fail(Errc::kUnsupported,
           "pkv_batch_prepare_decode is not supported on a multi-group pool: append with "
           "pkv_seq_append, then pkv_batch_prepare_ex (pagedkv/groups.h)");
    auto b = std::make_unique<pkv_batch>();
    b->impl = pagedkv::Batch::prepare_decode(pool->impl, seqs, tokens, num_seqs, stream,
                                             (flags & PKV_PREPARE_PERSISTENT_TABLE) != 0);
    *out = b.release();
  });
}

pkv_status pkv_batch_commit(pkv_batch* batch) {
  PKV_GUARD({
    pc::require(batch, "batch");
    if (batch->groups)
      batch->groups->commit();
    else
      batch_of(batch).commit();
  });
}

pkv_status pkv_batch_abort(pkv_batch* batch) {
  PKV_GUARD({
    pc::require(batch, "batch");
    if (batch->groups)
      batch->groups->abort();
    else
      batch_of(batch).abort();
  });
}

void pkv_batch_destroy(pkv_batch* batch) {
  delete batch;  // ~Batch is noexcept and frees its plan memory
}

void pkv_batch_info_init(pkv_batch_info* info) { pc::init_frozen<pc::kBatchInfoFrozen>(info); }

pkv_status pkv_batch_info_init_sized(pkv_batch_info* info, size_t size) {
  PKV_GUARD(pc::init_sized(info, "info", size, pc::kBatchInfoV1, "pkv_batch_info"));
}

pkv_status pkv_batch_get_info(const pkv_batch* batch, pkv_batch_info* out) {
  PKV_GUARD({
    pc::require(batch, "batch");
    pc::require(out, "out");
    pc::check_struct_size(out->struct_size, pc::kBatchInfoV1, "out", "pkv_batch_info",
                          "pkv_batch_info_init");
    const pagedkv::BatchInfo& i = batch->groups ? batch->groups->info() : batch_of(batch).info();
    pkv_batch_info r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.num_seqs = i.num_seqs;
    r.num_tokens = i.num_tokens;
    r.num_pages = i.num_pages;
    r.max_context = i.max_context;
    r.max_query = i.max_query;
    r.block_size = i.block_size;
    pc::write_out(out, r);
  });
}

pkv_status pkv_batch_plan_tensor(const pkv_batch* batch, uint32_t which, pkv_tensor* out) {
  PKV_GUARD({
    pc::require(batch, "batch");
    pc::require(out, "out");
    if (batch->groups)
      pc::from_arg(batch->groups->plan_tensor(0, which), out);
    else
      pc::from_arg(batch_of(batch).plan_tensor(which), out);
  });
}

pkv_status pkv_batch_plan_tensor_group(const pkv_batch* batch, uint32_t group, uint32_t which,
                                       pkv_tensor* out) {
  PKV_GUARD({
    pc::require(batch, "batch");
    pc::require(out, "out");
    if (batch->groups) {
      pc::from_arg(batch->groups->plan_tensor(group, which), out);
    } else {
      if (group != 0)
        fail(Errc::kInvalidArgument,
             "group " + std::to_string(group) + " is out of range (the pool has 1)");
      // As a multi-group plan answers for a group that is not recurrent.
      if (which >= pagedkv::kPlanSnapshotIndptr && which <= pagedkv::kPlanSnapshotBlocks)
        fail(Errc::kInvalidArgument,
             "which " + std::to_string(which) +
                 " is a PKV_PLAN_SNAPSHOT_* array but group 0 is not PKV_GROUP_RECURRENT (a "
                 "single-group pool's plan)");
      pc::from_arg(batch_of(batch).plan_tensor(which), out);
    }
  });
}

pkv_status pkv_cache_write(pkv_batch* batch, uint32_t layer, const pkv_tensor* k,
                           const pkv_tensor* v, void* stream) {
  PKV_GUARD({
    pagedkv::Batch& b = batch_of(batch);
    pc::require(k, "k");
    pc::require(v, "v");
    pagedkv::TensorArg ka = pc::to_arg(*k), va = pc::to_arg(*v);
    b.write(layer, &ka, &va, stream);
  });
}

void pkv_attention_params_init(pkv_attention_params* params) {
  pc::init_frozen<pc::kAttentionParamsFrozen>(params);
}

pkv_status pkv_attention_params_init_sized(pkv_attention_params* params, size_t size) {
  PKV_GUARD(pc::init_sized(params, "params", size, pc::kAttentionParamsV1, "pkv_attention_params"));
}

pkv_status pkv_attention_forward(pkv_batch* batch, uint32_t layer, const pkv_tensor* q,
                                 const pkv_tensor* out, const pkv_tensor* lse,
                                 const pkv_attention_params* params, void* stream) {
  PKV_GUARD({
    pagedkv::Batch& b = batch_of(batch);
    pc::require(q, "q");
    pc::require(out, "out");
    pagedkv::AttentionParams ap;
    if (params) {
      pc::check_struct_size(params->struct_size, pc::kAttentionParamsV1, "params",
                            "pkv_attention_params", "pkv_attention_params_init");
      ap.softmax_scale = params->softmax_scale;
      ap.sliding_window = params->sliding_window;
      ap.logit_softcap = params->logit_softcap;
    }
    pagedkv::TensorArg qa = pc::to_arg(*q), oa = pc::to_arg(*out), la;
    if (lse) la = pc::to_arg(*lse);
    b.attend(layer, &qa, &oa, lse ? &la : nullptr, ap, stream);
  });
}

pkv_status pkv_batch_token_positions(const pkv_batch* batch, pkv_tensor* out) {
  PKV_GUARD({
    pc::require(batch, "batch");
    pc::require(out, "out");
    pc::from_arg(
        batch->groups ? batch->groups->token_positions() : batch_of(batch).token_positions(), out);
  });
}

pkv_status pkv_batch_last_token_indices(const pkv_batch* batch, pkv_tensor* out) {
  PKV_GUARD({
    pc::require(batch, "batch");
    pc::require(out, "out");
    pc::from_arg(
        batch->groups ? batch->groups->last_token_indices() : batch_of(batch).last_token_indices(),
        out);
  });
}

pkv_status pkv_mla_cache_write(pkv_batch* batch, uint32_t layer, const pkv_tensor* kv_c,
                               const pkv_tensor* k_pe, void* stream) {
  PKV_GUARD({
    pagedkv::Batch& b = batch_of(batch);
    pc::require(kv_c, "kv_c");
    pagedkv::TensorArg ca = pc::to_arg(*kv_c), pa;
    if (k_pe) pa = pc::to_arg(*k_pe);
    b.mla_write(layer, &ca, k_pe ? &pa : nullptr, stream);
  });
}

pkv_status pkv_mla_attention(pkv_batch* batch, uint32_t layer, const pkv_tensor* q_latent,
                             const pkv_tensor* q_pe, const pkv_tensor* out, const pkv_tensor* lse,
                             const pkv_attention_params* params, void* stream) {
  PKV_GUARD({
    pagedkv::Batch& b = batch_of(batch);
    pc::require(q_latent, "q_latent");
    pc::require(out, "out");
    pc::require(params, "params");  // MLA has no default softmax_scale
    pc::check_struct_size(params->struct_size, pc::kAttentionParamsV1, "params",
                          "pkv_attention_params", "pkv_attention_params_init");
    pagedkv::AttentionParams ap;
    ap.softmax_scale = params->softmax_scale;
    ap.sliding_window = params->sliding_window;
    ap.logit_softcap = params->logit_softcap;
    pagedkv::TensorArg qa = pc::to_arg(*q_latent), pa, oa = pc::to_arg(*out), la;
    if (q_pe) pa = pc::to_arg(*q_pe);
    if (lse) la = pc::to_arg(*lse);
    b.mla_attend(layer, &qa, q_pe ? &pa : nullptr, &oa, lse ? &la : nullptr, ap, stream);
  });
}

}  // extern "C"
