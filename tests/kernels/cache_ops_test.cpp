// Cache writes, block copies and swaps: every byte lands exactly where the
// mapping says, and nothing else changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend.h"
#include "error.h"
#include "test_util.h"

namespace pagedkv {
namespace test {
namespace {

struct Arena {
  KvArena arena;
  Buffer storage;
  size_t bytes;

  Arena(int32_t layers, int32_t blocks, int32_t heads, int32_t bs, int32_t d, DType dt,
        uint32_t seed) {
    arena.num_layers = layers;
    arena.layout = {blocks, heads, bs, d, dt};
    bytes = arena.layout.layer_bytes() * 2 * size_t(layers);
    storage = Buffer(bytes);
    arena.base = storage.data();
    std::mt19937 rng(seed);
    auto* p = static_cast<uint8_t*>(arena.base);
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
      const uint32_t r = rng();
      std::memcpy(p + i, &r, 4);
    }
  }
  std::vector<uint8_t> snapshot() const {
    const auto* p = static_cast<const uint8_t*>(arena.base);
    return std::vector<uint8_t>(p, p + bytes);
  }
};

TEST(CacheWrite, ScattersEverySlotAndNothingElse) {
  std::mt19937 rng(9);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int32_t d : {64, 80, 128}) {
      for (int32_t bs : {8, 16, 64}) {
        for (int32_t threads : {1, 3}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " d=" + std::to_string(d) +
                       " bs=" + std::to_string(bs) + " threads=" + std::to_string(threads));
          const int32_t heads = 2, blocks = 20, layers = 2, layer = 1;
          Arena a(layers, blocks, heads, bs, d, dt, rng());
          const auto before = a.snapshot();
          // Distinct random slots (some tokens are padding), many tokens so
          // that the threaded path runs too.
          const int64_t T = std::min<int64_t>(300, int64_t(blocks) * bs);
          std::vector<int64_t> all(size_t(blocks) * bs);
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), rng);
          std::vector<int64_t> slots(all.begin(), all.begin() + T);
          for (int64_t t = 0; t < T; t += 7) slots[size_t(t)] = -1;
          const int64_t s1 = d + 4, s0 = heads * s1 + 8;
          const size_t es = dtype_size(dt);
          Buffer kb(size_t(T * s0) * es), vb(size_t(T * s0) * es);
          for (auto* b : {&kb, &vb}) {
            auto* p = static_cast<uint8_t*>(b->data());
            for (size_t i = 0; i < size_t(T * s0) * es; ++i) p[i] = uint8_t(rng());
          }
          PlanView plan{};
          plan.num_tokens = T;
          plan.slot_mapping = slots.data();
          Tensor3 k{kb.data(), dt, T, heads, d, s0, s1}, v{vb.data(), dt, T, heads, d, s0, s1};
          auto backend = make_cpu_backend(threads);
          backend->write(a.arena, layer, plan, k, v, nullptr);

          std::vector<uint8_t> expect = before;
          for (int64_t t = 0; t < T; ++t) {
            if (slots[size_t(t)] < 0) continue;
            const int64_t blk = slots[size_t(t)] / bs, off = slots[size_t(t)] % bs;
            for (int32_t h = 0; h < heads; ++h) {
              for (int w = 0; w < 2; ++w) {
                const size_t plane = (size_t(2) * layer + w) * a.arena.layout.layer_bytes();
                const size_t dst = plane + size_t(((blk * heads + h) * bs + off) * d) * es;
                const auto* src = static_cast<const uint8_t*>((w ? vb : kb).data()) +
                                  size_t(t * s0 + h * s1) * es;
                std::memcpy(&expect[dst], src, size_t(d) * es);
              }
            }
          }
          ASSERT_TRUE(expect == a.snapshot());
        }
      }
    }
  }
}

TEST(CacheWrite, BadSlotOrShapeChangesNothing) {
  Arena a(1, 4, 1, 8, 64, DType::kBF16, 1);
  const auto before = a.snapshot();
  std::vector<int64_t> slots{3, 32};  // 32 = 4 blocks * 8: one past the end
  std::vector<uint16_t> kv(2 * 64, 0x3f80);
  PlanView plan{};
  plan.num_tokens = 2;
  plan.slot_mapping = slots.data();
  Tensor3 k{kv.data(), DType::kBF16, 2, 1, 64, 64, 64};
  auto backend = make_cpu_backend(1);
  auto expect_invalid = [&](const Tensor3& kk) {
    try {
      backend->write(a.arena, 0, plan, kk, k, nullptr);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    }
    EXPECT_TRUE(before == a.snapshot());
  };
  expect_invalid(k);
  slots[1] = 5;
  Tensor3 wrong_dtype = k;
  wrong_dtype.dtype = DType::kF16;
  expect_invalid(wrong_dtype);
  Tensor3 wrong_dim = k;
  wrong_dim.n2 = 32;
  expect_invalid(wrong_dim);
}

TEST(CopyBlocks, CopiesEveryPlaneAndNothingElse) {
  for (int32_t threads : {1, 2}) {
    std::mt19937 rng(5 + threads);
    Arena a(3, 40, 2, 16, 64, DType::kF16, rng());
    const auto before = a.snapshot();
    std::vector<int32_t> ids(39);
    std::iota(ids.begin(), ids.end(), 1);
    std::shuffle(ids.begin(), ids.end(), rng);
    // Sources and destinations disjoint (as copy-on-write produces them).
    std::vector<int32_t> src(ids.begin(), ids.begin() + 12),
        dst(ids.begin() + 12, ids.begin() + 24);
    auto backend = make_cpu_backend(threads);
    backend->copy_blocks(a.arena, src.data(), dst.data(), int64_t(src.size()), nullptr);
    std::vector<uint8_t> expect = before;
    const size_t bb = a.arena.layout.block_bytes(), lb = a.arena.layout.layer_bytes();
    for (size_t p = 0; p < 6; ++p) {
      for (size_t i = 0; i < src.size(); ++i) {
        std::memcpy(&expect[p * lb + size_t(dst[i]) * bb], &before[p * lb + size_t(src[i]) * bb],
                    bb);
      }
    }
    ASSERT_TRUE(expect == a.snapshot());
  }
}

TEST(CopyBlocks, BadIdChangesNothing) {
  Arena a(1, 4, 1, 8, 64, DType::kF32, 2);
  const auto before = a.snapshot();
  std::vector<int32_t> src{1, 2}, dst{3, 4};
  auto backend = make_cpu_backend(1);
  EXPECT_THROW(backend->copy_blocks(a.arena, src.data(), dst.data(), 2, nullptr), Error);
  EXPECT_TRUE(before == a.snapshot());
}

TEST(Swap, OutThenInRoundTripsWithHostLayout) {
  for (int32_t threads : {1, 2}) {
    std::mt19937 rng(17 + threads);
    Arena a(2, 30, 2, 16, 128, DType::kBF16, rng());
    const auto before = a.snapshot();
    const size_t bb = a.arena.layout.block_bytes(), lb = a.arena.layout.layer_bytes();
    std::vector<int32_t> blocks{7, 3, 29, 12, 1};
    const size_t host_bytes = blocks.size() * 2 * 2 * bb;
    std::vector<uint8_t> host(host_bytes, 0);
    auto backend = make_cpu_backend(threads);
    backend->swap(a.arena, blocks.data(), int64_t(blocks.size()), host.data(), true, nullptr);
    ASSERT_TRUE(before == a.snapshot());
    for (size_t i = 0; i < blocks.size(); ++i) {
      for (size_t layer = 0; layer < 2; ++layer) {
        for (size_t w = 0; w < 2; ++w) {
          const uint8_t* want = &before[(2 * layer + w) * lb + size_t(blocks[i]) * bb];
          ASSERT_EQ(0, std::memcmp(&host[((i * 2 + layer) * 2 + w) * bb], want, bb));
        }
      }
    }
    // Swap the same contents into other blocks.
    std::vector<int32_t> targets{2, 4, 5, 6, 8};
    backend->swap(a.arena, targets.data(), int64_t(targets.size()), host.data(), false, nullptr);
    std::vector<uint8_t> expect = before;
    for (size_t i = 0; i < blocks.size(); ++i) {
      for (size_t p = 0; p < 4; ++p) {
        std::memcpy(&expect[p * lb + size_t(targets[i]) * bb],
                    &before[p * lb + size_t(blocks[i]) * bb], bb);
      }
    }
    ASSERT_TRUE(expect == a.snapshot());
  }
}

}  // namespace
}  // namespace test
}  // namespace pagedkv
