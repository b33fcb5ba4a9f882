// Instantiates paged attention over FP8 E4M3 pages, for f16 and bf16
// queries (one file per FP8 format so that they compile in parallel).
#include "attention.cuh"

namespace pagedkv {
namespace cuda {

cudaError_t launch_attention_e4m3_f16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  return launch_attention_typed<__half, Fp8E4m3>(p, l, s);
}

cudaError_t launch_attention_e4m3_bf16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  return launch_attention_typed<__nv_bfloat16, Fp8E4m3>(p, l, s);
}

}  // namespace cuda
}  // namespace pagedkv
