// The simulated model's numbers. K and V of a token are a pure function of
// the hash of its context (and layer, head), so the program can recompute
// any cached entry for the float64 reference without keeping a copy. All
// values lie on a grid of 1/128 (queries: 1/32) within [-1, 1) ([-4, 4)):
// exactly representable in bf16, f16 and f32, so the reference sees the
// very inputs the kernels see.
#pragma once

#include <cstdint>

namespace sim {

// PKV_DTYPE_F32, F16 or BF16 element i of buf.
void store_element(void* buf, uint32_t dtype, uint64_t i, float value);
float load_element(const void* buf, uint32_t dtype, uint64_t i);

// head_dim values of K (kind 0) or V (kind 1) of one token, layer and head.
void kv_head_values(uint64_t context_hash, uint32_t layer, uint32_t kind, uint32_t head,
                    uint32_t head_dim, float* out);

// Writes n random query values into buf[first, first + n) of dtype.
void random_queries(uint64_t* state, void* buf, uint32_t dtype, uint64_t first, uint64_t n);

}  // namespace sim
