#include "mla_plan.h"

#include <string>

namespace pagedkv {
namespace cuda {

MlaWriteParams mla_write_params(const KvArena& arena, int32_t layer, const PlanView& plan,
                                const Tensor3& kv_c, const Tensor3& k_pe) {
  MlaWriteParams p{};
  p.plane = static_cast<char*>(arena.plane(layer, 0));
  p.rank = int32_t(kv_c.n2);
  p.rope = arena.layout.head_dim - p.rank;
  p.elem_bytes = int32_t(dtype_size(arena.layout.dtype));
  p.slot_mapping = plan.slot_mapping;
  p.num_tokens = plan.num_tokens;
  p.kv_c = static_cast<const char*>(kv_c.data);
  p.c_s0 = kv_c.s0;
  p.k_pe = static_cast<const char*>(k_pe.data);
  p.pe_s0 = k_pe.s0;
  return p;
}

MlaParams mla_attention_params(const KvArena& arena, int32_t layer, const PlanView& plan,
                               const Tensor3& q_latent, const Tensor3& q_pe, const Tensor3& out,
                               const AttentionArgs& args) {
  if (q_latent.n2 > kMlaMaxRank)
    fail(Errc::kUnsupported, "kv_lora_rank " + std::to_string(q_latent.n2) +
                                 " exceeds the CUDA MLA kernel's " + std::to_string(kMlaMaxRank));
  if (q_latent.n1 > 65535)
    fail(Errc::kUnsupported, "the CUDA MLA kernel takes at most 65535 heads");
  MlaParams p{};
  p.plane = arena.plane(layer, 0);
  p.block_size = arena.layout.block_size;
  p.rank = int32_t(q_latent.n2);
  p.rope = arena.layout.head_dim - p.rank;
  p.num_seqs = plan.num_seqs;
  p.query_indptr = plan.query_indptr;
  p.page_indptr = plan.page_indptr;
  p.page_indices = plan.page_indices;
  p.context_lens = plan.context_lens;
  p.q_lat = q_latent.data;
  p.ql_s0 = q_latent.s0;
  p.ql_s1 = q_latent.s1;
  p.q_pe = q_pe.data;
  p.qp_s0 = q_pe.s0;
  p.qp_s1 = q_pe.s1;
  p.out = out.data;
  p.o_s0 = out.s0;
  p.o_s1 = out.s1;
  p.lse = args.lse;
  p.lse_s0 = args.lse_stride0;
  p.num_heads = int32_t(q_latent.n1);
  p.num_tokens = plan.num_tokens;
  p.scale = args.softmax_scale;
  return p;
}

}  // namespace cuda
}  // namespace pagedkv
