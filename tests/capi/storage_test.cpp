// A pool's K/V storage reads as zeros wherever nothing was written, even
// where the process freed memory of the same size just before (another
// pool's K/V): pkv_pool_kv_tensor, swap-outs and block copies expose
// unwritten slots, and stale bytes there would leak whatever the heap held.
// Block copies whose pairs depend on each other are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

pkv_pool* storage_pool(uint32_t num_blocks) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 16;
  o.num_blocks = num_blocks;
  o.num_layers = 2;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.dtype = PKV_DTYPE_BF16;
  o.num_threads = 1;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

// The bytes of every layer's K and V planes.
std::vector<std::pair<uint8_t*, size_t>> planes(const pkv_pool* p) {
  std::vector<std::pair<uint8_t*, size_t>> out;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (uint32_t which : {uint32_t(PKV_KV_KEY), uint32_t(PKV_KV_VALUE)}) {
      pkv_tensor t;
      EXPECT_EQ(pkv_pool_kv_tensor(p, layer, which, &t), PKV_OK);
      size_t bytes = 2;  // bf16
      for (int d = 0; d < t.ndim; ++d) bytes *= size_t(t.shape[d]);
      out.push_back({static_cast<uint8_t*>(t.data) + t.byte_offset, bytes});
    }
  }
  return out;
}

// 64 blocks: 256 KiB of K/V, from the heap; 1024 blocks: 4 MiB, a mapping.
class Storage : public ::testing::TestWithParam<uint32_t> {};

TEST_P(Storage, NewPoolReadsZerosWhereNothingWasWritten) {
  const uint32_t num_blocks = GetParam();
  for (int round = 0; round < 3; ++round) {
    pkv_pool* p = storage_pool(num_blocks);
    ASSERT_NE(p, nullptr);
    for (const auto& [data, bytes] : planes(p)) {
      size_t nonzero = 0;
      for (size_t i = 0; i < bytes; ++i) nonzero += data[i] != 0;
      EXPECT_EQ(nonzero, 0u) << "round " << round << ": " << bytes << "-byte plane";
    }
    // Out of an unwritten block, through the swap path.
    const size_t block_bytes =
        size_t(2) * 2 * 2 * 16 * 64 * 2;  // layers, K/V, heads, slots, dim, bf16
    std::vector<uint8_t> host(block_bytes, 0xAB);
    const int32_t block = int32_t(num_blocks - 1);
    ASSERT_EQ(pkv_pool_swap_blocks(p, &block, 1, host.data(), host.size(), PKV_SWAP_OUT, nullptr),
              PKV_OK)
        << pkv_last_error_message();
    for (size_t i = 0; i < host.size(); ++i) ASSERT_EQ(host[i], 0) << i;
    // Fill the storage before freeing it: the next round's pool may get
    // the same memory back.
    for (const auto& [data, bytes] : planes(p)) std::memset(data, 0xAB, bytes);
    pkv_pool_destroy(p);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, Storage, ::testing::Values(64u, 1024u));

// Block b's bytes in layer 0's K plane.
uint8_t* block_bytes(const pkv_pool* p, int32_t b, size_t* n) {
  pkv_tensor t;
  EXPECT_EQ(pkv_pool_kv_tensor(p, 0, PKV_KV_KEY, &t), PKV_OK);
  *n = size_t(t.strides[0]) * 2;  // bf16
  return static_cast<uint8_t*>(t.data) + t.byte_offset + size_t(b) * *n;
}

// Copy pairs run at once: a chain (1 -> 2, 2 -> 3) or two pairs writing
// one block would race, so they are refused before any byte moves; a pair
// copying a block onto itself is allowed next to others.
TEST(CopyBlocks, DependentPairsAreRefusedAndCopyNothing) {
  pkv_pool* p = storage_pool(64);
  ASSERT_NE(p, nullptr);
  size_t n = 0;
  for (int32_t b = 1; b <= 3; ++b) std::memset(block_bytes(p, b, &n), 0x10 * b, n);
  const std::vector<uint8_t> b1(block_bytes(p, 1, &n), block_bytes(p, 1, &n) + n);
  const std::vector<uint8_t> b2(block_bytes(p, 2, &n), block_bytes(p, 2, &n) + n);
  const std::vector<uint8_t> b3(block_bytes(p, 3, &n), block_bytes(p, 3, &n) + n);
  auto same = [&](int32_t b, const std::vector<uint8_t>& want) {
    return std::memcmp(block_bytes(p, b, &n), want.data(), n) == 0;
  };
  const int32_t chain_src[2] = {1, 2}, chain_dst[2] = {2, 3};
  EXPECT_EQ(pkv_pool_copy_blocks(p, chain_src, chain_dst, 2, nullptr), PKV_E_INVALID_ARGUMENT);
  const int32_t twice_src[2] = {1, 2}, twice_dst[2] = {3, 3};
  EXPECT_EQ(pkv_pool_copy_blocks(p, twice_src, twice_dst, 2, nullptr), PKV_E_INVALID_ARGUMENT);
  EXPECT_TRUE(same(1, b1) && same(2, b2) && same(3, b3));
  const int32_t self_src[2] = {1, 3}, self_dst[2] = {2, 3};
  ASSERT_EQ(pkv_pool_copy_blocks(p, self_src, self_dst, 2, nullptr), PKV_OK)
      << pkv_last_error_message();
  EXPECT_TRUE(same(1, b1) && same(2, b1) && same(3, b3));
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK);
  pkv_pool_destroy(p);
}

}  // namespace
