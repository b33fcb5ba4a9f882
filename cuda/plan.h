// Host-side planning of kernel launches: argument checks, tile choice,
// split-KV count, parameter structs. Pure host code shared by the CUDA
// backend and the CPU-side emulation tests of the kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend.h"
#include "launch.h"

namespace pagedkv {
namespace cuda {

struct AttnPlan {
  AttnParams params;  // part_o / part_lse left null: the caller provides scratch
  AttnLaunch launch;
  size_t smem_bytes;     // dynamic shared memory of the chosen instantiation
  size_t scratch_bytes;  // f32 partials + LSE when params.num_splits > 1, else 0
};

// Throws Error(kInvalidArgument / kUnsupported) for arguments the kernels
// cannot take. sm_count drives the split-KV heuristic; max_smem is the
// device's opt-in shared memory per block: f16/bf16 head dim 256, whose
// mma.sync tiles need more than the 99 KB of sm_86/sm_89 parts, then take
// the generic kernel.
AttnPlan plan_attention(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& q,
                        const Tensor3& out, const AttentionArgs& args, int sm_count,
                        size_t max_smem = SIZE_MAX);

// Points part_o / part_lse into a scratch buffer of plan.scratch_bytes.
void attach_scratch(AttnPlan& plan, void* scratch);

WriteParams plan_write(const KvArena& arena, int32_t layer, const PlanView& plan, const Tensor3& k,
                       const Tensor3& v);

}  // namespace cuda
}  // namespace pagedkv
