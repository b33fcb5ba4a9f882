// scan_lane's AVX2 loop: eight lane entries at a time, their token counts
// and capacities gathered (one 32-byte entry each), the ends widened to 64
// bits, and the sequences to read in full taken from a movemask.
#include <cstddef>

#include "lane_scan.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace pagedkv {
namespace lane_scan_detail {
namespace {

static_assert(sizeof(DecodeTail) == 32 && offsetof(DecodeTail, n) == 12 &&
                  offsetof(DecodeTail, cap) == 24,
              "the gathers below read n and cap at these places");

// Token counts are at most kMaxSeqTokens (2^31 - 1), so n + 1 fits 32 bits.
__attribute__((target("avx2"))) uint32_t scan_groups_avx2(const DecodeTail* tails, uint32_t n,
                                                          int shift, uint64_t* ends,
                                                          uint32_t* page_counts, uint32_t* slow,
                                                          LaneScan& r, uint64_t& top) {
  const __m256i entry = _mm256_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56);  // 32 B apart
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i all = _mm256_set1_epi32(-1);
  const __m256i mask = _mm256_set1_epi32(int32_t((uint32_t(1) << shift) - 1));
  const __m128i count = _mm_cvtsi32_si128(shift);
  __m256i pages = _mm256_setzero_si256();  // 4 x u64
  __m256i most = _mm256_setzero_si256();   // 8 x u32
  uint32_t i = 0, found = r.slow;
  for (; i + 8 <= n; i += 8) {
    const int* base = reinterpret_cast<const int*>(tails + i);
    const __m256i n0 = _mm256_i32gather_epi32(base + offsetof(DecodeTail, n) / 4, entry, 4);
    const __m256i cap = _mm256_i32gather_epi32(base + offsetof(DecodeTail, cap) / 4, entry, 4);
    const __m256i end = _mm256_add_epi32(n0, one);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ends + i),
                        _mm256_cvtepu32_epi64(_mm256_castsi256_si128(end)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ends + i + 4),
                        _mm256_cvtepu32_epi64(_mm256_extracti128_si256(end, 1)));
    const __m256i np = _mm256_add_epi32(_mm256_srl_epi32(n0, count), one);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(page_counts + i), np);
    pages = _mm256_add_epi64(pages, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(np)));
    pages = _mm256_add_epi64(pages, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(np, 1)));
    most = _mm256_max_epu32(most, n0);
    // Enters or fills a block: (end & mask) <= 1; no room: end > cap
    // (unsigned: max(end, cap) != cap).
    const __m256i slot = _mm256_and_si256(end, mask);
    const __m256i edge = _mm256_cmpeq_epi32(_mm256_min_epu32(slot, one), slot);
    const __m256i room = _mm256_cmpeq_epi32(_mm256_max_epu32(end, cap), cap);
    const __m256i out = _mm256_or_si256(edge, _mm256_xor_si256(room, all));
    for (uint32_t bits = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(out))); bits != 0;
         bits &= bits - 1)
      slow[found++] = i + uint32_t(__builtin_ctz(bits));
  }
  r.slow = found;
  alignas(32) uint64_t p[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(p), pages);
  r.pages += p[0] + p[1] + p[2] + p[3];
  alignas(32) uint32_t t[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(t), most);
  for (uint32_t v : t) top = std::max<uint64_t>(top, v);
  return i;
}

}  // namespace

ScanGroups avx2_scan_groups() {
  // __builtin_cpu_supports also checks that the OS saves the ymm state.
  return __builtin_cpu_supports("avx2") ? scan_groups_avx2 : nullptr;
}

}  // namespace lane_scan_detail
}  // namespace pagedkv

#else

namespace pagedkv {
namespace lane_scan_detail {
ScanGroups avx2_scan_groups() { return nullptr; }
}  // namespace lane_scan_detail
}  // namespace pagedkv

#endif
