#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "kv_pool.h"
#include "test_util.h"
#include "token_arena.h"

namespace pagedkv {
namespace {

// The largest array the arena holds (under ASan its redzone takes the rest).
constexpr size_t kBig = TokenArena::kMaxBytes - TokenArena::kRedzone;

TEST(TokenArena, EverySizeGetsAClassThatHoldsItWithLittleWaste) {
  for (size_t bytes = 1; bytes <= TokenArena::kMaxBytes; bytes += (bytes < 4096 ? 1 : 61)) {
    const int c = TokenArena::class_of(bytes);
    ASSERT_GE(c, 0);
    ASSERT_LT(c, TokenArena::kNumClasses);
    const size_t n = TokenArena::class_bytes(c);
    ASSERT_GE(n, bytes) << bytes;
    ASSERT_EQ(n % 64, 0u) << bytes;  // chunks stay cache-line aligned
    if (bytes > TokenArena::kMinBytes) {
      ASSERT_LE(n, bytes + bytes / 4 + 64) << bytes;              // quarters of a doubling
      ASSERT_LT(TokenArena::class_bytes(c - 1), bytes) << bytes;  // the smallest that fits
    }
  }
  EXPECT_EQ(TokenArena::class_bytes(TokenArena::class_of(TokenArena::kMaxBytes)),
            TokenArena::kMaxBytes);
  EXPECT_EQ(TokenArena::class_of(TokenArena::kMaxBytes), TokenArena::kNumClasses - 1);
}

TEST(TokenArena, AFreedChunkIsReusedForItsClass) {
  TokenArena a;
  void* p = a.allocate(1000);
  a.deallocate(p, 1000);
  EXPECT_EQ(a.allocate(TokenArena::class_bytes(TokenArena::class_of(1000))), p);
}

// A reference model of what a user of the memory sees: each live chunk
// keeps the bytes written to it, and no two overlap, under random
// allocations and frees of every size (crossing into new regions).
TEST(TokenArena, LiveChunksKeepTheirBytesAndNeverOverlap) {
  TokenArena a;
  std::mt19937 rng(11);
  struct Live {
    size_t bytes;
    uint8_t fill;
  };
  std::map<char*, Live> live;
  std::vector<char> pattern(kBig);
  auto check_and_free = [&](std::map<char*, Live>::iterator it) {
    std::memset(pattern.data(), it->second.fill, it->second.bytes);
    ASSERT_EQ(std::memcmp(it->first, pattern.data(), it->second.bytes), 0);
    a.deallocate(it->first, it->second.bytes);
    live.erase(it);
  };
  for (int step = 0; step < 20000; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      check_and_free(it);
      continue;
    }
    const size_t bytes = TokenArena::kMinBytes +
                         rng() % (rng() % 8 == 0 ? kBig - TokenArena::kMinBytes + 1 : size_t(8192));
    char* p = static_cast<char*>(a.allocate(bytes));
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    auto next = live.lower_bound(p);
    if (next != live.end()) ASSERT_LE(p + bytes, next->first);
    if (next != live.begin()) {
      auto prev = std::prev(next);
      ASSERT_LE(prev->first + prev->second.bytes, p);
    }
    const uint8_t fill = uint8_t(rng());
    std::fill(p, p + bytes, char(fill));
    live[p] = {bytes, fill};
  }
  while (!live.empty()) check_and_free(live.begin());
  // Big enough to have left the small first region for huge-page ones.
  EXPECT_GT(a.bytes_reserved(), huge_pages::kHugePage);
}

TEST(TokenArena, ARegionWhoseChunksAreAllFreeGoesBackToTheSystem) {
  TokenArena a;
  // Long sequences first: several regions of big chunks.
  std::vector<void*> big;
  for (int i = 0; i < 200; ++i) big.push_back(a.allocate(kBig));
  const size_t regions = a.num_regions();
  ASSERT_GE(regions, 3u);
  ASSERT_GE(a.bytes_reserved(), 200 * kBig);
  // Then short ones, while the long ones finish.
  std::vector<void*> small;
  for (void* p : big) {
    a.deallocate(p, kBig);
    small.push_back(a.allocate(4000));
  }
  // Only the region new arrays are carved from stays.
  EXPECT_EQ(a.num_regions(), 1u);
  EXPECT_LE(a.bytes_reserved(), size_t(32) << 20);
  for (void* p : small) a.deallocate(p, 4000);
  EXPECT_EQ(a.num_regions(), 1u);
  a.release();
  EXPECT_EQ(a.bytes_reserved(), 0u);
  EXPECT_EQ(a.num_regions(), 0u);
  // Usable again after a release.
  void* p = a.allocate(300);
  a.deallocate(p, 300);
}

#if defined(__SANITIZE_ADDRESS__)
#define PKV_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PKV_TEST_ASAN 1
#endif
#endif
#if defined(PKV_TEST_ASAN)
// Under ASan the arena's free memory is poisoned: a read after free, or
// past a vector's chunk into the free space after it, is reported as on
// the heap.
TEST(TokenArenaDeathTest, AsanSeesUseAfterFreeAndOverflow) {
  TokenArena a;
  auto* keep = static_cast<volatile char*>(a.allocate(1000));
  auto* p = static_cast<volatile char*>(a.allocate(1000));
  a.deallocate(const_cast<char*>(p), 1000);
  EXPECT_DEATH(p[10] = 1, "use-after-poison");
  const size_t n = TokenArena::class_bytes(TokenArena::class_of(1000 + TokenArena::kRedzone));
  keep[999] = 1;                                          // the array's own bytes
  EXPECT_DEATH(keep[3 * n + 5] = 1, "use-after-poison");  // never handed out
  // Past a live vector's capacity, towards a live neighbour: its redzone.
  TokenVector x{ArenaAllocator<int32_t>(&a)}, y{ArenaAllocator<int32_t>(&a)};
  x.resize(64);
  y.resize(64);
  auto* xs = static_cast<volatile int32_t*>(x.data());
  EXPECT_DEATH(xs[x.capacity()] = 1, "use-after-poison");
  a.deallocate(const_cast<char*>(keep), 1000);
}
#endif

TEST(TokenArena, VectorsMoveSwapAndCopyAcrossArenasAndTheHeap) {
  TokenArena a, b;
  TokenVector x{ArenaAllocator<int32_t>(&a)}, y{ArenaAllocator<int32_t>(&b)}, heap;
  for (int32_t i = 0; i < 5000; ++i) x.push_back(i);
  for (int32_t i = 0; i < 300; ++i) y.push_back(-i);
  heap.assign(x.begin(), x.begin() + 10);
  x.swap(y);  // the allocators travel with the buffers
  EXPECT_EQ(x.get_allocator().arena, &b);
  EXPECT_EQ(y.size(), 5000u);
  EXPECT_EQ(y[4999], 4999);
  y = heap;  // copy: y keeps its arena
  EXPECT_EQ(y.get_allocator().arena, &a);
  EXPECT_EQ(y, heap);
  heap = std::move(x);  // move: the heap vector takes the arena's buffer
  EXPECT_EQ(heap.get_allocator().arena, &b);
  EXPECT_EQ(heap.size(), 300u);
  EXPECT_EQ(heap[299], -299);
  heap.clear();
  heap.shrink_to_fit();
  // Past the arena's largest class: the heap (freed with the vector).
  TokenVector big{ArenaAllocator<int32_t>(&a)};
  big.resize(kBig / sizeof(int32_t) + 1, 3);
  EXPECT_EQ(big.back(), 3);
}

TEST(TokenArena, APoolKeepsItsSequencesTokensAndBlockHashesInItsArena) {
  auto pool = Pool::create(test::manager_options(16, 100000));
  std::vector<SeqId> ids(200);
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> want(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = pool->seq_create(SeqOptions{});
    for (int k = 0; k < 100 + int(i); ++k) want[i].push_back(int32_t(rng() % 150000));
    pool->append(ids[i], want[i].data(), want[i].size(), 0);
  }
  const TokenArena& arena = pool->token_arena_for_testing();
  EXPECT_GT(arena.bytes_reserved(), 0u);
  auto in_arena = [&](SeqId id) {
    const Sequence* s = pool->seq_table_for_testing().find(id);
    return s != nullptr && s->tokens.get_allocator().arena == &arena &&
           s->hashes.get_allocator().arena == &arena;
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_TRUE(in_arena(ids[i]));
    const Sequence* s = pool->seq_table_for_testing().find(ids[i]);
    EXPECT_EQ(std::vector<int32_t>(s->tokens.begin(), s->tokens.end()), want[i]);
    EXPECT_EQ(s->hashes.size(), want[i].size() / 16) << i;  // one per full block
  }
  // A fork's copy, and a freed slot's next sequence, are in the arena too;
  // freeing sequences gives their token ids back to the arena (not kept in
  // their slots), so that emptied regions go back to the system.
  const SeqId child = pool->fork(ids[3]);
  EXPECT_TRUE(in_arena(child));
  std::vector<SeqId> longs(300);
  const std::vector<int32_t> long_prompt(4000, 17);
  for (SeqId& id : longs) {
    id = pool->seq_create(SeqOptions{});
    pool->append(id, long_prompt.data(), long_prompt.size(), 0);
  }
  const size_t held = arena.bytes_reserved();
  ASSERT_GT(held, size_t(4) << 20);
  for (SeqId id : longs) pool->free(id);
  EXPECT_LT(arena.bytes_reserved(), held);
  for (size_t i = 0; i < ids.size(); i += 2) pool->free(ids[i]);
  const SeqId again = pool->seq_create(SeqOptions{});
  pool->append(again, want[1].data(), want[1].size(), 0);
  EXPECT_TRUE(in_arena(again));
  // Destroying the pool (pkv_pool_destroy) gives the memory back at once.
  pool->close();
  EXPECT_EQ(arena.bytes_reserved(), 0u);
}

}  // namespace
}  // namespace pagedkv
