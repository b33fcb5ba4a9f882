// Host launchers of the CUDA kernels. Each returns the launch's cudaError_t;
// the backend (backend_cuda.cpp) turns errors into pagedkv::Error. The
// parameter structs are POD and passed to the kernels by value.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pagedkv {
namespace cuda {

// ------------------------------------------------------------ attention

// One paged-attention launch over a step plan. Rows of work are (query token,
// q head of the group) pairs; a CTA covers up to `rows` consecutive rows of
// one sequence for one KV head (the whole GQA group of a decode token) and
// one KV split. Pointers are device pointers.
struct AttnParams {
  const void* k_plane;  // [num_blocks, num_kv_heads, block_size, head_dim]
  const void* v_plane;
  int32_t num_kv_heads;
  int32_t block_size;
  const int32_t* query_indptr;  // [num_seqs + 1]
  const int32_t* page_indptr;   // [num_seqs + 1]
  const int32_t* page_indices;
  const int32_t* context_lens;  // [num_seqs]
  const void* q;                // [num_tokens, num_q_heads, head_dim]
  int64_t q_s0, q_s1;           // element strides
  void* out;
  int64_t o_s0, o_s1;
  float* lse;  // nullable, natural log
  int64_t lse_s0;
  int32_t num_q_heads;
  int32_t group;  // num_q_heads / num_kv_heads
  float softmax_scale;
  float softcap;   // 0 = off
  int32_t window;  // 0 = off
  int32_t tiles_per_seq;
  int32_t num_splits;
  int64_t num_tokens;
  float* part_o;    // [num_splits, num_tokens, num_q_heads, head_dim] when split
  float* part_lse;  // [num_splits, num_tokens, num_q_heads], log2 domain
  // FP8 caches: this layer's per-KV-head dequantisation scales (device
  // memory, after the planes); null otherwise.
  const float* k_scales;
  const float* v_scales;
};

struct AttnLaunch {
  int32_t head_dim;  // 64, 80, 96, 128, 256
  bool large_tile;   // false: 16 rows per CTA (decode); true: prefill tile
                     // (16 and 128 rows, 64 at head dim 256, for f16/bf16 pages)
  int32_t num_seqs;
  // f16/bf16 pages on the generic kernel instead of the mma.sync one (head
  // dim 256 on devices with too little shared memory for the latter).
  bool generic;
};

// Rows per CTA of the large (prefill) tile for a dtype size and head dim.
int attn_large_rows(int dtype_bytes, int head_dim);
int attn_small_rows();

// Launch attention (and the merge of splits when p.num_splits > 1).
cudaError_t launch_attention_f32(const AttnParams& p, const AttnLaunch& l, cudaStream_t s);
cudaError_t launch_attention_f16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s);
cudaError_t launch_attention_bf16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s);
// FP8 pages (E4M3 / E5M2) with f16 or bf16 queries and outputs.
cudaError_t launch_attention_e4m3_f16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s);
cudaError_t launch_attention_e4m3_bf16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s);
cudaError_t launch_attention_e5m2_f16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s);
cudaError_t launch_attention_e5m2_bf16(const AttnParams& p, const AttnLaunch& l, cudaStream_t s);

// Dynamic shared memory of the instantiation a launch would use (0 for an
// unsupported head dim).
size_t attn_smem_bytes(int dtype_bytes, int head_dim, bool large_tile);
// The same for FP8 pages read with 2-byte (f16/bf16) queries.
size_t attn_smem_bytes_fp8(int head_dim, bool large_tile);
// f16/bf16 pages (paged_attention_mma_kernel): rows per CTA of the large
// tile (the small one has attn_small_rows()) and dynamic shared memory (f16
// and bf16 are equal).
int attn_mma_large_rows(int head_dim);
size_t attn_mma_smem_bytes(int head_dim, bool large_tile);
// Largest dynamic shared memory any attention instantiation asks for.
size_t attn_max_smem_bytes();

// ------------------------------------------------------- moving KV bytes

// Slot-mapped scatter of new K and V rows into one layer's planes. Strides
// are in bytes; row_bytes = head_dim * element size.
struct WriteParams {
  char* k_plane;
  char* v_plane;
  const char* k;
  const char* v;
  int64_t k_s0, k_s1, v_s0, v_s1;
  const int64_t* slot_mapping;  // [num_tokens], -1 = padding
  int64_t num_tokens;
  int32_t num_kv_heads;
  int32_t block_size;
  int32_t row_bytes;
  int32_t unit;  // widest access (16, 8, 4 or 2 bytes) all addresses allow
  // FP8 pools (fp8 = PKV_DTYPE_FP8_E4M3 / E5M2, else 0): k and v are
  // f32/f16/bf16 (k_dtype, v_dtype: PKV_DTYPE_* values; strides in their
  // bytes), quantised as code(x / scale of the head); row_bytes = head dim.
  int32_t fp8;
  int32_t k_dtype, v_dtype;
  const float* k_scales;
  const float* v_scales;
};
cudaError_t launch_write(const WriteParams& p, cudaStream_t s);

// Block copies in every plane of the arena: pairs[2i] -> pairs[2i+1].
cudaError_t launch_copy_blocks(char* base, int32_t num_planes, int64_t plane_bytes,
                               int64_t block_bytes, const int32_t* pairs, int64_t num_pairs,
                               cudaStream_t s);

// Gather blocks[i] of every plane into buf laid out [n][num_planes][block
// bytes] (to_buffer) or scatter buf back into the blocks.
cudaError_t launch_gather_blocks(char* base, int32_t num_planes, int64_t plane_bytes,
                                 int64_t block_bytes, const int32_t* blocks, int64_t n, char* buf,
                                 bool to_buffer, cudaStream_t s);

// Testing hook: force the number of KV splits of every attention launch
// (0 = heuristic). Lets tests exercise the split/merge path on small inputs.
void set_forced_splits(int splits);
int forced_splits();

}  // namespace cuda
}  // namespace pagedkv
