// Tile shapes of the attention kernels, for the host-side planner.
#include <algorithm>

#include "attention.cuh"

namespace pagedkv {
namespace cuda {

namespace {
template <typename T, int D, bool FP8>
constexpr size_t smem_for_dim() {
  constexpr int KT = kv_tile<T, D>();
  return std::max(AttnSmem<T, D, kSmallRows, KT, FP8>::kBytes,
                  AttnSmem<T, D, large_rows(int(sizeof(T)), D), KT, FP8>::kBytes);
}
template <typename T, bool FP8 = false>
constexpr size_t smem_for_type() {
  return std::max({smem_for_dim<T, 64, FP8>(), smem_for_dim<T, 80, FP8>(),
                   smem_for_dim<T, 96, FP8>(), smem_for_dim<T, 128, FP8>(),
                   smem_for_dim<T, 256, FP8>()});
}
std::atomic<int> g_forced_splits{0};
}  // namespace

int attn_large_rows(int dtype_bytes, int head_dim) { return large_rows(dtype_bytes, head_dim); }
int attn_small_rows() { return kSmallRows; }

namespace {
template <typename T, bool FP8 = false>
size_t smem_of(int head_dim, bool large) {
  switch (head_dim) {
#define PKV_SMEM_CASE(D)                                                                       \
  case D:                                                                                      \
    return large ? AttnSmem<T, D, large_rows(int(sizeof(T)), D), kv_tile<T, D>(), FP8>::kBytes \
                 : AttnSmem<T, D, kSmallRows, kv_tile<T, D>(), FP8>::kBytes;
    PKV_SMEM_CASE(64)
    PKV_SMEM_CASE(80)
    PKV_SMEM_CASE(96)
    PKV_SMEM_CASE(128)
    PKV_SMEM_CASE(256)
#undef PKV_SMEM_CASE
    default:
      return 0;
  }
}
}  // namespace

size_t attn_smem_bytes(int dtype_bytes, int head_dim, bool large_tile) {
  switch (dtype_bytes) {
    case 4:
      return smem_of<float>(head_dim, large_tile);
    case 2:
      return smem_of<__half>(head_dim, large_tile);  // f16 and bf16 tiles are equal
    default:
      return 0;
  }
}

// FP8 pages are widened to f16/bf16 tiles; both have the same layout.
size_t attn_smem_bytes_fp8(int head_dim, bool large_tile) {
  return smem_of<__half, true>(head_dim, large_tile);
}

size_t attn_mma_smem_bytes(int head_dim, bool large_tile) {
  switch (head_dim) {
#define PKV_MMA_SMEM_CASE(D) \
  case D:                    \
    return large_tile ? MmaSmem<__half, D, false>::kBytes : MmaSmem<__half, D, true>::kBytes;
    PKV_MMA_SMEM_CASE(64)
    PKV_MMA_SMEM_CASE(80)
    PKV_MMA_SMEM_CASE(96)
    PKV_MMA_SMEM_CASE(128)
    PKV_MMA_SMEM_CASE(256)
#undef PKV_MMA_SMEM_CASE
    default:
      return 0;
  }
}
int attn_mma_large_rows(int head_dim) {
  return head_dim == 256 ? MmaSmem<__half, 256, false>::kRows : MmaSmem<__half, 128, false>::kRows;
}

size_t attn_max_smem_bytes() {
  size_t mma = 0;
  for (int d : {64, 80, 96, 128, 256}) {
    mma = std::max({mma, attn_mma_smem_bytes(d, false), attn_mma_smem_bytes(d, true)});
  }
  return std::max({smem_for_type<float>(), smem_for_type<__half>(), smem_for_type<__nv_bfloat16>(),
                   smem_for_type<__half, true>(), mma});
}

void set_forced_splits(int splits) { g_forced_splits.store(splits < 0 ? 0 : splits); }
int forced_splits() { return g_forced_splits.load(); }

}  // namespace cuda
}  // namespace pagedkv
