// scan_lane (pass 1 of a decode-lane step; AVX2 where the CPU has it)
// against a model written from what the pass promises: each end, its page
// count, and, in order, the sequences whose token enters or fills a block
// or finds no room. Random lanes of every length around the 8-wide groups,
// every power-of-two block size up to 1024, counts at block edges, at the
// capacity, and near the 2^31 - 1 token limit.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "lane_scan.h"

namespace pagedkv {
namespace {

struct Expected {
  std::vector<uint64_t> ends;
  std::vector<uint32_t> pages_each, slow;
  uint64_t pages = 0, max_ctx = 0, max_pages = 0;
  bool too_long = false;
};

Expected model(const std::vector<DecodeTail>& t, uint64_t bs) {
  Expected e;
  for (size_t i = 0; i < t.size(); ++i) {
    const uint64_t pos = t[i].n;  // the new token's position
    const uint64_t end = pos + 1, pages = (end + bs - 1) / bs;
    e.ends.push_back(end);
    e.pages_each.push_back(uint32_t(pages));
    e.pages += pages;
    e.max_ctx = std::max(e.max_ctx, end);
    const bool first_slot = pos % bs == 0, last_slot = pos % bs == bs - 1;
    if (first_slot || last_slot || end > t[i].cap) e.slow.push_back(uint32_t(i));
    if (pos >= uint64_t(INT32_MAX)) e.too_long = true;
  }
  e.max_pages = (e.max_ctx + bs - 1) / bs;
  return e;
}

void check(const std::vector<DecodeTail>& t, int shift, bool vector_path, const char* what) {
  const uint32_t n = uint32_t(t.size());
  const Expected e = model(t, uint64_t(1) << shift);
  std::vector<uint64_t> ends(n + 1, 0xdeadbeef);
  std::vector<uint32_t> pages(n + 1, 0xdeadbeef), slow(n + 1, 0xdeadbeef);
  const LaneScan r =
      vector_path ? scan_lane(t.data(), n, shift, ends.data(), pages.data(), slow.data())
                  : scan_lane_scalar(t.data(), n, shift, ends.data(), pages.data(), slow.data());
  SCOPED_TRACE(::testing::Message() << what << ", " << n << " sequences, block size "
                                    << (1u << shift) << (vector_path ? "" : ", scalar"));
  if (e.too_long) {
    EXPECT_EQ(r.slow, n + 1) << "a sequence at the token limit refuses the lane";
    return;
  }
  ASSERT_EQ(r.slow, e.slow.size());
  for (size_t k = 0; k < e.slow.size(); ++k) ASSERT_EQ(slow[k], e.slow[k]) << "slow[" << k << "]";
  for (uint32_t i = 0; i < n; ++i) {
    ASSERT_EQ(ends[i], e.ends[i]) << "ends[" << i << "]";
    ASSERT_EQ(pages[i], e.pages_each[i]) << "page_counts[" << i << "]";
  }
  EXPECT_EQ(ends[n], 0xdeadbeefu) << "written past the lane";
  EXPECT_EQ(pages[n], 0xdeadbeefu) << "written past the lane";
  EXPECT_EQ(slow[n], 0xdeadbeefu) << "written past the lane (the caller's slow[] has n entries)";
  EXPECT_EQ(r.pages, e.pages);
  if (n > 0) {
    EXPECT_EQ(r.max_ctx, e.max_ctx);
    EXPECT_EQ(r.max_pages, e.max_pages);
  }
}

std::vector<DecodeTail> random_lane(std::mt19937_64& rng, uint32_t n, uint64_t bs, uint32_t top) {
  std::vector<DecodeTail> t(n);
  for (DecodeTail& m : t) {
    uint64_t pos;
    switch (rng() % 4) {
      case 0:  // at a block's edge (first or last slot)
        pos = (rng() % (top / bs + 1)) * bs + (rng() % 2 ? 0 : bs - 1);
        break;
      case 1:  // small
        pos = rng() % (4 * bs);
        break;
      default:
        pos = rng() % top;
    }
    pos = std::min<uint64_t>(pos, top);
    m.n = uint32_t(pos);
    m.block = int32_t(rng() % 1000);
    m.block_index = uint32_t(pos / bs);
    m.table_version = uint32_t(rng());
    m.epoch = uint32_t(rng());
    m.tok = nullptr;
    switch (rng() % 5) {  // the capacity: none left, exactly one, some, the most
      case 0:
        m.cap = uint32_t(pos);
        break;
      case 1:
        m.cap = uint32_t(pos + 1);
        break;
      case 2:
        m.cap = UINT32_MAX;
        break;
      default:
        m.cap = uint32_t(std::min<uint64_t>(pos + 1 + rng() % 64, UINT32_MAX));
    }
  }
  return t;
}

TEST(LaneScan, MatchesTheModelForEveryLengthAndBlockSize) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // Where the CPU has AVX2, scan_lane is the vector loop under test.
  if (__builtin_cpu_supports("avx2")) ASSERT_NE(lane_scan_detail::avx2_scan_groups(), nullptr);
#endif
  std::mt19937_64 rng(20261201);
  for (int shift = 0; shift <= 10; ++shift) {
    const uint64_t bs = uint64_t(1) << shift;
    for (uint32_t n = 0; n <= 40; ++n) {
      for (int rep = 0; rep < 4; ++rep) {
        const auto t = random_lane(rng, n, bs, 5000);
        check(t, shift, true, "small counts");
        check(t, shift, false, "small counts");
      }
    }
    for (uint32_t n : {1023u, 1024u, 1029u}) {
      const auto t = random_lane(rng, n, bs, uint32_t(INT32_MAX - 1));
      check(t, shift, true, "counts up to 2^31 - 2");
      check(t, shift, false, "counts up to 2^31 - 2");
    }
  }
}

TEST(LaneScan, ASequenceAtTheTokenLimitRefusesTheLane) {
  std::mt19937_64 rng(7);
  for (uint32_t at : {0u, 5u, 8u, 15u, 16u}) {
    auto t = random_lane(rng, 17, 16, 3000);
    t[at].n = uint32_t(INT32_MAX);  // already at kMaxSeqTokens: no token fits
    check(t, 4, true, "one sequence at the limit");
    check(t, 4, false, "one sequence at the limit");
  }
}

}  // namespace
}  // namespace pagedkv
