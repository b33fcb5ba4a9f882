// What the single-head attention reproductions (known_issues_test.cpp,
// attention_regression_test.cpp) share: deterministic K/V values by position
// and a one-layer, one-KV-head f32 CPU pool.
#pragma once

#include <cstdint>

#include "pagedkv/pagedkv.h"

namespace pkvrel {

inline float key_at(int pos, int d) { return float(((pos * 31 + d * 7) % 17) - 8) / 8.f; }
inline float value_at(int pos, int d) { return float(((pos * 13 + d * 3) % 11) - 5) / 4.f; }

// NULL if the pool cannot be created (the caller asserts).
inline pkv_pool* one_head_pool(uint32_t block_size, uint64_t num_blocks, uint32_t window,
                               uint32_t head_dim) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = block_size;
  o.num_blocks = num_blocks;
  o.sliding_window = window;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = head_dim;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 1;
  pkv_pool* p = nullptr;
  return pkv_pool_create(&o, &p) == PKV_OK ? p : nullptr;
}

}  // namespace pkvrel
