// The CBOR token encoder of cbor_writer.h eight tokens at a time, compiled
// for AVX2 inside a baseline x86-64 library and called only after a
// run-time CPU check. AVX2 adds what SSE2 lacks for it: a byte shuffle
// (the argument's byte swap in one instruction) and per-lane shifts (the
// argument cut to its length without a select per size).
#include "hash/cbor_tokens.h"

#include <cstring>

#include "hash/cbor_writer.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace pagedkv {
namespace cbor {
namespace {

__attribute__((target("avx2"))) uint8_t* put_int32s_avx2(uint8_t* p, const int32_t* t, size_t n) {
  size_t i = 0;
  alignas(32) uint64_t words[8];
  alignas(32) uint32_t lens[8];
  const __m256i bswap32 = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,  //
                                           3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + i));
    const __m256i sign = _mm256_srai_epi32(x, 31);
    const __m256i v = _mm256_xor_si256(x, sign);  // 0 <= v <= 2^31 - 1: signed compares hold
    // Nested masks (c3 implies c2 implies c1): a 1-, 2- or 4-byte argument.
    const __m256i c1 = _mm256_cmpgt_epi32(v, _mm256_set1_epi32(23));
    const __m256i c2 = _mm256_cmpgt_epi32(v, _mm256_set1_epi32(255));
    const __m256i c3 = _mm256_cmpgt_epi32(v, _mm256_set1_epi32(65535));
    const __m256i c23 = _mm256_add_epi32(c2, c3);
    const __m256i neg_bytes = _mm256_add_epi32(_mm256_add_epi32(c1, c23), c3);  // -(0, 1, 2, 4)
    // Additional info: v itself below 24, else 24, 25 or 26.
    const __m256i info = _mm256_blendv_epi8(v, _mm256_sub_epi32(_mm256_set1_epi32(24), c23), c1);
    const __m256i head =
        _mm256_or_si256(info, _mm256_and_si256(sign, _mm256_set1_epi32(kMajorNegInt)));
    // The argument's bytes in memory order (big-endian), as a little-endian
    // integer: the byte-swapped v shifted right by 32 - 8 * bytes (a shift
    // of 32 gives 0).
    const __m256i arg =
        _mm256_srlv_epi32(_mm256_shuffle_epi8(v, bswap32),
                          _mm256_add_epi32(_mm256_set1_epi32(32), _mm256_slli_epi32(neg_bytes, 3)));
    const __m256i lo = _mm256_or_si256(head, _mm256_slli_epi32(arg, 8));  // bytes 0-3 of each word
    const __m256i hi = _mm256_srli_epi32(arg, 24);                        // byte 4
    // Within each 128-bit half: words of tokens 0, 1, 4, 5, then 2, 3, 6, 7.
    _mm256_store_si256(reinterpret_cast<__m256i*>(words), _mm256_unpacklo_epi32(lo, hi));
    _mm256_store_si256(reinterpret_cast<__m256i*>(words + 4), _mm256_unpackhi_epi32(lo, hi));
    _mm256_store_si256(reinterpret_cast<__m256i*>(lens),
                       _mm256_sub_epi32(_mm256_set1_epi32(1), neg_bytes));
    // Each word stored whole (8 bytes), the next one over its spare bytes.
    constexpr int kWordOf[8] = {0, 1, 4, 5, 2, 3, 6, 7};
    for (int j = 0; j < 8; ++j) {
      std::memcpy(p, &words[kWordOf[j]], 8);
      p += lens[j];
    }
  }
  return put_int32s(p, t + i, n - i);
}

}  // namespace

PutInt32s avx2_put_int32s() {
  // __builtin_cpu_supports also checks that the OS saves the ymm state.
  return __builtin_cpu_supports("avx2") ? put_int32s_avx2 : nullptr;
}

}  // namespace cbor
}  // namespace pagedkv

#else

namespace pagedkv {
namespace cbor {
PutInt32s avx2_put_int32s() { return nullptr; }
}  // namespace cbor
}  // namespace pagedkv

#endif
