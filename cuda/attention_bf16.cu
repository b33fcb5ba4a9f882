// Instantiates paged attention for __nv_bfloat16 (one file per dtype so that the
// instantiations compile in parallel).
#include "attention.cuh"

namespace pagedkv {
namespace cuda {

cudaError_t launch_attention_bf16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  return launch_attention_typed<__nv_bfloat16>(p, l, s);
}

}  // namespace cuda
}  // namespace pagedkv
