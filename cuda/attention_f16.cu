// Instantiates paged attention for __half (one file per dtype so that the
// instantiations compile in parallel).
#include "attention.cuh"

namespace pagedkv {
namespace cuda {

cudaError_t launch_attention_f16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  return launch_attention_typed<__half>(p, l, s);
}

}  // namespace cuda
}  // namespace pagedkv
