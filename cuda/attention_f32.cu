// Instantiates paged attention for float (one file per dtype so that the
// instantiations compile in parallel).
#include "attention.cuh"

namespace pagedkv {
namespace cuda {

cudaError_t launch_attention_f32(const AttnParams& p, const AttnLaunch& l, cudaStream_t s) {
  return launch_attention_typed<float>(p, l, s);
}

}  // namespace cuda
}  // namespace pagedkv
