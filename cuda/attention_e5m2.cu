// Instantiates paged attention over FP8 E5M2 pages, for f16 and bf16
// queries (one file per FP8 format so that they compile in parallel).
#include "attention.cuh"

namespace pagedkv {
namespace cuda {

cudaError_t launch_attention_e5m2_f16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  return launch_attention_typed<__half, Fp8E5m2>(p, l, s);
}

cudaError_t launch_attention_e5m2_bf16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  return launch_attention_typed<__nv_bfloat16, Fp8E5m2>(p, l, s);
}

}  // namespace cuda
}  // namespace pagedkv
