// Plain-old-data views shared by the block manager, the CPU kernels and the
// CUDA kernels. Passed by value into kernels (FlashInfer-style), so they hold
// raw pointers only: host pointers for the CPU backend, device pointers for
// the CUDA backend.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagedkv {

// Values equal PKV_DTYPE_*.
enum class DType : uint32_t {
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kI32 = 4,
  kI64 = 5,
  kFp8E4m3 = 6,  // OCP FP8 E4M3 (max 448, no inf, NaN 0x7f/0xff); KV storage only
  kFp8E5m2 = 7,  // OCP FP8 E5M2 (max 57344, inf, NaN); KV storage only
};

inline constexpr bool is_fp8(DType t) { return t == DType::kFp8E4m3 || t == DType::kFp8E5m2; }

// Head dims the CUDA attention kernels are compiled for (the dispatch in
// cuda/attention.cuh and cuda/attention_config.cu); a CUDA pool with storage
// is created only for these. The CPU kernels take any head dim.
inline constexpr bool cuda_head_dim_supported(uint64_t d) {
  return d == 64 || d == 80 || d == 96 || d == 128 || d == 256;
}
constexpr const char* kCudaHeadDims = "64, 80, 96, 128, 256";

inline constexpr size_t dtype_size(DType t) {
  return t == DType::kF32 || t == DType::kI32 ? 4 : t == DType::kI64 ? 8 : is_fp8(t) ? 1 : 2;
}

// One layer's K (or V) storage: [num_blocks, num_kv_heads, block_size,
// head_dim], dense, so one head of one block is contiguous.
struct KvLayout {
  int32_t num_blocks;
  int32_t num_kv_heads;
  int32_t block_size;
  int32_t head_dim;
  DType dtype;

  int64_t head_stride() const { return int64_t(block_size) * head_dim; }
  int64_t block_stride() const { return int64_t(num_kv_heads) * head_stride(); }
  size_t layer_bytes() const { return size_t(num_blocks) * block_stride() * dtype_size(dtype); }
  size_t block_bytes() const { return size_t(block_stride()) * dtype_size(dtype); }
};

// The step plan as the kernels read it. Sequence s owns query rows
// [query_indptr[s], query_indptr[s+1]) and pages page_indices[page_indptr[s]
// .. page_indptr[s+1]); its keys are positions [0, context_lens[s]); its
// queries are the last (query_indptr[s+1]-query_indptr[s]) positions.
// Pages wholly outside a sliding window hold the null block (id 0) and must
// not be read.
struct PlanView {
  int32_t num_seqs;
  int64_t num_tokens;
  int32_t max_query;
  int32_t max_context;
  const int64_t* slot_mapping;   // [num_tokens]; -1 = padding, skip
  const int32_t* query_indptr;   // [num_seqs + 1]
  const int32_t* page_indptr;    // [num_seqs + 1]
  const int32_t* page_indices;   // [page_indptr[num_seqs]]
  const int32_t* last_page_len;  // [num_seqs]
  const int32_t* context_lens;   // [num_seqs]
};

// A 3-d tensor [n0, n1, n2] with element strides s0, s1 and unit innermost
// stride: q, k, v and out rows are [token, head, dim].
struct Tensor3 {
  void* data;
  DType dtype;
  int64_t n0, n1, n2;
  int64_t s0, s1;
};

struct AttentionArgs {
  float softmax_scale;     // already resolved (never 0)
  int32_t sliding_window;  // 0 = none; query p sees keys k with p - w < k <= p
  float logit_softcap;     // 0 = none
  float* lse;              // nullable; f32 [num_tokens, num_q_heads]
  int64_t lse_stride0;     // elements between tokens in lse (head stride 1)
};

}  // namespace pagedkv
