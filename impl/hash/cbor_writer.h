// Minimal canonical CBOR writer (RFC 8949 §4.2.1 core deterministic
// encoding) for the handful of types block hashes need: unsigned and negative
// integers, byte strings, text strings, array heads and null. Every head uses
// the shortest form, which is all that determinism asks for these types; the
// output equals Python's cbor2.dumps(x, canonical=True).
//
// The writer does no bounds checks: callers size the buffer first with the
// *_size() helpers (worst cases), so the hot loop is branch-light.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pagedkv {
namespace cbor {

constexpr uint8_t kMajorUint = 0x00;
constexpr uint8_t kMajorNegInt = 0x20;
constexpr uint8_t kMajorBytes = 0x40;
constexpr uint8_t kMajorText = 0x60;
constexpr uint8_t kMajorArray = 0x80;
constexpr uint8_t kNull = 0xf6;

constexpr size_t kMaxHeadSize = 9;   // initial byte + 8-byte argument
constexpr size_t kMaxInt32Size = 5;  // initial byte + 4-byte argument

inline uint8_t* put_be16(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
  return p + 2;
}

inline uint8_t* put_be32(uint8_t* p, uint32_t v) {
  v = __builtin_bswap32(v);
  std::memcpy(p, &v, 4);
  return p + 4;
}

inline uint8_t* put_be64(uint8_t* p, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
  return p + 8;
}

// A data item head: major type (already shifted) and its argument, shortest form.
inline uint8_t* put_head(uint8_t* p, uint8_t major, uint64_t v) {
  if (v < 24) {
    *p = static_cast<uint8_t>(major | v);
    return p + 1;
  }
  if (v <= 0xff) {
    p[0] = major | 24;
    p[1] = static_cast<uint8_t>(v);
    return p + 2;
  }
  if (v <= 0xffff) {
    *p = major | 25;
    return put_be16(p + 1, static_cast<uint32_t>(v));
  }
  if (v <= 0xffffffffu) {
    *p = major | 26;
    return put_be32(p + 1, static_cast<uint32_t>(v));
  }
  *p = major | 27;
  return put_be64(p + 1, v);
}

// A signed 32-bit integer: major type 0 for t >= 0, else major type 1 with
// argument -1 - t (which is ~t, and always fits 32 bits). Without branches
// (token ids of a block mix argument sizes at random, which a branch per
// size mispredicts): always stores 5 bytes, the head and up to 4 argument
// bytes, and advances past those used, so p needs room for kMaxInt32Size.
// The head and argument of an integer whose argument v (< 2^32) is of size
// class k: 0, v in the head; 1, 2, 3: a 1-, 2- or 4-byte argument (info
// 24 + k - 1). Stores 5 bytes, advances past those used.
inline uint8_t* put_int_class(uint8_t* p, uint8_t major, uint32_t v, uint32_t k) {
  const uint32_t bytes = k + (k == 3);
  p[0] = static_cast<uint8_t>(major | (k == 0 ? v : 23 + k));
  // The argument's `bytes` low bytes, big-endian, at p + 1.
  const uint32_t be = static_cast<uint32_t>(uint64_t(__builtin_bswap32(v)) >> (32 - 8 * bytes));
  std::memcpy(p + 1, &be, 4);
  return p + 1 + bytes;
}

inline uint8_t* put_int32(uint8_t* p, int32_t t) {
  const uint32_t sign = static_cast<uint32_t>(t >> 31);  // 0 or all ones
  const uint32_t v = static_cast<uint32_t>(t) ^ sign;
  const uint8_t major = static_cast<uint8_t>(sign & kMajorNegInt);
  return put_int_class(p, major, v, (v >= 24) + (v > 0xff) + (v > 0xffff));
}

// Bytes put_int32s may write past n * kMaxInt32Size (its last 8-byte store).
constexpr size_t kInt32sSlack = 3;

// put_int32 of t[0..n) in turn (a block's token ids). Four tokens at a
// time with SSE2 (part of x86-64's baseline): each token's head and
// big-endian argument are built in one 64-bit word (head | argument << 8)
// and its length from three compares, without a branch or a scalar
// byte swap; then each word is stored whole (8 bytes) and the pointer
// advanced by its length, so the next word overwrites the spare bytes. The
// bytes are put_int32's (tests/hash/block_hash_test.cpp). p needs room for
// n * kMaxInt32Size + kInt32sSlack.
inline uint8_t* put_int32s(uint8_t* p, const int32_t* t, size_t n) {
  size_t i = 0;
#if defined(__SSE2__)
  alignas(16) uint64_t words[4];
  alignas(16) uint32_t lens[4];
  const __m128i ff = _mm_set1_epi32(0xff), ff00 = _mm_set1_epi32(0xff00);
  for (; i + 4 <= n; i += 4) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + i));
    const __m128i sign = _mm_srai_epi32(x, 31);
    const __m128i v = _mm_xor_si128(x, sign);  // 0 <= v <= 2^31 - 1: signed compares hold
    // Nested masks (c3 implies c2 implies c1): a 1-, 2- or 4-byte argument.
    const __m128i c1 = _mm_cmpgt_epi32(v, _mm_set1_epi32(23));
    const __m128i c2 = _mm_cmpgt_epi32(v, _mm_set1_epi32(255));
    const __m128i c3 = _mm_cmpgt_epi32(v, _mm_set1_epi32(65535));
    // Additional info: v itself below 24, else 24, 25 or 26 (24 - c2 - c3).
    const __m128i info =
        _mm_or_si128(_mm_and_si128(c1, _mm_sub_epi32(_mm_set1_epi32(24), _mm_add_epi32(c2, c3))),
                     _mm_andnot_si128(c1, v));
    const __m128i head = _mm_or_si128(info, _mm_and_si128(sign, _mm_set1_epi32(kMajorNegInt)));
    // The argument's bytes in memory order, as a little-endian integer.
    const __m128i be2 = _mm_or_si128(_mm_slli_epi32(_mm_and_si128(v, ff), 8), _mm_srli_epi32(v, 8));
    const __m128i be4 = _mm_or_si128(_mm_or_si128(_mm_slli_epi32(v, 24), _mm_srli_epi32(v, 24)),
                                     _mm_or_si128(_mm_slli_epi32(_mm_and_si128(v, ff00), 8),
                                                  _mm_and_si128(_mm_srli_epi32(v, 8), ff00)));
    __m128i arg = _mm_and_si128(c1, v);
    arg = _mm_or_si128(_mm_and_si128(c2, be2), _mm_andnot_si128(c2, arg));
    arg = _mm_or_si128(_mm_and_si128(c3, be4), _mm_andnot_si128(c3, arg));
    const __m128i lo = _mm_or_si128(head, _mm_slli_epi32(arg, 8));  // bytes 0-3 of each word
    const __m128i hi = _mm_srli_epi32(arg, 24);                     // byte 4
    _mm_store_si128(reinterpret_cast<__m128i*>(words), _mm_unpacklo_epi32(lo, hi));
    _mm_store_si128(reinterpret_cast<__m128i*>(words + 2), _mm_unpackhi_epi32(lo, hi));
    // length 1 + (0, 1, 2 or 4 argument bytes) = 1 - c1 - c2 - 2 * c3
    _mm_store_si128(reinterpret_cast<__m128i*>(lens),
                    _mm_sub_epi32(_mm_set1_epi32(1),
                                  _mm_add_epi32(_mm_add_epi32(c1, c2), _mm_add_epi32(c3, c3))));
    for (int j = 0; j < 4; ++j) {
      std::memcpy(p, &words[j], 8);
      p += lens[j];
    }
  }
#endif
  for (; i < n; ++i) p = put_int32(p, t[i]);
  return p;
}

inline uint8_t* put_string(uint8_t* p, uint8_t major, const void* data, size_t n) {
  p = put_head(p, major, n);
  if (n) std::memcpy(p, data, n);
  return p + n;
}

}  // namespace cbor
}  // namespace pagedkv
