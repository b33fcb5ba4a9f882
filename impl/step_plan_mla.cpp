// The MLA entry points of a step plan: the latent cache write and absorbed
// attention over an MLA pool's one plane per layer (impl/cpu/mla.h has the
// kernel semantics). Argument checks and locking follow write()/attend().
#include <cmath>
#include <limits>

#include "step_plan.h"

namespace pagedkv {

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

// kv_c and k_pe are [tokens, width] (vLLM passes k_pe as [tokens, 1, rope]:
// taken too); checked as [tokens, 1, width] rows.
Tensor3 check_latent_rows(const TensorArg* t, const char* name, const RowsSpec& spec,
                          ByteSpan* span) {
  if (t->ndim == 3) return check_rows(t, name, spec, span);
  if (t->ndim != 2)
    fail(Errc::kInvalidArgument, std::string(name) + " has " + std::to_string(t->ndim) +
                                     " dimensions, expected 2 [num_tokens, " + str(spec.n2) +
                                     "] (or 3 with a middle dimension of 1)");
  // A wrong shape is named as the caller gave it, not as the view below.
  if (t->shape[0] != spec.n0 || t->shape[1] != spec.n2)
    fail(Errc::kInvalidArgument, std::string(name) + " has shape [" + std::to_string(t->shape[0]) +
                                     ", " + std::to_string(t->shape[1]) + "], expected [" +
                                     str(uint64_t(spec.n0)) + ", " + str(uint64_t(spec.n2)) + "]");
  TensorArg r = *t;
  r.ndim = 3;
  r.shape[2] = t->shape[1];
  r.shape[1] = 1;
  r.strides[2] = t->strides[1];
  // The middle dimension has extent 1: its stride moves nothing, and is
  // not computed from the caller's (unchecked) shape, which could overflow.
  r.strides[1] = t->strides[0] == 0 && t->strides[1] == 0 ? 0 : t->strides[1];
  r.strides[0] = t->strides[0];
  return check_rows(&r, name, spec, span);
}

ByteSpan plane_span(const KvArena& a, uint32_t layer) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(a.plane(int32_t(layer), 0));
  return ByteSpan{b, b + a.layout.layer_bytes()};
}

ByteSpan whole_arena(const KvArena& a) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(a.base);
  return ByteSpan{b, b + a.bytes()};
}

}  // namespace

void Batch::mla_write(uint32_t layer, const TensorArg* kv_c, const TensorArg* k_pe, void* stream) {
  Pool& p = *pool_;
  std::unique_lock<OpMutex> lock(p.mu_);
  p.keep_lane();  // checks only, until the write's second section
  check_layer_call(layer, true, "pkv_mla_cache_write");
  const PoolOptions& o = p.opts_;
  const int64_t n = int64_t(info_.num_tokens);
  RowsSpec cs{o.dtype, o.device_type, o.device_id, n, 1, int64_t(o.kv_lora_rank)};
  RowsSpec ps{o.dtype, o.device_type, o.device_id, n, 1, int64_t(o.qk_rope_head_dim)};
  ByteSpan c_span, pe_span;
  const Tensor3 c3 = check_latent_rows(kv_c, "kv_c", cs, &c_span);
  // A pool without a rotary part takes an empty (or absent) k_pe.
  Tensor3 pe3{};
  if (o.qk_rope_head_dim > 0 || k_pe != nullptr) {
    if (k_pe == nullptr) fail(Errc::kInvalidArgument, "k_pe is NULL");
    pe3 = check_latent_rows(k_pe, "k_pe", ps, &pe_span);
  }
  const ByteSpan dst = plane_span(p.arena_, layer);
  check_disjoint(c_span, "kv_c", dst, "the pool's KV storage of the layer it writes");
  check_disjoint(pe_span, "k_pe", dst, "the pool's KV storage of the layer it writes");
  const KvArena arena = p.arena_;
  const std::shared_ptr<void> hold = p.arena_hold_;  // as in write()
  lock.unlock();
  std::unique_lock<std::shared_mutex> kv_lock(p.kv_mu_);
  p.backend_->mla_write(arena, int32_t(layer), view_, c3, pe3, stream);
  kv_lock.unlock();  // mu_ before kv_mu_, as in write()
  lock.lock();
  mark_layer_written_keeping_lane(layer);
}

void Batch::mla_attend(uint32_t layer, const TensorArg* q_latent, const TensorArg* q_pe,
                       const TensorArg* out, const TensorArg* lse, const AttentionParams& params,
                       void* stream) {
  Pool& p = *pool_;
  std::unique_lock<OpMutex> lock(p.mu_);
  p.keep_lane();  // reads only
  check_layer_call(layer, true, "pkv_mla_attention");
  const PoolOptions& o = p.opts_;
  if (!std::isfinite(params.softmax_scale) || params.softmax_scale <= 0)
    fail(Errc::kInvalidArgument,
         "params->softmax_scale must be finite and > 0 for MLA (the model's scale, e.g. "
         "1/sqrt(qk_nope_head_dim + qk_rope_head_dim); the latent width does not give it)");
  if (params.sliding_window != 0 || params.logit_softcap != 0)
    fail(Errc::kUnsupported,
         "params->sliding_window and params->logit_softcap must be 0: MLA attention has neither");
  const int64_t n = int64_t(info_.num_tokens);
  RowsSpec qs{o.dtype, o.device_type, o.device_id, n, -1, int64_t(o.kv_lora_rank)};
  ByteSpan ql_span, qp_span, out_span, lse_span;
  const Tensor3 ql = check_rows(q_latent, "q_latent", qs, &ql_span);
  Tensor3 qp{};
  if (o.qk_rope_head_dim > 0 || q_pe != nullptr) {
    if (q_pe == nullptr) fail(Errc::kInvalidArgument, "q_pe is NULL");
    RowsSpec ps{o.dtype, o.device_type, o.device_id, n, ql.n1, int64_t(o.qk_rope_head_dim)};
    qp = check_rows(q_pe, "q_pe", ps, &qp_span);
  }
  if (ql.n1 > 4096)
    fail(Errc::kInvalidArgument, "q_latent has " + str(uint64_t(ql.n1)) + " heads, more than 4096");
  RowsSpec os{o.dtype, o.device_type, o.device_id, n, ql.n1, int64_t(o.kv_lora_rank), true};
  const Tensor3 out3 = check_rows(out, "out", os, &out_span);
  const ByteSpan kv = whole_arena(p.arena_);
  check_disjoint(out_span, "out", ql_span, "q_latent");
  check_disjoint(out_span, "out", qp_span, "q_pe");
  check_disjoint(out_span, "out", kv, "the pool's KV storage");
  AttentionArgs args{};
  args.softmax_scale = params.softmax_scale;
  if (lse) {
    args.lse = check_lse(lse, o.device_type, o.device_id, n, ql.n1, &args.lse_stride0, &lse_span);
    check_disjoint(lse_span, "lse", ql_span, "q_latent");
    check_disjoint(lse_span, "lse", qp_span, "q_pe");
    check_disjoint(lse_span, "lse", out_span, "out");
    check_disjoint(lse_span, "lse", kv, "the pool's KV storage");
  }
  const KvArena arena = p.arena_;
  const std::shared_ptr<void> hold = p.arena_hold_;  // as in write()
  lock.unlock();
  std::shared_lock<std::shared_mutex> kv_lock(p.kv_mu_);
  p.backend_->mla_attend(arena, int32_t(layer), view_, ql, qp, out3, args, stream);
}

}  // namespace pagedkv
