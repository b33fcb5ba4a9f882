// Host-side parameter building for the MLA kernels: the backend's views of
// an MLA arena, a step plan and the checked tensors, as MlaWriteParams /
// MlaParams (device pointers throughout on a CUDA pool; host pointers under
// emulation).
#pragma once

#include "backend.h"
#include "mla_launch.h"

namespace pagedkv {
namespace cuda {

MlaWriteParams mla_write_params(const KvArena& arena, int32_t layer, const PlanView& plan,
                                const Tensor3& kv_c, const Tensor3& k_pe);
MlaParams mla_attention_params(const KvArena& arena, int32_t layer, const PlanView& plan,
                               const Tensor3& q_latent, const Tensor3& q_pe, const Tensor3& out,
                               const AttentionArgs& args);

}  // namespace cuda
}  // namespace pagedkv
