// Kernels that move KV bytes without arithmetic: the slot-mapped write, the
// batched block copy and the block gather/scatter used by swap. They are
// dtype-agnostic (a head row is row_bytes bytes) and use 16-byte accesses
// wherever the addresses allow; arena blocks always do (cudaMalloc'd base,
// head rows of 128+ bytes).
#pragma once

#include "common.cuh"
#include "launch.h"

namespace pagedkv {
namespace cuda {

template <int UNIT>
struct Unit;
template <>
struct Unit<16> {
  using type = uint4;
};
template <>
struct Unit<8> {
  using type = uint2;
};
template <>
struct Unit<4> {
  using type = uint32_t;
};
template <>
struct Unit<2> {
  using type = uint16_t;
};

// One CTA per token (grid-stride): threads over (kv head, unit of the row).
template <int UNIT>
__global__ void __launch_bounds__(128) write_kv_kernel(const WriteParams p) {
  using V = typename Unit<UNIT>::type;
  const int per_row = p.row_bytes / UNIT;
  const int64_t head_bytes = int64_t(p.block_size) * p.row_bytes;
  const int64_t block_bytes = head_bytes * p.num_kv_heads;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;  // padding token
    const int64_t block = slot / p.block_size, off = slot % p.block_size;
    const int64_t dst_row = block * block_bytes + off * p.row_bytes;
    for (int e = threadIdx.x; e < p.num_kv_heads * per_row; e += blockDim.x) {
      const int h = e / per_row, c = e % per_row;
      const int64_t dst = dst_row + h * head_bytes + int64_t(c) * UNIT;
      const V kv = *reinterpret_cast<const V*>(p.k + t * p.k_s0 + h * p.k_s1 + int64_t(c) * UNIT);
      const V vv = *reinterpret_cast<const V*>(p.v + t * p.v_s0 + h * p.v_s1 + int64_t(c) * UNIT);
      *reinterpret_cast<V*>(p.k_plane + dst) = kv;
      *reinterpret_cast<V*>(p.v_plane + dst) = vv;
    }
  }
}

// A PKV_DTYPE_* f32/f16/bf16 element as float.
__device__ __forceinline__ float load_as_float(const char* row, int32_t dtype, int d) {
  switch (dtype) {
    case 1:
      return reinterpret_cast<const float*>(row)[d];
    case 2:
      return to_float(reinterpret_cast<const __half*>(row)[d]);
    default:
      return to_float(reinterpret_cast<const __nv_bfloat16*>(row)[d]);
  }
}

// FP8 pools: one CTA per token (grid-stride), threads over (kv head, element);
// code = encode(x / scale of the head), the CPU encoder's rounding, bit for
// bit (tests/gpu/fp8_encode_test.cpp).
template <typename F>
__global__ void __launch_bounds__(128) write_kv_fp8_kernel(const WriteParams p) {
  const int D = p.row_bytes;
  const int64_t head_bytes = int64_t(p.block_size) * D;
  const int64_t block_bytes = head_bytes * p.num_kv_heads;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;  // padding token
    const int64_t block = slot / p.block_size, off = slot % p.block_size;
    const int64_t dst_row = block * block_bytes + off * D;
    for (int e = threadIdx.x; e < p.num_kv_heads * D; e += blockDim.x) {
      const int h = e / D, d = e % D;
      const int64_t dst = dst_row + h * head_bytes + d;
      const float kx = load_as_float(p.k + t * p.k_s0 + h * p.k_s1, p.k_dtype, d);
      const float vx = load_as_float(p.v + t * p.v_s0 + h * p.v_s1, p.v_dtype, d);
      p.k_plane[dst] = char(float_to_fp8<F>(kx / p.k_scales[h]));
      p.v_plane[dst] = char(float_to_fp8<F>(vx / p.v_scales[h]));
    }
  }
}

// gridDim.y is at most 65535, fewer than the planes of a pool of 32768+
// layers (65536 with MLA): the kernels below take grid.y = min(planes,
// cap) and loop over the planes gridDim.y apart.
constexpr int64_t kMaxGridY = 65535;
inline dim3 move_grid(int64_t n, int32_t num_planes, int64_t cap = kMaxGridY) {
  return dim3(unsigned(n), unsigned(num_planes < cap ? num_planes : cap), 1);
}

// grid (pair, plane): one CTA copies one block of one plane (or of every
// gridDim.y-th plane from blockIdx.y).
__global__ void __launch_bounds__(128)
    copy_blocks_kernel(char* base, int32_t num_planes, int64_t plane_bytes, int64_t block_bytes,
                       const int32_t* pairs) {
  const int64_t i = blockIdx.x;
  const int64_t src_off = int64_t(pairs[2 * i]) * block_bytes;
  const int64_t dst_off = int64_t(pairs[2 * i + 1]) * block_bytes;
  const int64_t n = block_bytes / 16;
  for (int64_t plane = blockIdx.y; plane < num_planes; plane += gridDim.y) {
    char* pl = base + plane * plane_bytes;
    const uint4* src = reinterpret_cast<const uint4*>(pl + src_off);
    uint4* dst = reinterpret_cast<uint4*>(pl + dst_off);
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) dst[e] = src[e];
  }
}

// grid (block i, plane): buffer row (i, plane) <-> arena block blocks[i]
// (planes gridDim.y apart, as copy_blocks_kernel).
__global__ void __launch_bounds__(128)
    gather_blocks_kernel(char* base, int32_t num_planes, int64_t plane_bytes, int64_t block_bytes,
                         const int32_t* blocks, char* buf, bool to_buffer) {
  const int64_t i = blockIdx.x;
  const int64_t n = block_bytes / 16;
  for (int64_t plane = blockIdx.y; plane < num_planes; plane += gridDim.y) {
    uint4* arena =
        reinterpret_cast<uint4*>(base + plane * plane_bytes + int64_t(blocks[i]) * block_bytes);
    uint4* row = reinterpret_cast<uint4*>(buf + (i * num_planes + plane) * block_bytes);
    if (to_buffer) {
      for (int64_t e = threadIdx.x; e < n; e += blockDim.x) row[e] = arena[e];
    } else {
      for (int64_t e = threadIdx.x; e < n; e += blockDim.x) arena[e] = row[e];
    }
  }
}

}  // namespace cuda
}  // namespace pagedkv
