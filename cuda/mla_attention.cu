// Launchers of the MLA kernels (cuda/mla.cuh).
#include <algorithm>

#include "mla.cuh"

namespace pagedkv {
namespace cuda {

cudaError_t launch_mla_write(const MlaWriteParams& p, cudaStream_t s) {
  if (p.num_tokens <= 0) return cudaSuccess;
  const unsigned grid = unsigned(std::min<int64_t>(p.num_tokens, 1 << 16));
  if (p.elem_bytes == 4) {
    mla_write_kernel<uint32_t><<<grid, 128, 0, s>>>(p);
  } else if (p.elem_bytes == 2) {
    mla_write_kernel<uint16_t><<<grid, 128, 0, s>>>(p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_mla_attention(const MlaParams& p, int32_t dtype, cudaStream_t s) {
  if (p.num_tokens <= 0 || p.num_heads <= 0) return cudaSuccess;
  if (p.rank > kMlaMaxRank || p.num_tokens > INT32_MAX || p.num_heads > 65535)
    return cudaErrorInvalidValue;
  const dim3 grid(unsigned(p.num_tokens), unsigned(p.num_heads), 1);
  const size_t smem = mla_smem_bytes(p.rank, p.rope);
  if (smem > 48 * 1024) return cudaErrorInvalidValue;  // rank + rope <= ~12k floats
  switch (dtype) {
    case 1:
      mla_attention_kernel<float><<<grid, kMlaThreads, smem, s>>>(p);
      break;
    case 2:
      mla_attention_kernel<__half><<<grid, kMlaThreads, smem, s>>>(p);
      break;
    case 3:
      mla_attention_kernel<__nv_bfloat16><<<grid, kMlaThreads, smem, s>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace pagedkv
