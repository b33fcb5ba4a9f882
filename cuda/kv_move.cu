// Launchers of the KV-moving kernels.
#include <algorithm>

#include "kv_move.cuh"

namespace pagedkv {
namespace cuda {

cudaError_t launch_write(const WriteParams& p, cudaStream_t s) {
  if (p.num_tokens <= 0) return cudaSuccess;
  const unsigned grid = unsigned(std::min<int64_t>(p.num_tokens, 1 << 16));
  if (p.fp8 != 0) {
    if (p.fp8 == 6) {  // PKV_DTYPE_FP8_E4M3
      write_kv_fp8_kernel<Fp8E4m3><<<grid, 128, 0, s>>>(p);
    } else {
      write_kv_fp8_kernel<Fp8E5m2><<<grid, 128, 0, s>>>(p);
    }
    return cudaGetLastError();
  }
  switch (p.unit) {
    case 16:
      write_kv_kernel<16><<<grid, 128, 0, s>>>(p);
      break;
    case 8:
      write_kv_kernel<8><<<grid, 128, 0, s>>>(p);
      break;
    case 4:
      write_kv_kernel<4><<<grid, 128, 0, s>>>(p);
      break;
    case 2:
      write_kv_kernel<2><<<grid, 128, 0, s>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_copy_blocks(char* base, int32_t num_planes, int64_t plane_bytes,
                               int64_t block_bytes, const int32_t* pairs, int64_t num_pairs,
                               cudaStream_t s) {
  if (num_pairs <= 0 || num_planes <= 0) return cudaSuccess;
  copy_blocks_kernel<<<move_grid(num_pairs, num_planes), 128, 0, s>>>(base, num_planes, plane_bytes,
                                                                      block_bytes, pairs);
  return cudaGetLastError();
}

cudaError_t launch_gather_blocks(char* base, int32_t num_planes, int64_t plane_bytes,
                                 int64_t block_bytes, const int32_t* blocks, int64_t n, char* buf,
                                 bool to_buffer, cudaStream_t s) {
  if (n <= 0 || num_planes <= 0) return cudaSuccess;
  gather_blocks_kernel<<<move_grid(n, num_planes), 128, 0, s>>>(
      base, num_planes, plane_bytes, block_bytes, blocks, buf, to_buffer);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace pagedkv
