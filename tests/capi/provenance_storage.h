// The K/V that the single-group provenance models (provenance_test.cpp,
// provenance_tiers_test.cpp) write for each token, and reading it back from
// a pool's storage: every element encodes the token's extra keys and whole
// prefix, so a slot either holds exactly what its sequence's tokens wrote
// or names what it holds instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"
#include "provenance_model.h"

namespace provenance {

constexpr uint32_t kLayers = 2;
constexpr uint32_t kHeadDim = 4;

// The pools the models drive: f32 K/V of one head, kLayers layers, one
// kernel thread.
inline pkv_pool_options storage_options(uint32_t block_size, uint64_t num_blocks) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = block_size;
  o.num_blocks = num_blocks;
  o.num_layers = kLayers;
  o.num_kv_heads = 1;
  o.head_dim = kHeadDim;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 1;
  return o;
}

// The 64-bit identity of the K/V of token pos of a sequence with key k and
// tokens t: its extra keys and every token up to pos.
inline uint64_t ident(const Key& k, const std::vector<int32_t>& t, size_t pos) {
  uint64_t h = mix(mix(1, k.lora), uint64_t(k.salt));
  for (size_t i = 0; i <= pos; ++i) h = mix(h, uint64_t(uint32_t(t[i])) + 7);
  return h;
}

// Element d of layer l's K (kv 0) or V (kv 1) for identity id: 16 bits each,
// never 0 (storage nobody wrote reads as zeros).
inline float elem(uint64_t id, uint32_t l, uint32_t kv, uint32_t d) {
  const uint64_t h = mix(id, l * 2 + kv);
  return float(((h >> (16 * d)) & 0xffff) + 1);
}

// A f32 pool's K/V planes (pkv_pool_kv_tensor of every layer, K and V).
struct Storage {
  pkv_tensor kv[kLayers][2];

  float* slot_ptr(uint32_t l, uint32_t w, int64_t block, int64_t off) {
    const pkv_tensor& t = kv[l][w];
    char* base = static_cast<char*>(t.data) + t.byte_offset;
    return reinterpret_cast<float*>(base) + block * t.strides[0] + off * t.strides[2];
  }

  // "" when the slot holds identity id in every layer, K and V.
  std::string slot_holds(int64_t block, int64_t off, uint64_t id) {
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t w = 0; w < 2; ++w) {
        const float* p = slot_ptr(l, w, block, off);
        for (uint32_t d = 0; d < kHeadDim; ++d)
          if (p[d] != elem(id, l, w, d))
            return "block " + std::to_string(block) + " slot " + std::to_string(off) + " layer " +
                   std::to_string(l) + (w ? " V" : " K") +
                   (p[d] == 0 ? " never written" : " holds other K/V");
      }
    return "";
  }
};

}  // namespace provenance
