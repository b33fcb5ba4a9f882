#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>

#include "huge_pages.h"

namespace pagedkv {
namespace {

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

TEST(HugePages, LargeArraysStartOnAHugePage) {
  // 300k blocks' hashes or 1M prefix-cache slots: what a big pool allocates.
  BlockArray<int32_t> slots(size_t(1) << 20, -1);
  ASSERT_TRUE(huge_pages::wants(slots.size() * sizeof(int32_t)));
  EXPECT_TRUE(aligned(slots.data(), huge_pages::kHugePage));
  for (int32_t v : slots) ASSERT_EQ(v, -1);
  // Every byte of the array is usable up to its end.
  std::iota(slots.begin(), slots.end(), 0);
  EXPECT_EQ(slots.back(), (1 << 20) - 1);
}

TEST(HugePages, SmallArraysStayOrdinary) {
  BlockArray<uint8_t> small(1000, 7);
  EXPECT_FALSE(huge_pages::wants(small.size()));
  for (uint8_t v : small) ASSERT_EQ(v, 7);
}

TEST(HugePages, GrowingAcrossTheThresholdKeepsTheContents) {
  // Allocation and release pick the same path from the same size, also
  // when a vector grows from operator new's memory into huge pages and back.
  BlockArray<uint64_t> a;
  for (uint64_t i = 0; i < (uint64_t(1) << 18); ++i) a.push_back(i * 3);
  ASSERT_TRUE(huge_pages::wants(a.capacity() * sizeof(uint64_t)));
  EXPECT_TRUE(aligned(a.data(), huge_pages::kHugePage));
  for (uint64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], i * 3);
  a.resize(10);
  a.shrink_to_fit();
  EXPECT_EQ(a[9], 27u);
}

TEST(HugePages, AnImpossibleSizeThrowsBadAlloc) {
  HugePageAllocator<uint64_t> alloc;
  EXPECT_THROW(alloc.allocate(size_t(-1) / 4), std::bad_alloc);
  EXPECT_THROW(huge_pages::allocate(size_t(-1) - 100), std::bad_alloc);
}

}  // namespace
}  // namespace pagedkv
