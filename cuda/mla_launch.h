// Host launchers of the MLA kernels (cuda/mla.cuh): the latent cache write
// and absorbed attention over an MLA pool's one plane per layer, with the
// semantics of impl/cpu/mla.h. Each returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagedkv {
namespace cuda {

// Threads per CTA and latent dims one thread accumulates: kv_lora_rank is at
// most kMlaThreads * kMlaMaxPerThread on a CUDA pool.
constexpr int kMlaThreads = 128;
constexpr int kMlaMaxPerThread = 8;
constexpr int kMlaMaxRank = kMlaThreads * kMlaMaxPerThread;
constexpr int kMlaKeyTile = 32;  // keys scored per round (a multiple of the warps)

struct MlaWriteParams {
  char* plane;  // [num_blocks, block_size, rank + rope] of elem_bytes elements
  int32_t rank, rope, elem_bytes;
  const int64_t* slot_mapping;
  int64_t num_tokens;
  const char* kv_c;  // [num_tokens, rank], row stride c_s0 elements
  int64_t c_s0;
  const char* k_pe;  // [num_tokens, rope], row stride pe_s0 elements
  int64_t pe_s0;
};

struct MlaParams {
  const void* plane;
  int32_t block_size, rank, rope;
  int32_t num_seqs;
  const int32_t* query_indptr;
  const int32_t* page_indptr;
  const int32_t* page_indices;
  const int32_t* context_lens;
  const void* q_lat;  // [num_tokens, num_heads, rank]
  int64_t ql_s0, ql_s1;
  const void* q_pe;  // [num_tokens, num_heads, rope]
  int64_t qp_s0, qp_s1;
  void* out;  // [num_tokens, num_heads, rank]
  int64_t o_s0, o_s1;
  float* lse;  // nullable
  int64_t lse_s0;
  int32_t num_heads;
  int64_t num_tokens;
  float scale;
};

// Dynamic shared memory of one attention CTA.
inline size_t mla_smem_bytes(int rank, int rope) {
  return sizeof(float) * (size_t(rank) + size_t(rope) + kMlaKeyTile);
}

cudaError_t launch_mla_write(const MlaWriteParams& p, cudaStream_t s);
// dtype: PKV_DTYPE_F32 (1), F16 (2) or BF16 (3).
cudaError_t launch_mla_attention(const MlaParams& p, int32_t dtype, cudaStream_t s);

}  // namespace cuda
}  // namespace pagedkv
