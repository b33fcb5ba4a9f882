// Shared by the transfer tests and their peer process (peer_main.cpp): a
// pool with storage, sequences prefilled with random K/V through the C ABI,
// their blocks' bytes, and one decode step's attention, all reproducible
// from a seed so that both processes can compute the same step.
#pragma once

#include <pagedkv/pagedkv.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace pkv_xfer {

inline void ok(pkv_status s, const char* what) {
  if (s != PKV_OK)
    throw std::runtime_error(std::string(what) + ": " + pkv_status_string(s) + " " +
                             pkv_last_error_message());
}

struct Layout {
  uint32_t num_layers = 2, num_kv_heads = 2, head_dim = 64, block_size = 16;
  uint32_t dtype = PKV_DTYPE_BF16;
  uint64_t num_blocks = 512;
};

inline pkv_pool* make_pool(const Layout& l) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.num_layers = l.num_layers;
  o.num_kv_heads = l.num_kv_heads;
  o.head_dim = l.head_dim;
  o.block_size = l.block_size;
  o.dtype = l.dtype;
  o.num_blocks = l.num_blocks;
  o.num_threads = 1;  // one summation order: attention compares exactly across processes
  pkv_pool* p = nullptr;
  ok(pkv_pool_create(&o, &p), "pkv_pool_create");
  return p;
}

inline std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const float f = d(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    x = uint16_t(b >> 16);
  }
  return v;
}

inline pkv_tensor tensor3(void* data, uint32_t dtype, int64_t a, int64_t b, int64_t c) {
  const int64_t shape[3] = {a, b, c};
  pkv_tensor t;
  ok(pkv_tensor_init(data, dtype, PKV_DEVICE_CPU, 0, 3, shape, &t), "pkv_tensor_init");
  return t;
}

// Appends n tokens to seq and runs one step writing random K/V for them
// (every layer), so that they count as computed.
inline void prefill(pkv_pool* p, const Layout& l, pkv_seq_id seq,
                    const std::vector<int32_t>& tokens, std::mt19937_64& rng) {
  ok(pkv_seq_append(p, seq, tokens.data(), tokens.size(), 0), "pkv_seq_append");
  const uint32_t q = uint32_t(tokens.size());
  pkv_batch* b = nullptr;
  ok(pkv_batch_prepare(p, &seq, &q, 1, nullptr, &b), "pkv_batch_prepare");
  const size_t n = size_t(q) * l.num_kv_heads * l.head_dim;
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    auto k = random_bf16(rng, n), v = random_bf16(rng, n);
    pkv_tensor tk = tensor3(k.data(), PKV_DTYPE_BF16, q, l.num_kv_heads, l.head_dim);
    pkv_tensor tv = tensor3(v.data(), PKV_DTYPE_BF16, q, l.num_kv_heads, l.head_dim);
    ok(pkv_cache_write(b, layer, &tk, &tv, nullptr), "pkv_cache_write");
  }
  pkv_batch_destroy(b);
}

// The bytes of the blocks holding seq's first num_tokens tokens, layer by
// layer, K then V.
inline std::vector<uint8_t> block_bytes(pkv_pool* p, const Layout& l, pkv_seq_id seq,
                                        uint64_t num_tokens) {
  std::vector<int32_t> table(4096);
  uint64_t len = 0;
  ok(pkv_seq_get_block_table(p, seq, table.data(), table.size(), &len), "block table");
  const uint64_t nb = (num_tokens + l.block_size - 1) / l.block_size;
  const size_t bb = size_t(l.num_kv_heads) * l.block_size * l.head_dim * pkv_dtype_size(l.dtype);
  std::vector<uint8_t> out;
  for (uint32_t layer = 0; layer < l.num_layers; ++layer)
    for (uint32_t w = 0; w < 2; ++w) {
      pkv_tensor t;
      ok(pkv_pool_kv_tensor(p, layer, w, &t), "pkv_pool_kv_tensor");
      const uint8_t* base = static_cast<const uint8_t*>(t.data) + t.byte_offset;
      for (uint64_t j = 0; j < nb; ++j)
        out.insert(out.end(), base + size_t(table[j]) * bb, base + size_t(table[j] + 1) * bb);
    }
  return out;
}

// One decode step of seq (a new token with K/V and a query from seed):
// the attention output, f32 [num_kv_heads * 2 q heads, head_dim].
inline std::vector<float> decode_step(pkv_pool* p, const Layout& l, pkv_seq_id seq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int32_t tok = 7;
  ok(pkv_seq_append(p, seq, &tok, 1, 0), "pkv_seq_append (decode)");
  const uint32_t one = 1, hq = 2 * l.num_kv_heads;
  pkv_batch* b = nullptr;
  ok(pkv_batch_prepare(p, &seq, &one, 1, nullptr, &b), "pkv_batch_prepare (decode)");
  std::vector<float> all;
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    auto k = random_bf16(rng, l.num_kv_heads * l.head_dim);
    auto v = random_bf16(rng, l.num_kv_heads * l.head_dim);
    auto q = random_bf16(rng, hq * l.head_dim);
    std::vector<uint16_t> o(hq * l.head_dim);
    pkv_tensor tk = tensor3(k.data(), PKV_DTYPE_BF16, 1, l.num_kv_heads, l.head_dim);
    pkv_tensor tv = tensor3(v.data(), PKV_DTYPE_BF16, 1, l.num_kv_heads, l.head_dim);
    pkv_tensor tq = tensor3(q.data(), PKV_DTYPE_BF16, 1, hq, l.head_dim);
    pkv_tensor to = tensor3(o.data(), PKV_DTYPE_BF16, 1, hq, l.head_dim);
    ok(pkv_cache_write(b, layer, &tk, &tv, nullptr), "pkv_cache_write (decode)");
    ok(pkv_attention_forward(b, layer, &tq, &to, nullptr, nullptr, nullptr), "attention");
    for (uint16_t x : o) {
      const uint32_t bits = uint32_t(x) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      all.push_back(f);
    }
  }
  pkv_batch_destroy(b);
  return all;
}

inline std::string hex(const void* data, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s(2 * n, '0');
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = d[p[i] >> 4];
    s[2 * i + 1] = d[p[i] & 15];
  }
  return s;
}

inline std::vector<uint8_t> unhex(const std::string& s) {
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = uint8_t(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return out;
}

inline std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n) {
  std::uniform_int_distribution<int32_t> d(0, 50000);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

}  // namespace pkv_xfer
