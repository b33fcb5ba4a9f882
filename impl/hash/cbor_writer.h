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

// put_int32 of t[0..n) in turn (a block's token ids). Each token's size
// class is computed four at a time with SSE2 compares (part of x86-64's
// baseline), which halves the instructions per token; the bytes written
// are put_int32's (tests/hash/block_hash_test.cpp). p needs room for
// n * kMaxInt32Size.
inline uint8_t* put_int32s(uint8_t* p, const int32_t* t, size_t n) {
  size_t i = 0;
#if defined(__SSE2__)
  alignas(16) uint32_t vs[4], ks[4], ms[4];
  for (; i + 4 <= n; i += 4) {
    __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + i));
    const __m128i sign = _mm_srai_epi32(x, 31);
    const __m128i v = _mm_xor_si128(x, sign);  // 0 <= v <= 2^31 - 1: signed compares hold
    // k = (v > 23) + (v > 255) + (v > 65535), each compare -1 when true
    const __m128i k = _mm_sub_epi32(
        _mm_setzero_si128(),
        _mm_add_epi32(_mm_add_epi32(_mm_cmpgt_epi32(v, _mm_set1_epi32(23)),
                                    _mm_cmpgt_epi32(v, _mm_set1_epi32(255))),
                      _mm_cmpgt_epi32(v, _mm_set1_epi32(65535))));
    _mm_store_si128(reinterpret_cast<__m128i*>(vs), v);
    _mm_store_si128(reinterpret_cast<__m128i*>(ks), k);
    _mm_store_si128(reinterpret_cast<__m128i*>(ms),
                    _mm_and_si128(sign, _mm_set1_epi32(kMajorNegInt)));
    for (int j = 0; j < 4; ++j) p = put_int_class(p, static_cast<uint8_t>(ms[j]), vs[j], ks[j]);
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
